//! Bearer tokens that stay valid for as long as the process runs.
//!
//! A [`TokenSource`] hands out the current token of one identity and renews it before it expires: a static token
//! (never renewed), the Iceberg REST OAuth2 client-credentials grant (`credential = "id:secret"`, renewed from the
//! `expires_in` the server returns), or Google Application Default Credentials through `gcp_auth` (a service-account
//! key file — also one whose `token_uri` points somewhere else —, gcloud user credentials, the metadata server).
//!
//! Invariants: a token is never handed out within [`RENEW_MARGIN`] of its expiry (or a fifth of its lifetime, for
//! short-lived ones); after the server refuses a token (HTTP 401) the caller calls [`TokenSource::invalidate`] and the
//! next [`TokenSource::token`] fetches a new one instead of returning the cached one.
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::error::{Error, Result};

/// OAuth2 scope of Google APIs (BigLake, Cloud Storage).
pub const GOOGLE_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// How long before its expiry a token is renewed.
pub const RENEW_MARGIN: Duration = Duration::from_secs(60);

/// A bearer token and when it stops being valid (`None`: the issuer did not say).
#[derive(Clone)]
pub struct Token {
    /// The secret; never logged (see the `Debug` impl).
    pub secret: String,
    /// When the token expires.
    pub expires_at: Option<SystemTime>,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token").field("secret", &"<redacted>").field("expires_at", &self.expires_at).finish()
    }
}

impl Token {
    /// Whether the token may still be handed out at `now`: before its expiry minus the renewal margin (a fifth of the
    /// remaining lifetime at issue for tokens that live shorter than a few minutes).
    pub fn fresh_at(&self, now: SystemTime, issued: SystemTime) -> bool {
        match self.expires_at {
            None => true,
            Some(exp) => {
                let life = exp.duration_since(issued).unwrap_or_default();
                let margin = RENEW_MARGIN.min(life / 5);
                now + margin < exp
            }
        }
    }
}

struct Cached {
    token: Token,
    issued: SystemTime,
}

/// Where tokens come from.
enum Kind {
    Static(String),
    ClientCredentials { client: reqwest::Client, url: String, id: String, secret: String, scope: String },
    Google { key_file: Option<String> },
}

/// One identity's tokens, renewed before they expire. Cheap to share (`Arc`).
pub struct TokenSource {
    kind: Kind,
    /// What the token is for, in messages ("REST catalog", "Google").
    label: String,
    cached: tokio::sync::Mutex<Option<Cached>>,
    google: tokio::sync::Mutex<Option<Arc<dyn gcp_auth::TokenProvider>>>,
}

impl fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenSource").field("label", &self.label).finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

impl TokenSource {
    /// A token that never changes (`token = "..."`).
    pub fn fixed(token: impl Into<String>) -> Arc<Self> {
        Self::new(Kind::Static(token.into()), "token")
    }

    /// The OAuth2 client-credentials grant against `url` (`credential = "id:secret"` of an Iceberg REST catalog).
    pub fn client_credentials(client: reqwest::Client, url: String, credential: &str, scope: String) -> Arc<Self> {
        let (id, secret) = credential.split_once(':').unwrap_or(("", credential));
        Self::new(Kind::ClientCredentials { client, url, id: id.into(), secret: secret.into(), scope }, "OAuth2 client credentials")
    }

    /// Google credentials: the key file `key_file`, else Application Default Credentials.
    pub fn google(key_file: Option<String>) -> Arc<Self> {
        Self::new(Kind::Google { key_file }, "Google credentials")
    }

    fn new(kind: Kind, label: &str) -> Arc<Self> {
        Arc::new(TokenSource { kind, label: label.into(), cached: tokio::sync::Mutex::new(None), google: tokio::sync::Mutex::new(None) })
    }

    /// Whether tokens of this source are Google's (so storage on `gs://` may use them too).
    pub fn is_google(&self) -> bool {
        matches!(self.kind, Kind::Google { .. })
    }

    /// The current token, fetching a new one when the cached one is about to expire.
    pub async fn token(&self) -> Result<Token> {
        let mut cached = self.cached.lock().await;
        let now = SystemTime::now();
        if let Some(c) = cached.as_ref() {
            if c.token.fresh_at(now, c.issued) {
                return Ok(c.token.clone());
            }
        }
        let token = self.fetch().await?;
        tracing::debug!(source = %self.label, expires_at = token.expires_at.map(|t| humantime::format_rfc3339_seconds(t).to_string()), "token renewed");
        *cached = Some(Cached { token: token.clone(), issued: now });
        Ok(token)
    }

    /// Forgets the cached token (the server refused it): the next [`Self::token`] fetches a new one.
    pub async fn invalidate(&self) {
        *self.cached.lock().await = None;
        // gcp_auth keeps its own cache per provider: a new provider fetches anew.
        *self.google.lock().await = None;
    }

    async fn fetch(&self) -> Result<Token> {
        match &self.kind {
            Kind::Static(t) => Ok(Token { secret: t.clone(), expires_at: None }),
            Kind::ClientCredentials { client, url, id, secret, scope } => {
                let form = [("grant_type", "client_credentials"), ("client_id", id), ("client_secret", secret), ("scope", scope.as_str())];
                let resp = client.post(url).form(&form).send().await.map_err(|e| self.error(format!("token request to {url}: {e}"), true))?;
                let status = resp.status();
                if !status.is_success() {
                    let retry = status.is_server_error() || status.as_u16() == 429;
                    return Err(self.error(format!("token request to {url}: HTTP {status}; check `credential`"), retry));
                }
                let r: TokenResponse = resp.json().await.map_err(|e| self.error(format!("token response of {url}: {e}"), true))?;
                Ok(Token { secret: r.access_token, expires_at: r.expires_in.map(|s| SystemTime::now() + Duration::from_secs(s)) })
            }
            Kind::Google { key_file } => {
                let provider = {
                    let mut p = self.google.lock().await;
                    match p.as_ref() {
                        Some(p) => p.clone(),
                        None => {
                            let built: Arc<dyn gcp_auth::TokenProvider> =
                                match key_file {
                                    Some(f) => Arc::new(gcp_auth::CustomServiceAccount::from_file(f).map_err(|e| {
                                        self.error(format!("service-account key file {f}: {e}; check `google-credentials-file`"), false)
                                    })?),
                                    None => gcp_auth::provider().await.map_err(|e| {
                                        self.error(
                                            format!(
                                                "no Google Application Default Credentials found ({e}); set GOOGLE_APPLICATION_CREDENTIALS to a \
                                             service-account key file, run `gcloud auth application-default login`, or run on Google Cloud"
                                            ),
                                            false,
                                        )
                                    })?,
                                };
                            *p = Some(built.clone());
                            built
                        }
                    }
                };
                let t = provider.token(&[GOOGLE_SCOPE]).await.map_err(|e| self.error(format!("token request: {e}"), true))?;
                let expires_at = SystemTime::UNIX_EPOCH + Duration::from_secs(t.expires_at().timestamp().max(0) as u64);
                Ok(Token { secret: t.as_str().to_string(), expires_at: Some(expires_at) })
            }
        }
    }

    fn error(&self, message: String, retryable: bool) -> Error {
        Error::Auth { source_name: self.label.clone(), message, retryable, cause: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renews_before_expiry() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = Token { secret: "s".into(), expires_at: Some(t0 + Duration::from_secs(3600)) };
        assert!(hour.fresh_at(t0 + Duration::from_secs(3500), t0));
        assert!(!hour.fresh_at(t0 + Duration::from_secs(3545), t0), "within a minute of expiry");
        // a 10 s token is renewed in its last 2 s
        let short = Token { secret: "s".into(), expires_at: Some(t0 + Duration::from_secs(10)) };
        assert!(short.fresh_at(t0 + Duration::from_secs(7), t0));
        assert!(!short.fresh_at(t0 + Duration::from_secs(8), t0));
        assert!(Token { secret: "s".into(), expires_at: None }.fresh_at(t0, t0));
    }

    #[test]
    fn debug_hides_the_secret() {
        let t = Token { secret: "hunter2".into(), expires_at: None };
        assert!(!format!("{t:?}").contains("hunter2"));
    }

    #[tokio::test]
    async fn fixed_token_is_returned_as_is() {
        let s = TokenSource::fixed("abc");
        assert_eq!(s.token().await.unwrap().secret, "abc");
        s.invalidate().await;
        assert_eq!(s.token().await.unwrap().secret, "abc");
        assert!(!s.is_google());
    }
}

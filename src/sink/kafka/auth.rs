//! SASL OAUTHBEARER with Google access tokens, for Google Cloud Managed Service for Apache Kafka.
//!
//! The broker takes a JWT-shaped token: `base64url(header).base64url(claims).base64url(access token)` with the header
//! `{"typ":"JWT","alg":"GOOG_OAUTH2_TOKEN"}` and the claims `exp`, `iat`, `iss: "Google"`, `scope: "kafka"`,
//! `sub` (the principal's e-mail) — the shape of Google's own client examples. librdkafka asks for a token from its
//! own thread ([`ClientContext::generate_oauth_token`] is synchronous), before the previous one expires; the token
//! comes from the shared [`TokenSource`] on the runtime that created the client.
use std::sync::Arc;
use std::time::SystemTime;

use base64::Engine as _;
use rdkafka::client::{ClientContext, OAuthToken};
use rdkafka::consumer::ConsumerContext;
use rdkafka::producer::{DeliveryResult, ProducerContext};

use crate::auth::{Token, TokenSource};
use crate::error::{Error, Result};

/// Client context of every Kafka client of a sink: Google tokens when configured, nothing otherwise.
#[derive(Clone, Default)]
pub struct KafkaContext {
    google: Option<GoogleBearer>,
}

#[derive(Clone)]
struct GoogleBearer {
    tokens: Arc<TokenSource>,
    runtime: tokio::runtime::Handle,
    principal: String,
}

impl KafkaContext {
    /// A context that answers OAUTHBEARER token requests with Google tokens of `principal` (a service account
    /// e-mail). Must be created inside a Tokio runtime.
    pub fn google(tokens: Arc<TokenSource>, principal: String) -> Self {
        KafkaContext { google: Some(GoogleBearer { tokens, runtime: tokio::runtime::Handle::current(), principal }) }
    }
}

/// The context for a client configured with `auth` (only `google`) and `principal` (default: the `client_email` of
/// GOOGLE_APPLICATION_CREDENTIALS); `section` names the configuration section in errors (`kafka`, `cluster`).
/// Must be called inside a Tokio runtime.
pub fn context_for(auth: Option<&str>, principal: Option<&str>, section: &str) -> Result<KafkaContext> {
    if auth != Some("google") {
        return Ok(KafkaContext::default());
    }
    let key_file = std::env::var("GOOGLE_APPLICATION_CREDENTIALS").ok();
    let principal = principal.map(str::to_string).or_else(|| key_file.as_deref().and_then(key_file_principal)).ok_or_else(|| {
        Error::Config(vec![format!(
            "{section}.principal: the service account e-mail OAUTHBEARER presents; set it, or GOOGLE_APPLICATION_CREDENTIALS to a key file"
        )])
    })?;
    Ok(KafkaContext::google(TokenSource::google(None), principal))
}

/// Client settings `auth` implies (before the user's `properties`, which may override them): TLS and OAUTHBEARER for
/// `google` (Google Cloud Managed Service for Apache Kafka).
pub fn auth_defaults(auth: Option<&str>, c: &mut rdkafka::config::ClientConfig) {
    if auth == Some("google") {
        c.set("security.protocol", "SASL_SSL").set("sasl.mechanism", "OAUTHBEARER");
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s.as_bytes())
}

/// The OAUTHBEARER token Google's Kafka brokers take for an access token.
pub fn google_kafka_token(access: &Token, principal: &str, now: SystemTime) -> (String, i64) {
    let secs = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let exp = access.expires_at.unwrap_or(now + std::time::Duration::from_secs(3600));
    let header = r#"{"typ":"JWT","alg":"GOOG_OAUTH2_TOKEN"}"#;
    let claims = serde_json::json!({"exp": secs(exp), "iat": secs(now), "iss": "Google", "scope": "kafka", "sub": principal}).to_string();
    (format!("{}.{}.{}", b64(header), b64(&claims), b64(&access.secret)), secs(exp) as i64 * 1000)
}

impl ClientContext for KafkaContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        let g = self.google.as_ref().ok_or("sasl.mechanism OAUTHBEARER needs `auth = \"google\"` (in [kafka] or [cluster])")?;
        // librdkafka's thread is not a runtime thread: run the token fetch on the client's runtime
        let tokens = g.tokens.clone();
        let access = std::thread::scope(|s| s.spawn(|| g.runtime.block_on(tokens.token())).join()).map_err(|_| "token thread panicked")??;
        let (token, lifetime_ms) = google_kafka_token(&access, &g.principal, SystemTime::now());
        Ok(OAuthToken { token, principal_name: g.principal.clone(), lifetime_ms })
    }
}

impl ProducerContext for KafkaContext {
    type DeliveryOpaque = ();
    // delivery failures surface in commit_transaction
    fn delivery(&self, _: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

impl ConsumerContext for KafkaContext {}

/// The e-mail of the service account in a key file (the OAUTHBEARER principal).
pub fn key_file_principal(path: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok()?.get("client_email")?.as_str().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn auth_google_brings_tokens_and_sasl_defaults() {
        assert!(context_for(None, None, "cluster").unwrap().google.is_none());
        let g = context_for(Some("google"), Some("sa@p.iam.gserviceaccount.com"), "cluster").unwrap();
        assert_eq!(g.google.as_ref().map(|g| g.principal.as_str()), Some("sa@p.iam.gserviceaccount.com"));
        let mut c = rdkafka::config::ClientConfig::new();
        auth_defaults(Some("google"), &mut c);
        assert_eq!((c.get("security.protocol"), c.get("sasl.mechanism")), (Some("SASL_SSL"), Some("OAUTHBEARER")));
        let mut plain = rdkafka::config::ClientConfig::new();
        auth_defaults(None, &mut plain);
        assert_eq!(plain.get("sasl.mechanism"), None);
    }

    #[test]
    fn token_has_googles_shape() {
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        let t = Token { secret: "ya29.secret".into(), expires_at: Some(now + std::time::Duration::from_secs(3600)) };
        let (tok, lifetime) = google_kafka_token(&t, "sa@p.iam.gserviceaccount.com", now);
        let parts: Vec<&str> = tok.split('.').collect();
        assert_eq!(parts.len(), 3);
        let d = |s: &str| String::from_utf8(base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(s).unwrap()).unwrap();
        assert_eq!(d(parts[0]), r#"{"typ":"JWT","alg":"GOOG_OAUTH2_TOKEN"}"#);
        let c: serde_json::Value = serde_json::from_str(&d(parts[1])).unwrap();
        assert_eq!(
            (c["iss"].as_str(), c["scope"].as_str(), c["sub"].as_str(), c["exp"].as_u64()),
            (Some("Google"), Some("kafka"), Some("sa@p.iam.gserviceaccount.com"), Some(4600))
        );
        assert_eq!(d(parts[2]), "ya29.secret");
        assert_eq!(lifetime, 4_600_000);
    }
}

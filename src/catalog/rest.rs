//! Commits to an Iceberg REST catalog with our own hand-built updates: `POST /v1/{prefix}/namespaces/{ns}/tables/{t}`
//! with a `CommitTableRequest` (iceberg-rust's REST client only accepts its sealed `TableCommit`).
use std::collections::HashMap;
use std::time::Duration;

use iceberg::{TableIdent, TableRequirement, TableUpdate};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use serde::Deserialize;

use crate::error::{Error, Result};

const CATALOG: &str = "rest";

/// Outcome of a commit request.
#[derive(Debug, PartialEq, Eq)]
pub enum CommitOutcome {
    Committed,
    /// 409: a requirement failed (someone else committed); reload and retry.
    Conflict(String),
    /// 5xx / transport error after the request was sent: the commit may or may not have happened.
    Unknown(String),
}

pub struct RestCommitter {
    client: reqwest::Client,
    base: String,
    prefix: Option<String>,
    headers: HeaderMap,
}

#[derive(Deserialize)]
struct ConfigResponse {
    #[serde(default)]
    defaults: HashMap<String, String>,
    #[serde(default)]
    overrides: HashMap<String, String>,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
}

impl RestCommitter {
    pub async fn connect(props: &HashMap<String, String>) -> Result<Self> {
        let base = props.get("uri").cloned().unwrap_or_default().trim_end_matches('/').to_string();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| Error::catalog(CATALOG, e, false))?;
        let mut headers = HeaderMap::new();
        for (k, v) in props {
            if let Some(name) = k.strip_prefix("header.") {
                let n = HeaderName::from_bytes(name.as_bytes()).map_err(|e| Error::Config(vec![format!("header `{name}`: {e}")]))?;
                let v = HeaderValue::from_str(v).map_err(|e| Error::Config(vec![format!("header `{name}` value: {e}")]))?;
                headers.insert(n, v);
            }
        }
        let token = match (props.get("token"), props.get("credential")) {
            (Some(t), _) => Some(t.clone()),
            (None, Some(cred)) => {
                let (id, secret) = cred.split_once(':').unwrap_or(("", cred.as_str()));
                let url = props.get("oauth2-server-uri").cloned().unwrap_or_else(|| format!("{base}/v1/oauth/tokens"));
                let scope = props.get("scope").cloned().unwrap_or_else(|| "catalog".into());
                let form = [("grant_type", "client_credentials"), ("client_id", id), ("client_secret", secret), ("scope", scope.as_str())];
                let resp =
                    client.post(&url).form(&form).send().await.map_err(|e| Error::catalog(CATALOG, format!("token request to {url}: {e}"), true))?;
                if !resp.status().is_success() {
                    return Err(Error::catalog(CATALOG, format!("token request to {url}: HTTP {}", resp.status()), false));
                }
                Some(resp.json::<TokenResponse>().await.map_err(|e| Error::catalog(CATALOG, e, false))?.access_token)
            }
            _ => None,
        };
        if let Some(t) = token {
            headers.insert(AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {t}")).map_err(|e| Error::Config(vec![e.to_string()]))?);
        }
        let mut url = format!("{base}/v1/config");
        if let Some(w) = props.get("warehouse") {
            url = format!("{url}?warehouse={}", urlencode(w));
        }
        let resp = client.get(&url).headers(headers.clone()).send().await.map_err(|e| Error::catalog(CATALOG, format!("{url}: {e}"), true))?;
        if !resp.status().is_success() {
            let retry = resp.status().is_server_error();
            return Err(Error::catalog(CATALOG, format!("{url}: HTTP {}", resp.status()), retry));
        }
        let cfg: ConfigResponse = resp.json().await.map_err(|e| Error::catalog(CATALOG, e, false))?;
        let prefix = props.get("prefix").cloned().or_else(|| cfg.overrides.get("prefix").cloned()).or_else(|| cfg.defaults.get("prefix").cloned());
        Ok(RestCommitter { client, base, prefix, headers })
    }

    fn table_url(&self, ident: &TableIdent) -> String {
        let ns = ident.namespace().iter().map(|p| urlencode(p)).collect::<Vec<_>>().join("%1F");
        match &self.prefix {
            Some(p) => format!("{}/v1/{}/namespaces/{ns}/tables/{}", self.base, p, urlencode(ident.name())),
            None => format!("{}/v1/namespaces/{ns}/tables/{}", self.base, urlencode(ident.name())),
        }
    }

    pub async fn commit(&self, ident: &TableIdent, requirements: &[TableRequirement], updates: &[TableUpdate]) -> Result<CommitOutcome> {
        let body = serde_json::json!({
            "identifier": {"namespace": ident.namespace().iter().collect::<Vec<_>>(), "name": ident.name()},
            "requirements": requirements,
            "updates": updates,
        });
        let url = self.table_url(ident);
        let resp = match self.client.post(&url).headers(self.headers.clone()).json(&body).send().await {
            Ok(r) => r,
            // connect errors happen before the request reaches the server: nothing was committed
            Err(e) if e.is_connect() => return Err(Error::catalog(CATALOG, format!("{url}: {e}"), true)),
            Err(e) => return Ok(CommitOutcome::Unknown(e.to_string())),
        };
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        match status.as_u16() {
            200..=299 => Ok(CommitOutcome::Committed),
            409 => Ok(CommitOutcome::Conflict(text)),
            500..=599 => Ok(CommitOutcome::Unknown(format!("HTTP {status}: {text}"))),
            401 | 403 => Err(Error::catalog(CATALOG, format!("commit refused (HTTP {status}): check token/credential: {text}"), false)),
            404 => Err(Error::TableNotFound { catalog: CATALOG.into(), table: ident.to_string() }),
            _ => Err(Error::catalog(CATALOG, format!("commit failed (HTTP {status}): {text}"), false)),
        }
    }
}

fn urlencode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn encodes_names() {
        assert_eq!(super::urlencode("a b/c"), "a%20b%2Fc");
    }
}

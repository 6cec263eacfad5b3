//! Keeping credentials out of messages: what a server sends back in an error body (some echo the request, headers
//! included) is shown only after every secret `cdc` holds is replaced, and any bearer token is cut.
//!
//! Invariant: a message built from outside text with [`redact`] holds none of the given secrets, whatever the server
//! echoed; secrets shorter than [`MIN_SECRET`] are not searched for (they would redact ordinary words).

/// What a secret is replaced with.
const MASK: &str = "[redacted]";
/// Secrets shorter than this are not searched for.
const MIN_SECRET: usize = 6;

/// Whether a configuration key names a secret value (tokens, keys, passwords, credentials, authorization headers).
pub(crate) fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ["token", "secret", "password", "credential", "authorization", "access-key", "session-key", "api-key", "apikey", "private-key", "sas"]
        .iter()
        .any(|s| k.contains(s))
}

/// `text` with every secret in `secrets` and every `Bearer …` token replaced by a mask.
pub(crate) fn redact<'a>(text: &str, secrets: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = text.to_string();
    for s in secrets {
        if s.len() >= MIN_SECRET {
            out = out.replace(s, MASK);
        }
    }
    bearer_cut(&out)
}

/// Cuts what follows `Bearer ` (any case) up to the next character that cannot be in a token.
fn bearer_cut(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(i) = lower[at..].find("bearer ").map(|i| at + i) {
        let start = i + "bearer ".len();
        let end = text[start..].find(|c: char| !(c.is_ascii_alphanumeric() || "-._~+/=".contains(c))).map_or(text.len(), |j| start + j);
        out.push_str(&text[at..start]);
        if end > start {
            out.push_str(MASK);
        }
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echoed_request_loses_its_secrets() {
        let body = r#"{"error":{"message":"bad request (abc); headers: Authorization: Bearer eyJhbGciOi.abc-123_x, X-Api-Key: k3y-s3cret-value; client secret=hunter22"}}"#;
        let out = redact(body, ["k3y-s3cret-value", "hunter22", "abc"]);
        for leaked in ["eyJhbGciOi", "k3y-s3cret-value", "hunter22"] {
            assert!(!out.contains(leaked), "{leaked} leaked: {out}");
        }
        assert!(out.contains("Bearer [redacted]") && out.contains("bad request"), "{out}");
        assert!(out.contains("abc"), "too short to be searched for: {out}");
        assert_eq!(redact("no secrets here", ["whatever-secret"]), "no secrets here");
        assert_eq!(redact("BEARER", ["x"]), "BEARER");
    }

    #[test]
    fn secret_keys_are_recognised() {
        for k in ["token", "credential", "s3.secret-access-key", "gcs.oauth2.token", "header.Authorization", "s3.access-key-id", "password"] {
            assert!(is_secret_key(k), "{k}");
        }
        for k in ["uri", "warehouse", "header.x-goog-user-project", "s3.region", "prefix"] {
            assert!(!is_secret_key(k), "{k}");
        }
    }
}

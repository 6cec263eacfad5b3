//! AWS Signature Version 4 for JSON-RPC calls (Glue), and where AWS credentials come from.
//!
//! Signing: canonical request (method, path, query, the signed headers lower-cased and sorted, the payload's
//! SHA-256) → string to sign (algorithm, time, scope `date/region/service/aws4_request`, the canonical request's
//! SHA-256) → signature with the key derived from the secret through date, region, service. Only the headers given
//! to [`sign`] are signed; the caller sends exactly those (plus `authorization`).
//!
//! Credentials, first found wins: the catalog's `access-key-id` / `secret-access-key` / `session-token`; the
//! environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`); the shared credentials file
//! (`AWS_SHARED_CREDENTIALS_FILE` or `~/.aws/credentials`, profile `profile` / `AWS_PROFILE` / `default`).
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// AWS credentials: a key pair, and a session token for temporary ones.
#[derive(Clone, PartialEq)]
pub(crate) struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("access_key_id", &self.access_key_id).finish_non_exhaustive()
    }
}

/// Where credentials were looked for, for the message when none were found.
pub(crate) const SOURCES: &str =
    "the catalog's `access-key-id`/`secret-access-key`, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws/credentials";

impl Credentials {
    /// The first credentials found (see the module header); `props` are the catalog's keys, `env` looks up
    /// environment variables.
    pub fn resolve(props: &std::collections::BTreeMap<String, String>, env: impl Fn(&str) -> Option<String>) -> Option<Credentials> {
        if let (Some(id), Some(secret)) = (props.get("access-key-id"), props.get("secret-access-key")) {
            return Some(Credentials {
                access_key_id: id.clone(),
                secret_access_key: secret.clone(),
                session_token: props.get("session-token").cloned(),
            });
        }
        if let (Some(id), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            return Some(Credentials { access_key_id: id, secret_access_key: secret, session_token: env("AWS_SESSION_TOKEN") });
        }
        let file = env("AWS_SHARED_CREDENTIALS_FILE").or_else(|| env("HOME").map(|h| format!("{h}/.aws/credentials")))?;
        let profile = props.get("profile").cloned().or_else(|| env("AWS_PROFILE")).unwrap_or_else(|| "default".into());
        Self::from_profile(&std::fs::read_to_string(file).ok()?, &profile)
    }

    /// The credentials of `[profile]` in an AWS shared-credentials (INI) file.
    fn from_profile(text: &str, profile: &str) -> Option<Credentials> {
        let mut in_profile = false;
        let (mut id, mut secret, mut token) = (None, None, None);
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';')) {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                in_profile = name.trim() == profile;
            } else if in_profile {
                if let Some((k, v)) = line.split_once('=') {
                    let v = Some(v.trim().to_string());
                    match k.trim() {
                        "aws_access_key_id" => id = v,
                        "aws_secret_access_key" => secret = v,
                        "aws_session_token" => token = v,
                        _ => {}
                    }
                }
            }
        }
        Some(Credentials { access_key_id: id?, secret_access_key: secret?, session_token: token })
    }
}

/// What is signed: one request.
pub(crate) struct Request<'a> {
    pub method: &'a str,
    /// The URL path (already URI-encoded), `/` for JSON-RPC services.
    pub path: &'a str,
    /// The canonical query string (sorted, encoded), empty for JSON-RPC.
    pub query: &'a str,
    /// Headers to sign, names in any case; `host` and `x-amz-date` must be among them.
    pub headers: &'a [(&'a str, &'a str)],
    pub payload: &'a [u8],
}

/// The `authorization` header value for `req` at `amz_date` (`YYYYMMDDTHHMMSSZ`).
pub(crate) fn sign(creds: &Credentials, region: &str, service: &str, amz_date: &str, req: &Request) -> String {
    let mut headers: Vec<(String, String)> =
        req.headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.split_whitespace().collect::<Vec<_>>().join(" "))).collect();
    headers.sort();
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed_headers = headers.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(";");
    let canonical =
        format!("{}\n{}\n{}\n{canonical_headers}\n{signed_headers}\n{}", req.method, req.path, req.query, hex::encode(Sha256::digest(req.payload)));
    let date = &amz_date[..8];
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical.as_bytes())));
    let mut key = hmac(format!("AWS4{}", creds.secret_access_key).as_bytes(), date.as_bytes());
    for part in [region, service, "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let signature = hex::encode(hmac(&key, to_sign.as_bytes()));
    format!("AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}", creds.access_key_id)
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_the_documented_s3_get_example() {
        // "GET Object" from AWS's Signature Version 4 documentation for S3 (header-based auth)
        let creds = Credentials {
            access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        };
        let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let req = Request {
            method: "GET",
            path: "/test.txt",
            query: "",
            headers: &[
                ("Host", "examplebucket.s3.amazonaws.com"),
                ("Range", "bytes=0-9"),
                ("x-amz-content-sha256", empty),
                ("x-amz-date", "20130524T000000Z"),
            ],
            payload: b"",
        };
        assert_eq!(
            sign(&creds, "us-east-1", "s3", "20130524T000000Z", &req),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn credentials_come_from_the_catalog_then_the_environment_then_the_profile() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("credentials");
        std::fs::write(&file, "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n\n[etl]\naws_access_key_id=E\naws_secret_access_key=ES\naws_session_token=T\n").unwrap();
        let file = file.display().to_string();
        let env = |vars: &'static [(&'static str, &'static str)], file: String| {
            move |k: &str| {
                if k == "AWS_SHARED_CREDENTIALS_FILE" {
                    Some(file.clone())
                } else {
                    vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
                }
            }
        };
        let mut props = std::collections::BTreeMap::new();
        assert_eq!(Credentials::resolve(&props, env(&[], file.clone())).unwrap().access_key_id, "D");
        assert_eq!(Credentials::resolve(&props, env(&[("AWS_PROFILE", "etl")], file.clone())).unwrap().session_token.as_deref(), Some("T"));
        assert_eq!(
            Credentials::resolve(&props, env(&[("AWS_ACCESS_KEY_ID", "V"), ("AWS_SECRET_ACCESS_KEY", "VS")], file.clone())).unwrap().access_key_id,
            "V"
        );
        props.insert("access-key-id".into(), "C".into());
        props.insert("secret-access-key".into(), "CS".into());
        assert_eq!(
            Credentials::resolve(&props, env(&[("AWS_ACCESS_KEY_ID", "V"), ("AWS_SECRET_ACCESS_KEY", "VS")], file.clone())).unwrap().access_key_id,
            "C"
        );
        assert!(Credentials::resolve(&std::collections::BTreeMap::new(), env(&[("AWS_PROFILE", "missing")], file)).is_none());
        assert!(!format!("{:?}", Credentials::resolve(&props, |_| None).unwrap()).contains("CS"), "secrets stay out of Debug");
    }
}

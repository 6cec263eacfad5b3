//! An Iceberg REST catalog client: config, namespaces, load/create table, and commits of our own hand-built updates.
//!
//! We speak the protocol ourselves instead of using iceberg-catalog-rest 0.10.1 because a service running for months
//! against Google BigLake needs what that client lacks: tokens renewed before they expire and after a 401 (it fetches
//! one at start and keeps it), vended storage credentials (`X-Iceberg-Access-Delegation`; it ignores
//! `storage-credentials` and never re-fetches them), commits of our own `TableUpdate`s (its `TableCommit` is sealed),
//! and FileIO on `gs://`/`s3://` through [`crate::storage`].
//!
//! Requests: every one carries the configured `header.*` headers and the current bearer token; a 401 renews the token
//! and is retried once; reads (GET/HEAD) are retried on transport errors, 429 and 5xx with jittered backoff. A commit
//! is never retried here: after it was sent its outcome can be unknown, which the caller settles by reloading.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use iceberg::io::FileIO;
use iceberg::spec::TableMetadata;
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableCreation, TableIdent, TableRequirement, TableUpdate};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use reqwest::{Method, StatusCode};
use serde::Deserialize;

use super::{Backend, Swapped};
use crate::auth::{Token, TokenSource};
use crate::config::{CatalogConfig, CatalogType};
use crate::error::{Error, Result};
use crate::storage::{self, props as sp, truthy, CdcStorageFactory, GoogleStorageToken, StorageCredentials};

/// Catalog property keys of the REST client.
pub mod keys {
    pub const URI: &str = "uri";
    pub const WAREHOUSE: &str = "warehouse";
    pub const PREFIX: &str = "prefix";
    pub const TOKEN: &str = "token";
    pub const CREDENTIAL: &str = "credential";
    pub const OAUTH2_SERVER_URI: &str = "oauth2-server-uri";
    pub const SCOPE: &str = "scope";
    /// `google`: Google Application Default Credentials (or `google-credentials-file`) for the catalog and storage.
    pub const AUTH: &str = "auth";
    pub const GOOGLE_CREDENTIALS_FILE: &str = "google-credentials-file";
    /// `true`: ask the catalog for short-lived storage credentials (`X-Iceberg-Access-Delegation`).
    pub const VENDED_CREDENTIALS: &str = "vended-credentials";
    pub const HEADER_PREFIX: &str = "header.";
    /// Keys the client itself understands (everything else must be a storage property or a header).
    pub const ALL: &[&str] =
        &[URI, WAREHOUSE, PREFIX, TOKEN, CREDENTIAL, OAUTH2_SERVER_URI, SCOPE, AUTH, GOOGLE_CREDENTIALS_FILE, VENDED_CREDENTIALS];
}

const ACCESS_DELEGATION: &str = "x-iceberg-access-delegation";
const READ_ATTEMPTS: u32 = 4;

/// Outcome of a commit request.
#[derive(Debug, PartialEq, Eq)]
pub enum CommitOutcome {
    Committed,
    /// 409: a requirement failed (someone else committed); reload and retry.
    Conflict(String),
    /// 503: by the REST spec the service did not take the request (a proxy that forwarded it anyway shows in a
    /// reload).
    Unavailable(String),
    /// 5xx other than 503 / transport error after the request was sent: the commit may or may not have happened,
    /// and may still happen later (a gateway timeout while the server works on).
    Unknown(String),
}

/// A connected REST catalog (cheap to share).
pub struct RestClient {
    http: reqwest::Client,
    base: String,
    prefix: Option<String>,
    headers: HeaderMap,
    auth: Option<Arc<TokenSource>>,
    vended: bool,
    /// Storage properties for FileIO: catalog config defaults < user properties < catalog overrides.
    storage_props: HashMap<String, String>,
    label: String,
    /// Per table URL: the `ETag` of its last full load and the metadata location that load returned, for
    /// conditional loads ([`RestClient::unchanged_location`]). Only tables whose server sends an ETag are here.
    etags: std::sync::Mutex<HashMap<String, (String, String)>>,
    /// The secret values of the catalog's properties (tokens, credentials, keys, secret headers): never shown in a
    /// message, whatever a server echoes back ([`crate::redact`]).
    secrets: Vec<String>,
}

#[derive(Deserialize)]
struct ConfigResponse {
    #[serde(default)]
    defaults: HashMap<String, String>,
    #[serde(default)]
    overrides: HashMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct LoadTableResponse {
    metadata_location: Option<String>,
    metadata: TableMetadata,
    #[serde(default)]
    config: HashMap<String, String>,
    #[serde(default)]
    storage_credentials: Vec<StorageCredential>,
}

#[derive(Deserialize)]
struct StorageCredential {
    prefix: String,
    config: HashMap<String, String>,
}

#[derive(Deserialize)]
struct ErrorResponse {
    error: ErrorModel,
}

#[derive(Deserialize)]
struct ErrorModel {
    message: String,
    #[serde(default, rename = "type")]
    kind: String,
}

pub(crate) fn server_message(body: &str) -> String {
    match serde_json::from_str::<ErrorResponse>(body) {
        Ok(e) if e.error.kind.is_empty() => e.error.message,
        Ok(e) => format!("{}: {}", e.error.kind, e.error.message),
        Err(_) => body.chars().take(500).collect(),
    }
}

/// Parses a LoadTableResult body as a load does (for the parsers' property tests).
/// Keys of the `biglake` catalog shorthand.
pub(crate) mod biglake {
    /// The Google Cloud project (BigLake).
    pub const PROJECT: &str = "project";
    /// The Google Cloud location (BigLake).
    pub const LOCATION: &str = "location";
    /// The global endpoint (`location = "global"`, the default).
    pub const GLOBAL_URI: &str = "https://biglake.googleapis.com/iceberg/v1/restcatalog";
    /// Header that bills requests to (and checks quota of) the project.
    pub const USER_PROJECT_HEADER: &str = "header.x-goog-user-project";

    /// The REST endpoint of a BigLake location (`global`, or a region such as `us-central1`).
    pub fn uri(location: &str) -> String {
        if location == "global" {
            GLOBAL_URI.to_string()
        } else {
            format!("https://biglake.{location}.rep.googleapis.com/iceberg/v1/restcatalog")
        }
    }
}

/// The problems of a `rest` catalog section (named `field`).
pub(crate) fn validate(cfg: &CatalogConfig, field: &str, p: &mut Vec<String>) {
    match cfg.props.get("uri") {
        None => p.push(format!("{field}.uri: required for a rest catalog")),
        Some(u) if !(u.starts_with("http://") || u.starts_with("https://")) => {
            p.push(format!("{field}.uri: `{u}` must start with http:// or https://"))
        }
        _ => {}
    }
    validate_keys(cfg, field, &[], p);
}

/// The problems of a `biglake` catalog section (named `field`).
pub(crate) fn validate_biglake(cfg: &CatalogConfig, field: &str, p: &mut Vec<String>) {
    match cfg.props.get(biglake::PROJECT) {
        Some(v) if !v.trim().is_empty() => {}
        _ => p.push(format!("{field}.project: required for a biglake catalog (the Google Cloud project id)")),
    }
    match cfg.warehouse.as_deref() {
        Some(w) if w.starts_with("gs://") || w.starts_with("bl://projects/") => {}
        Some(w) => p.push(format!("{field}.warehouse: `{w}` — BigLake takes `gs://BUCKET` or `bl://projects/PROJECT/catalogs/CATALOG`")),
        None => p.push(format!("{field}.warehouse: required for a biglake catalog (`gs://BUCKET` or `bl://projects/P/catalogs/C`)")),
    }
    if let Some(l) = cfg.props.get(biglake::LOCATION) {
        if l.is_empty() || !l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
            p.push(format!("{field}.location: `{l}` — `global` or a region such as `us-central1`"));
        }
    }
    validate_keys(cfg, field, &[biglake::PROJECT, biglake::LOCATION], p);
}

/// Unknown keys of a `rest` or `biglake` section (`extra`: the keys the kind adds).
fn validate_keys(cfg: &CatalogConfig, field: &str, extra: &[&str], p: &mut Vec<String>) {
    for k in cfg.props.keys() {
        let known = keys::ALL.contains(&k.as_str())
            || extra.contains(&k.as_str())
            || k.starts_with(keys::HEADER_PREFIX)
            || crate::storage::props::PREFIXES.iter().any(|pre| k.starts_with(pre));
        if !known {
            p.push(format!(
                "{field}.{k}: unknown key (catalog keys: {}; `header.NAME` for HTTP headers; `gcs.*`, `s3.*` for storage)",
                keys::ALL.join(", ")
            ));
        }
    }
}

/// The properties of the REST client: as given for `rest`; for `biglake` the endpoint of its location, Google
/// credentials, the `x-goog-user-project` header and vended storage credentials (each overridable).
pub(crate) fn client_props(cfg: &CatalogConfig) -> std::collections::HashMap<String, String> {
    let mut props: std::collections::HashMap<String, String> = cfg.props.clone().into_iter().collect();
    if let Some(w) = &cfg.warehouse {
        props.insert(keys::WAREHOUSE.into(), w.clone());
    }
    if cfg.kind == CatalogType::Biglake {
        let location = props.remove(biglake::LOCATION).unwrap_or_else(|| "global".into());
        let project = props.remove(biglake::PROJECT).unwrap_or_default();
        props.entry(keys::URI.into()).or_insert_with(|| biglake::uri(&location));
        props.entry(keys::AUTH.into()).or_insert_with(|| "google".into());
        props.entry(keys::VENDED_CREDENTIALS.into()).or_insert_with(|| "true".into());
        props.entry(biglake::USER_PROJECT_HEADER.into()).or_insert(project);
    }
    props
}

/// A client of the REST catalog `cfg` names (a `biglake` section becomes its REST settings).
pub(crate) async fn connect(cfg: &CatalogConfig, label: &str) -> Result<Box<dyn Backend>> {
    Ok(Box::new(RestBackend(RestClient::connect(&client_props(cfg), label).await?)))
}

/// A connected REST catalog as a [`Backend`].
struct RestBackend(Arc<RestClient>);

#[async_trait::async_trait]
impl Backend for RestBackend {
    async fn storage(&self, table: &Table) -> Result<CdcStorageFactory> {
        self.0.storage_factory(table.identifier()).await
    }
    async fn load_table(&self, ident: &TableIdent) -> Result<Table> {
        self.0.load_table(ident).await
    }
    /// A conditional load answered `304 Not Modified`, when the server sends ETags.
    async fn metadata_location(&self, ident: &TableIdent) -> Result<Option<String>> {
        self.0.unchanged_location(ident).await
    }
    /// The namespace is created when missing; the format version goes as the property servers take it from.
    async fn create_table(&self, ident: &TableIdent, creation: TableCreation) -> Result<Table> {
        let ns = ident.namespace().clone();
        // Servers take the format version from this property.
        let mut creation = creation;
        let v = match creation.format_version {
            iceberg::spec::FormatVersion::V1 => "1",
            iceberg::spec::FormatVersion::V2 => "2",
            iceberg::spec::FormatVersion::V3 => "3",
        };
        creation.properties.insert("format-version".into(), v.into());
        if !self.0.namespace_exists(&ns).await? {
            self.0.create_namespace(&ns).await?;
        }
        self.0.create_table(&ns, creation).await
    }
    async fn swap(&self, table: &Table, requirements: Vec<TableRequirement>, updates: Vec<TableUpdate>) -> Result<Swapped> {
        let ident = table.identifier();
        Ok(match self.0.commit(ident, &requirements, &updates).await? {
            CommitOutcome::Committed => Swapped::Done(self.0.load_table(ident).await?),
            CommitOutcome::Conflict(m) => return Err(Error::Conflict { table: ident.to_string(), message: m }),
            CommitOutcome::Unknown(m) => Swapped::Unsure(Error::CommitUnknown { catalog: "rest".into(), message: m }),
            CommitOutcome::Unavailable(m) => Swapped::Unsure(Error::catalog("rest", m, true)),
        })
    }
    async fn list_tables(&self) -> Result<(Vec<TableIdent>, usize)> {
        self.0.list_tables().await
    }
    async fn rename_table(&self, from: &TableIdent, to: &TableIdent) -> Result<()> {
        if !self.0.namespace_exists(to.namespace()).await? {
            self.0.create_namespace(to.namespace()).await?;
        }
        self.0.rename_table(from, to).await
    }
    async fn drop_table(&self, ident: &TableIdent) -> Result<()> {
        self.0.drop_table(ident).await
    }
    fn is_server(&self) -> bool {
        true
    }
}

#[cfg(test)]
pub(crate) fn parse_load_response(body: &[u8]) -> bool {
    serde_json::from_slice::<LoadTableResponse>(body).is_ok()
}

impl RestClient {
    /// Connects: builds the token source, asks the server for its config (prefix, defaults), and checks the token.
    pub async fn connect(props: &HashMap<String, String>, label: &str) -> Result<Arc<Self>> {
        let base = props.get(keys::URI).cloned().unwrap_or_default().trim_end_matches('/').to_string();
        let err = |m: String, retry: bool| Error::catalog(label, m, retry);
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| err(e.to_string(), false))?;
        let mut headers = HeaderMap::new();
        for (k, v) in props {
            if let Some(name) = k.strip_prefix(keys::HEADER_PREFIX) {
                let n = HeaderName::from_bytes(name.as_bytes()).map_err(|e| Error::Config(vec![format!("header `{name}`: {e}")]))?;
                let v = HeaderValue::from_str(v).map_err(|e| Error::Config(vec![format!("header `{name}` value: {e}")]))?;
                headers.insert(n, v);
            }
        }
        let auth = match (props.get(keys::AUTH).map(String::as_str), props.get(keys::TOKEN), props.get(keys::CREDENTIAL)) {
            (Some("google"), _, _) => Some(TokenSource::google(props.get(keys::GOOGLE_CREDENTIALS_FILE).cloned())),
            (_, Some(t), _) => Some(TokenSource::fixed(t.clone())),
            (_, None, Some(cred)) => {
                let url = props.get(keys::OAUTH2_SERVER_URI).cloned().unwrap_or_else(|| format!("{base}/v1/oauth/tokens"));
                let scope = props.get(keys::SCOPE).cloned().unwrap_or_else(|| "catalog".into());
                Some(TokenSource::client_credentials(http.clone(), url, cred, scope))
            }
            _ => None,
        };
        let vended = truthy(props.get(keys::VENDED_CREDENTIALS));
        let mut client = RestClient {
            http,
            base,
            prefix: None,
            headers,
            auth,
            vended,
            storage_props: HashMap::new(),
            label: label.to_string(),
            etags: Default::default(),
            secrets: props
                .iter()
                .filter(|(k, _)| crate::redact::is_secret_key(k))
                .flat_map(|(_, v)| {
                    std::iter::once(v.clone()).chain(v.split_once(':').map(|(id, secret)| [id.to_string(), secret.to_string()]).into_iter().flatten())
                })
                .collect(),
        };

        let mut url = format!("{}/v1/config", client.base);
        if let Some(w) = props.get(keys::WAREHOUSE) {
            url = format!("{url}?warehouse={}", urlencode(w));
        }
        let resp = client.read(Method::GET, &url).await?;
        if !resp.status().is_success() {
            return Err(client.status_error(&url, resp).await);
        }
        let cfg: ConfigResponse = resp.json().await.map_err(|e| err(format!("{url}: {e}"), false))?;
        let mut merged = cfg.defaults;
        merged.extend(props.iter().map(|(k, v)| (k.clone(), v.clone())));
        merged.extend(cfg.overrides);
        client.prefix = merged.get(keys::PREFIX).cloned();
        client.storage_props = merged.into_iter().filter(|(k, _)| sp::PREFIXES.iter().any(|p| k.starts_with(p))).collect();
        Ok(Arc::new(client))
    }

    fn url(&self, path: &str) -> String {
        match &self.prefix {
            Some(p) => format!("{}/v1/{}/{path}", self.base, p),
            None => format!("{}/v1/{path}", self.base),
        }
    }

    fn ns_path(ns: &NamespaceIdent) -> String {
        ns.iter().map(|p| urlencode(p)).collect::<Vec<_>>().join("%1F")
    }

    fn table_url(&self, ident: &TableIdent) -> String {
        self.url(&format!("namespaces/{}/tables/{}", Self::ns_path(ident.namespace()), urlencode(ident.name())))
    }

    async fn token(&self) -> Result<Option<Token>> {
        match &self.auth {
            Some(a) => Ok(Some(a.token().await?)),
            None => Ok(None),
        }
    }

    /// Sends one request with headers and token (and `If-None-Match` when given); a 401 renews the token and is sent
    /// once more.
    async fn send(
        &self,
        method: Method,
        url: &str,
        body: Option<&serde_json::Value>,
        if_none_match: Option<&str>,
    ) -> std::result::Result<reqwest::Response, reqwest::Error> {
        let mut renewed = false;
        loop {
            let token = self.token().await.ok().flatten();
            let mut req = self.http.request(method.clone(), url).headers(self.headers.clone());
            if self.vended {
                req = req.header(ACCESS_DELEGATION, "vended-credentials");
            }
            if let Some(t) = &token {
                req = req.header(AUTHORIZATION, format!("Bearer {}", t.secret));
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            if let Some(tag) = if_none_match {
                req = req.header(reqwest::header::IF_NONE_MATCH, tag);
            }
            let resp = req.send().await?;
            if resp.status() == StatusCode::UNAUTHORIZED && !renewed && self.auth.is_some() {
                tracing::info!(catalog = %self.label, "the catalog refused the token (HTTP 401); renewing it");
                if let Some(a) = &self.auth {
                    a.invalidate().await;
                }
                renewed = true;
                continue;
            }
            return Ok(resp);
        }
    }

    /// A read-only request, retried on transport errors, 429 and 5xx.
    async fn read(&self, method: Method, url: &str) -> Result<reqwest::Response> {
        self.read_if(method, url, None).await
    }

    /// [`Self::read`], conditional on the resource no longer having ETag `if_none_match` when given.
    async fn read_if(&self, method: Method, url: &str, if_none_match: Option<&str>) -> Result<reqwest::Response> {
        // the token source's own errors (e.g. no credentials) are not transport errors: surface them first
        self.token().await?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let r = self.send(method.clone(), url, None, if_none_match).await;
            let transient = match &r {
                Ok(resp) => resp.status().is_server_error() || resp.status() == StatusCode::TOO_MANY_REQUESTS,
                Err(_) => true,
            };
            if !transient || attempt >= READ_ATTEMPTS {
                return r.map_err(|e| Error::catalog(&self.label, format!("{url}: {e}"), true).with_cause(e));
            }
            let delay = crate::backoff::delay(Duration::from_millis(200), attempt);
            tracing::debug!(catalog = %self.label, url, attempt, "transient catalog error; retrying in {delay:?}");
            tokio::time::sleep(delay).await;
        }
    }

    /// A server's error text without any secret this client holds (its properties' and the current token).
    async fn server_text(&self, resp: reqwest::Response) -> String {
        let token = self.token().await.ok().flatten().map(|t| t.secret.clone());
        let secrets = || self.secrets.iter().map(String::as_str).chain(token.as_deref());
        // redacted before a long body is shortened (no prefix of a secret left) and after it is decoded (escapes)
        let body = crate::redact::redact(&resp.text().await.unwrap_or_default(), secrets());
        crate::redact::redact(&server_message(&body), secrets())
    }

    async fn status_error(&self, url: &str, resp: reqwest::Response) -> Error {
        let status = resp.status();
        let text = self.server_text(resp).await;
        match status.as_u16() {
            401 | 403 => Error::Auth {
                source_name: format!("{} catalog", self.label),
                message: format!("{url}: HTTP {status}: {text}; check the credentials and that they may use this catalog (IAM roles)"),
                retryable: false,
                cause: None,
            },
            429 | 500..=599 => Error::catalog(&self.label, format!("{url}: HTTP {status}: {text}"), true),
            _ => Error::catalog(&self.label, format!("{url}: HTTP {status}: {text}"), false),
        }
    }

    /// The credentials the storage of table `ident` at `location` needs, from its load response: vended ones
    /// (renewed by loading the table again), else the catalog's Google token for `gs://`.
    fn credentials(self: &Arc<Self>, ident: &TableIdent, location: &str, resp: &LoadTableResponse) -> Option<Arc<dyn StorageCredentials>> {
        let vended = vended_props(location, resp);
        if !vended.is_empty() {
            return Some(Arc::new(VendedCredentials::new(self.clone(), ident.clone(), vended)));
        }
        match &self.auth {
            Some(a) if a.is_google() && location.starts_with("gs://") => Some(Arc::new(GoogleStorageToken(a.clone()))),
            _ => None,
        }
    }

    /// A storage factory with the credentials of table `ident` (for listing its files).
    pub(crate) async fn storage_factory(self: &Arc<Self>, ident: &TableIdent) -> Result<CdcStorageFactory> {
        let (resp, _) = self.load_response(ident).await?;
        let location = resp.metadata.location().to_string();
        Ok(CdcStorageFactory::with_credentials(self.credentials(ident, &location, &resp)))
    }

    /// Loads a table, with a FileIO for its location (vended or configured credentials).
    pub async fn load_table(self: &Arc<Self>, ident: &TableIdent) -> Result<Table> {
        let (resp, url) = self.load_response(ident).await?;
        let location = resp.metadata.location().to_string();
        let meta_loc = resp.metadata_location.clone();
        let credentials = self.credentials(ident, &location, &resp);
        let mut props = self.storage_props.clone();
        props.extend(resp.config.iter().filter(|(k, _)| sp::PREFIXES.iter().any(|p| k.starts_with(p))).map(|(k, v)| (k.clone(), v.clone())));
        let io: FileIO = storage::file_io(CdcStorageFactory::with_credentials(credentials), &props);
        let runtime = iceberg::Runtime::try_current().map_err(|e| Error::failed("no async runtime", e))?;
        let mut b = Table::builder().metadata(resp.metadata).identifier(ident.clone()).file_io(io).runtime(runtime);
        if let Some(l) = meta_loc {
            b = b.metadata_location(l);
        }
        b.build().map_err(|e| Error::catalog(&self.label, format!("{url}: {e}"), false).with_cause(e))
    }

    async fn load_response(&self, ident: &TableIdent) -> Result<(LoadTableResponse, String)> {
        let url = self.table_url(ident);
        let resp = self.read(Method::GET, &url).await?;
        if resp.status() == StatusCode::NOT_FOUND {
            return Err(Error::TableNotFound { catalog: self.label.clone(), table: ident.to_string() });
        }
        let parsed = self.parse_load(&url, resp).await?;
        Ok((parsed, url))
    }

    /// A successful load's body (remembering its ETag and metadata location), or the status as an error.
    async fn parse_load(&self, url: &str, resp: reqwest::Response) -> Result<LoadTableResponse> {
        if !resp.status().is_success() {
            return Err(self.status_error(url, resp).await);
        }
        let etag = resp.headers().get(reqwest::header::ETAG).and_then(|v| v.to_str().ok()).map(str::to_string);
        let text = resp.text().await.map_err(|e| Error::catalog(&self.label, format!("{url}: {e}"), true).with_cause(e))?;
        let parsed: LoadTableResponse = serde_json::from_str(&text)
            .map_err(|e| Error::catalog(&self.label, format!("{url}: unreadable LoadTableResult: {e}"), false).with_cause(e))?;
        let mut etags = self.etags.lock().unwrap_or_else(|p| p.into_inner());
        match (etag, &parsed.metadata_location) {
            (Some(tag), Some(loc)) => {
                etags.insert(url.to_string(), (tag, loc.clone()));
            }
            _ => {
                etags.remove(url);
            }
        }
        Ok(parsed)
    }

    /// The table's metadata location by a conditional load (`If-None-Match` with the ETag of the last load, as the
    /// REST spec allows): `304 Not Modified` costs a round trip and no body. `None` when this cannot be told cheaply —
    /// the server sent no ETag, the table was never loaded, or it is gone (the caller's full load then says why).
    pub async fn unchanged_location(&self, ident: &TableIdent) -> Result<Option<String>> {
        let url = self.table_url(ident);
        let Some((tag, location)) = self.etags.lock().unwrap_or_else(|p| p.into_inner()).get(&url).cloned() else {
            return Ok(None);
        };
        let resp = self.read_if(Method::GET, &url, Some(&tag)).await?;
        match resp.status() {
            StatusCode::NOT_MODIFIED => Ok(Some(location)),
            StatusCode::NOT_FOUND => {
                self.etags.lock().unwrap_or_else(|p| p.into_inner()).remove(&url);
                Ok(None)
            }
            _ => Ok(self.parse_load(&url, resp).await?.metadata_location),
        }
    }

    /// Whether the namespace exists.
    pub async fn namespace_exists(&self, ns: &NamespaceIdent) -> Result<bool> {
        let url = self.url(&format!("namespaces/{}", Self::ns_path(ns)));
        let resp = self.read(Method::HEAD, &url).await?;
        match resp.status() {
            s if s.is_success() => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            _ => Err(self.status_error(&url, resp).await),
        }
    }

    /// Every table of the catalog: namespaces listed level by level (`parent`), each list followed through its
    /// `next-page-token`s. Returns the tables and how many list calls it took.
    pub async fn list_tables(&self) -> Result<(Vec<TableIdent>, usize)> {
        #[derive(Deserialize)]
        struct Namespaces {
            #[serde(default)]
            namespaces: Vec<Vec<String>>,
            #[serde(rename = "next-page-token")]
            next: Option<String>,
        }
        #[derive(Deserialize)]
        struct Identifier {
            namespace: Vec<String>,
            name: String,
        }
        #[derive(Deserialize)]
        struct Tables {
            #[serde(default)]
            identifiers: Vec<Identifier>,
            #[serde(rename = "next-page-token")]
            next: Option<String>,
        }
        let mut calls = 0;
        let (mut tables, mut pending) = (Vec::new(), vec![None::<NamespaceIdent>]);
        while let Some(parent) = pending.pop() {
            let base = match &parent {
                Some(ns) => format!("{}?parent={}", self.url("namespaces"), Self::ns_path(ns)),
                None => self.url("namespaces"),
            };
            let mut token = None;
            loop {
                let page: Namespaces = self.get_page(&base, token.as_deref(), &mut calls).await?;
                for ns in page.namespaces {
                    let ns = NamespaceIdent::from_vec(ns)
                        .map_err(|e| Error::catalog(&self.label, format!("{base}: a namespace without a name: {e}"), false))?;
                    let list = self.url(&format!("namespaces/{}/tables", Self::ns_path(&ns)));
                    let mut t_token = None;
                    loop {
                        let page: Tables = self.get_page(&list, t_token.as_deref(), &mut calls).await?;
                        for id in page.identifiers {
                            tables.push(TableIdent::from_strs(id.namespace.iter().map(String::as_str).chain([id.name.as_str()]))?);
                        }
                        match page.next.filter(|t| !t.is_empty()) {
                            Some(t) => t_token = Some(t),
                            None => break,
                        }
                    }
                    pending.push(Some(ns));
                }
                match page.next.filter(|t| !t.is_empty()) {
                    Some(t) => token = Some(t),
                    None => break,
                }
            }
        }
        Ok((tables, calls))
    }

    /// One page of a list call (`pageToken` when continuing); counts the call.
    async fn get_page<T: serde::de::DeserializeOwned>(&self, base: &str, token: Option<&str>, calls: &mut usize) -> Result<T> {
        let url = match token {
            Some(t) => format!("{base}{}pageToken={}", if base.contains('?') { '&' } else { '?' }, urlencode(t)),
            None => base.to_string(),
        };
        *calls += 1;
        let resp = self.read(Method::GET, &url).await?;
        if !resp.status().is_success() {
            return Err(self.status_error(&url, resp).await);
        }
        let body = resp.bytes().await.map_err(|e| Error::catalog(&self.label, format!("{url}: {e}"), true).with_cause(e))?;
        serde_json::from_slice(&body).map_err(|e| Error::catalog(&self.label, format!("{url}: unexpected answer: {e}"), false).with_cause(e))
    }

    /// Creates the namespace; one that exists already (another writer was first) is fine.
    pub async fn create_namespace(&self, ns: &NamespaceIdent) -> Result<()> {
        let url = self.url("namespaces");
        let body = serde_json::json!({"namespace": ns.iter().collect::<Vec<_>>(), "properties": {}});
        let resp = self
            .send(Method::POST, &url, Some(&body), None)
            .await
            .map_err(|e| Error::catalog(&self.label, format!("{url}: {e}"), true).with_cause(e))?;
        match resp.status() {
            s if s.is_success() => Ok(()),
            StatusCode::CONFLICT => Ok(()),
            _ => {
                let error = self.status_error(&url, resp).await;
                // two appliers creating it at once: the Iceberg REST fixture's JDBC catalog answers the loser with
                // a 500 (a failed INSERT), not a 409 — what counts is whether the namespace is there now
                match self.namespace_exists(ns).await {
                    Ok(true) => Ok(()),
                    _ => Err(error),
                }
            }
        }
    }

    /// Creates a table (the namespace must exist) and returns it loaded.
    pub async fn create_table(self: &Arc<Self>, ns: &NamespaceIdent, creation: TableCreation) -> Result<Table> {
        let url = self.url(&format!("namespaces/{}/tables", Self::ns_path(ns)));
        let mut body = serde_json::json!({
            "name": creation.name,
            "schema": creation.schema,
            "properties": creation.properties,
        });
        if let Some(l) = &creation.location {
            body["location"] = serde_json::json!(l);
        }
        if let Some(p) = &creation.partition_spec {
            body["partition-spec"] = serde_json::to_value(p).map_err(|e| Error::failed("encoding the partition spec", e))?;
        }
        if let Some(o) = &creation.sort_order {
            body["write-order"] = serde_json::to_value(o).map_err(|e| Error::failed("encoding the sort order", e))?;
        }
        let resp = self
            .send(Method::POST, &url, Some(&body), None)
            .await
            .map_err(|e| Error::catalog(&self.label, format!("{url}: {e}"), true).with_cause(e))?;
        if !resp.status().is_success() {
            return Err(self.status_error(&url, resp).await);
        }
        // The response carries the metadata, but loading also sets up the storage credentials the same way.
        self.load_table(&TableIdent::new(ns.clone(), creation.name)).await
    }

    /// Renames table `from` to `to` (`POST .../tables/rename`; `to`'s namespace must exist).
    pub async fn rename_table(&self, from: &TableIdent, to: &TableIdent) -> Result<()> {
        let ident = |t: &TableIdent| serde_json::json!({"namespace": t.namespace().iter().collect::<Vec<_>>(), "name": t.name()});
        let body = serde_json::json!({"source": ident(from), "destination": ident(to)});
        self.write(Method::POST, &self.url("tables/rename"), Some(&body), from).await
    }

    /// Drops table `ident` from the catalog, its files kept (`DELETE .../tables/{t}`, no `purgeRequested`).
    pub async fn drop_table(&self, ident: &TableIdent) -> Result<()> {
        self.write(Method::DELETE, &self.table_url(ident), None, ident).await
    }

    /// A change of the catalog that is no commit (rename, drop): one request; `404` is [`Error::TableNotFound`].
    async fn write(&self, method: Method, url: &str, body: Option<&serde_json::Value>, ident: &TableIdent) -> Result<()> {
        self.token().await?;
        let resp =
            self.send(method, url, body, None).await.map_err(|e| Error::catalog(&self.label, format!("{url}: {e}"), e.is_connect()).with_cause(e))?;
        match resp.status() {
            s if s.is_success() => Ok(()),
            StatusCode::NOT_FOUND => Err(Error::TableNotFound { catalog: self.label.clone(), table: ident.to_string() }),
            _ => Err(self.status_error(url, resp).await),
        }
    }

    /// Commits `updates` under `requirements` (`POST .../tables/{t}` with a `CommitTableRequest`).
    pub async fn commit(&self, ident: &TableIdent, requirements: &[TableRequirement], updates: &[TableUpdate]) -> Result<CommitOutcome> {
        let body = serde_json::json!({
            "identifier": {"namespace": ident.namespace().iter().collect::<Vec<_>>(), "name": ident.name()},
            "requirements": requirements,
            "updates": updates,
        });
        let url = self.table_url(ident);
        self.token().await?;
        let resp = match self.send(Method::POST, &url, Some(&body), None).await {
            Ok(r) => r,
            // connect errors happen before the request reaches the server: nothing was committed
            Err(e) if e.is_connect() => return Err(Error::catalog(&self.label, format!("{url}: {e}"), true)),
            Err(e) => return Ok(CommitOutcome::Unknown(e.to_string())),
        };
        let status = resp.status();
        match status.as_u16() {
            200..=299 => Ok(CommitOutcome::Committed),
            409 => Ok(CommitOutcome::Conflict(self.server_text(resp).await)),
            500..=599 => {
                let m = format!("HTTP {status}: {}", self.server_text(resp).await);
                // the spec's 503: the service did not take the request; any other 5xx leaves its state unknown
                Ok(if status.as_u16() == 503 { CommitOutcome::Unavailable(m) } else { CommitOutcome::Unknown(m) })
            }
            404 => Err(Error::TableNotFound { catalog: self.label.clone(), table: ident.to_string() }),
            _ => Err(self.status_error(&url, resp).await),
        }
    }
}

/// The storage properties a load response vends for `location`: the `storage-credentials` entry with the longest
/// matching prefix, else the storage keys of `config` that carry credentials.
fn vended_props(location: &str, resp: &LoadTableResponse) -> HashMap<String, String> {
    if let Some(c) = resp.storage_credentials.iter().filter(|c| location.starts_with(&c.prefix)).max_by_key(|c| c.prefix.len()) {
        return c.config.clone();
    }
    const CREDENTIAL_KEYS: &[&str] = &[sp::GCS_TOKEN, sp::S3_ACCESS_KEY_ID, sp::S3_SESSION_TOKEN];
    if CREDENTIAL_KEYS.iter().any(|k| resp.config.contains_key(*k)) {
        return resp.config.iter().filter(|(k, _)| sp::PREFIXES.iter().any(|p| k.starts_with(p))).map(|(k, v)| (k.clone(), v.clone())).collect();
    }
    HashMap::new()
}

/// When vended credentials stop working: `gcs.oauth2.token-expires-at` / `s3.session-token-expires-at-ms` (epoch ms).
fn vended_expiry(props: &HashMap<String, String>) -> Option<SystemTime> {
    [sp::GCS_TOKEN_EXPIRES_AT, "s3.session-token-expires-at-ms"]
        .iter()
        .find_map(|k| props.get(*k))
        .and_then(|v| v.parse::<u64>().ok())
        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
}

struct Vended {
    props: HashMap<String, String>,
    token: Token,
    issued: SystemTime,
}

/// Storage credentials the catalog vended for one table, fetched again (by reloading the table) before they expire.
pub struct VendedCredentials {
    client: Arc<RestClient>,
    ident: TableIdent,
    state: tokio::sync::Mutex<Vended>,
}

impl std::fmt::Debug for VendedCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VendedCredentials").field("table", &self.ident.to_string()).finish_non_exhaustive()
    }
}

impl VendedCredentials {
    fn new(client: Arc<RestClient>, ident: TableIdent, props: HashMap<String, String>) -> Self {
        let token = Token { secret: String::new(), expires_at: vended_expiry(&props) };
        VendedCredentials { client, ident, state: tokio::sync::Mutex::new(Vended { props, token, issued: SystemTime::now() }) }
    }
}

#[async_trait::async_trait]
impl StorageCredentials for VendedCredentials {
    async fn current(&self) -> Result<HashMap<String, String>> {
        let mut st = self.state.lock().await;
        let now = SystemTime::now();
        if !st.token.fresh_at(now, st.issued) {
            let (resp, _) = self.client.load_response(&self.ident).await?;
            let props = vended_props(resp.metadata.location(), &resp);
            if props.is_empty() {
                return Err(Error::Auth {
                    source_name: format!("{} catalog", self.client.label),
                    message: format!("the catalog stopped vending storage credentials for {}", self.ident),
                    retryable: true,
                    cause: None,
                });
            }
            tracing::debug!(table = %self.ident, "vended storage credentials renewed");
            *st = Vended { token: Token { secret: String::new(), expires_at: vended_expiry(&props) }, props, issued: now };
        }
        Ok(st.props.clone())
    }

    async fn invalidate(&self) {
        // refused before its stated expiry: fetch new ones on the next call
        self.state.lock().await.token.expires_at = Some(SystemTime::UNIX_EPOCH);
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
    fn biglake_shorthand() {
        let cfg = crate::config::Config::parse(
            "[source]\ntable='db.t'\n[source.catalog]\ntype='biglake'\nproject='p1'\nlocation='us-central1'\nwarehouse='gs://bucket'\n",
        )
        .unwrap();
        let p = client_props(&cfg.source.catalog);
        assert_eq!(p["uri"], "https://biglake.us-central1.rep.googleapis.com/iceberg/v1/restcatalog");
        assert_eq!(p["header.x-goog-user-project"], "p1");
        assert_eq!((p["auth"].as_str(), p["vended-credentials"].as_str(), p["warehouse"].as_str()), ("google", "true", "gs://bucket"));
        assert!(!p.contains_key("project") && !p.contains_key("location"));
        // the endpoint can be pointed elsewhere (a proxy, a test server), vending turned off
        let cfg = crate::config::Config::parse(
            "[source]\ntable='db.t'\n[source.catalog]\ntype='biglake'\nproject='p1'\nwarehouse='bl://projects/p1/catalogs/c'\nuri='http://127.0.0.1:1'\nvended-credentials='false'\n",
        )
        .unwrap();
        let p = client_props(&cfg.source.catalog);
        assert_eq!((p["uri"].as_str(), p["vended-credentials"].as_str()), ("http://127.0.0.1:1", "false"));
        assert_eq!(biglake::uri("global"), biglake::GLOBAL_URI);
    }

    use super::*;

    #[test]
    fn encodes_names() {
        assert_eq!(urlencode("a b/c"), "a%20b%2Fc");
    }

    fn response(config: &[(&str, &str)], creds: &[(&str, &[(&str, &str)])]) -> LoadTableResponse {
        let meta = serde_json::json!({
            "format-version": 2, "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1", "location": "gs://b/wh/t",
            "last-sequence-number": 0, "last-updated-ms": 1, "last-column-id": 1, "current-schema-id": 0,
            "schemas": [{"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "required": true, "type": "long"}]}],
            "default-spec-id": 0, "partition-specs": [{"spec-id": 0, "fields": []}], "last-partition-id": 999,
            "default-sort-order-id": 0, "sort-orders": [{"order-id": 0, "fields": []}]
        });
        LoadTableResponse {
            metadata_location: None,
            metadata: serde_json::from_value(meta).unwrap(),
            config: config.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            storage_credentials: creds
                .iter()
                .map(|(p, c)| StorageCredential { prefix: p.to_string(), config: c.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() })
                .collect(),
        }
    }

    /// A REST server on a socket that answers `/v1/config` and one table, with ETag `"v1"` on the table and `304`
    /// to `If-None-Match: "v1"`; records every table request's conditional header.
    fn etag_server(seen: Arc<std::sync::Mutex<Vec<Option<String>>>>, etag: bool) -> String {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let meta = serde_json::to_value(&response(&[], &[]).metadata).unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let (seen, meta) = (seen.clone(), meta.clone());
                std::thread::spawn(move || {
                    let mut r = BufReader::new(conn.try_clone().unwrap());
                    let mut w = conn;
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                        let mut inm = None;
                        loop {
                            let mut h = String::new();
                            r.read_line(&mut h).unwrap();
                            if h.trim().is_empty() {
                                break;
                            }
                            if let Some((k, v)) = h.split_once(':') {
                                if k.eq_ignore_ascii_case("if-none-match") {
                                    inm = Some(v.trim().to_string());
                                }
                            }
                        }
                        let (status, body, tag) = if path.starts_with("/v1/config") {
                            ("200 OK", r#"{"defaults":{},"overrides":{}}"#.to_string(), "")
                        } else {
                            seen.lock().unwrap().push(inm.clone());
                            if etag && inm.as_deref() == Some("\"v1\"") {
                                ("304 Not Modified", String::new(), "ETag: \"v1\"\r\n")
                            } else {
                                let body = serde_json::json!({"metadata-location": "file:/wh/t/metadata/00001-x.metadata.json", "metadata": meta});
                                ("200 OK", body.to_string(), if etag { "ETag: \"v1\"\r\n" } else { "" })
                            }
                        };
                        let _ = write!(w, "HTTP/1.1 {status}\r\n{tag}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                    }
                });
            }
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn idle_polls_are_conditional_loads_when_the_server_sends_etags() {
        for etag in [true, false] {
            let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            let uri = etag_server(seen.clone(), etag);
            let c = RestClient::connect(&HashMap::from([(keys::URI.to_string(), uri)]), "rest").await.unwrap();
            let ident = TableIdent::from_strs(["n", "t"]).unwrap();
            assert_eq!(c.unchanged_location(&ident).await.unwrap(), None, "never loaded: nothing to compare with");
            c.load_table(&ident).await.unwrap();
            let got = c.unchanged_location(&ident).await.unwrap();
            let seen = seen.lock().unwrap().clone();
            if etag {
                assert_eq!(got.as_deref(), Some("file:/wh/t/metadata/00001-x.metadata.json"));
                assert_eq!(seen, vec![None, Some("\"v1\"".to_string())], "one full load, then one conditional");
            } else {
                assert_eq!(got, None, "no ETag: the poll loads the table instead");
                assert_eq!(seen, vec![None], "no conditional request without an ETag");
            }
        }
    }

    #[test]
    fn vended_credentials_prefer_the_longest_matching_prefix() {
        let r = response(
            &[("gcs.oauth2.token", "from-config")],
            &[("gs://b/", &[("gcs.oauth2.token", "short")]), ("gs://b/wh", &[("gcs.oauth2.token", "long")])],
        );
        assert_eq!(vended_props("gs://b/wh/t", &r)["gcs.oauth2.token"], "long");
        let r = response(&[("gcs.oauth2.token", "from-config"), ("gcs.oauth2.token-expires-at", "1700000000000")], &[]);
        let p = vended_props("gs://b/wh/t", &r);
        assert_eq!(p["gcs.oauth2.token"], "from-config");
        assert_eq!(vended_expiry(&p), Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)));
        assert!(vended_props("gs://b/wh/t", &response(&[("gcs.service.path", "http://x")], &[])).is_empty());
    }

    #[test]
    fn server_errors_are_summarised() {
        assert_eq!(server_message(r#"{"error":{"message":"no","type":"NotAuthorized","code":403}}"#), "NotAuthorized: no");
        assert_eq!(server_message("plain"), "plain");
    }
}

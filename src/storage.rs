//! Table file I/O on local disk, Google Cloud Storage (`gs://`) and S3 (`s3://`), behind iceberg-rust's `FileIO`.
//!
//! [`CdcStorageFactory`] plugs into `FileIOBuilder`; the [`CdcStorage`] it builds picks the backend by each path's
//! scheme: `file:`/plain paths go to iceberg-rust's local storage, `gs://`, `gcs://`, `s3://`, `s3a://` to an OpenDAL
//! operator (one per bucket, cached). We drive OpenDAL ourselves rather than through `iceberg-storage-opendal`
//! because a long-running service needs what that crate cannot give:
//! - **credentials that change**: storage properties are the table's static ones overlaid with the current
//!   [`StorageCredentials`] (a Google token renewed before expiry, or credentials vended by the catalog and re-fetched
//!   before they expire); an operator is rebuilt when the overlay changes, never used with an expired token;
//! - **one operator per bucket**, not one per call (each OpenDAL operator would otherwise sign anew);
//! - **bounded uploads**: writes go out in [`UPLOAD_CHUNK`] parts (multipart on S3/GCS) instead of one buffer per
//!   file; files smaller than a chunk are a single request;
//! - `gcs.no-auth` honoured by value (`false` keeps authentication on).
//!
//! Transient errors (429, 5xx, resets, timeouts) are retried by OpenDAL's retry layer with jittered exponential
//! backoff; every attempt has a timeout so a stalled connection cannot hang a commit.
use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use iceberg::io::{
    FileIO, FileIOBuilder, FileMetadata, FileRead, FileWrite, InputFile, LocalFsStorage, OutputFile, Storage, StorageConfig, StorageFactory,
};
use iceberg::{Error as IcebergError, ErrorKind};
use opendal::layers::{RetryLayer, TimeoutLayer};
use opendal::Operator;
use serde::{Deserialize, Serialize};

use crate::auth::TokenSource;
use crate::error::Result;

/// Size of one upload part: the most a writer buffers per open file.
pub const UPLOAD_CHUNK: usize = 16 * 1024 * 1024;
/// S3's (and GCS's XML API's) smallest part but the last.
pub const MIN_UPLOAD_CHUNK: usize = 5 * 1024 * 1024;

/// Storage property keys we read (the names Iceberg's Java FileIOs use).
#[cfg_attr(not(all(feature = "gcs", feature = "s3")), allow(dead_code))]
pub mod props {
    pub const GCS_ENDPOINT: &str = "gcs.service.path";
    /// Java's name of the same setting.
    pub const GCS_SERVICE_HOST: &str = "gcs.service.host";
    pub const GCS_TOKEN: &str = "gcs.oauth2.token";
    pub const GCS_TOKEN_EXPIRES_AT: &str = "gcs.oauth2.token-expires-at";
    pub const GCS_NO_AUTH: &str = "gcs.no-auth";
    pub const GCS_CREDENTIALS_JSON: &str = "gcs.credentials-json";
    pub const S3_ENDPOINT: &str = "s3.endpoint";
    pub const S3_REGION: &str = "s3.region";
    pub const CLIENT_REGION: &str = "client.region";
    pub const S3_ACCESS_KEY_ID: &str = "s3.access-key-id";
    pub const S3_SECRET_ACCESS_KEY: &str = "s3.secret-access-key";
    pub const S3_SESSION_TOKEN: &str = "s3.session-token";
    pub const S3_PATH_STYLE: &str = "s3.path-style-access";
    /// Bytes per upload part (default [`super::UPLOAD_CHUNK`]; at least 5 MiB, S3's smallest part).
    pub const UPLOAD_CHUNK_SIZE: &str = "io.upload-chunk-size";
    /// Prefixes of keys that configure storage (copied from catalog and table properties into FileIO).
    pub const PREFIXES: &[&str] = &["gcs.", "s3.", "client.", "io."];
}

/// Object-store traffic of this process (local files are not counted): what a run cost in requests and bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IoStats {
    /// GET requests (whole objects and ranges).
    pub read_requests: u64,
    pub read_bytes: u64,
    /// Objects written (each may be several upload parts).
    pub objects_written: u64,
    pub written_bytes: u64,
    /// Metadata requests: exists/stat/delete.
    pub other_requests: u64,
}

mod counters {
    use std::sync::atomic::AtomicU64;
    pub(super) static READ_REQUESTS: AtomicU64 = AtomicU64::new(0);
    pub(super) static READ_BYTES: AtomicU64 = AtomicU64::new(0);
    pub(super) static OBJECTS_WRITTEN: AtomicU64 = AtomicU64::new(0);
    pub(super) static WRITTEN_BYTES: AtomicU64 = AtomicU64::new(0);
    pub(super) static OTHER: AtomicU64 = AtomicU64::new(0);
}

fn count(c: &std::sync::atomic::AtomicU64, n: u64) {
    c.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
}

/// Object-store traffic since the process started.
pub fn io_stats() -> IoStats {
    use std::sync::atomic::Ordering::Relaxed;
    IoStats {
        read_requests: counters::READ_REQUESTS.load(Relaxed),
        read_bytes: counters::READ_BYTES.load(Relaxed),
        objects_written: counters::OBJECTS_WRITTEN.load(Relaxed),
        written_bytes: counters::WRITTEN_BYTES.load(Relaxed),
        other_requests: counters::OTHER.load(Relaxed),
    }
}

impl IoStats {
    /// Traffic between `earlier` and `self`.
    pub fn since(&self, earlier: &IoStats) -> IoStats {
        IoStats {
            read_requests: self.read_requests - earlier.read_requests,
            read_bytes: self.read_bytes - earlier.read_bytes,
            objects_written: self.objects_written - earlier.objects_written,
            written_bytes: self.written_bytes - earlier.written_bytes,
            other_requests: self.other_requests - earlier.other_requests,
        }
    }
}

/// Credentials laid over a table's static storage properties, renewed by their owner.
#[async_trait::async_trait]
pub trait StorageCredentials: fmt::Debug + Send + Sync {
    /// The properties to use now (e.g. `gcs.oauth2.token`); callers compare them to decide whether to rebuild.
    async fn current(&self) -> Result<HashMap<String, String>>;

    /// The storage refused what [`Self::current`] returned (HTTP 401): fetch anew next time.
    #[cfg_attr(not(feature = "gcs"), allow(dead_code))]
    async fn invalidate(&self) {}
}

/// A Google token source as storage credentials (`gcs.oauth2.token`).
#[derive(Debug)]
pub struct GoogleStorageToken(pub Arc<TokenSource>);

#[async_trait::async_trait]
impl StorageCredentials for GoogleStorageToken {
    async fn current(&self) -> Result<HashMap<String, String>> {
        let t = self.0.token().await?;
        Ok(HashMap::from([(props::GCS_TOKEN.to_string(), t.secret)]))
    }

    async fn invalidate(&self) {
        self.0.invalidate().await
    }
}

/// Sends OpenDAL's GCS requests with the bearer token of this moment (every attempt, retries included), and once more
/// with a renewed token after a 401. Operators therefore live as long as the FileIO while tokens come and go.
#[cfg(feature = "gcs")]
struct BearerFetch {
    inner: opendal::HttpTransporter,
    credentials: Arc<dyn StorageCredentials>,
}

#[cfg(feature = "gcs")]
impl BearerFetch {
    async fn authorize(&self, req: &mut http::Request<opendal::Buffer>) -> opendal::Result<()> {
        let props = self.credentials.current().await.map_err(|e| {
            let temporary = e.is_retryable();
            let err = opendal::Error::new(opendal::ErrorKind::PermissionDenied, format!("storage credentials: {e}"));
            if temporary {
                err.set_temporary()
            } else {
                err
            }
        })?;
        if let Some(t) = props.get(props::GCS_TOKEN) {
            let v = http::HeaderValue::from_str(&format!("Bearer {t}"))
                .map_err(|e| opendal::Error::new(opendal::ErrorKind::ConfigInvalid, "token is not a valid header value").set_source(e))?;
            req.headers_mut().insert(http::header::AUTHORIZATION, v);
        }
        Ok(())
    }
}

#[cfg(feature = "gcs")]
impl opendal::HttpTransport for BearerFetch {
    async fn fetch(&self, mut req: http::Request<opendal::Buffer>) -> opendal::Result<http::Response<opendal::HttpBody>> {
        // keep what is needed to send it again (the body is a cheap, shared buffer)
        let (method, uri, headers, body) = (req.method().clone(), req.uri().clone(), req.headers().clone(), req.body().clone());
        self.authorize(&mut req).await?;
        let resp = self.inner.fetch(req).await?;
        if resp.status() != http::StatusCode::UNAUTHORIZED {
            return Ok(resp);
        }
        tracing::info!(%uri, "storage refused the token (HTTP 401); renewing it");
        self.credentials.invalidate().await;
        let mut again = http::Request::new(body);
        *again.method_mut() = method;
        *again.uri_mut() = uri;
        *again.headers_mut() = headers;
        self.authorize(&mut again).await?;
        self.inner.fetch(again).await
    }
}

/// Builds [`CdcStorage`]; `credentials` (if any) are laid over the FileIO's properties.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct CdcStorageFactory {
    #[serde(skip)]
    credentials: Option<Arc<dyn StorageCredentials>>,
}

impl fmt::Debug for CdcStorageFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CdcStorageFactory").field("credentials", &self.credentials.is_some()).finish()
    }
}

impl CdcStorageFactory {
    /// A factory whose storages use `credentials` on top of their properties.
    pub fn with_credentials(credentials: Option<Arc<dyn StorageCredentials>>) -> Self {
        CdcStorageFactory { credentials }
    }
}

#[typetag::serde(name = "CdcStorageFactory")]
impl StorageFactory for CdcStorageFactory {
    fn build(&self, config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        Ok(Arc::new(CdcStorage {
            inner: Arc::new(Inner { props: config.props().clone(), credentials: self.credentials.clone(), ops: Mutex::default() }),
        }))
    }
}

/// A FileIO over `factory` with the storage properties among `props` (keys under [`props::PREFIXES`]).
pub fn file_io<'a>(factory: CdcStorageFactory, props: impl IntoIterator<Item = (&'a String, &'a String)>) -> FileIO {
    let storage_props = props.into_iter().filter(|(k, _)| props::PREFIXES.iter().any(|p| k.starts_with(p))).map(|(k, v)| (k.clone(), v.clone()));
    FileIOBuilder::new(Arc::new(factory)).with_props(storage_props).build()
}

/// Whether `location` is on an object store this build can reach.
pub fn is_object_store(location: &str) -> bool {
    Scheme::of(location).is_ok_and(|s| s != Scheme::Local)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Scheme {
    Local,
    Gcs,
    S3,
}

impl Scheme {
    fn of(path: &str) -> iceberg::Result<Scheme> {
        match path.split_once("://").map(|(s, _)| s) {
            None => Ok(Scheme::Local),
            Some("file") => Ok(Scheme::Local),
            Some("gs" | "gcs") => Ok(Scheme::Gcs),
            Some("s3" | "s3a" | "s3n") => Ok(Scheme::S3),
            Some(other) => Err(IcebergError::new(
                ErrorKind::FeatureUnsupported,
                format!("storage scheme `{other}://` of {path} is not supported (file, gs, s3)"),
            )),
        }
    }
}

/// An operator and the credential overlay it was built with (empty when tokens are added per request).
struct CachedOp {
    overlay: HashMap<String, String>,
    op: Operator,
}

struct Inner {
    props: HashMap<String, String>,
    credentials: Option<Arc<dyn StorageCredentials>>,
    /// (scheme, bucket) → its operator.
    ops: Mutex<HashMap<(Scheme, String), CachedOp>>,
}

/// Storage for one FileIO: local paths and object-store URLs (see the module docs).
#[derive(Clone)]
pub struct CdcStorage {
    inner: Arc<Inner>,
}

impl fmt::Debug for CdcStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // properties may hold secrets: only their names
        f.debug_struct("CdcStorage").field("props", &self.inner.props.keys().collect::<Vec<_>>()).finish()
    }
}

impl Serialize for CdcStorage {
    fn serialize<S: serde::Serializer>(&self, _: S) -> std::result::Result<S::Ok, S::Error> {
        // it holds live credentials and caches; FileIO is never sent across processes here
        Err(serde::ser::Error::custom("CdcStorage cannot be serialized"))
    }
}

impl<'de> Deserialize<'de> for CdcStorage {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> std::result::Result<Self, D::Error> {
        Err(serde::de::Error::custom("CdcStorage cannot be deserialized"))
    }
}

fn split_bucket(path: &str) -> iceberg::Result<(&str, &str)> {
    let rest = path.split_once("://").map(|(_, r)| r).unwrap_or(path);
    match rest.split_once('/') {
        Some((bucket, key)) if !bucket.is_empty() => Ok((bucket, key)),
        _ => Err(IcebergError::new(ErrorKind::DataInvalid, format!("{path}: expected scheme://bucket/key"))),
    }
}

/// Whether a property is set to a true value (`true`, `1`, `yes`, `on`; any case).
pub(crate) fn truthy(v: Option<&String>) -> bool {
    v.is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "on"))
}

fn from_opendal(path: &str, e: opendal::Error) -> IcebergError {
    let kind = match e.kind() {
        opendal::ErrorKind::NotFound => ErrorKind::DataInvalid,
        _ => ErrorKind::Unexpected,
    };
    let prefix = if e.kind() == opendal::ErrorKind::NotFound { "NotFound: " } else { "" };
    let retryable = e.is_temporary();
    IcebergError::new(kind, format!("{prefix}{path}: {e}")).with_retryable(retryable).with_source(e)
}

fn from_crate(e: crate::error::Error) -> IcebergError {
    let retryable = e.is_retryable();
    IcebergError::new(ErrorKind::Unexpected, format!("storage credentials: {e}")).with_retryable(retryable).with_source(e)
}

/// A file found by [`CdcStorage::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    /// Its full path or URL, spelled as the table's paths are (`scheme://bucket/key`, or a local path).
    pub(crate) path: String,
    /// When it was last written, in ms since the epoch (0 when the store does not say: never "old").
    pub(crate) modified_ms: i64,
}

impl CdcStorageFactory {
    /// A storage for `io`'s properties with this factory's credentials, for what FileIO cannot do (listing).
    pub(crate) fn storage_for(&self, io: &FileIO) -> CdcStorage {
        CdcStorage { inner: Arc::new(Inner { props: io.config().props().clone(), credentials: self.credentials.clone(), ops: Mutex::default() }) }
    }
}

impl CdcStorage {
    /// Every file under `prefix` (a directory path or URL), recursively.
    pub(crate) async fn list(&self, prefix: &str) -> iceberg::Result<Vec<Listed>> {
        let dir = if prefix.ends_with('/') { prefix.to_string() } else { format!("{prefix}/") };
        if Self::local(&dir) {
            let root = dir.strip_prefix("file://").or_else(|| dir.strip_prefix("file:")).unwrap_or(&dir).to_string();
            let scheme = if dir.starts_with("file:") { &dir[..dir.len() - root.len()] } else { "" };
            let mut out = Vec::new();
            let mut stack = vec![std::path::PathBuf::from(&root)];
            while let Some(d) = stack.pop() {
                let entries = match std::fs::read_dir(&d) {
                    Ok(e) => e,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(IcebergError::new(ErrorKind::Unexpected, format!("cannot list {}: {e}", d.display())).with_source(e)),
                };
                for e in entries.flatten() {
                    let Ok(meta) = e.metadata() else { continue };
                    if meta.is_dir() {
                        stack.push(e.path());
                    } else {
                        let modified_ms =
                            meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_millis() as i64);
                        out.push(Listed { path: format!("{scheme}{}", e.path().display()), modified_ms });
                    }
                }
            }
            return Ok(out);
        }
        let (op, key) = self.op(&dir).await?;
        let base = &dir[..dir.len() - key.len()];
        count(&counters::OTHER, 1);
        let entries = op.list_with(key).recursive(true).await.map_err(|e| from_opendal(&dir, e))?;
        Ok(entries
            .into_iter()
            .filter(|e| e.metadata().mode().is_file())
            .map(|e| Listed {
                path: format!("{base}{}", e.path()),
                modified_ms: e.metadata().last_modified().map_or(0, |t| t.into_inner().as_millisecond()),
            })
            .collect())
    }

    /// The operator for `path`'s bucket and the key inside it, built with the credentials of this moment.
    async fn op<'p>(&self, path: &'p str) -> iceberg::Result<(Operator, &'p str)> {
        let scheme = Scheme::of(path)?;
        let (bucket, key) = split_bucket(path)?;
        let cache_key = (scheme, bucket.to_string());
        if let (Scheme::Gcs, Some(creds)) = (scheme, &self.inner.credentials) {
            // tokens are added per request: one operator per bucket for good
            if let Some(c) = self.inner.ops.lock().unwrap_or_else(|p| p.into_inner()).get(&cache_key) {
                return Ok((c.op.clone(), key));
            }
            let mut all = self.inner.props.clone();
            all.extend(creds.current().await.map_err(from_crate)?);
            let op = build_operator(scheme, bucket, &all, Some(creds.clone()))?;
            self.inner.ops.lock().unwrap_or_else(|p| p.into_inner()).insert(cache_key, CachedOp { overlay: HashMap::new(), op: op.clone() });
            return Ok((op, key));
        }
        let overlay = match &self.inner.credentials {
            Some(c) => c.current().await.map_err(from_crate)?,
            None => HashMap::new(),
        };
        if let Some(c) = self.inner.ops.lock().unwrap_or_else(|p| p.into_inner()).get(&cache_key) {
            if c.overlay == overlay {
                return Ok((c.op.clone(), key));
            }
        }
        let mut all = self.inner.props.clone();
        all.extend(overlay.clone());
        let op = build_operator(scheme, bucket, &all, None)?;
        self.inner.ops.lock().unwrap_or_else(|p| p.into_inner()).insert(cache_key, CachedOp { overlay, op: op.clone() });
        Ok((op, key))
    }

    fn local(path: &str) -> bool {
        Scheme::of(path).is_ok_and(|s| s == Scheme::Local)
    }
}

/// Why `bucket` cannot be reached by a build without the storage's cargo `feature`.
#[cfg(not(all(feature = "gcs", feature = "s3")))]
fn left_out(bucket: &str, feature: &str) -> IcebergError {
    IcebergError::new(
        ErrorKind::FeatureUnsupported,
        format!("bucket {bucket}: this cdc was built without the `{feature}` storage; build it with `--features {feature}` (on by default)"),
    )
}

/// An operator for `bucket`; with `bearer`, GCS requests carry that source's current token instead of a fixed one.
#[cfg_attr(not(feature = "gcs"), allow(unused_variables))]
#[cfg_attr(not(any(feature = "gcs", feature = "s3")), allow(unreachable_code))]
fn build_operator(
    scheme: Scheme,
    bucket: &str,
    p: &HashMap<String, String>,
    bearer: Option<Arc<dyn StorageCredentials>>,
) -> iceberg::Result<Operator> {
    let err =
        |e: opendal::Error| IcebergError::new(ErrorKind::Unexpected, format!("cannot configure storage for bucket {bucket}: {e}")).with_source(e);
    let op: Operator = match scheme {
        #[cfg(not(feature = "gcs"))]
        Scheme::Gcs => return Err(left_out(bucket, "gcs")),
        #[cfg(not(feature = "s3"))]
        Scheme::S3 => return Err(left_out(bucket, "s3")),
        #[cfg(feature = "gcs")]
        Scheme::Gcs => {
            let mut cfg = opendal::services::GcsConfig::default();
            cfg.bucket = bucket.to_string();
            cfg.endpoint = p.get(props::GCS_ENDPOINT).or_else(|| p.get(props::GCS_SERVICE_HOST)).cloned();
            cfg.token = p.get(props::GCS_TOKEN).cloned();
            cfg.credential = p.get(props::GCS_CREDENTIALS_JSON).cloned();
            // Never fall back to the VM metadata server or gcloud's files on our own: credentials are explicit
            // (a token, a key, or a token source the caller renews).
            cfg.disable_vm_metadata = true;
            cfg.disable_config_load = true;
            if truthy(p.get(props::GCS_NO_AUTH)) || bearer.is_some() {
                cfg.skip_signature = true;
            }
            let op = Operator::from_config(cfg).map_err(err)?;
            match bearer {
                Some(credentials) => {
                    let fetch = BearerFetch { inner: opendal::HttpTransporter::default(), credentials };
                    op.with_context(opendal::OperationContext::new().with_http_transport(opendal::HttpTransporter::new(fetch)))
                }
                None => op,
            }
        }
        #[cfg(feature = "s3")]
        Scheme::S3 => {
            let mut cfg = opendal::services::S3Config::default();
            cfg.bucket = bucket.to_string();
            cfg.endpoint = p.get(props::S3_ENDPOINT).cloned();
            cfg.region = p.get(props::S3_REGION).or_else(|| p.get(props::CLIENT_REGION)).cloned().or_else(|| Some("us-east-1".into()));
            cfg.access_key_id = p.get(props::S3_ACCESS_KEY_ID).cloned();
            cfg.secret_access_key = p.get(props::S3_SECRET_ACCESS_KEY).cloned();
            cfg.session_token = p.get(props::S3_SESSION_TOKEN).cloned();
            cfg.enable_virtual_host_style = p.get(props::S3_PATH_STYLE).is_some_and(|v| v.eq_ignore_ascii_case("false"));
            cfg.disable_config_load = cfg.access_key_id.is_some();
            Operator::from_config(cfg).map_err(err)?
        }
        Scheme::Local => unreachable!("local paths do not use an operator"),
    };
    // Timeout inside retry: each attempt is bounded, so a stalled connection becomes a retryable error.
    Ok(op
        .layer(TimeoutLayer::new().with_timeout(Duration::from_secs(60)).with_io_timeout(Duration::from_secs(30)))
        .layer(RetryLayer::new().with_jitter().with_max_times(6).with_min_delay(Duration::from_millis(200)).with_max_delay(Duration::from_secs(10))))
}

struct Reader(opendal::Reader, String);

#[async_trait]
impl FileRead for Reader {
    async fn read(&self, range: Range<u64>) -> iceberg::Result<Bytes> {
        let b = self.0.read(range).await.map_err(|e| from_opendal(&self.1, e))?.to_bytes();
        count(&counters::READ_REQUESTS, 1);
        count(&counters::READ_BYTES, b.len() as u64);
        Ok(b)
    }
}

struct Writer(opendal::Writer, String);

#[async_trait]
impl FileWrite for Writer {
    async fn write(&mut self, bs: Bytes) -> iceberg::Result<()> {
        let n = bs.len() as u64;
        self.0.write(bs).await.map_err(|e| from_opendal(&self.1, e))?;
        count(&counters::WRITTEN_BYTES, n);
        Ok(())
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        self.0.close().await.map_err(|e| from_opendal(&self.1, e))?;
        count(&counters::OBJECTS_WRITTEN, 1);
        Ok(())
    }
}

#[async_trait]
#[typetag::serde(name = "CdcStorage")]
impl Storage for CdcStorage {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        if Self::local(path) {
            return LocalFsStorage::new().exists(path).await;
        }
        let (op, key) = self.op(path).await?;
        count(&counters::OTHER, 1);
        op.exists(key).await.map_err(|e| from_opendal(path, e))
    }

    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        if Self::local(path) {
            return LocalFsStorage::new().metadata(path).await;
        }
        let (op, key) = self.op(path).await?;
        count(&counters::OTHER, 1);
        let m = op.stat(key).await.map_err(|e| from_opendal(path, e))?;
        Ok(FileMetadata { size: m.content_length() })
    }

    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        if Self::local(path) {
            return LocalFsStorage::new().read(path).await;
        }
        let (op, key) = self.op(path).await?;
        let b = op.read(key).await.map_err(|e| from_opendal(path, e))?.to_bytes();
        count(&counters::READ_REQUESTS, 1);
        count(&counters::READ_BYTES, b.len() as u64);
        Ok(b)
    }

    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        if Self::local(path) {
            return LocalFsStorage::new().reader(path).await;
        }
        let (op, key) = self.op(path).await?;
        Ok(Box::new(Reader(op.reader(key).await.map_err(|e| from_opendal(path, e))?, path.to_string())))
    }

    async fn write(&self, path: &str, bs: Bytes) -> iceberg::Result<()> {
        if Self::local(path) {
            return LocalFsStorage::new().write(path, bs).await;
        }
        let (op, key) = self.op(path).await?;
        let n = bs.len() as u64;
        op.write(key, bs).await.map_err(|e| from_opendal(path, e))?;
        count(&counters::OBJECTS_WRITTEN, 1);
        count(&counters::WRITTEN_BYTES, n);
        Ok(())
    }

    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        if Self::local(path) {
            return LocalFsStorage::new().writer(path).await;
        }
        let (op, key) = self.op(path).await?;
        let chunk =
            self.inner.props.get(props::UPLOAD_CHUNK_SIZE).and_then(|v| v.parse::<usize>().ok()).unwrap_or(UPLOAD_CHUNK).max(MIN_UPLOAD_CHUNK);
        let w = op.writer_with(key).chunk(chunk).await.map_err(|e| from_opendal(path, e))?;
        Ok(Box::new(Writer(w, path.to_string())))
    }

    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        if Self::local(path) {
            return LocalFsStorage::new().delete(path).await;
        }
        let (op, key) = self.op(path).await?;
        count(&counters::OTHER, 1);
        op.delete(key).await.map_err(|e| from_opendal(path, e))
    }

    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        if Self::local(path) {
            return LocalFsStorage::new().delete_prefix(path).await;
        }
        let (op, key) = self.op(path).await?;
        let dir = if key.ends_with('/') { key.to_string() } else { format!("{key}/") };
        op.delete_with(&dir).recursive(true).await.map_err(|e| from_opendal(path, e))
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> iceberg::Result<()> {
        while let Some(p) = paths.next().await {
            self.delete(&p).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> iceberg::Result<InputFile> {
        Scheme::of(path)?;
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> iceberg::Result<OutputFile> {
        Scheme::of(path)?;
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_and_buckets() {
        assert_eq!(Scheme::of("/tmp/x").unwrap(), Scheme::Local);
        assert_eq!(Scheme::of("file:///tmp/x").unwrap(), Scheme::Local);
        assert_eq!(Scheme::of("gs://b/k").unwrap(), Scheme::Gcs);
        assert_eq!(Scheme::of("s3a://b/k").unwrap(), Scheme::S3);
        assert!(Scheme::of("hdfs://nn/x").unwrap_err().to_string().contains("not supported"));
        assert_eq!(split_bucket("gs://bucket/a/b.parquet").unwrap(), ("bucket", "a/b.parquet"));
        assert!(split_bucket("gs://bucket").is_err());
        assert!(is_object_store("s3://b/k") && !is_object_store("/wh"));
    }

    #[test]
    fn no_auth_is_read_by_value() {
        assert!(truthy(Some(&"true".to_string())));
        assert!(!truthy(Some(&"false".to_string())));
        assert!(!truthy(None));
    }

    #[tokio::test]
    async fn local_paths_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let io = file_io(CdcStorageFactory::default(), &HashMap::new());
        let p = format!("{}/a.bin", dir.path().display());
        io.new_output(&p).unwrap().write(Bytes::from_static(b"abc")).await.unwrap();
        assert_eq!(io.new_input(&p).unwrap().read().await.unwrap().as_ref(), b"abc");
        assert!(io.exists(&p).await.unwrap());
        io.delete(&p).await.unwrap();
        assert!(!io.exists(&p).await.unwrap());
    }

    #[test]
    fn only_storage_properties_reach_file_io() {
        let all = HashMap::from([("gcs.service.path".to_string(), "http://x".to_string()), ("token".to_string(), "secret".to_string())]);
        let io = file_io(CdcStorageFactory::default(), &all);
        assert!(io.config().get("gcs.service.path").is_some());
        assert!(io.config().get("token").is_none());
    }
}

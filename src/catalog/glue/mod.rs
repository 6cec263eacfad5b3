//! Iceberg tables in the AWS Glue Data Catalog (`type = "glue"`), read and committed the way Iceberg Java's
//! `GlueCatalog` does: a Glue table whose parameters say `table_type = ICEBERG` points at its current metadata file
//! in `metadata_location` ([`super::metastore`]).
//!
//! Commit (the order is the invariant):
//! 1. write the new metadata file (a fresh name);
//! 2. `GetTable`: its `metadata_location` must still be the file the change was planned on, else conflict;
//! 3. `UpdateTable` with the swapped pointer and the `VersionId` step 2 read — Glue refuses the update with
//!    `ConcurrentModificationException` when another writer updated the table in between, which makes 2–3 a
//!    compare-and-set (`SkipArchive`: no table version per commit, Iceberg Java's default).
//!
//! A refused commit deletes its metadata file; one whose answer was lost keeps it and is settled by the caller
//! reloading. Calls are Glue's JSON-RPC over HTTPS, signed with SigV4 ([`sigv4`]); reads are retried on transport
//! errors, throttling and 5xx with jittered backoff, an `UpdateTable` never blindly.
pub(crate) mod sigv4;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use iceberg::io::FileIO;
use iceberg::spec::TableMetadata;
use iceberg::TableIdent;
use serde_json::{json, Map, Value};

use super::metastore::{self, Change, Metastore, MetastoreCatalog, Refusal};
use super::Backend;
use crate::config::CatalogConfig;
use crate::error::{Error, Result};
use crate::storage::{self, CdcStorageFactory};
use sigv4::Credentials;

/// Catalog keys of `type = "glue"` (besides `warehouse` and storage properties).
pub mod keys {
    /// AWS region (default: `AWS_REGION`, `AWS_DEFAULT_REGION`).
    pub const REGION: &str = "region";
    /// Glue endpoint (default `https://glue.<region>.amazonaws.com`); for VPC endpoints and emulators.
    pub const ENDPOINT: &str = "endpoint";
    /// The AWS account id whose Data Catalog holds the tables (default: the caller's).
    pub const CATALOG_ID: &str = "catalog-id";
    /// Static credentials (default: the environment, then the shared credentials file).
    pub const ACCESS_KEY_ID: &str = "access-key-id";
    pub const SECRET_ACCESS_KEY: &str = "secret-access-key";
    pub const SESSION_TOKEN: &str = "session-token";
    /// Profile of the shared credentials file (default `AWS_PROFILE`, then `default`).
    pub const PROFILE: &str = "profile";
    /// Every key the catalog takes itself.
    pub const ALL: &[&str] = &[REGION, ENDPOINT, CATALOG_ID, ACCESS_KEY_ID, SECRET_ACCESS_KEY, SESSION_TOKEN, PROFILE];
}

const CALL_TIMEOUT: Duration = Duration::from_secs(60);
const READ_ATTEMPTS: u32 = 4;

/// An AWS Glue Data Catalog.
pub struct GlueCatalog {
    http: reqwest::Client,
    endpoint: reqwest::Url,
    region: String,
    catalog_id: Option<String>,
    credentials: Credentials,
    warehouse: Option<String>,
    storage: CdcStorageFactory,
    /// Storage properties for the tables' files; S3 gets the catalog's credentials and region unless given its own.
    storage_props: HashMap<String, String>,
}

/// A Glue error: its type (`EntityNotFoundException`, …) and message, or a transport failure.
#[derive(Debug)]
struct CallError {
    kind: String,
    message: String,
    /// Whether the request may have been processed (false: surely not sent, or refused before processing).
    maybe_applied: bool,
    retryable: bool,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl GlueCatalog {
    /// A catalog from the section's keys; fails when no region or no credentials are found.
    pub fn new(props: &BTreeMap<String, String>, warehouse: Option<String>, storage: CdcStorageFactory) -> Result<Self> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let region = props
            .get(keys::REGION)
            .cloned()
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .ok_or_else(|| Error::Config(vec!["glue catalog: no region; set the catalog's `region` or AWS_REGION".into()]))?;
        let endpoint = props.get(keys::ENDPOINT).cloned().unwrap_or_else(|| format!("https://glue.{region}.amazonaws.com"));
        let endpoint = reqwest::Url::parse(&endpoint).map_err(|e| Error::Config(vec![format!("glue catalog endpoint `{endpoint}`: {e}")]))?;
        let credentials = Credentials::resolve(props, env).ok_or_else(|| Error::Auth {
            source_name: "aws".into(),
            message: format!("no AWS credentials for the Glue catalog; give them through {}", sigv4::SOURCES),
            retryable: false,
            cause: None,
        })?;
        let mut storage_props: HashMap<String, String> =
            props.iter().filter(|(k, _)| !keys::ALL.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
        if !storage_props.contains_key(storage::props::S3_ACCESS_KEY_ID) {
            storage_props.insert(storage::props::S3_ACCESS_KEY_ID.into(), credentials.access_key_id.clone());
            storage_props.insert(storage::props::S3_SECRET_ACCESS_KEY.into(), credentials.secret_access_key.clone());
            if let Some(t) = &credentials.session_token {
                storage_props.insert(storage::props::S3_SESSION_TOKEN.into(), t.clone());
            }
        }
        storage_props.entry(storage::props::CLIENT_REGION.into()).or_insert_with(|| region.clone());
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .build()
            .map_err(|e| Error::catalog("glue", format!("cannot build an HTTP client: {e}"), false))?;
        Ok(GlueCatalog { http, endpoint, region, catalog_id: props.get(keys::CATALOG_ID).cloned(), credentials, warehouse, storage, storage_props })
    }

    fn error(&self, what: &str, e: CallError) -> Error {
        let auth = ["AccessDeniedException", "UnrecognizedClientException", "InvalidSignatureException", "ExpiredTokenException"];
        if auth.contains(&e.kind.as_str()) {
            return Error::Auth {
                source_name: "aws".into(),
                message: format!("{what}: {e} — check the credentials ({}) and the IAM permissions on glue:*Table/glue:*Database", sigv4::SOURCES),
                retryable: false,
                cause: None,
            };
        }
        Error::catalog("glue", format!("{what}: {e}"), e.retryable)
    }

    /// One signed call of operation `op`; reads (`idempotent`) are retried on transport errors, throttling and 5xx.
    async fn call(&self, op: &str, mut body: Value, idempotent: bool) -> std::result::Result<Value, CallError> {
        if let (Some(id), Some(obj)) = (&self.catalog_id, body.as_object_mut()) {
            obj.insert("CatalogId".into(), Value::String(id.clone()));
        }
        let payload = serde_json::to_vec(&body).expect("JSON values serialise");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let res = self.send(op, &payload).await;
            match res {
                Err(e) if e.retryable && (idempotent || !e.maybe_applied) && attempt < READ_ATTEMPTS => {
                    tokio::time::sleep(crate::backoff::delay(Duration::from_millis(200), attempt)).await;
                }
                other => return other,
            }
        }
    }

    async fn send(&self, op: &str, payload: &[u8]) -> std::result::Result<Value, CallError> {
        let amz_date = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
        let host = match self.endpoint.port() {
            Some(p) => format!("{}:{p}", self.endpoint.host_str().unwrap_or_default()),
            None => self.endpoint.host_str().unwrap_or_default().to_string(),
        };
        let target = format!("AWSGlue.{op}");
        let mut headers = vec![
            ("content-type", "application/x-amz-json-1.1"),
            ("host", host.as_str()),
            ("x-amz-date", amz_date.as_str()),
            ("x-amz-target", target.as_str()),
        ];
        if let Some(t) = &self.credentials.session_token {
            headers.push(("x-amz-security-token", t.as_str()));
        }
        let path = self.endpoint.path().to_string();
        let auth = sigv4::sign(
            &self.credentials,
            &self.region,
            "glue",
            &amz_date,
            &sigv4::Request { method: "POST", path: &path, query: "", headers: &headers, payload },
        );
        let mut req = self.http.post(self.endpoint.clone()).header("authorization", auth).body(payload.to_vec());
        for (k, v) in headers.iter().filter(|(k, _)| *k != "host") {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.map_err(|e| CallError {
            kind: "transport".into(),
            message: format!("{e} (endpoint {})", self.endpoint),
            maybe_applied: !e.is_connect(),
            retryable: true,
        })?;
        let status = resp.status();
        let text =
            resp.text().await.map_err(|e| CallError { kind: "transport".into(), message: e.to_string(), maybe_applied: true, retryable: true })?;
        if status.is_success() {
            return serde_json::from_str(&text).map_err(|e| CallError {
                kind: "protocol".into(),
                message: format!("{op}: not a Glue answer ({e})"),
                maybe_applied: true,
                retryable: false,
            });
        }
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let kind =
            body.get("__type").and_then(Value::as_str).map(|t| t.rsplit('#').next().unwrap_or(t).to_string()).unwrap_or_else(|| status.to_string());
        let message = body.get("message").or_else(|| body.get("Message")).and_then(Value::as_str).unwrap_or(text.as_str());
        // a server or proxy may echo the request: none of the credentials may reach a message (redacted before it is
        // shortened, so that no prefix of one is left either)
        let c = &self.credentials;
        let message =
            crate::redact::redact(message, [c.secret_access_key.as_str(), c.access_key_id.as_str()].into_iter().chain(c.session_token.as_deref()));
        let message = message.chars().take(500).collect();
        let throttled = kind.contains("Throttling") || status.as_u16() == 429;
        Err(CallError { maybe_applied: status.is_server_error(), retryable: throttled || status.is_server_error(), kind, message })
    }

    /// The Glue table, `None` when it (or its database) does not exist.
    async fn glue_table(&self, db: &str, name: &str) -> Result<Option<Map<String, Value>>> {
        match self.call("GetTable", json!({"DatabaseName": db, "Name": name}), true).await {
            Ok(v) => match v.get("Table") {
                Some(Value::Object(t)) => Ok(Some(t.clone())),
                _ => Err(Error::catalog("glue", format!("GetTable {db}.{name}: the answer holds no table"), false)),
            },
            Err(e) if e.kind == "EntityNotFoundException" => Ok(None),
            Err(e) => Err(self.error(&format!("cannot read table {db}.{name}"), e)),
        }
    }

    fn parameters(t: &Map<String, Value>) -> Vec<(String, String)> {
        t.get("Parameters")
            .and_then(Value::as_object)
            .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
            .unwrap_or_default()
    }

    /// Every item of `key` in the pages of `op` (each call with `body` and the last page's `NextToken`), and how many
    /// calls that took.
    async fn pages(&self, op: &str, body: Value, key: &str) -> Result<(Vec<Value>, usize)> {
        let (mut out, mut calls, mut token) = (Vec::new(), 0, None::<String>);
        loop {
            let mut req = body.clone();
            if let (Some(t), Some(obj)) = (&token, req.as_object_mut()) {
                obj.insert("NextToken".into(), Value::String(t.clone()));
            }
            calls += 1;
            let page = self.call(op, req, true).await.map_err(|e| self.error(op, e))?;
            out.extend(page.get(key).and_then(Value::as_array).cloned().unwrap_or_default());
            match page.get("NextToken").and_then(Value::as_str).filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t.to_string()),
                None => return Ok((out, calls)),
            }
        }
    }

    /// Where a new table of `db` goes: the database's location, or `<warehouse>/<db>.db`; creates a missing database.
    async fn database_location_of(&self, db: &str) -> Result<String> {
        let fallback = self.warehouse.as_deref().map(|w| format!("{}/{db}.db", w.trim_end_matches('/')));
        match self.call("GetDatabase", json!({"Name": db}), true).await {
            Ok(v) => {
                let loc = v.pointer("/Database/LocationUri").and_then(Value::as_str).filter(|l| !l.is_empty()).map(str::to_string);
                return loc.or(fallback).ok_or_else(|| {
                    Error::Config(vec![format!(
                        "glue catalog: database `{db}` has no location; set the catalog's `warehouse` so `cdc` can place tables"
                    )])
                });
            }
            Err(e) if e.kind == "EntityNotFoundException" => {}
            Err(e) => return Err(self.error(&format!("cannot read database {db}"), e)),
        }
        let location = fallback.ok_or_else(|| {
            Error::Config(vec![format!("glue catalog: database `{db}` does not exist; set the catalog's `warehouse` so `cdc` can create it there")])
        })?;
        match self.call("CreateDatabase", json!({"DatabaseInput": {"Name": db, "LocationUri": location}}), false).await {
            Ok(_) => {}
            Err(e) if e.kind == "AlreadyExistsException" => {}
            Err(e) => return Err(self.error(&format!("cannot create database {db}"), e)),
        }
        Ok(location)
    }
}

/// A `TableInput` for `CreateTable`/`UpdateTable`: the fields of `current` (a `GetTable` answer) that an input may
/// carry, with the parameters of the commit and the storage descriptor's location and columns of `new`.
fn table_input(
    current: Map<String, Value>,
    name: &str,
    old: Option<&TableMetadata>,
    new: &TableMetadata,
    location: &str,
    previous: Option<&str>,
) -> Value {
    const INPUT_FIELDS: &[&str] = &[
        "Description",
        "Owner",
        "LastAccessTime",
        "LastAnalyzedTime",
        "Retention",
        "StorageDescriptor",
        "PartitionKeys",
        "ViewOriginalText",
        "ViewExpandedText",
        "TableType",
        "TargetTable",
    ];
    let params = metastore::parameters(GlueCatalog::parameters(&current), old, new, location, previous);
    let mut input: Map<String, Value> = current.into_iter().filter(|(k, _)| INPUT_FIELDS.contains(&k.as_str())).collect();
    input.insert("Name".into(), json!(name));
    input.entry("TableType").or_insert(json!("EXTERNAL_TABLE"));
    input.insert("Parameters".into(), Value::Object(params.into_iter().map(|(k, v)| (k, Value::String(v))).collect()));
    let columns: Vec<Value> = metastore::columns(new)
        .into_iter()
        .map(|c| {
            let mut col = json!({"Name": c.name, "Type": c.hive_type});
            if !c.comment.is_empty() {
                col["Comment"] = json!(c.comment);
            }
            col
        })
        .collect();
    let sd = input.entry("StorageDescriptor").or_insert(json!({}));
    if let Some(sd) = sd.as_object_mut() {
        sd.insert("Location".into(), json!(new.location()));
        sd.insert("Columns".into(), Value::Array(columns));
    }
    Value::Object(input)
}

/// The problems of a `glue` catalog section (named `field`).
pub(crate) fn validate(cfg: &CatalogConfig, field: &str, p: &mut Vec<String>) {
    if let Some(e) = cfg.props.get(keys::ENDPOINT) {
        if !(e.starts_with("http://") || e.starts_with("https://")) {
            p.push(format!("{field}.endpoint: `{e}` must start with https:// (or http:// for an emulator)"));
        }
    }
    if cfg.props.contains_key(keys::ACCESS_KEY_ID) != cfg.props.contains_key(keys::SECRET_ACCESS_KEY) {
        p.push(format!("{field}: `access-key-id` and `secret-access-key` go together"));
    }
    for k in cfg.props.keys() {
        let storage = crate::storage::props::PREFIXES.iter().any(|pre| k.starts_with(pre));
        if !storage && !keys::ALL.contains(&k.as_str()) {
            p.push(format!(
                "{field}.{k}: unknown key for a glue catalog (it takes {}, `warehouse`, and storage properties such as `s3.*`)",
                keys::ALL.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
            ));
        }
    }
}

/// A client of the Data Catalog `cfg` names.
pub(crate) fn connect(cfg: &CatalogConfig) -> Result<Box<dyn Backend>> {
    Ok(Box::new(MetastoreCatalog(GlueCatalog::new(&cfg.props, cfg.warehouse.clone(), super::storage_factory(cfg))?)))
}

#[async_trait::async_trait]
impl Metastore for GlueCatalog {
    type Record = Map<String, Value>;
    const NAME: &'static str = "the Glue Data Catalog";

    fn label(&self) -> String {
        format!("glue:{}", self.region)
    }

    fn file_io(&self) -> FileIO {
        storage::file_io(self.storage.clone(), &self.storage_props)
    }

    fn storage(&self) -> CdcStorageFactory {
        self.storage.clone()
    }

    async fn record(&self, db: &str, name: &str) -> Result<Option<Map<String, Value>>> {
        self.glue_table(db, name).await
    }

    /// `DeleteTable` (Glue has no rename: the default refusal stands).
    async fn drop(&self, db: &str, name: &str) -> Result<bool> {
        match self.call("DeleteTable", json!({"DatabaseName": db, "Name": name}), false).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind == "EntityNotFoundException" => Ok(false),
            Err(e) => Err(self.error(&format!("cannot drop table {db}.{name}"), e)),
        }
    }

    /// `GetDatabases`, then `GetTables` per database, each followed through its `NextToken`s (only Iceberg tables are
    /// listed).
    async fn list_iceberg_tables(&self) -> Result<(Vec<TableIdent>, usize)> {
        let (dbs, mut calls) = self.pages("GetDatabases", json!({}), "DatabaseList").await?;
        let mut out = Vec::new();
        for db in dbs.iter().filter_map(|d| d.get("Name").and_then(Value::as_str)) {
            let (tables, n) = self.pages("GetTables", json!({"DatabaseName": db}), "TableList").await?;
            calls += n;
            for t in tables.iter().filter_map(Value::as_object) {
                let params: HashMap<String, String> = Self::parameters(t).into_iter().collect();
                if let (Some(name), true) = (t.get("Name").and_then(Value::as_str), metastore::is_iceberg(&params)) {
                    out.push(TableIdent::from_strs([db, name])?);
                }
            }
        }
        Ok((out, calls))
    }

    fn location(ident: &TableIdent, t: &Map<String, Value>) -> Result<String> {
        metastore::iceberg_location("glue", ident, &Self::parameters(t).into_iter().collect())
    }

    async fn database_location(&self, db: &str) -> Result<String> {
        self.database_location_of(db).await
    }

    /// The Glue table pointing at `location`.
    async fn create(&self, ident: &TableIdent, db: &str, name: &str, metadata: &TableMetadata, location: &str) -> Result<()> {
        let input = table_input(Map::new(), name, None, metadata, location, None);
        match self.call("CreateTable", json!({"DatabaseName": db, "TableInput": input}), false).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind == "AlreadyExistsException" => Err(Error::catalog("glue", format!("table {ident} already exists"), false)),
            Err(e) => Err(self.error(&format!("cannot create table {ident}"), e)),
        }
    }

    /// `UpdateTable` with the record's `VersionId`, after checking the record still points at `base`.
    async fn swap(&self, change: &Change<'_>) -> std::result::Result<(), Refusal> {
        let Change { ident, db, name, base, old, new_location, new } = *change;
        let current = self
            .glue_table(db, name)
            .await
            .map_err(Refusal::Refused)?
            .ok_or_else(|| Refusal::Refused(Error::TableNotFound { catalog: self.label(), table: ident.to_string() }))?;
        let pointer = Self::location(ident, &current).map_err(Refusal::Refused)?;
        if pointer != base {
            let message = format!("Glue points at {pointer}, not at {base} the change was planned on");
            return Err(Refusal::Refused(Error::Conflict { table: ident.to_string(), message }));
        }
        let version = current.get("VersionId").cloned();
        let input = table_input(current, name, Some(old), new, new_location, Some(base));
        let mut body = json!({"DatabaseName": db, "TableInput": input, "SkipArchive": true});
        if let Some(v) = version {
            body["VersionId"] = v;
        }
        match self.call("UpdateTable", body, false).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind == "ConcurrentModificationException" => {
                Err(Refusal::Refused(Error::Conflict { table: ident.to_string(), message: e.to_string() }))
            }
            Err(e) if e.maybe_applied => Err(Refusal::Unknown(Error::CommitUnknown { catalog: "glue".into(), message: e.to_string() })),
            Err(e) => Err(Refusal::Refused(self.error(&format!("Glue refused the commit to {ident}"), e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};

    fn metadata(props: &[(&str, &str)]) -> TableMetadata {
        let schema =
            Schema::builder().with_fields(vec![NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into()]).build().unwrap();
        let creation = iceberg::TableCreation::builder()
            .name("t".into())
            .location("s3://b/wh/db.db/t".into())
            .schema(schema)
            .properties(props.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .build();
        iceberg::spec::TableMetadataBuilder::from_table_creation(creation).unwrap().build().unwrap().metadata
    }

    #[test]
    fn an_update_keeps_what_it_may_and_drops_what_an_input_cannot_carry() {
        let old = metadata(&[("owner-note", "x"), ("gone", "1")]);
        let new = metadata(&[("owner-note", "y")]);
        let current = json!({
            "Name": "t", "DatabaseName": "db", "CreateTime": 1.7e9, "VersionId": "7", "CatalogId": "123", "Owner": "etl",
            "TableType": "EXTERNAL_TABLE",
            "Parameters": {"table_type": "ICEBERG", "metadata_location": "s3://old", "gone": "1", "lake_formation": "keep"},
            "StorageDescriptor": {"Location": "s3://b/wh/db.db/t", "SerdeInfo": {"SerializationLibrary": "x"}}
        });
        let Value::Object(current) = current else { unreachable!() };
        let input = table_input(current, "t", Some(&old), &new, "s3://new", Some("s3://old"));
        for absent in ["DatabaseName", "CreateTime", "VersionId", "CatalogId"] {
            assert!(input.get(absent).is_none(), "{absent} is not a TableInput field");
        }
        assert_eq!(input["Owner"], "etl");
        let p = &input["Parameters"];
        assert_eq!((p["metadata_location"].as_str(), p["previous_metadata_location"].as_str()), (Some("s3://new"), Some("s3://old")));
        assert_eq!((p["owner-note"].as_str(), p.get("gone"), p["lake_formation"].as_str()), (Some("y"), None, Some("keep")));
        assert_eq!(input["StorageDescriptor"]["Columns"], json!([{"Name": "id", "Type": "bigint"}]));
        assert_eq!(input["StorageDescriptor"]["SerdeInfo"]["SerializationLibrary"], "x");
    }

    /// A server that answers every request with a Glue error whose message echoes the request, headers included.
    fn echoing_server() -> String {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut w = conn;
                let mut echoed = String::new();
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                        break;
                    }
                    if h.to_ascii_lowercase().contains("token") || h.to_ascii_lowercase().starts_with("authorization") {
                        echoed.push_str(&h);
                    }
                }
                let body = json!({"__type": "com.amazonaws#ValidationException", "message": format!("bad request: {echoed} secret=S3cr3tK3yValue")});
                let body = body.to_string();
                let _ = write!(w, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
            }
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn an_error_body_that_echoes_the_request_loses_every_credential() {
        let props: BTreeMap<String, String> = [
            (keys::REGION, "eu-west-1"),
            (keys::ENDPOINT, echoing_server().as_str()),
            (keys::ACCESS_KEY_ID, "AKIAEXAMPLEKEYID"),
            (keys::SECRET_ACCESS_KEY, "S3cr3tK3yValue"),
            (keys::SESSION_TOKEN, "FwoGZXIvYXdzSESSIONTOKEN"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let glue = GlueCatalog::new(&props, None, CdcStorageFactory::default()).unwrap();
        let e = glue.send("GetTable", b"{}").await.unwrap_err();
        assert_eq!(e.kind, "ValidationException");
        assert!(e.message.contains("x-amz-security-token") && e.message.contains("Credential="), "the echo is shown: {e}");
        for secret in ["S3cr3tK3yValue", "FwoGZXIvYXdzSESSIONTOKEN", "AKIAEXAMPLEKEYID"] {
            assert!(!e.message.contains(secret), "{secret} leaked: {e}");
        }
    }

    #[test]
    fn namespaces_are_one_level() {
        assert!(metastore::db_and_name(GlueCatalog::NAME, &TableIdent::from_strs(["a", "b", "t"]).unwrap()).is_err());
    }
}

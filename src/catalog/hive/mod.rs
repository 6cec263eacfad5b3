//! Iceberg tables in a Hive Metastore (`type = "hive"`), read and committed the way Iceberg Java's `HiveCatalog`
//! does, so that Spark, Hive and `cdc` can write one table without losing a commit.
//!
//! A table is a Metastore table with parameters `table_type = ICEBERG` and `metadata_location = <current metadata
//! file>`; its metadata lives beside its data (`<location>/metadata/NNNNN-<uuid>.metadata.json`).
//!
//! Commit (the order is the invariant):
//! 1. write the new metadata file (a fresh name: it cannot clobber anything);
//! 2. take the Metastore's EXCLUSIVE table lock (`lock`, then `check_lock` until acquired) — the lock Iceberg Java
//!    takes, so a Spark commit and ours are serialised;
//! 3. under the lock, read the table again: its `metadata_location` must still be the one our change was planned on,
//!    else the commit conflicts (the new file is deleted, the caller re-plans);
//! 4. `alter_table_with_environment_context` with `metadata_location` swapped (and `previous_metadata_location`).
//!    Like Iceberg Java's default (locked) commit, it sends no `expected_parameter_*`: the lock already guards the
//!    swap, and Hive 4 compares that parameter in SQL, which Derby and Oracle refuse on their CLOB column ("ERROR
//!    42818: Comparisons between 'CLOB (UCS_BASIC)' …") — every commit would fail there;
//! 5. release the lock — always, also after a failure.
//!
//! A lock held by another writer is waited for up to `lock_timeout` (default 3 minutes, Iceberg Java's
//! `iceberg.hive.lock-timeout-ms`); past it the commit fails at once — no retry in the same run, which would only
//! wait again — with the holder as the Metastore reports it (`show_locks`: lock id, user, host, agent, age), and the
//! service retries later with backoff.
//!
//! A failure after the alter was sent leaves the outcome unknown; the caller settles it by reloading
//! ([`super::Catalog`] checks for the new snapshot). The Metastore speaks Thrift ([`thrift`]); calls are blocking and
//! run on tokio's blocking pool, one connection per catalog, reopened after any transport error.
pub(crate) mod thrift;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iceberg::io::FileIO;
use iceberg::spec::TableMetadata;
use iceberg::TableIdent;

use super::metastore::{self, Change, Metastore, MetastoreCatalog, Refusal};
use super::Backend;
use crate::config::CatalogConfig;
use crate::error::{Error, Result};
use crate::storage::{self, CdcStorageFactory};
use thrift::{CallError, Connection, Struct, Value};

/// How long a commit waits for the table lock by default (Iceberg Java's default `iceberg.hive.lock-timeout-ms`).
const LOCK_TIMEOUT: Duration = Duration::from_secs(180);
/// Catalog key: how long a commit waits for the table lock (a humantime duration).
pub(crate) const LOCK_TIMEOUT_KEY: &str = "lock_timeout";
/// Per call: connect, send, and wait for the answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts of a read call over fresh connections after transport errors.
const READ_ATTEMPTS: u32 = 3;

/// `Table` field ids (hive_metastore.thrift).
mod table {
    pub const NAME: i16 = 1;
    pub const DB: i16 = 2;
    pub const OWNER: i16 = 3;
    pub const CREATE_TIME: i16 = 4;
    pub const LAST_ACCESS_TIME: i16 = 5;
    pub const RETENTION: i16 = 6;
    pub const SD: i16 = 7;
    pub const PARTITION_KEYS: i16 = 8;
    pub const PARAMETERS: i16 = 9;
    pub const TABLE_TYPE: i16 = 12;
}

/// `StorageDescriptor` field ids.
mod sd {
    pub const COLS: i16 = 1;
    pub const LOCATION: i16 = 2;
    pub const INPUT_FORMAT: i16 = 3;
    pub const OUTPUT_FORMAT: i16 = 4;
    pub const COMPRESSED: i16 = 5;
    pub const NUM_BUCKETS: i16 = 6;
    pub const SERDE: i16 = 7;
    pub const PARAMETERS: i16 = 10;
}

/// A Hive Metastore holding Iceberg tables.
pub struct HiveCatalog {
    /// `host:port` of the Metastore's Thrift service.
    addr: String,
    /// Where new databases' directories go when the Metastore has none for them.
    warehouse: Option<String>,
    /// How table storage is reached.
    storage: CdcStorageFactory,
    /// Storage properties (`s3.*`, `gcs.*`, …) of the catalog section.
    props: HashMap<String, String>,
    /// The connection, opened on first use and after a transport error.
    conn: Arc<Mutex<Option<Connection>>>,
    /// How long a commit waits for the table lock (`lock_timeout`).
    lock_timeout: Duration,
    /// What listings learnt: whether each table (database, name) is an Iceberg table (see
    /// [`Metastore::list_iceberg_tables`]).
    kinds: Mutex<TableKinds>,
}

/// Whether each table a listing saw is an Iceberg table. A table's kind only changes when it is dropped and created
/// again under its name (or migrated), so a listing asks the Metastore for the objects of the names it has not seen;
/// every [`TableKinds::REFRESH_EVERY`]th listing asks for all of them again.
#[derive(Default)]
struct TableKinds {
    iceberg: HashMap<(String, String), bool>,
    listings: u64,
}

impl TableKinds {
    /// One listing in this many asks for every table's object again (a kind that changed is seen within it).
    const REFRESH_EVERY: u64 = 10;
}

/// Whether a call may be sent again after a transport error.
#[derive(Clone, Copy, PartialEq)]
enum Idempotent {
    Yes,
    No,
}

impl HiveCatalog {
    /// A catalog for the Metastore at `uri` (`thrift://host:port`). Connects lazily.
    pub fn new(uri: &str, warehouse: Option<String>, storage: CdcStorageFactory, props: HashMap<String, String>) -> Result<Self> {
        let addr = uri
            .strip_prefix("thrift://")
            .map(|a| a.trim_end_matches('/').to_string())
            .filter(|a| !a.is_empty())
            .ok_or_else(|| Error::Config(vec![format!("hive catalog uri `{uri}` must be thrift://HOST:PORT")]))?;
        let addr = if addr.contains(':') { addr } else { format!("{addr}:9083") };
        let lock_timeout = match props.get(LOCK_TIMEOUT_KEY) {
            Some(v) => humantime::parse_duration(v).map_err(|e| Error::Config(vec![format!("hive catalog {LOCK_TIMEOUT_KEY}: `{v}`: {e}")]))?,
            None => LOCK_TIMEOUT,
        };
        let props = props.into_iter().filter(|(k, _)| k != LOCK_TIMEOUT_KEY).collect();
        Ok(HiveCatalog { addr, warehouse, storage, props, conn: Arc::default(), lock_timeout, kinds: Mutex::default() })
    }

    fn error(&self, what: &str, e: CallError) -> Error {
        let retryable = matches!(e, CallError::Io { .. });
        let hint = match &e {
            CallError::Io { .. } => format!(" — is the Hive Metastore running at thrift://{}?", self.addr),
            _ => String::new(),
        };
        Error::catalog("hive", format!("{what}: {e}{hint}"), retryable).with_cause(e)
    }

    /// One call on the shared connection (opened as needed; dropped after any error that may have left it mid-
    /// message). Idempotent calls are repeated on a fresh connection after transport errors.
    async fn call(&self, method: &'static str, args: Vec<Value>, idempotent: Idempotent) -> std::result::Result<Option<Value>, CallError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (conn, addr, args_now) = (self.conn.clone(), self.addr.clone(), args.clone());
            let res = tokio::task::spawn_blocking(move || {
                let mut guard = conn.lock().unwrap_or_else(|p| p.into_inner());
                if guard.is_none() {
                    *guard = Some(Connection::open(&addr, CALL_TIMEOUT).map_err(|e| CallError::Io { source: e, sent: false })?);
                }
                let res = guard.as_mut().expect("opened above").call(method, args_now);
                if matches!(res, Err(CallError::Io { .. } | CallError::Protocol(_))) {
                    *guard = None;
                }
                res
            })
            .await
            .unwrap_or_else(|e| Err(CallError::Protocol(format!("call task failed: {e}"))));
            match res {
                Err(CallError::Io { sent, .. }) if (idempotent == Idempotent::Yes || !sent) && attempt < READ_ATTEMPTS => {
                    tokio::time::sleep(crate::backoff::delay(Duration::from_millis(200), attempt)).await;
                }
                other => return other,
            }
        }
    }

    /// The Metastore table, `None` when it (or its database) does not exist.
    async fn hms_table(&self, db: &str, name: &str) -> Result<Option<Struct>> {
        let req = Struct::of([(1, Value::str(db)), (2, Value::str(name))]);
        match self.call("get_table_req", vec![Value::Struct(req)], Idempotent::Yes).await {
            Ok(Some(Value::Struct(result))) => match result.child(1) {
                Some(t) => Ok(Some(t.clone())),
                None => Err(Error::catalog("hive", format!("get_table_req {db}.{name}: the answer holds no table"), false)),
            },
            // NoSuchObjectException
            Err(CallError::Declared { field: 2, .. }) => Ok(None),
            Ok(_) => Err(Error::catalog("hive", format!("get_table_req {db}.{name}: unexpected answer"), false)),
            Err(e) => Err(self.error(&format!("cannot read table {db}.{name}"), e)),
        }
    }

    /// The strings of a `list<string>` answer of `method`.
    async fn string_list(&self, method: &'static str, args: Vec<Value>) -> Result<Vec<String>> {
        match self.call(method, args, Idempotent::Yes).await {
            Ok(Some(Value::List { items, .. })) => Ok(items.iter().filter_map(Value::as_str).collect()),
            Ok(None) => Ok(Vec::new()),
            Ok(_) => Err(Error::catalog("hive", format!("{method}: unexpected answer"), false)),
            Err(e) => Err(self.error(method, e)),
        }
    }

    fn parameters(t: &Struct) -> HashMap<String, String> {
        t.get(table::PARAMETERS).map(Value::as_string_map).unwrap_or_default().into_iter().collect()
    }

    /// The directory of database `db`, creating the database when missing (in `<warehouse>/<db>.db`, Hive's layout).
    async fn database_location(&self, db: &str) -> Result<String> {
        match self.call("get_database", vec![Value::str(db)], Idempotent::Yes).await {
            Ok(Some(Value::Struct(d))) => {
                if let Some(loc) = d.string(3).filter(|l| !l.is_empty()) {
                    return Ok(loc);
                }
            }
            Err(CallError::Declared { field: 1, .. }) => {} // NoSuchObjectException
            Ok(_) => return Err(Error::catalog("hive", format!("get_database {db}: unexpected answer"), false)),
            Err(e) => return Err(self.error(&format!("cannot read database {db}"), e)),
        }
        let warehouse = self.warehouse.as_deref().map(|w| w.trim_end_matches('/')).filter(|w| !w.is_empty()).ok_or_else(|| {
            Error::Config(vec![format!("hive catalog: database `{db}` has no location; set the catalog's `warehouse` so `cdc` can create it there")])
        })?;
        let location = format!("{warehouse}/{db}.db");
        let database = Struct::of([
            (1, Value::str(db)),
            (2, Value::str("created by iceberg-cdc")),
            (3, Value::str(location.clone())),
            (4, Value::string_map([])),
        ]);
        match self.call("create_database", vec![Value::Struct(database)], Idempotent::No).await {
            Ok(_) | Err(CallError::Declared { field: 1, .. }) => {} // created, or by another writer meanwhile
            Err(e) => return Err(self.error(&format!("cannot create database {db}"), e)),
        }
        Ok(location)
    }

    /// The swap, under the table lock: the pointer checked, the record altered.
    async fn swap_locked(&self, change: &Change<'_>) -> std::result::Result<(), Refusal> {
        let Change { ident, db, name, base, old: old_meta, new_location: new_loc, new: new_meta } = *change;
        let mut t =
            self.hms_table(db, name).await.map_err(Refusal::Refused)?.ok_or_else(|| {
                Refusal::Refused(Error::TableNotFound { catalog: format!("hive:thrift://{}", self.addr), table: ident.to_string() })
            })?;
        let current = Self::location(ident, &t).map_err(Refusal::Refused)?;
        if current != base {
            return Err(Refusal::Refused(Error::Conflict {
                table: ident.to_string(),
                message: format!("the Metastore points at {current}, not at {base} the change was planned on"),
            }));
        }
        set_parameters(&mut t, Some(old_meta), new_meta, new_loc, Some(base));
        if let Some(Value::Struct(sd)) = t.0.iter_mut().find(|(i, _)| *i == table::SD).map(|(_, v)| v) {
            sd.set(sd::COLS, columns(new_meta));
        }
        // no expected_parameter_*: under the lock it adds nothing, and Derby/Oracle-backed Hive 4 refuse it
        let env = Struct::of([(1, Value::string_map([("DO_NOT_UPDATE_STATS", "true")]))]);
        let args = vec![Value::str(db), Value::str(name), Value::Struct(t), Value::Struct(env)];
        match self.call("alter_table_with_environment_context", args, Idempotent::No).await {
            Ok(_) => Ok(()),
            Err(e @ CallError::Declared { .. }) => {
                let msg = e.declared_message().unwrap_or_default();
                if msg.contains("has been modified") {
                    Err(Refusal::Refused(Error::Conflict { table: ident.to_string(), message: msg }))
                } else {
                    Err(Refusal::Refused(self.error(&format!("the Metastore refused the commit to {ident}"), e)))
                }
            }
            Err(e @ CallError::Io { sent: false, .. }) => Err(Refusal::Refused(self.error(&format!("commit to {ident}"), e))),
            Err(e) => Err(Refusal::Unknown(Error::CommitUnknown { catalog: "hive".into(), message: e.to_string() })),
        }
    }

    /// Takes the Metastore's EXCLUSIVE lock on `db.name`, waiting up to [`LOCK_TIMEOUT`].
    async fn lock(&self, db: &str, name: &str) -> Result<i64> {
        let component = Struct::of([
            (1, Value::I32(3)), // LockType.EXCLUSIVE
            (2, Value::I32(2)), // LockLevel.TABLE
            (3, Value::str(db)),
            (4, Value::str(name)),
        ]);
        let request = Struct::of([
            (1, Value::struct_list(vec![component])),
            (3, Value::str(user())),
            (4, Value::str(crate::hostname())),
            (5, Value::str(format!("iceberg-cdc-{}", uuid::Uuid::new_v4()))),
        ]);
        let (mut id, mut state) = self.lock_response(self.call("lock", vec![Value::Struct(request)], Idempotent::No).await, db, name)?;
        let started = Instant::now();
        let mut polls = 0;
        while state == LockState::Waiting {
            if started.elapsed() > self.lock_timeout {
                let holders = self.lock_holders(db, name, id).await;
                self.unlock(id).await;
                // not retryable within the commit: another attempt would only wait as long again
                return Err(Error::catalog("hive", lock_timeout_message(db, name, id, self.lock_timeout, &holders), false));
            }
            tokio::time::sleep(crate::backoff::delay(Duration::from_millis(50), polls.min(5))).await;
            polls += 1;
            let check = Struct::of([(1, Value::I64(id))]);
            (id, state) = self.lock_response(self.call("check_lock", vec![Value::Struct(check)], Idempotent::Yes).await, db, name)?;
        }
        match state {
            LockState::Acquired => Ok(id),
            _ => {
                self.unlock(id).await;
                Err(Error::catalog("hive", format!("the Metastore did not grant the lock on {db}.{name}"), true))
            }
        }
    }

    fn lock_response(&self, res: std::result::Result<Option<Value>, CallError>, db: &str, name: &str) -> Result<(i64, LockState)> {
        match res {
            Ok(Some(Value::Struct(r))) => {
                let id = r.get(1).and_then(Value::as_i64).unwrap_or_default();
                let state = match r.get(2).and_then(Value::as_i64) {
                    Some(1) => LockState::Acquired,
                    Some(2) => LockState::Waiting,
                    _ => LockState::Refused,
                };
                Ok((id, state))
            }
            Ok(_) => Err(Error::catalog("hive", format!("lock {db}.{name}: unexpected answer"), false)),
            Err(e) => Err(self.error(&format!("cannot lock {db}.{name}"), e)),
        }
    }

    /// The other locks on `db.name` as the Metastore's `show_locks` reports them (empty when it cannot tell).
    async fn lock_holders(&self, db: &str, name: &str, ours: i64) -> Vec<LockHolder> {
        let req = Struct::of([(1, Value::str(db)), (2, Value::str(name))]);
        let Ok(Some(Value::Struct(resp))) = self.call("show_locks", vec![Value::Struct(req)], Idempotent::Yes).await else { return Vec::new() };
        let Some(Value::List { items: locks, .. }) = resp.get(1) else { return Vec::new() };
        let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        locks
            .iter()
            .filter_map(|l| match l {
                Value::Struct(l) => Some(LockHolder::of(l, now_ms)),
                _ => None,
            })
            .filter(|h| h.id != ours)
            .collect()
    }

    /// Releases a lock; a failure is logged (the Metastore times out locks whose holder stopped heartbeating).
    async fn unlock(&self, id: i64) {
        let req = Struct::of([(1, Value::I64(id))]);
        if let Err(e) = self.call("unlock", vec![Value::Struct(req)], Idempotent::Yes).await {
            tracing::warn!(lock = id, error = %e, "could not release a Hive Metastore lock; the Metastore times it out (hive.txn.timeout)");
        }
    }
}

/// Another writer's lock, as `show_locks` reports it (`ShowLocksResponseElement`).
#[derive(Debug, PartialEq)]
struct LockHolder {
    id: i64,
    acquired: bool,
    user: String,
    host: String,
    agent: String,
    /// Since it was acquired (or, while waiting, since its last heartbeat).
    age: Option<Duration>,
}

impl LockHolder {
    fn of(l: &Struct, now_ms: i64) -> Self {
        let text = |i: i16| l.get(i).and_then(Value::as_str).unwrap_or_default();
        let at = l.get(9).and_then(Value::as_i64).filter(|t| *t > 0).or_else(|| l.get(8).and_then(Value::as_i64).filter(|t| *t > 0));
        LockHolder {
            id: l.get(1).and_then(Value::as_i64).unwrap_or_default(),
            acquired: l.get(5).and_then(Value::as_i64) == Some(1),
            user: text(10),
            host: text(11),
            agent: text(13),
            age: at.map(|t| Duration::from_millis(now_ms.saturating_sub(t).max(0) as u64)),
        }
    }
}

/// The message of a lock wait that ran out: the table, our lock, who holds it and how to free it.
fn lock_timeout_message(db: &str, name: &str, ours: i64, waited: Duration, holders: &[LockHolder]) -> String {
    let held: Vec<String> = holders
        .iter()
        .filter(|h| h.acquired)
        .map(|h| {
            let age = h.age.map(|a| format!(", held for {}", humantime::format_duration(Duration::from_secs(a.as_secs())))).unwrap_or_default();
            let agent = if h.agent.is_empty() { String::new() } else { format!(", agent {}", h.agent) };
            format!("lock {} of {}@{}{agent}{age}", h.id, h.user, h.host)
        })
        .collect();
    let who =
        if held.is_empty() { "another writer (the Metastore did not say which; SHOW LOCKS in Hive tells)".to_string() } else { held.join("; ") };
    format!(
        "waited {} (lock_timeout) for the Metastore's lock on {db}.{name} (our lock {ours}); it is held by {who}. If that writer is gone, its lock stays until the Metastore's housekeeping times it out (metastore.txn.timeout after its last heartbeat; only where the housekeeping threads run); to free it now, unlock that lock id through the Metastore's `unlock` call (or, for a transaction's lock, Hive's ABORT TRANSACTIONS). The service retries on its own; `lock_timeout` in the catalog section sets the wait",
        humantime::format_duration(waited)
    )
}

#[derive(PartialEq)]
enum LockState {
    Acquired,
    Waiting,
    Refused,
}

/// Sets the Metastore parameters of a committed table ([`metastore::parameters`]).
fn set_parameters(t: &mut Struct, old: Option<&TableMetadata>, new: &TableMetadata, location: &str, previous: Option<&str>) {
    let params = metastore::parameters(t.get(table::PARAMETERS).map(Value::as_string_map).unwrap_or_default(), old, new, location, previous);
    t.set(table::PARAMETERS, Value::string_map(params.iter().map(|(k, v)| (k.as_str(), v.as_str()))));
}

/// The storage descriptor Iceberg Java writes for tables Hive does not read itself: the location, the columns for
/// tools that list them, and input/output formats that make Hive refuse to read the files behind Iceberg's back.
fn storage_descriptor(metadata: &TableMetadata) -> Struct {
    Struct::of([
        (sd::COLS, columns(metadata)),
        (sd::LOCATION, Value::str(metadata.location())),
        (sd::INPUT_FORMAT, Value::str("org.apache.hadoop.mapred.FileInputFormat")),
        (sd::OUTPUT_FORMAT, Value::str("org.apache.hadoop.mapred.FileOutputFormat")),
        (sd::COMPRESSED, Value::Bool(false)),
        (sd::NUM_BUCKETS, Value::I32(-1)),
        (sd::SERDE, Value::Struct(Struct::of([(2, Value::str("org.apache.hadoop.hive.serde2.lazy.LazySimpleSerDe")), (3, Value::string_map([]))]))),
        (sd::PARAMETERS, Value::string_map([])),
    ])
}

/// The current schema as Hive columns (`FieldSchema` list).
fn columns(metadata: &TableMetadata) -> Value {
    Value::struct_list(
        metastore::columns(metadata)
            .into_iter()
            .map(|c| Struct::of([(1, Value::str(c.name)), (2, Value::str(c.hive_type)), (3, Value::str(c.comment))]))
            .collect(),
    )
}

fn user() -> String {
    std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_else(|_| "iceberg-cdc".into())
}

/// The problems of a `hive` catalog section (named `field`).
pub(crate) fn validate(cfg: &CatalogConfig, field: &str, p: &mut Vec<String>) {
    match cfg.props.get("uri") {
        None => p.push(format!("{field}.uri: required for a hive catalog (`thrift://HOST:9083`)")),
        Some(u) if !u.starts_with("thrift://") || u.len() == "thrift://".len() => {
            p.push(format!("{field}.uri: `{u}` must be thrift://HOST:PORT (the Metastore's Thrift service)"))
        }
        _ => {}
    }
    if let Some(v) = cfg.props.get(LOCK_TIMEOUT_KEY) {
        if let Err(e) = humantime::parse_duration(v) {
            p.push(format!("{field}.{}: `{v}` is not a duration ({e}); e.g. \"3m\" or \"30s\"", LOCK_TIMEOUT_KEY));
        }
    }
    for k in cfg.props.keys() {
        let storage = crate::storage::props::PREFIXES.iter().any(|pre| k.starts_with(pre));
        if !storage && !["uri", LOCK_TIMEOUT_KEY, super::rest::keys::AUTH, super::rest::keys::GOOGLE_CREDENTIALS_FILE].contains(&k.as_str()) {
            p.push(format!("{field}.{k}: unknown key for a hive catalog (it takes `uri`, `warehouse`, `lock_timeout`, `auth`, and storage properties such as `s3.*`, `gcs.*`)"));
        }
    }
}

/// A client of the Metastore `cfg` names.
pub(crate) fn connect(cfg: &CatalogConfig) -> Result<Box<dyn Backend>> {
    let uri = cfg.props.get("uri").map(String::as_str).unwrap_or_default();
    let props = cfg.props.iter().filter(|(k, _)| k.as_str() != "uri").map(|(k, v)| (k.clone(), v.clone())).collect();
    Ok(Box::new(MetastoreCatalog(HiveCatalog::new(uri, cfg.warehouse.clone(), super::storage_factory(cfg), props)?)))
}

#[async_trait::async_trait]
impl Metastore for HiveCatalog {
    type Record = Struct;
    const NAME: &'static str = "a Hive Metastore";

    fn label(&self) -> String {
        format!("hive:thrift://{}", self.addr)
    }

    fn file_io(&self) -> FileIO {
        storage::file_io(self.storage.clone(), &self.props)
    }

    fn storage(&self) -> CdcStorageFactory {
        self.storage.clone()
    }

    async fn record(&self, db: &str, name: &str) -> Result<Option<Struct>> {
        self.hms_table(db, name).await
    }

    fn location(ident: &TableIdent, t: &Struct) -> Result<String> {
        metastore::iceberg_location("hive", ident, &Self::parameters(t))
    }

    async fn database_location(&self, db: &str) -> Result<String> {
        HiveCatalog::database_location(self, db).await
    }

    /// The Metastore table pointing at `location`.
    async fn create(&self, ident: &TableIdent, db: &str, name: &str, metadata: &TableMetadata, location: &str) -> Result<()> {
        let now = chrono::Utc::now().timestamp() as i32;
        let mut t = Struct::of([
            (table::NAME, Value::str(name)),
            (table::DB, Value::str(db)),
            (table::OWNER, Value::str(user())),
            (table::CREATE_TIME, Value::I32(now)),
            (table::LAST_ACCESS_TIME, Value::I32(now)),
            (table::RETENTION, Value::I32(i32::MAX)),
            (table::SD, Value::Struct(storage_descriptor(metadata))),
            (table::PARTITION_KEYS, Value::struct_list(Vec::new())),
            (table::PARAMETERS, Value::string_map([])),
            (table::TABLE_TYPE, Value::str("EXTERNAL_TABLE")),
        ]);
        set_parameters(&mut t, None, metadata, location, None);
        match self.call("create_table", vec![Value::Struct(t)], Idempotent::No).await {
            Ok(_) => {}
            Err(e) => {
                return Err(match e {
                    CallError::Declared { field: 1, .. } => Error::catalog("hive", format!("table {ident} already exists"), false),
                    e => self.error(&format!("cannot create table {ident}"), e),
                });
            }
        }
        Ok(())
    }

    /// Under the Metastore's EXCLUSIVE table lock (see the module header for the protocol).
    /// `get_all_databases`, then per database `get_all_tables` and, for the names whose kind is not known yet (all of
    /// them at the first listing and every [`TableKinds::REFRESH_EVERY`]th), one `get_table_objects_by_name_req` for
    /// their parameters: only Iceberg tables are listed. A Metastore on Derby takes ~6 ms a table object, so a lake's
    /// steady listing is one call per database.
    async fn list_iceberg_tables(&self) -> Result<(Vec<TableIdent>, usize)> {
        let refresh = {
            let mut k = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
            k.listings += 1;
            let refresh = k.listings % TableKinds::REFRESH_EVERY == 1;
            if refresh {
                k.iceberg.clear();
            }
            refresh
        };
        let (mut out, mut calls) = (Vec::new(), 1);
        let mut seen = std::collections::HashSet::new();
        for db in self.string_list("get_all_databases", vec![]).await? {
            calls += 1;
            let names = self.string_list("get_all_tables", vec![Value::str(db.clone())]).await?;
            let unknown: Vec<String> = {
                let k = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
                names.iter().filter(|n| refresh || !k.iceberg.contains_key(&(db.clone(), (*n).clone()))).cloned().collect()
            };
            if !unknown.is_empty() {
                calls += 1;
                let req = Struct::of([
                    (1, Value::str(db.clone())),
                    (2, Value::List { elem: 11, items: unknown.iter().cloned().map(Value::str).collect() }),
                ]);
                let tables = match self.call("get_table_objects_by_name_req", vec![Value::Struct(req)], Idempotent::Yes).await {
                    Ok(Some(Value::Struct(result))) => match result.get(1) {
                        Some(Value::List { items, .. }) => items.clone(),
                        _ => Vec::new(),
                    },
                    Ok(_) => Vec::new(),
                    Err(e) => return Err(self.error(&format!("cannot list the tables of database {db}"), e)),
                };
                let mut k = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
                for t in tables {
                    let Value::Struct(t) = t else { continue };
                    if let Some(name) = t.string(table::NAME) {
                        k.iceberg.insert((db.clone(), name), metastore::is_iceberg(&Self::parameters(&t)));
                    }
                }
            }
            let k = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
            for name in names {
                if k.iceberg.get(&(db.clone(), name.clone())) == Some(&true) {
                    out.push(TableIdent::from_strs([db.as_str(), name.as_str()])?);
                }
                seen.insert((db.clone(), name));
            }
        }
        // forget tables that are gone: a table created again under a gone name is asked about afresh
        self.kinds.lock().unwrap_or_else(|p| p.into_inner()).iceberg.retain(|key, _| seen.contains(key));
        Ok((out, calls))
    }

    /// `alter_table_with_environment_context` with the record's database and name changed (the table is external:
    /// the Metastore moves no file).
    async fn rename(&self, from: (&str, &str), to: (&str, &str)) -> Result<()> {
        let (db, name) = from;
        let mut t = self.hms_table(db, name).await?.ok_or_else(|| Error::TableNotFound { catalog: self.label(), table: format!("{db}.{name}") })?;
        self.database_location(to.0).await?;
        t.set(table::DB, Value::str(to.0));
        t.set(table::NAME, Value::str(to.1));
        let env = Struct::of([(1, Value::string_map([("DO_NOT_UPDATE_STATS", "true")]))]);
        let args = vec![Value::str(db), Value::str(name), Value::Struct(t), Value::Struct(env)];
        self.call("alter_table_with_environment_context", args, Idempotent::No)
            .await
            .map(|_| ())
            .map_err(|e| self.error(&format!("cannot rename table {db}.{name} to {}.{}", to.0, to.1), e))
    }

    /// `drop_table` with `deleteData = false`.
    async fn drop(&self, db: &str, name: &str) -> Result<bool> {
        match self.call("drop_table", vec![Value::str(db), Value::str(name), Value::Bool(false)], Idempotent::No).await {
            Ok(_) => Ok(true),
            Err(CallError::Declared { field: 1, .. }) => Ok(false), // NoSuchObjectException
            Err(e) => Err(self.error(&format!("cannot drop table {db}.{name}"), e)),
        }
    }

    async fn swap(&self, change: &Change<'_>) -> std::result::Result<(), Refusal> {
        let (db, name) = (change.db, change.name);
        let lock = self.lock(db, name).await.map_err(Refusal::Refused)?;
        let outcome = self.swap_locked(change).await;
        self.unlock(lock).await;
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_name_a_thrift_endpoint() {
        let c = |u: &str| HiveCatalog::new(u, None, CdcStorageFactory::default(), HashMap::new()).map(|c| c.addr);
        assert_eq!(c("thrift://meta:9083").unwrap(), "meta:9083");
        assert_eq!(c("thrift://meta").unwrap(), "meta:9083");
        assert!(c("http://meta:9083").is_err());
        assert!(c("thrift://").is_err());
    }

    #[test]
    fn a_lock_wait_that_ran_out_names_the_holder_and_how_to_free_it() {
        // ShowLocksResponseElement: lockid 1, state 5 (1 = acquired), acquiredat 9, user 10, hostname 11, agentInfo 13
        let element = Struct::of([
            (1, Value::I64(41)),
            (5, Value::I32(1)),
            (8, Value::I64(1_000)),
            (9, Value::I64(1_000)),
            (10, Value::str("spark")),
            (11, Value::str("worker-3")),
            (13, Value::str("Iceberg-abc")),
        ]);
        let holder = LockHolder::of(&element, 1_000 + 125_000);
        let want = LockHolder {
            id: 41,
            acquired: true,
            user: "spark".into(),
            host: "worker-3".into(),
            agent: "Iceberg-abc".into(),
            age: Some(Duration::from_secs(125)),
        };
        assert_eq!(holder, want);
        let m = lock_timeout_message("db", "t", 42, Duration::from_secs(30), &[holder]);
        for needle in
            ["db.t", "our lock 42", "lock 41 of spark@worker-3", "agent Iceberg-abc", "held for 2m 5s", "30s (lock_timeout)", "`unlock` call"]
        {
            assert!(m.contains(needle), "{needle} missing from: {m}");
        }
        // a Metastore that does not tell still gets a message that says where to look
        assert!(lock_timeout_message("db", "t", 42, Duration::from_secs(30), &[]).contains("SHOW LOCKS"));
    }

    #[test]
    fn the_lock_timeout_is_a_catalog_key() {
        let c = |v: &str| HiveCatalog::new("thrift://m:1", None, CdcStorageFactory::default(), HashMap::from([(LOCK_TIMEOUT_KEY.into(), v.into())]));
        let cat = c("45s").unwrap();
        assert_eq!(cat.lock_timeout, Duration::from_secs(45));
        assert!(!cat.props.contains_key(LOCK_TIMEOUT_KEY), "not a storage property");
        assert!(c("soon").is_err());
    }

    #[test]
    fn namespaces_are_one_level() {
        assert!(metastore::db_and_name(HiveCatalog::NAME, &TableIdent::from_strs(["a", "b", "t"]).unwrap()).is_err());
        assert_eq!(metastore::db_and_name(HiveCatalog::NAME, &TableIdent::from_strs(["a", "t"]).unwrap()).unwrap(), ("a".into(), "t".into()));
    }
}

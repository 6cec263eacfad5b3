//! Library errors. Each variant knows whether retrying can help and which process exit code it maps to, so the
//! CLI can tell a user (and systemd) apart "fix your input" from "try again later".
use std::path::PathBuf;

/// Process exit codes, one per class of failure (documented in README).
pub mod exit {
    /// Success.
    pub const OK: i32 = 0;
    /// A bug.
    pub const INTERNAL: i32 = 1;
    /// Bad command-line arguments.
    pub const USAGE: i32 = 2;
    /// An invalid configuration, or work too large for it.
    pub const CONFIG: i32 = 3;
    /// A table does not exist.
    pub const NOT_FOUND: i32 = 4;
    /// A snapshot range or recorded progress that does not fit the source.
    pub const RANGE: i32 = 5;
    /// A snapshot needed was expired.
    pub const EXPIRED: i32 = 6;
    /// Key columns or a schema the target cannot follow.
    pub const SCHEMA: i32 = 7;
    /// A file cannot be read, or is missing.
    pub const DATA: i32 = 8;
    /// The catalog failed or refused, or a commit conflicted.
    pub const CATALOG: i32 = 9;
    /// A local or object-store I/O failure.
    pub const IO: i32 = 10;
    /// Stopped by a signal before finishing (nothing half-done).
    pub const CANCELLED: i32 = 11;
    /// Credentials missing, refused, or their issuer unreachable.
    pub const AUTH: i32 = 12;
    /// Kafka unreachable or refusing, or this instance fenced by another one of the same pipeline.
    pub const KAFKA: i32 = 13;
    /// The source's history was rewritten under the destination (rollback, replace, a new table under the name) and
    /// `on_history_rewrite = "stop"` asks to be told.
    pub const HISTORY: i32 = 14;
    /// `cdc status`: no instance of the service answers, or some of its pipelines are not running cleanly.
    pub const SERVICE: i32 = 15;
    /// `cdc sync` of table patterns: some tables failed (each said why); the others were synced.
    pub const PARTIAL: i32 = 16;
}

#[derive(Debug, thiserror::Error)]
/// Everything that can go wrong, classified: exit code, retryable or permanent, metric kind.
pub enum Error {
    #[error("invalid configuration:\n  - {}", .0.join("\n  - "))]
    /// The configuration is invalid: every problem found.
    Config(Vec<String>),

    #[error("cannot read config file {path}: {source}")]
    /// The configuration file cannot be read.
    ConfigFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },

    /// The catalog failed or refused a call.
    #[error("catalog error ({catalog}): {message}")]
    Catalog {
        /// The catalog's kind or name ("rest", "source", …).
        catalog: String,
        /// What failed, and how to fix it where that is known.
        message: String,
        /// Whether the same call may succeed later.
        retryable: bool,
        /// The underlying error, when there is one.
        #[source]
        cause: Option<Cause>,
    },

    /// Credentials missing or refused, or their issuer unreachable.
    #[error("authentication ({source_name}): {message}")]
    Auth {
        /// Where the credentials come from (a file, the metadata server, …).
        source_name: String,
        /// What failed, and how to fix it.
        message: String,
        /// Whether the same call may succeed later.
        retryable: bool,
        /// The underlying error, when there is one.
        #[source]
        cause: Option<Cause>,
    },

    /// Kafka unreachable or refusing a call.
    #[error("Kafka ({what}): {message}")]
    Kafka {
        /// The call that failed (connect, produce, commit, …).
        what: String,
        /// What failed, and how to fix it.
        message: String,
        /// Whether the same call may succeed later.
        retryable: bool,
        /// The underlying error, when there is one.
        #[source]
        cause: Option<Cause>,
    },

    #[error("another instance with transactional.id `{transactional_id}` took over this pipeline (fenced); this instance stops it — run one instance per pipeline, or give each its own `transactional_id`")]
    /// Another instance of the pipeline took over its Kafka transactions.
    Fenced {
        /// The transactional id both use.
        transactional_id: String,
    },

    #[error("commit to `{table}` conflicted with another writer: {message}")]
    /// Another writer committed first, on every attempt.
    Conflict {
        /// The table (or sinks) concerned.
        table: String,
        /// What moved.
        message: String,
    },

    /// The catalog may or may not have applied a commit (a 5xx other than 503, a timeout or a dropped connection
    /// after the request was sent), and a reload did not show it applied. A request still in flight may yet land, so
    /// the files it references must not be deleted while it can.
    #[error("catalog error ({catalog}): commit state unknown and not applied when checked: {message}; run the sync again — it resumes from the progress the target records, whether or not this commit still lands")]
    CommitUnknown {
        /// The catalog.
        catalog: String,
        /// What the catalog answered.
        message: String,
    },

    #[error("table `{table}` not found in catalog `{catalog}`; check `table` (namespace.table) and the catalog settings")]
    /// A table does not exist.
    TableNotFound {
        /// The catalog looked in.
        catalog: String,
        /// The table, `namespace.table`.
        table: String,
    },

    #[error("snapshot {snapshot} does not exist in table `{table}`; it may have been expired (expire_snapshots) — run `cdc snapshots` to list the snapshots that remain")]
    /// A snapshot does not exist (any more).
    SnapshotNotFound {
        /// The table.
        table: String,
        /// The snapshot id.
        snapshot: i64,
    },

    #[error("invalid snapshot range: {0}")]
    /// The snapshot range (or the progress a destination records) does not fit the source.
    Range(String),

    #[error("the history of `{table}` was rewritten under `{target}` ({kind}): the target is at source snapshot {from}, which is not on the history of {to}. `on_history_rewrite = \"stop\"` asks to be told; to follow it, set `on_history_rewrite = \"follow\"` under [source] (or the pipeline's source) and run again: one commit brings the target to the source's state at {to}")]
    /// The source's history no longer runs through the destination's progress and the policy is to stop.
    HistoryRewritten {
        /// The source table.
        table: String,
        /// The destination.
        target: String,
        /// What happened (rollback, rewrite, replace, recreate).
        kind: &'static str,
        /// The source snapshot the destination records.
        from: String,
        /// The source snapshot it would be brought to.
        to: i64,
    },

    #[error("service: {0}")]
    /// `cdc status`: what is wrong with the running service (not reachable, pipelines failing).
    Service(String),

    #[error("{} of {total} tables failed ({}); the others were synced — fix what each error above says and run again (synced tables resume from their progress)", failed.len(), failed.join(", "))]
    /// `cdc sync` of table patterns: these tables failed, each reported as it did.
    Partial {
        /// The tables that failed.
        failed: Vec<String>,
        /// The tables the patterns matched.
        total: usize,
    },

    #[error("key columns: {0}")]
    /// The key columns cannot be resolved.
    Key(String),

    #[error("schema: {0}")]
    /// A schema the target cannot follow.
    Schema(String),

    /// A data, delete or metadata file that cannot be read as what it should be.
    #[error("cannot read {path}: {message}")]
    Data {
        /// The file.
        path: String,
        /// What is wrong with it.
        message: String,
        /// The underlying error, when there is one.
        #[source]
        cause: Option<Cause>,
    },

    #[error("{path} is {format} ({content}), by the table's manifest: the file is not corrupt, but `cdc` reads Parquet data and delete files only so far. Rewrite the table in Parquet to replicate it (Spark: ALTER TABLE … SET TBLPROPERTIES ('write.format.default'='parquet', 'write.delete.format.default'='parquet'), then CALL <catalog>.system.rewrite_data_files(table => '…', options => map('rewrite-all','true')) and rewrite_position_delete_files), and start the range after that rewrite")]
    /// A data or delete file in a format `cdc` does not read (ORC, Avro).
    UnsupportedFormat {
        /// The file.
        path: String,
        /// Its format, as the manifest names it.
        format: String,
        /// What it holds (data, position deletes, equality deletes).
        content: String,
    },

    #[error("file {path} is missing; it was deleted outside of Iceberg, or by snapshot expiration")]
    /// A file the metadata references is gone.
    MissingFile {
        /// The file.
        path: String,
    },

    #[error("the changes of snapshot {snapshot} in `{table}` cannot be computed: its parent {parent} was expired and file {path}, which the snapshot removed or still needs, was deleted with it; start the range at or after this snapshot (--from-snapshot {snapshot})")]
    /// A snapshot's changes need files its expired parent took with it.
    ExpiredParent {
        /// The table.
        table: String,
        /// The snapshot whose changes are wanted.
        snapshot: i64,
        /// Its expired parent.
        parent: i64,
        /// A file that is gone.
        path: String,
    },

    /// Reading or writing a file or an object failed.
    #[error("I/O error on {path}: {message}")]
    Io {
        /// The file or object concerned.
        path: String,
        /// What failed, and how to fix it.
        message: String,
        /// Whether the same call may succeed later.
        retryable: bool,
        /// The underlying error, when there is one.
        #[source]
        cause: Option<Cause>,
    },

    #[error("iceberg: {0}")]
    /// An error of iceberg-rust's.
    Iceberg(#[from] iceberg::Error),

    #[error("stopped by a shutdown request before committing; nothing of the interrupted commit was applied")]
    /// A shutdown request stopped the run before its commit.
    Cancelled,

    /// The work does not fit what the engine can hold as configured (`engine.memory_budget`), or at all.
    #[error("{what}: {fix}")]
    TooLarge {
        /// What does not fit.
        what: String,
        /// The setting that makes it fit.
        fix: String,
    },

    /// An Arrow computation failed (a bug, or data Arrow cannot handle).
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),

    /// A bug: something that should not happen did.
    #[error("{0}")]
    Internal(String),

    /// A bug met through another error (a task that panicked, a builder that refused what we built): `what` was
    /// being done; the error beneath is kept.
    #[error("{what}: {cause}")]
    Failed {
        /// What was being done.
        what: String,
        /// The error beneath.
        #[source]
        cause: Cause,
    },
}

/// The error beneath one of ours, kept for `source()` chains.
#[derive(Debug)]
pub struct Cause(Box<dyn std::error::Error + Send + Sync>);

impl Cause {
    fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Cause(Box::new(e))
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// A result with our [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether the same call may succeed later without the user changing anything.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Catalog { retryable, .. } | Error::Io { retryable, .. } | Error::Auth { retryable, .. } | Error::Kafka { retryable, .. } => {
                *retryable
            }
            Error::Conflict { .. } | Error::CommitUnknown { .. } => true,
            Error::Iceberg(e) => e.retryable(),
            _ => false,
        }
    }

    /// A short name of the error's class, for metrics labels and structured logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Config(_) | Error::ConfigFile { .. } => "config",
            Error::TooLarge { .. } => "too_large",
            Error::Catalog { .. } | Error::CommitUnknown { .. } => "catalog",
            Error::Auth { .. } => "auth",
            Error::Kafka { .. } => "kafka",
            Error::Fenced { .. } => "fenced",
            Error::Conflict { .. } => "conflict",
            Error::TableNotFound { .. } => "not_found",
            Error::SnapshotNotFound { .. } | Error::ExpiredParent { .. } => "expired",
            Error::Range(_) => "range",
            Error::HistoryRewritten { .. } => "history_rewritten",
            Error::Service(_) => "service",
            Error::Partial { .. } => "partial",
            Error::Key(_) | Error::Schema(_) => "schema",
            Error::Data { .. } | Error::MissingFile { .. } => "data",
            Error::UnsupportedFormat { .. } => "unsupported_format",
            Error::Io { .. } => "io",
            Error::Iceberg(_) => "iceberg",
            Error::Cancelled => "cancelled",
            Error::Internal(_) | Error::Failed { .. } | Error::Arrow(_) => "internal",
        }
    }

    /// Whether a pipeline should stop on this error until its configuration (or the tables) change: retrying the
    /// same poll cannot succeed. A missing table or an unreachable catalog may come back, so those are retried.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Error::Config(_)
                | Error::TooLarge { .. }
                | Error::Key(_)
                | Error::Schema(_)
                | Error::Range(_)
                | Error::HistoryRewritten { .. }
                | Error::SnapshotNotFound { .. }
                | Error::ExpiredParent { .. }
                | Error::Fenced { .. }
                | Error::UnsupportedFormat { .. }
        )
    }

    /// Whether a file the operation read was not there (deleted — by another writer's expiry, or outside Iceberg).
    pub fn is_missing_file(&self) -> bool {
        match self {
            Error::MissingFile { .. } => true,
            Error::Data { message, .. } => message.contains("No such file"),
            Error::Iceberg(e) => e.to_string().contains("No such file"),
            _ => false,
        }
    }

    /// The process exit code of this error (see [`exit`]).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_) | Error::ConfigFile { .. } | Error::TooLarge { .. } => exit::CONFIG,
            Error::Catalog { .. } | Error::Conflict { .. } | Error::CommitUnknown { .. } => exit::CATALOG,
            Error::Auth { .. } => exit::AUTH,
            Error::Kafka { .. } | Error::Fenced { .. } => exit::KAFKA,
            Error::TableNotFound { .. } => exit::NOT_FOUND,
            Error::SnapshotNotFound { .. } => exit::EXPIRED,
            Error::Range(_) => exit::RANGE,
            Error::HistoryRewritten { .. } => exit::HISTORY,
            Error::Service(_) => exit::SERVICE,
            Error::Partial { .. } => exit::PARTIAL,
            Error::Key(_) | Error::Schema(_) => exit::SCHEMA,
            Error::Data { .. } | Error::MissingFile { .. } | Error::UnsupportedFormat { .. } => exit::DATA,
            Error::ExpiredParent { .. } => exit::EXPIRED,
            Error::Io { .. } => exit::IO,
            Error::Iceberg(e) => match e.kind() {
                iceberg::ErrorKind::TableNotFound | iceberg::ErrorKind::NamespaceNotFound => exit::NOT_FOUND,
                iceberg::ErrorKind::DataInvalid => exit::DATA,
                _ => exit::INTERNAL,
            },
            Error::Internal(_) | Error::Failed { .. } | Error::Arrow(_) => exit::INTERNAL,
            Error::Cancelled => exit::CANCELLED,
        }
    }

    /// File `path` cannot be read: `message` says why.
    pub fn data(path: impl Into<String>, message: impl std::fmt::Display) -> Self {
        Error::Data { path: path.into(), message: message.to_string(), cause: None }
    }

    /// A bug met through `e` while doing `what` ([`Error::Failed`]).
    pub fn failed<E: std::error::Error + Send + Sync + 'static>(what: impl Into<String>, e: E) -> Self {
        Error::Failed { what: what.into(), cause: Cause::new(e) }
    }

    /// The file at `path` could not be read or decoded because of `e`, which stays the error's cause.
    pub fn data_from<E: std::error::Error + Send + Sync + 'static>(path: impl Into<String>, e: E) -> Self {
        Error::data(path, &e).with_cause(e)
    }

    /// Catalog `catalog` failed: `message` says how (add the underlying error with [`Error::with_cause`]).
    pub fn catalog(catalog: impl Into<String>, message: impl std::fmt::Display, retryable: bool) -> Self {
        Error::Catalog { catalog: catalog.into(), message: message.to_string(), retryable, cause: None }
    }

    /// An I/O error `e` on `path` (kept as the source).
    pub fn io<E: std::error::Error + Send + Sync + 'static>(path: impl Into<String>, e: E, retryable: bool) -> Self {
        Error::Io { path: path.into(), message: e.to_string(), retryable, cause: Some(Cause::new(e)) }
    }

    /// The same error with `e` as its source (on variants that keep one: catalog, auth, Kafka, data, I/O).
    pub fn with_cause<E: std::error::Error + Send + Sync + 'static>(mut self, e: E) -> Self {
        match &mut self {
            Error::Catalog { cause, .. }
            | Error::Auth { cause, .. }
            | Error::Kafka { cause, .. }
            | Error::Data { cause, .. }
            | Error::Io { cause, .. } => *cause = Some(Cause::new(e)),
            _ => {}
        }
        self
    }
}

impl Error {
    /// An error writing or reading the local spill file at `path` (an `io::Error` or Arrow's). An I/O failure there (a full disk, most often)
    /// is the user's to fix, in `engine.spill_dir`: it names the file and takes the I/O exit code; anything else
    /// Arrow reports stays internal.
    pub(crate) fn spill(path: &std::path::Path, e: impl Into<arrow_schema::ArrowError>) -> Error {
        match e.into() {
            arrow_schema::ArrowError::IoError(_, io) => Error::Io {
                path: path.display().to_string(),
                message: format!("{io} (a spill file: give engine.spill_dir more room or point it at a larger disk)"),
                retryable: false,
                cause: Some(Cause::new(io)),
            },
            other => Error::from(other),
        }
    }
}

impl From<parquet::errors::ParquetError> for Error {
    fn from(e: parquet::errors::ParquetError) -> Self {
        Error::Data { path: String::from("<parquet>"), message: e.to_string(), cause: Some(Cause::new(e)) }
    }
}

/// Names the file of an I/O failure: `std::fs::write(&p, b).at(&p)?`.
pub(crate) trait AtPath<T> {
    /// The result, its error an [`Error::Io`] on `path` (not retryable) keeping the `io::Error` as its source.
    fn at(self, path: impl AsRef<std::path::Path>) -> Result<T>;
}

impl<T> AtPath<T> for std::io::Result<T> {
    fn at(self, path: impl AsRef<std::path::Path>) -> Result<T> {
        self.map_err(|e| Error::io(path.as_ref().display().to_string(), e, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_spill_disk_names_the_file_and_is_an_io_error() {
        let full = std::io::Error::from_raw_os_error(28); // ENOSPC
        let e = Error::spill(std::path::Path::new("/var/tmp/cdc-spill-1.arrow"), arrow_schema::ArrowError::from(full));
        assert_eq!(e.exit_code(), exit::IO);
        assert!(!e.is_retryable());
        let msg = e.to_string();
        assert!(msg.contains("/var/tmp/cdc-spill-1.arrow") && msg.contains("engine.spill_dir"), "{msg}");
        // what is not I/O stays an internal error
        let other = Error::spill(std::path::Path::new("/x"), arrow_schema::ArrowError::ComputeError("bad".into()));
        assert_eq!(other.exit_code(), exit::INTERNAL);
    }
}

//! Library errors. Each variant knows whether retrying can help and which process exit code it maps to, so the
//! CLI can tell a user (and systemd) apart "fix your input" from "try again later".
use std::path::PathBuf;

/// Process exit codes, one per class of failure (documented in README).
pub mod exit {
    pub const OK: i32 = 0;
    pub const INTERNAL: i32 = 1;
    pub const USAGE: i32 = 2;
    pub const CONFIG: i32 = 3;
    pub const NOT_FOUND: i32 = 4;
    pub const RANGE: i32 = 5;
    pub const EXPIRED: i32 = 6;
    pub const SCHEMA: i32 = 7;
    pub const DATA: i32 = 8;
    pub const CATALOG: i32 = 9;
    pub const IO: i32 = 10;
    /// Stopped by a signal before finishing (nothing half-done).
    pub const CANCELLED: i32 = 11;
    /// Credentials missing, refused, or their issuer unreachable.
    pub const AUTH: i32 = 12;
    /// Kafka unreachable or refusing, or this instance fenced by another one of the same pipeline.
    pub const KAFKA: i32 = 13;
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration:\n  - {}", .0.join("\n  - "))]
    Config(Vec<String>),

    #[error("cannot read config file {path}: {source}")]
    ConfigFile { path: PathBuf, source: std::io::Error },

    #[error("catalog error ({catalog}): {message}")]
    Catalog { catalog: String, message: String, retryable: bool },

    #[error("authentication ({source_name}): {message}")]
    Auth { source_name: String, message: String, retryable: bool },

    #[error("Kafka ({what}): {message}")]
    Kafka { what: String, message: String, retryable: bool },

    #[error("another instance with transactional.id `{transactional_id}` took over this pipeline (fenced); this instance stops it — run one instance per pipeline, or give each its own `transactional_id`")]
    Fenced { transactional_id: String },

    #[error("commit to `{table}` conflicted with another writer: {message}")]
    Conflict { table: String, message: String },

    /// The catalog may or may not have applied a commit (a 5xx other than 503, a timeout or a dropped connection
    /// after the request was sent), and a reload did not show it applied. A request still in flight may yet land, so
    /// the files it references must not be deleted while it can.
    #[error("catalog error ({catalog}): commit state unknown and not applied when checked: {message}; run the sync again — it resumes from the progress the target records, whether or not this commit still lands")]
    CommitUnknown { catalog: String, message: String },

    #[error("table `{table}` not found in catalog `{catalog}`; check `table` (namespace.table) and the catalog settings")]
    TableNotFound { catalog: String, table: String },

    #[error("snapshot {snapshot} does not exist in table `{table}`; it may have been expired (expire_snapshots) — run `cdc snapshots` to list the snapshots that remain")]
    SnapshotNotFound { table: String, snapshot: i64 },

    #[error("invalid snapshot range: {0}")]
    Range(String),

    #[error("key columns: {0}")]
    Key(String),

    #[error("schema: {0}")]
    Schema(String),

    #[error("cannot read {path}: {message}")]
    Data { path: String, message: String },

    #[error("file {path} is missing; it was deleted outside of Iceberg, or by snapshot expiration")]
    MissingFile { path: String },

    #[error("the changes of snapshot {snapshot} in `{table}` cannot be computed: its parent {parent} was expired and file {path}, which the snapshot removed or still needs, was deleted with it; start the range at or after this snapshot (--from-snapshot {snapshot})")]
    ExpiredParent { table: String, snapshot: i64, parent: i64, path: String },

    #[error("I/O error on {path}: {message}")]
    Io { path: String, message: String, retryable: bool },

    #[error("iceberg: {0}")]
    Iceberg(#[from] iceberg::Error),

    #[error("stopped by a shutdown request before committing; nothing of the interrupted commit was applied")]
    Cancelled,

    /// The work does not fit what the engine can hold as configured (`engine.memory_budget`), or at all.
    #[error("{what}: {fix}")]
    TooLarge { what: String, fix: String },

    #[error("{0}")]
    Internal(String),
}

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
            Error::Key(_) | Error::Schema(_) => "schema",
            Error::Data { .. } | Error::MissingFile { .. } => "data",
            Error::Io { .. } => "io",
            Error::Iceberg(_) => "iceberg",
            Error::Cancelled => "cancelled",
            Error::Internal(_) => "internal",
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
                | Error::SnapshotNotFound { .. }
                | Error::ExpiredParent { .. }
                | Error::Fenced { .. }
        )
    }

    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_) | Error::ConfigFile { .. } | Error::TooLarge { .. } => exit::CONFIG,
            Error::Catalog { .. } | Error::Conflict { .. } | Error::CommitUnknown { .. } => exit::CATALOG,
            Error::Auth { .. } => exit::AUTH,
            Error::Kafka { .. } | Error::Fenced { .. } => exit::KAFKA,
            Error::TableNotFound { .. } => exit::NOT_FOUND,
            Error::SnapshotNotFound { .. } => exit::EXPIRED,
            Error::Range(_) => exit::RANGE,
            Error::Key(_) | Error::Schema(_) => exit::SCHEMA,
            Error::Data { .. } | Error::MissingFile { .. } => exit::DATA,
            Error::ExpiredParent { .. } => exit::EXPIRED,
            Error::Io { .. } => exit::IO,
            Error::Iceberg(e) => match e.kind() {
                iceberg::ErrorKind::TableNotFound | iceberg::ErrorKind::NamespaceNotFound => exit::NOT_FOUND,
                iceberg::ErrorKind::DataInvalid => exit::DATA,
                _ => exit::INTERNAL,
            },
            Error::Internal(_) => exit::INTERNAL,
            Error::Cancelled => exit::CANCELLED,
        }
    }

    pub fn data(path: impl Into<String>, message: impl std::fmt::Display) -> Self {
        Error::Data { path: path.into(), message: message.to_string() }
    }

    pub fn catalog(catalog: impl Into<String>, e: impl std::fmt::Display, retryable: bool) -> Self {
        Error::Catalog { catalog: catalog.into(), message: e.to_string(), retryable }
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
            },
            other => Error::from(other),
        }
    }
}

impl From<arrow_schema::ArrowError> for Error {
    fn from(e: arrow_schema::ArrowError) -> Self {
        Error::Internal(format!("arrow: {e}"))
    }
}

impl From<parquet::errors::ParquetError> for Error {
    fn from(e: parquet::errors::ParquetError) -> Self {
        Error::Data { path: String::from("<parquet>"), message: e.to_string() }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io { path: String::new(), message: e.to_string(), retryable: false }
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

//! One handle over the catalogs we read from and write to: Spark/Java's filesystem layout (`hadoop`), iceberg-rust's
//! SQL catalog on sqlite (`sql`, the embedded default), any Iceberg REST catalog (`rest`), a Hive Metastore
//! (`hive`) and the AWS Glue Data Catalog (`glue`).
//!
//! Commits of hand-built snapshots (row deltas) go through [`Catalog::commit`]: iceberg-rust 0.10.1 keeps
//! `TableCommit` sealed, so for file-based catalogs we apply the updates to the metadata ourselves and swap the
//! pointer atomically (a new `vN.metadata.json` for hadoop, a compare-and-set row update for sql).
pub(crate) mod glue;
mod hadoop;
pub(crate) mod hive;
mod metastore;
pub(crate) mod rest;
mod sql_marks;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use iceberg::io::FileIO;
use iceberg::spec::TableMetadata;
use iceberg::table::Table;
use iceberg::{Catalog as _, CatalogBuilder, MetadataLocation, NamespaceIdent, TableCreation, TableIdent};
use iceberg::{TableRequirement, TableUpdate};
use iceberg_catalog_sql::{SqlCatalog, SqlCatalogBuilder};

use crate::auth::TokenSource;
use crate::config::{split_table_name, CatalogConfig, CatalogType};
use crate::error::{Error, Result};
use crate::storage::{self, CdcStorageFactory};

pub use glue::GlueCatalog;
pub use hadoop::HadoopCatalog;
pub use hive::HiveCatalog;

/// Default name of the sqlite catalog (the `catalog_name` column of its tables).
pub const SQL_DEFAULT_NAME: &str = "cdc";
const SQL_NAME_PROP: &str = "name";

/// A connected catalog: where tables are found, loaded, created and committed to.
pub enum Catalog {
    /// Spark/Java's filesystem layout (`hadoop`).
    Hadoop(HadoopCatalog),
    /// iceberg-rust's SQL catalog on sqlite (the embedded default).
    Sql {
        /// The catalog.
        inner: SqlCatalog,
        /// Its database, for the compare-and-set commits iceberg-rust does not offer.
        pool: sqlx::SqlitePool,
        /// Its name (the `catalog_name` column).
        name: String,
        /// How its tables' storage is reached (credentials for `gs://` warehouses).
        storage: CdcStorageFactory,
        /// The idle check's own read-only connection ([`Catalog::cheap_metadata_location`]).
        marks: sql_marks::SqlMarks,
    },
    /// An Iceberg REST catalog (BigLake, Polaris, the reference server, …).
    Rest(Arc<rest::RestClient>),
    /// A Hive Metastore (Iceberg Java's `HiveCatalog` protocol).
    Hive(HiveCatalog),
    /// The AWS Glue Data Catalog (Iceberg Java's `GlueCatalog` protocol).
    Glue(GlueCatalog),
}

pub(crate) fn local_file_io() -> FileIO {
    storage::file_io(CdcStorageFactory::default(), &HashMap::new())
}

/// Storage for a file-based catalog: Google tokens for `gs://` when `auth = "google"`.
fn storage_factory(cfg: &CatalogConfig) -> CdcStorageFactory {
    let google = cfg.props.get(rest::keys::AUTH).is_some_and(|a| a == "google");
    let creds: Option<Arc<dyn storage::StorageCredentials>> =
        google.then(|| Arc::new(storage::GoogleStorageToken(TokenSource::google(cfg.props.get(rest::keys::GOOGLE_CREDENTIALS_FILE).cloned()))) as _);
    CdcStorageFactory::with_credentials(creds)
}

fn strip_file_scheme(p: &str) -> String {
    p.strip_prefix("file://").or_else(|| p.strip_prefix("file:")).unwrap_or(p).to_string()
}

impl Catalog {
    /// `label` names the catalog in messages ("source", "target").
    pub async fn connect(cfg: &CatalogConfig, label: &str) -> Result<Catalog> {
        // every table's manifests are read through a catalog: bound the Avro decoder before the first
        crate::spec::bound_avro_allocations();
        let warehouse = cfg.warehouse.clone().unwrap_or_default();
        match cfg.kind {
            CatalogType::Hadoop => Ok(Catalog::Hadoop(HadoopCatalog::new(strip_file_scheme(&warehouse), local_file_io()))),
            CatalogType::Sql => {
                let wh = strip_file_scheme(&warehouse);
                if !storage::is_object_store(&wh) {
                    std::fs::create_dir_all(&wh)
                        .map_err(|e| Error::catalog(label, format!("cannot create warehouse {wh}: {e}"), false).with_cause(e))?;
                }
                let mut props: HashMap<String, String> = cfg.props.clone().into_iter().collect();
                let name = props.remove(SQL_NAME_PROP).unwrap_or_else(|| SQL_DEFAULT_NAME.to_string());
                let uri = props.remove("uri").unwrap_or_else(|| format!("sqlite:{wh}/catalog.db"));
                // sqlx only creates a missing sqlite file when asked to.
                let uri = if uri.contains('?') || uri.contains(":memory:") { uri } else { format!("{uri}?mode=rwc") };
                props.insert("uri".into(), uri.clone());
                props.insert("warehouse".into(), wh.clone());
                let storage = storage_factory(cfg);
                let inner = SqlCatalogBuilder::default()
                    .with_storage_factory(Arc::new(storage.clone()))
                    .load(name.clone(), props)
                    .await
                    .map_err(|e| Error::catalog(label, format!("sqlite catalog {uri}: {e}"), false).with_cause(e))?;
                let pool = sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(2)
                    .connect(&uri)
                    .await
                    .map_err(|e| Error::catalog(label, format!("sqlite catalog {uri}: {e}"), false).with_cause(e))?;
                // WAL: other processes reading the catalog (Spark's JdbcCatalog keeps read transactions open) must
                // not block our compare-and-set commits. The mode is stored in the database file.
                let _ = sqlx::query("PRAGMA journal_mode=WAL").execute(&pool).await;
                Ok(Catalog::Sql { inner, pool, name, storage, marks: sql_marks::SqlMarks::new(&uri) })
            }
            CatalogType::Hive => {
                let uri = cfg.props.get("uri").map(String::as_str).unwrap_or_default();
                let props = cfg.props.iter().filter(|(k, _)| k.as_str() != "uri").map(|(k, v)| (k.clone(), v.clone())).collect();
                Ok(Catalog::Hive(HiveCatalog::new(uri, cfg.warehouse.clone(), storage_factory(cfg), props)?))
            }
            CatalogType::Glue => Ok(Catalog::Glue(GlueCatalog::new(&cfg.props, cfg.warehouse.clone(), storage_factory(cfg))?)),
            CatalogType::Rest | CatalogType::Biglake => {
                let props = cfg.rest_props();
                Ok(Catalog::Rest(rest::RestClient::connect(&props, label).await?))
            }
        }
    }

    /// The connected catalog for `cfg`, shared by every caller that names the same one (same kind and keys) while any
    /// of them holds it: a service with thousands of pipelines on one catalog keeps one client, one connection pool,
    /// one token — not one each.
    pub async fn shared(cfg: &CatalogConfig, label: &str) -> Result<Arc<Catalog>> {
        use std::sync::{Mutex, OnceLock, Weak};
        type Slot = Arc<tokio::sync::Mutex<Weak<Catalog>>>;
        static SHARED: OnceLock<Mutex<HashMap<String, Slot>>> = OnceLock::new();
        let key = format!("{cfg:?}");
        let slot = {
            let mut map = SHARED.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner());
            map.retain(|k, s| *k == key || Arc::strong_count(s) > 1 || s.try_lock().is_ok_and(|w| w.strong_count() > 0));
            map.entry(key).or_default().clone()
        };
        // one connect per catalog: callers arriving while it runs (a service starting thousands of loops) wait for it
        let mut held = slot.lock().await;
        if let Some(c) = held.upgrade() {
            return Ok(c);
        }
        let c = Arc::new(Catalog::connect(cfg, label).await?);
        *held = Arc::downgrade(&c);
        Ok(c)
    }

    fn ident(name: &str) -> Result<TableIdent> {
        let (ns, t) = split_table_name(name);
        TableIdent::from_strs(ns.iter().map(String::as_str).chain(std::iter::once(t.as_str())))
            .map_err(|e| Error::Config(vec![format!("table name `{name}`: {e}")]))
    }

    /// Every file under `prefix` in `table`'s storage (recursively, with its modification time), reached with the
    /// credentials this catalog gives the table.
    pub(crate) async fn list_files(&self, table: &Table, prefix: &str) -> Result<Vec<storage::Listed>> {
        let factory = match self {
            Catalog::Hadoop(_) => CdcStorageFactory::default(),
            Catalog::Sql { storage, .. } => storage.clone(),
            Catalog::Rest(c) => c.storage_factory(table.identifier()).await?,
            Catalog::Hive(h) => h.storage(),
            Catalog::Glue(g) => g.storage(),
        };
        factory.storage_for(table.file_io()).list(prefix).await.map_err(Error::from)
    }

    /// Loads table `name` (`namespace.table`); [`Error::TableNotFound`] when it does not exist.
    pub async fn load_table(&self, name: &str) -> Result<Table> {
        let ident = Self::ident(name)?;
        let res = match self {
            Catalog::Hadoop(h) => return h.load_table(&ident).await,
            Catalog::Sql { inner, .. } => inner.load_table(&ident).await,
            Catalog::Rest(c) => return c.load_table(&ident).await,
            Catalog::Hive(h) => return h.load_table(&ident).await,
            Catalog::Glue(g) => return g.load_table(&ident).await,
        };
        res.map_err(|e| self.map_load_error(name, e))
    }

    /// The table's current metadata location when the catalog can tell it without loading the metadata (hadoop:
    /// one `stat`, a listing when the directory changed; sql: one row, read on the caller's task; hive, glue: one
    /// catalog call; REST: a conditional load answered `304 Not Modified`, when the server sends ETags), so a poll
    /// that finds nothing new costs next to nothing. `Ok(None)`: this catalog cannot tell cheaply (a REST server
    /// without ETags), or the table does not exist.
    pub async fn cheap_metadata_location(&self, name: &str) -> Result<Option<String>> {
        let ident = Self::ident(name)?;
        match self {
            Catalog::Hadoop(h) => Ok(h.metadata_location(&ident)),
            Catalog::Sql { pool, name: catalog, marks, .. } => {
                // on this task, without sqlx's thread hop; sqlx when that cannot tell
                if let Some(found) = marks.metadata_location(catalog, &ident.namespace().join("."), ident.name()) {
                    return Ok(found);
                }
                let row: Option<(Option<String>,)> =
                    sqlx::query_as("SELECT metadata_location FROM iceberg_tables WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?")
                        .bind(catalog)
                        .bind(ident.namespace().join("."))
                        .bind(ident.name())
                        .fetch_optional(pool)
                        .await
                        .map_err(|e| Error::catalog("sql", e, true))?;
                Ok(row.and_then(|r| r.0))
            }
            Catalog::Hive(h) => h.metadata_location(&ident).await,
            Catalog::Glue(g) => g.metadata_location(&ident).await,
            Catalog::Rest(c) => c.unchanged_location(&ident).await,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Catalog::Hadoop(_) => "hadoop",
            Catalog::Sql { .. } => "sql",
            Catalog::Rest(_) => "rest",
            Catalog::Hive(_) => "hive",
            Catalog::Glue(_) => "glue",
        }
    }

    fn map_load_error(&self, name: &str, e: iceberg::Error) -> Error {
        let msg = e.to_string();
        let not_found = matches!(e.kind(), iceberg::ErrorKind::TableNotFound | iceberg::ErrorKind::NamespaceNotFound)
            || msg.contains("No such table")
            || msg.contains("does not exist")
            || msg.contains("NoSuchTable")
            || msg.contains("NoSuchNamespace");
        if not_found {
            Error::TableNotFound { catalog: self.label().into(), table: name.into() }
        } else {
            let retryable = e.retryable() || msg.contains("error sending request") || msg.contains("connect");
            Error::catalog(self.label(), msg, retryable)
        }
    }

    /// Creates the namespace when missing, then the table.
    pub async fn create_table(&self, name: &str, creation: TableCreation) -> Result<Table> {
        let ident = Self::ident(name)?;
        let ns = ident.namespace().clone();
        match self {
            Catalog::Hadoop(h) => h.create_table(&ident, creation).await,
            Catalog::Hive(h) => h.create_table(&ident, creation).await,
            Catalog::Glue(g) => g.create_table(&ident, creation).await,
            Catalog::Sql { inner, .. } => Self::create_via(inner, &ns, creation).await,
            Catalog::Rest(c) => {
                // Servers take the format version from this property.
                let mut creation = creation;
                let v = match creation.format_version {
                    iceberg::spec::FormatVersion::V1 => "1",
                    iceberg::spec::FormatVersion::V2 => "2",
                    iceberg::spec::FormatVersion::V3 => "3",
                };
                creation.properties.insert("format-version".into(), v.into());
                if !c.namespace_exists(&ns).await? {
                    c.create_namespace(&ns).await?;
                }
                c.create_table(&ns, creation).await
            }
        }
    }

    async fn create_via(c: &impl iceberg::Catalog, ns: &NamespaceIdent, creation: TableCreation) -> Result<Table> {
        if !c.namespace_exists(ns).await? {
            if let Err(e) = c.create_namespace(ns, HashMap::new()).await {
                // another writer may have created it meanwhile; only a namespace that still is missing is an error
                if !c.namespace_exists(ns).await.unwrap_or(false) {
                    return Err(e.into());
                }
            }
        }
        Ok(c.create_table(ns, creation).await?)
    }

    /// Applies `updates` to `table` if `requirements` still hold, atomically. Returns the reloaded table.
    pub async fn commit(&self, table: &Table, requirements: Vec<TableRequirement>, updates: Vec<TableUpdate>) -> Result<Table> {
        let committed = self.swap(table, requirements, updates).await?;
        if !matches!(self, Catalog::Rest(_)) {
            // a REST server does this itself, as Iceberg Java's catalogs do
            delete_removed_metadata_files(table.file_io(), table.metadata(), committed.metadata()).await;
        }
        Ok(committed)
    }

    async fn swap(&self, table: &Table, requirements: Vec<TableRequirement>, updates: Vec<TableUpdate>) -> Result<Table> {
        match self {
            Catalog::Hadoop(h) => h.commit(table, requirements, updates).await,
            Catalog::Hive(_) | Catalog::Glue(_) => {
                let new_snapshot = updates.iter().find_map(|u| match u {
                    TableUpdate::AddSnapshot { snapshot } => Some(snapshot.snapshot_id()),
                    _ => None,
                });
                let res = match self {
                    Catalog::Hive(h) => h.commit(table, requirements, updates).await,
                    Catalog::Glue(g) => g.commit(table, requirements, updates).await,
                    _ => unreachable!("matched above"),
                };
                match res {
                    Err(e @ Error::CommitUnknown { .. }) => self.applied_or(table.identifier(), new_snapshot, e).await,
                    other => other,
                }
            }
            Catalog::Sql { pool, name, .. } => {
                let ident = table.identifier();
                let current = table.metadata_location_result()?.to_string();
                let new_meta = apply_updates(table.metadata(), &current, &requirements, updates)?;
                let loc = MetadataLocation::from_str(&current)?.with_next_version().with_new_metadata(&new_meta);
                new_meta.write_to(table.file_io(), &loc).await?;
                let new_loc = loc.to_string();
                let res = sqlx::query(
                    "UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = ? \
                     WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? AND metadata_location = ?",
                )
                .bind(&new_loc)
                .bind(&current)
                .bind(name)
                .bind(ident.namespace().join("."))
                .bind(ident.name())
                .bind(&current)
                .execute(pool)
                .await
                .map_err(|e| Error::catalog("sql", e, true))?;
                if res.rows_affected() == 0 {
                    return Err(Error::Conflict { table: ident.to_string(), message: "the table changed since it was loaded".into() });
                }
                self.load_table(&table_name(ident)).await
            }
            Catalog::Rest(committer) => {
                let ident = table.identifier();
                let new_snapshot = updates.iter().find_map(|u| match u {
                    TableUpdate::AddSnapshot { snapshot } => Some(snapshot.snapshot_id()),
                    _ => None,
                });
                match committer.commit(ident, &requirements, &updates).await? {
                    rest::CommitOutcome::Committed => self.load_table(&table_name(ident)).await,
                    rest::CommitOutcome::Conflict(m) => Err(Error::Conflict { table: ident.to_string(), message: m }),
                    rest::CommitOutcome::Unknown(m) => {
                        self.applied_or(ident, new_snapshot, Error::CommitUnknown { catalog: "rest".into(), message: m }).await
                    }
                    rest::CommitOutcome::Unavailable(m) => self.applied_or(ident, new_snapshot, Error::catalog("rest", m, true)).await,
                }
            }
        }
    }

    /// After a commit whose answer did not say it applied: the reloaded table if it holds `snapshot` (the server
    /// applied it after all), else `otherwise`.
    async fn applied_or(&self, ident: &TableIdent, snapshot: Option<i64>, otherwise: Error) -> Result<Table> {
        let t = self.load_table(&table_name(ident)).await?;
        match snapshot {
            Some(id) if t.metadata().snapshot_by_id(id).is_some() => Ok(t),
            _ => Err(otherwise),
        }
    }
}

fn table_name(ident: &TableIdent) -> String {
    format!("{}.{}", ident.namespace().join("."), ident.name())
}

/// Table property: delete metadata files that drop out of the metadata log after a commit (Iceberg's name).
pub(crate) const METADATA_DELETE_AFTER_COMMIT: &str = "write.metadata.delete-after-commit.enabled";
/// Table property: how many previous metadata files the metadata log keeps (Iceberg's name; default 100).
pub(crate) const METADATA_PREVIOUS_VERSIONS_MAX: &str = "write.metadata.previous-versions-max";

/// With [`METADATA_DELETE_AFTER_COMMIT`] on the committed table: deletes the metadata files that were in `before`'s
/// metadata log but are no longer in `after`'s (which keeps [`METADATA_PREVIOUS_VERSIONS_MAX`] entries), as Iceberg
/// Java's catalogs do after a commit. Only files that left the log go: the current and every logged file stay, so a
/// reader or committer working from any of them is unaffected. Best effort: a file that cannot be deleted is an
/// orphan, never an error of the commit that already landed.
async fn delete_removed_metadata_files(io: &FileIO, before: &TableMetadata, after: &TableMetadata) {
    if !storage::truthy(after.properties().get(METADATA_DELETE_AFTER_COMMIT)) {
        return;
    }
    let kept: std::collections::HashSet<&str> = after.metadata_log().iter().map(|e| e.metadata_file.as_str()).collect();
    for old in before.metadata_log().iter().filter(|e| !kept.contains(e.metadata_file.as_str())) {
        if let Err(e) = io.delete(&old.metadata_file).await {
            tracing::debug!(file = %old.metadata_file, error = %e, "could not delete an old metadata file; it stays as an orphan");
        }
    }
}

/// Checks the requirements against `meta` and applies the updates, as a catalog server would.
pub fn apply_updates(
    meta: &TableMetadata,
    current_location: &str,
    requirements: &[TableRequirement],
    updates: Vec<TableUpdate>,
) -> Result<TableMetadata> {
    for r in requirements {
        r.check(Some(meta)).map_err(|e| Error::Conflict { table: meta.location().to_string(), message: e.to_string() })?;
    }
    let mut builder = meta.clone().into_builder(Some(current_location.to_string()));
    for u in updates {
        builder = u.apply(builder)?;
    }
    Ok(builder.build()?.metadata)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn loops_starting_together_share_one_connected_catalog() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("[source]\ntable = \"db.t\"\n[source.catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n", dir.path().display());
        let cfg = crate::config::Config::parse(&text).unwrap().source.catalog;
        // a burst of callers, as at a service's start: one connect, one catalog
        let all = futures::future::join_all((0..64).map(|_| {
            let cfg = cfg.clone();
            tokio::spawn(async move { Catalog::shared(&cfg, "source").await.unwrap() })
        }))
        .await;
        let first = all[0].as_ref().unwrap().clone();
        assert!(all.iter().all(|c| Arc::ptr_eq(c.as_ref().unwrap(), &first)), "every caller got the same catalog");
        // once nobody holds it, the next caller connects afresh
        let weak = Arc::downgrade(&first);
        drop(first);
        drop(all);
        assert!(weak.upgrade().is_none());
        let again = Catalog::shared(&cfg, "source").await.unwrap();
        assert_eq!(Arc::strong_count(&again), 1);
    }
}

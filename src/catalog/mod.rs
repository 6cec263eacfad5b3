//! One handle over the catalogs we read from and write to: Spark/Java's filesystem layout (`hadoop`), iceberg-rust's
//! SQL catalog on sqlite (`sql`, the embedded default), any Iceberg REST catalog (`rest`), a Hive Metastore
//! (`hive`) and the AWS Glue Data Catalog (`glue`).
//!
//! Commits of hand-built snapshots (row deltas) go through [`Catalog::commit`]: iceberg-rust 0.10.1 keeps
//! `TableCommit` sealed, so for file-based catalogs we apply the updates to the metadata ourselves and swap the
//! pointer atomically (a new `vN.metadata.json` for hadoop, a compare-and-set row update for sql).
#[cfg(feature = "glue")]
pub(crate) mod glue;
mod hadoop;
#[cfg(feature = "hive")]
pub(crate) mod hive;
#[cfg(any(feature = "hive", feature = "glue"))]
mod metastore;
pub(crate) mod rest;
mod sql;
mod sql_marks;

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::io::FileIO;
use iceberg::spec::TableMetadata;
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableCreation, TableIdent};
use iceberg::{TableRequirement, TableUpdate};

use crate::auth::TokenSource;
use crate::config::{split_table_name, CatalogConfig, CatalogType};
use crate::error::{Error, Result};
use crate::storage::{self, CdcStorageFactory};

#[cfg(feature = "glue")]
pub use glue::GlueCatalog;
pub use hadoop::HadoopCatalog;
#[cfg(feature = "hive")]
pub use hive::HiveCatalog;

/// Default name of the sqlite catalog (the `catalog_name` column of its tables).
pub const SQL_DEFAULT_NAME: &str = sql::DEFAULT_NAME;

/// The backends: each module owns its keys (`validate`) and its construction (`connect`). Adding one: a module
/// implementing [`Backend`] with those two functions, a [`CatalogType`] variant, and its line in this match and in
/// [`Catalog::connect`]'s.
impl CatalogConfig {
    /// Adds the problems of this section (named `field`) to `p`: its backend's, and those of the keys they share.
    pub fn validate(&self, field: &str, p: &mut Vec<String>) {
        match self.kind {
            CatalogType::Hadoop => hadoop::validate(self, field, p),
            CatalogType::Sql => sql::validate(self, field, p),
            CatalogType::Rest => rest::validate(self, field, p),
            CatalogType::Biglake => rest::validate_biglake(self, field, p),
            #[cfg(feature = "hive")]
            CatalogType::Hive => hive::validate(self, field, p),
            #[cfg(feature = "glue")]
            CatalogType::Glue => glue::validate(self, field, p),
            #[cfg(not(feature = "hive"))]
            CatalogType::Hive => p.push(format!("{field}.type: {}", left_out("hive"))),
            #[cfg(not(feature = "glue"))]
            CatalogType::Glue => p.push(format!("{field}.type: {}", left_out("glue"))),
        }
        if let Some(a) = self.props.get(rest::keys::AUTH) {
            if a != "google" {
                p.push(format!(
                    "{field}.auth: `{a}` — the only value is `google` (Application Default Credentials); leave it out for `token`/`credential`"
                ));
            }
        }
    }
}

/// One kind of catalog, connected: where its tables are found, loaded, created and committed to. `ident`s come
/// checked ([`Catalog`] builds them from `namespace.table` names).
#[async_trait::async_trait]
pub(crate) trait Backend: Send + Sync {
    /// How the files of `table` are reached (with the credentials this catalog gives it).
    async fn storage(&self, table: &Table) -> Result<CdcStorageFactory>;
    /// Loads a table; [`Error::TableNotFound`] when it does not exist.
    async fn load_table(&self, ident: &TableIdent) -> Result<Table>;
    /// The table's current metadata location when the catalog can tell it without loading the metadata (see
    /// [`Catalog::cheap_metadata_location`]); `Ok(None)`: it cannot tell cheaply, or there is no such table.
    async fn metadata_location(&self, ident: &TableIdent) -> Result<Option<String>>;
    /// Creates the namespace when missing, then the table.
    async fn create_table(&self, ident: &TableIdent, creation: TableCreation) -> Result<Table>;
    /// Applies `updates` to `table` if `requirements` still hold, atomically.
    async fn swap(&self, table: &Table, requirements: Vec<TableRequirement>, updates: Vec<TableUpdate>) -> Result<Swapped>;
    /// Every table of the catalog (nested namespaces included, paginated lists followed to the end) and how many
    /// catalog calls that took: what table patterns are matched against.
    async fn list_tables(&self) -> Result<(Vec<TableIdent>, usize)> {
        Err(Error::Config(vec!["this kind of catalog cannot list its tables yet: name each table in its own pipeline".into()]))
    }
    /// Renames table `from` to `to` (creating `to`'s namespace when missing); its files stay where they are.
    async fn rename_table(&self, from: &TableIdent, _to: &TableIdent) -> Result<()> {
        Err(Error::catalog("catalog", format!("{from}: this kind of catalog cannot rename tables"), false))
    }
    /// Removes table `ident` from the catalog (its data files stay, as Iceberg's `DROP TABLE` without `PURGE`);
    /// [`Error::TableNotFound`] when it does not exist.
    async fn drop_table(&self, ident: &TableIdent) -> Result<()> {
        Err(Error::catalog("catalog", format!("{ident}: this kind of catalog cannot drop tables"), false))
    }
    /// A catalog server (REST): it deletes metadata files that leave the metadata log itself, and a load renews
    /// what it vends (storage credentials).
    fn is_server(&self) -> bool {
        false
    }
}

/// Why a catalog of kind `feature` cannot be used by a build without that cargo feature.
#[cfg(not(all(feature = "hive", feature = "glue")))]
fn left_out(feature: &str) -> String {
    format!("this cdc was built without the `{feature}` catalog; build it with `--features {feature}` (on by default)")
}

/// How a [`Backend::swap`] ended.
pub(crate) enum Swapped {
    /// It applied: the table as it is now.
    Done(Table),
    /// The catalog did not say whether it applied: done if the table now holds the commit's snapshot, else this error.
    Unsure(Error),
}

/// A connected catalog: where tables are found, loaded, created and committed to.
pub struct Catalog {
    backend: Box<dyn Backend>,
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
        let backend = match cfg.kind {
            CatalogType::Hadoop => hadoop::connect(cfg),
            CatalogType::Sql => sql::connect(cfg, label).await?,
            CatalogType::Rest | CatalogType::Biglake => rest::connect(cfg, label).await?,
            #[cfg(feature = "hive")]
            CatalogType::Hive => hive::connect(cfg)?,
            #[cfg(feature = "glue")]
            CatalogType::Glue => glue::connect(cfg)?,
            #[cfg(not(feature = "hive"))]
            CatalogType::Hive => return Err(Error::Config(vec![left_out("hive")])),
            #[cfg(not(feature = "glue"))]
            CatalogType::Glue => return Err(Error::Config(vec![left_out("glue")])),
        };
        Ok(Catalog { backend })
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
        let factory = self.backend.storage(table).await?;
        factory.storage_for(table.file_io()).list(prefix).await.map_err(Error::from)
    }

    /// Loads table `name` (`namespace.table`); [`Error::TableNotFound`] when it does not exist.
    pub async fn load_table(&self, name: &str) -> Result<Table> {
        self.backend.load_table(&Self::ident(name)?).await
    }

    /// Every table of the catalog as `namespace.table` names (sorted), and how many catalog calls listing them took.
    pub async fn list_tables(&self) -> Result<(Vec<String>, usize)> {
        let (idents, calls) = self.backend.list_tables().await?;
        let mut names: Vec<String> = idents.iter().map(table_name).collect();
        names.sort();
        names.dedup();
        Ok((names, calls))
    }

    /// Whether this is a catalog server (REST): it deletes old metadata files itself, and a load renews what it
    /// vends, so the table a sink holds is no substitute for a load.
    pub(crate) fn is_server(&self) -> bool {
        self.backend.is_server()
    }

    /// The table's current metadata location when the catalog can tell it without loading the metadata (hadoop:
    /// one `stat`, a listing when the directory changed; sql: one row, read on the caller's task; hive, glue: one
    /// catalog call; REST: a conditional load answered `304 Not Modified`, when the server sends ETags), so a poll
    /// that finds nothing new costs next to nothing. `Ok(None)`: this catalog cannot tell cheaply (a REST server
    /// without ETags), or the table does not exist.
    pub async fn cheap_metadata_location(&self, name: &str) -> Result<Option<String>> {
        self.backend.metadata_location(&Self::ident(name)?).await
    }

    /// Table `name` as of metadata file `location` (as [`Self::cheap_metadata_location`] told), read with `io` (the
    /// storage of an earlier load of it, whose identifier is `ident`), keeping only the snapshots from sequence
    /// number `since` on and those the table names ([`crate::spec::recent`]); also returns how many snapshots were
    /// left out, and what the next load of the table's next metadata file can reuse (`memo`: what the last load
    /// returned). A file that cannot be read or trimmed that way (compressed, unexpected) is loaded in full through
    /// the catalog, which reports any error.
    pub(crate) async fn load_recent(
        &self,
        name: &str,
        io: &FileIO,
        ident: &TableIdent,
        location: &str,
        since: i64,
        memo: Option<&crate::spec::recent::Memo>,
    ) -> Result<(Table, usize, Option<crate::spec::recent::Memo>)> {
        let read = async {
            let bytes = io.new_input(location).ok()?.read().await.ok()?;
            if bytes.starts_with(&[0x1f, 0x8b]) {
                return None; // gzip: the catalog's own load decompresses it
            }
            crate::spec::recent::parse_recent(&bytes, since, memo).ok()
        };
        let Some((metadata, dropped, memo)) = read.await else { return Ok((self.load_table(name).await?, 0, None)) };
        Ok((table_of(ident, location, metadata, io.clone())?, dropped, memo))
    }

    /// Renames table `from` to `to` (both `namespace.table`); the table keeps its uuid, files and history.
    pub(crate) async fn rename_table(&self, from: &str, to: &str) -> Result<()> {
        self.backend.rename_table(&Self::ident(from)?, &Self::ident(to)?).await
    }

    /// Removes table `name` from the catalog; its data files stay. [`Error::TableNotFound`] when it does not exist.
    pub(crate) async fn drop_table(&self, name: &str) -> Result<()> {
        self.backend.drop_table(&Self::ident(name)?).await
    }

    /// Creates the namespace when missing, then the table.
    pub async fn create_table(&self, name: &str, creation: TableCreation) -> Result<Table> {
        self.backend.create_table(&Self::ident(name)?, creation).await
    }

    /// Applies `updates` to `table` if `requirements` still hold, atomically. Returns the reloaded table.
    pub async fn commit(&self, table: &Table, requirements: Vec<TableRequirement>, updates: Vec<TableUpdate>) -> Result<Table> {
        let new_snapshot = updates.iter().find_map(|u| match u {
            TableUpdate::AddSnapshot { snapshot } => Some(snapshot.snapshot_id()),
            _ => None,
        });
        let committed = match self.backend.swap(table, requirements, updates).await? {
            Swapped::Done(t) => t,
            Swapped::Unsure(e) => self.applied_or(table.identifier(), new_snapshot, e).await?,
        };
        if !self.backend.is_server() {
            // a REST server does this itself, as Iceberg Java's catalogs do
            delete_removed_metadata_files(table.file_io(), table.metadata(), committed.metadata()).await;
        }
        Ok(committed)
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

/// `ident` as of its metadata file `location` holding `metadata` (read from it, or just written to it by a commit:
/// a metadata file never changes once it is committed, so a commit's result need not be read back), read through
/// `io`.
pub(crate) fn table_of(ident: &TableIdent, location: impl Into<String>, metadata: TableMetadata, io: FileIO) -> Result<Table> {
    Ok(Table::builder()
        .identifier(ident.clone())
        .metadata(metadata)
        .metadata_location(location.into())
        .file_io(io)
        .runtime(iceberg::Runtime::try_current()?)
        .build()?)
}

/// What a failed load of `name` from an iceberg-rust catalog of kind `kind` is: [`Error::TableNotFound`] when the
/// table or its namespace does not exist, else a catalog error (retryable when the request did not get through).
pub(crate) fn load_error(kind: &str, name: &str, e: iceberg::Error) -> Error {
    let msg = e.to_string();
    let not_found = matches!(e.kind(), iceberg::ErrorKind::TableNotFound | iceberg::ErrorKind::NamespaceNotFound)
        || msg.contains("No such table")
        || msg.contains("does not exist")
        || msg.contains("NoSuchTable")
        || msg.contains("NoSuchNamespace");
    if not_found {
        Error::TableNotFound { catalog: kind.into(), table: name.into() }
    } else {
        let retryable = e.retryable() || msg.contains("error sending request") || msg.contains("connect");
        Error::catalog(kind, msg, retryable)
    }
}

/// Creates the namespace when missing (another writer may create it meanwhile), then the table, in an iceberg-rust
/// catalog.
pub(crate) async fn create_via(c: &impl iceberg::Catalog, ns: &NamespaceIdent, creation: TableCreation) -> Result<Table> {
    ensure_namespace(c, ns).await?;
    Ok(c.create_table(ns, creation).await?)
}

/// Creates namespace `ns` of an iceberg-rust catalog when missing (another writer may create it meanwhile).
pub(crate) async fn ensure_namespace(c: &impl iceberg::Catalog, ns: &NamespaceIdent) -> Result<()> {
    if !c.namespace_exists(ns).await? {
        if let Err(e) = c.create_namespace(ns, HashMap::new()).await {
            // another writer may have created it meanwhile; only a namespace that still is missing is an error
            if !c.namespace_exists(ns).await.unwrap_or(false) {
                return Err(e.into());
            }
        }
    }
    Ok(())
}

/// `namespace.table` of `ident`.
pub(crate) fn table_name(ident: &TableIdent) -> String {
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

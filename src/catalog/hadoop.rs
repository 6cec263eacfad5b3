//! The filesystem catalog layout written by Spark/Java's `HadoopCatalog`:
//! `<warehouse>/<ns>/<table>/metadata/vN.metadata.json` plus `version-hint.text` holding N.
//! Commits create `v{N+1}.metadata.json` with a no-clobber link, which is the atomic step: two writers racing for
//! the same N cannot both win.
//!
//! The current version is the hint's and any version written after it (a writer may die between its metadata file
//! and the hint), one `stat` each; the directory is listed only without a usable hint, since a listing grows with
//! the table's history. The cheap check of a table's current version ([`HadoopCatalog::metadata_location`], every
//! idle poll) looks again only when the directory changed: every commit adds an entry (the new version, the renamed
//! hint), which moves the directory's mtime. A version found is remembered with that mtime only once the mtime is
//! [`SETTLED`] old, so a commit landing within the timestamp granularity of the one found cannot hide behind an
//! equal mtime (git's "racy clean" rule). A commit returns the table as it wrote it, without reading it back.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use iceberg::io::FileIO;
use iceberg::spec::{TableMetadata, TableMetadataBuilder};
use iceberg::table::Table;
use iceberg::{TableCreation, TableIdent, TableRequirement, TableUpdate};

use super::{Backend, Swapped};
use crate::config::CatalogConfig;
use crate::error::{AtPath, Error, Result};

const VERSION_HINT: &str = "version-hint.text";

/// How deep namespaces nest at most in a warehouse walk ([`Backend::list_tables`]).
const MAX_NAMESPACE_DEPTH: usize = 8;

/// How old a metadata directory's mtime must be before a listing is trusted for as long as the mtime stays.
const SETTLED: Duration = Duration::from_secs(2);

/// Tables in Spark/Java's filesystem layout: `<warehouse>/<namespace>/<table>/metadata/vN.metadata.json`.
pub struct HadoopCatalog {
    warehouse: PathBuf,
    file_io: FileIO,
    /// Per metadata directory: its (settled) mtime when it was last listed, and the version found then.
    listed: Mutex<HashMap<PathBuf, (SystemTime, u64)>>,
}

impl HadoopCatalog {
    /// The catalog rooted at `warehouse`, reading and writing through `file_io`.
    pub fn new(warehouse: impl Into<PathBuf>, file_io: FileIO) -> Self {
        HadoopCatalog { warehouse: warehouse.into(), file_io, listed: Mutex::default() }
    }

    fn table_dir(&self, ident: &TableIdent) -> PathBuf {
        let mut p = self.warehouse.clone();
        for n in ident.namespace().iter() {
            p.push(n);
        }
        p.push(ident.name());
        p
    }

    /// Highest committed version. With a hint naming a version that exists: that one and any a writer added after it
    /// (it may have died between the metadata file and the hint), one `stat` each, as Iceberg Java finds it — a
    /// listing would grow with the table's history. Without a usable hint: the largest `vN.metadata.json` listed (or
    /// the hint, when it is larger).
    fn current_version(meta_dir: &Path) -> Option<u64> {
        let version_file = |v: u64| meta_dir.join(format!("v{v}.metadata.json"));
        let hint = std::fs::read_to_string(meta_dir.join(VERSION_HINT)).ok().and_then(|s| s.trim().parse::<u64>().ok());
        if let Some(mut v) = hint.filter(|&h| version_file(h).is_file()) {
            while version_file(v + 1).is_file() {
                v += 1;
            }
            return Some(v);
        }
        let from_files = std::fs::read_dir(meta_dir)
            .ok()?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().to_string();
                n.strip_prefix('v')?.strip_suffix(".metadata.json")?.parse::<u64>().ok()
            })
            .max();
        match (hint, from_files) {
            (Some(h), Some(f)) => Some(h.max(f)),
            (h, f) => h.or(f),
        }
    }

    /// The current metadata file of a table, without reading it (None: no such table). One `stat` while the
    /// metadata directory has not changed since a listing (see the module docs).
    pub fn metadata_location(&self, ident: &TableIdent) -> Option<String> {
        let meta_dir = self.table_dir(ident).join("metadata");
        let location = |v: u64| meta_dir.join(format!("v{v}.metadata.json")).display().to_string();
        let mtime = std::fs::metadata(&meta_dir).and_then(|m| m.modified()).ok();
        let mut listed = self.listed.lock().unwrap_or_else(|p| p.into_inner());
        match (mtime, listed.get(&meta_dir)) {
            (Some(now), Some(&(then, version))) if now == then => return Some(location(version)),
            _ => {
                listed.remove(&meta_dir);
            }
        }
        drop(listed);
        let version = Self::current_version(&meta_dir)?;
        let settled = mtime.filter(|m| SystemTime::now().duration_since(*m).is_ok_and(|age| age >= SETTLED));
        if let Some(m) = settled {
            self.listed.lock().unwrap_or_else(|p| p.into_inner()).insert(meta_dir.clone(), (m, version));
        }
        Some(location(version))
    }

    /// Loads the highest metadata version of `ident`.
    pub async fn load_table(&self, ident: &TableIdent) -> Result<Table> {
        let meta_dir = self.table_dir(ident).join("metadata");
        let not_found = || Error::TableNotFound { catalog: format!("hadoop:{}", self.warehouse.display()), table: ident.to_string() };
        let version = Self::current_version(&meta_dir).ok_or_else(not_found)?;
        let path = meta_dir.join(format!("v{version}.metadata.json"));
        let text = std::fs::read(&path).map_err(|e| Error::data_from(path.display().to_string(), e))?;
        let metadata: TableMetadata = serde_json::from_slice(&text)
            .map_err(|e| Error::data(path.display().to_string(), format!("invalid table metadata: {e}")).with_cause(e))?;
        super::table_of(ident, path.display().to_string(), metadata, self.file_io.clone())
    }

    /// Creates `ident` (version 1); an error when it exists.
    pub async fn create_table(&self, ident: &TableIdent, creation: TableCreation) -> Result<Table> {
        let dir = self.table_dir(ident);
        let meta_dir = dir.join("metadata");
        if Self::current_version(&meta_dir).is_some() {
            return Err(Error::catalog("hadoop", format!("table {ident} already exists at {}", dir.display()), false));
        }
        std::fs::create_dir_all(&meta_dir).at(&meta_dir)?;
        let creation = TableCreation { location: Some(dir.display().to_string()), ..creation };
        let metadata = TableMetadataBuilder::from_table_creation(creation)?.build()?.metadata;
        self.write_version(&meta_dir, 1, &metadata)?;
        self.load_table(ident).await
    }

    /// Applies `updates` when `requirements` hold, as metadata version N+1 (exactly one writer wins a version), and
    /// returns the table as of that version (the metadata written, not read back).
    pub async fn commit(&self, table: &Table, requirements: Vec<TableRequirement>, updates: Vec<TableUpdate>) -> Result<Table> {
        let current = table.metadata_location_result()?.to_string();
        let meta_dir = Path::new(&current).parent().map(Path::to_path_buf).unwrap_or_default();
        let version: u64 = Path::new(&current)
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix('v')?.strip_suffix(".metadata.json")?.parse().ok())
            .ok_or_else(|| Error::Internal(format!("not a hadoop metadata file: {current}")))?;
        let new_meta = super::apply_updates(table.metadata(), &current, &requirements, updates)?;
        self.write_version(&meta_dir, version + 1, &new_meta)?;
        let written = meta_dir.join(format!("v{}.metadata.json", version + 1));
        super::table_of(table.identifier(), written.display().to_string(), new_meta, self.file_io.clone())
    }

    fn write_version(&self, meta_dir: &Path, version: u64, metadata: &TableMetadata) -> Result<()> {
        let json = serde_json::to_vec(metadata).map_err(|e| Error::failed("encoding table metadata", e))?;
        let tmp = meta_dir.join(format!(".v{version}-{}.tmp", uuid::Uuid::new_v4()));
        if let Err(e) = std::fs::write(&tmp, &json) {
            let _ = std::fs::remove_file(&tmp); // a full disk leaves a partial file: never leave it behind
            return Err(Error::io(tmp.display().to_string(), e, false));
        }
        let target = meta_dir.join(format!("v{version}.metadata.json"));
        // link(2) fails if the target exists: exactly one committer wins version N.
        let linked = std::fs::hard_link(&tmp, &target);
        let _ = std::fs::remove_file(&tmp);
        if let Err(e) = linked {
            return Err(if e.kind() == std::io::ErrorKind::AlreadyExists {
                Error::Conflict { table: meta_dir.display().to_string(), message: format!("version {version} was written by another writer") }
            } else {
                Error::io(target.display().to_string(), e, false)
            });
        }
        let hint_tmp = meta_dir.join(format!(".hint-{}.tmp", uuid::Uuid::new_v4()));
        // The commit has landed with the link: the version hint is only a hint (readers fall back to listing), so
        // failing to write it must not report the commit as failed — its caller would delete files it references.
        let hinted = std::fs::write(&hint_tmp, version.to_string()).and_then(|()| std::fs::rename(&hint_tmp, meta_dir.join(VERSION_HINT)));
        if let Err(e) = hinted {
            let _ = std::fs::remove_file(&hint_tmp);
            tracing::warn!(dir = %meta_dir.display(), version, error = %e, "committed, but the version hint could not be written; readers find the version by listing");
        }
        Ok(())
    }
}

/// The problems of a `hadoop` catalog section (named `field`).
pub(crate) fn validate(cfg: &CatalogConfig, field: &str, p: &mut Vec<String>) {
    if cfg.warehouse.as_deref().unwrap_or("").is_empty() {
        p.push(format!("{field}.warehouse: required for a hadoop catalog (the warehouse directory)"));
    }
    for k in cfg.props.keys() {
        p.push(format!("{field}.{k}: unknown key for a hadoop catalog (it only takes `warehouse`)"));
    }
    if let Some(w) = cfg.warehouse.as_deref().filter(|w| crate::storage::is_object_store(w)) {
        p.push(format!(
            "{field}.warehouse: `{w}` — a hadoop catalog works on local directories only; use a rest, biglake or sql catalog for object storage"
        ));
    }
}

/// The catalog of `cfg`'s warehouse directory.
pub(crate) fn connect(cfg: &CatalogConfig) -> Box<dyn Backend> {
    Box::new(HadoopCatalog::new(super::strip_file_scheme(cfg.warehouse.as_deref().unwrap_or_default()), super::local_file_io()))
}

#[async_trait::async_trait]
impl Backend for HadoopCatalog {
    async fn storage(&self, _: &Table) -> Result<crate::storage::CdcStorageFactory> {
        Ok(crate::storage::CdcStorageFactory::default())
    }
    async fn load_table(&self, ident: &TableIdent) -> Result<Table> {
        HadoopCatalog::load_table(self, ident).await
    }
    async fn metadata_location(&self, ident: &TableIdent) -> Result<Option<String>> {
        Ok(HadoopCatalog::metadata_location(self, ident))
    }
    /// A walk of the warehouse: a directory with a `metadata/` directory holding a version is a table, any other
    /// directory a namespace (hidden ones and those deeper than [`MAX_NAMESPACE_DEPTH`] are skipped). One listing
    /// per directory.
    async fn list_tables(&self) -> Result<(Vec<TableIdent>, usize)> {
        let (mut tables, mut calls, mut pending) = (Vec::new(), 0, vec![Vec::<String>::new()]);
        while let Some(ns) = pending.pop() {
            let mut dir = self.warehouse.clone();
            dir.extend(&ns);
            calls += 1;
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if ns.is_empty() => return Err(Error::data_from(dir.display().to_string(), e)),
                Err(_) => continue, // gone meanwhile
            };
            for e in entries.filter_map(|e| e.ok()).filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
                let name = e.file_name().to_string_lossy().to_string();
                if name.starts_with('.') || name.starts_with('_') {
                    continue;
                }
                if !ns.is_empty() && Self::current_version(&e.path().join("metadata")).is_some() {
                    tables.push(TableIdent::from_strs(ns.iter().map(String::as_str).chain([name.as_str()]))?);
                } else if ns.len() < MAX_NAMESPACE_DEPTH {
                    pending.push(ns.iter().cloned().chain([name]).collect());
                }
            }
        }
        Ok((tables, calls))
    }
    async fn create_table(&self, ident: &TableIdent, creation: TableCreation) -> Result<Table> {
        HadoopCatalog::create_table(self, ident, creation).await
    }
    /// The table's directory is the table: it goes, files and all (as Iceberg Java's `HadoopCatalog.dropTable`).
    async fn drop_table(&self, ident: &TableIdent) -> Result<()> {
        let dir = self.table_dir(ident);
        if Self::current_version(&dir.join("metadata")).is_none() {
            return Err(Error::TableNotFound { catalog: format!("hadoop:{}", self.warehouse.display()), table: ident.to_string() });
        }
        std::fs::remove_dir_all(&dir).map_err(|e| Error::data_from(dir.display().to_string(), e))
    }
    async fn swap(&self, table: &Table, requirements: Vec<TableRequirement>, updates: Vec<TableUpdate>) -> Result<Swapped> {
        self.commit(table, requirements, updates).await.map(Swapped::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sets `dir`'s mtime to `age` ago.
    fn age(dir: &Path, age: Duration) {
        let t = std::fs::File::open(dir).unwrap();
        t.set_modified(SystemTime::now() - age).unwrap();
    }

    #[test]
    fn the_cheap_check_lists_only_a_changed_directory() {
        let wh = tempfile::tempdir().unwrap();
        let meta = wh.path().join("ns").join("t").join("metadata");
        std::fs::create_dir_all(&meta).unwrap();
        std::fs::write(meta.join("v1.metadata.json"), "{}").unwrap();
        let catalog = HadoopCatalog::new(wh.path(), super::super::local_file_io());
        let ident = TableIdent::from_strs(["ns", "t"]).unwrap();
        let at = |v: u64| Some(meta.join(format!("v{v}.metadata.json")).display().to_string());

        // a directory changed just now is listed every time (nothing remembered)
        assert_eq!(catalog.metadata_location(&ident), at(1));
        std::fs::write(meta.join("v2.metadata.json"), "{}").unwrap();
        assert_eq!(catalog.metadata_location(&ident), at(2));

        // settled: remembered with its mtime; a file slipped in with the mtime put back is not seen (no listing) ...
        age(&meta, Duration::from_secs(60));
        assert_eq!(catalog.metadata_location(&ident), at(2));
        let settled = std::fs::metadata(&meta).unwrap().modified().unwrap();
        std::fs::write(meta.join("v3.metadata.json"), "{}").unwrap();
        std::fs::File::open(&meta).unwrap().set_modified(settled).unwrap();
        assert_eq!(catalog.metadata_location(&ident), at(2), "an unchanged mtime must answer without listing");

        // ... while any commit moves the mtime, and the next check lists again
        std::fs::write(meta.join("v4.metadata.json"), "{}").unwrap();
        assert_eq!(catalog.metadata_location(&ident), at(4));

        // a table that is gone is gone
        std::fs::remove_dir_all(wh.path().join("ns")).unwrap();
        assert_eq!(catalog.metadata_location(&ident), None);
    }

    #[test]
    fn the_version_is_the_hints_and_those_written_after_it_else_the_largest_listed() {
        let dir = tempfile::tempdir().unwrap();
        let meta = dir.path();
        let write = |v: u64| std::fs::write(meta.join(format!("v{v}.metadata.json")), "{}").unwrap();
        let hint = |v: &str| std::fs::write(meta.join(VERSION_HINT), v).unwrap();
        assert_eq!(HadoopCatalog::current_version(meta), None);
        write(1);
        write(2);
        assert_eq!(HadoopCatalog::current_version(meta), Some(2), "no hint: the largest listed");
        hint("1");
        assert_eq!(HadoopCatalog::current_version(meta), Some(2), "a writer died before its hint: the versions after it count");
        write(3);
        hint("3");
        assert_eq!(HadoopCatalog::current_version(meta), Some(3));
        // the hint's own file must exist for the hint to be used: v7 is missing, so the files are listed
        hint("7");
        assert_eq!(HadoopCatalog::current_version(meta), Some(7), "as before: a hint beyond the files wins a listing");
        hint("not a number");
        assert_eq!(HadoopCatalog::current_version(meta), Some(3));
        // past the hint, only consecutive versions are looked for (a gap means nobody committed there)
        hint("2");
        write(5);
        assert_eq!(HadoopCatalog::current_version(meta), Some(3));
    }

    #[tokio::test]
    async fn a_commit_returns_the_version_it_wrote_as_a_load_reads_it() {
        let wh = tempfile::tempdir().unwrap();
        let catalog = HadoopCatalog::new(wh.path(), super::super::local_file_io());
        let ident = TableIdent::from_strs(["ns", "t"]).unwrap();
        let schema = iceberg::spec::Schema::builder()
            .with_fields(vec![
                iceberg::spec::NestedField::required(1, "id", iceberg::spec::Type::Primitive(iceberg::spec::PrimitiveType::Long)).into()
            ])
            .build()
            .unwrap();
        let created = catalog.create_table(&ident, TableCreation::builder().name("t".into()).schema(schema).build()).await.unwrap();
        let update = TableUpdate::SetProperties { updates: [("k".to_string(), "v".to_string())].into() };
        let committed = catalog.commit(&created, vec![], vec![update]).await.unwrap();
        let loaded = catalog.load_table(&ident).await.unwrap();
        assert_eq!(committed.metadata_location(), loaded.metadata_location());
        assert!(committed.metadata_location().unwrap().ends_with("v2.metadata.json"));
        assert_eq!(committed.metadata(), loaded.metadata());
        assert_eq!(loaded.metadata().properties().get("k").map(String::as_str), Some("v"));
        // the returned table is the base of the next commit, as a loaded one would be
        let again = TableUpdate::SetProperties { updates: [("k".to_string(), "w".to_string())].into() };
        let next = catalog.commit(&committed, vec![], vec![again]).await.unwrap();
        assert!(next.metadata_location().unwrap().ends_with("v3.metadata.json"));
        assert!(matches!(catalog.commit(&committed, vec![], vec![]).await, Err(Error::Conflict { .. })), "a stale base loses its version");
    }
}

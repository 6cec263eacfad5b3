//! The filesystem catalog layout written by Spark/Java's `HadoopCatalog`:
//! `<warehouse>/<ns>/<table>/metadata/vN.metadata.json` plus `version-hint.text` holding N.
//! Commits create `v{N+1}.metadata.json` with a no-clobber link, which is the atomic step: two writers racing for
//! the same N cannot both win.
use std::path::{Path, PathBuf};

use iceberg::io::FileIO;
use iceberg::spec::{TableMetadata, TableMetadataBuilder};
use iceberg::table::Table;
use iceberg::{TableCreation, TableIdent, TableRequirement, TableUpdate};

use crate::error::{AtPath, Error, Result};

const VERSION_HINT: &str = "version-hint.text";

/// Tables in Spark/Java's filesystem layout: `<warehouse>/<namespace>/<table>/metadata/vN.metadata.json`.
pub struct HadoopCatalog {
    warehouse: PathBuf,
    file_io: FileIO,
}

impl HadoopCatalog {
    /// The catalog rooted at `warehouse`, reading and writing through `file_io`.
    pub fn new(warehouse: impl Into<PathBuf>, file_io: FileIO) -> Self {
        HadoopCatalog { warehouse: warehouse.into(), file_io }
    }

    fn table_dir(&self, ident: &TableIdent) -> PathBuf {
        let mut p = self.warehouse.clone();
        for n in ident.namespace().iter() {
            p.push(n);
        }
        p.push(ident.name());
        p
    }

    /// Highest committed version: the hint when present and valid, else the largest `vN.metadata.json`.
    fn current_version(meta_dir: &Path) -> Option<u64> {
        let from_files = std::fs::read_dir(meta_dir)
            .ok()?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().to_string();
                n.strip_prefix('v')?.strip_suffix(".metadata.json")?.parse::<u64>().ok()
            })
            .max();
        let hint = std::fs::read_to_string(meta_dir.join(VERSION_HINT)).ok().and_then(|s| s.trim().parse::<u64>().ok());
        // A writer may have died between the metadata file and the hint: the files are the truth.
        match (hint, from_files) {
            (Some(h), Some(f)) => Some(h.max(f)),
            (h, f) => h.or(f),
        }
    }

    /// The current metadata file of a table, without reading it (None: no such table).
    pub fn metadata_location(&self, ident: &TableIdent) -> Option<String> {
        let meta_dir = self.table_dir(ident).join("metadata");
        Self::current_version(&meta_dir).map(|v| meta_dir.join(format!("v{v}.metadata.json")).display().to_string())
    }

    /// Loads the highest metadata version of `ident`.
    pub async fn load_table(&self, ident: &TableIdent) -> Result<Table> {
        let meta_dir = self.table_dir(ident).join("metadata");
        let not_found = || Error::TableNotFound { catalog: format!("hadoop:{}", self.warehouse.display()), table: ident.to_string() };
        let version = Self::current_version(&meta_dir).ok_or_else(not_found)?;
        let path = meta_dir.join(format!("v{version}.metadata.json"));
        let text = std::fs::read(&path).map_err(|e| Error::data(path.display().to_string(), e))?;
        let metadata: TableMetadata = serde_json::from_slice(&text)
            .map_err(|e| Error::data(path.display().to_string(), format!("invalid table metadata: {e}")).with_cause(e))?;
        Ok(Table::builder()
            .identifier(ident.clone())
            .metadata(metadata)
            .metadata_location(path.display().to_string())
            .file_io(self.file_io.clone())
            .runtime(iceberg::Runtime::try_current()?)
            .build()?)
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

    /// Applies `updates` when `requirements` hold, as metadata version N+1 (exactly one writer wins a version).
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
        self.load_table(table.identifier()).await
    }

    fn write_version(&self, meta_dir: &Path, version: u64, metadata: &TableMetadata) -> Result<()> {
        let json = serde_json::to_vec(metadata).map_err(|e| Error::Internal(e.to_string()))?;
        let tmp = meta_dir.join(format!(".v{version}-{}.tmp", uuid::Uuid::new_v4()));
        std::fs::write(&tmp, &json).at(&tmp)?;
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
        std::fs::write(&hint_tmp, version.to_string()).at(&hint_tmp)?;
        std::fs::rename(&hint_tmp, meta_dir.join(VERSION_HINT)).at(meta_dir.join(VERSION_HINT))?;
        Ok(())
    }
}

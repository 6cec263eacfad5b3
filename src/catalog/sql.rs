//! iceberg-rust's SQL catalog on sqlite (`type = "sql"`, the embedded default): loads and creates through
//! iceberg-rust; commits of hand-built snapshots as a compare-and-set update of the table's row (iceberg-rust 0.10.1
//! keeps `TableCommit` sealed), the new metadata file written first.
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use iceberg::table::Table;
use iceberg::{Catalog as _, CatalogBuilder, MetadataLocation, TableCreation, TableIdent, TableRequirement, TableUpdate};
use iceberg_catalog_sql::SqlCatalogBuilder;

use super::sql_marks::SqlMarks;
use super::{apply_updates, create_via, ensure_namespace, load_error, strip_file_scheme, table_name, Backend, Swapped};
use crate::config::CatalogConfig;
use crate::error::{Error, Result};
use crate::storage::{self, CdcStorageFactory};

/// Default name of the catalog (the `catalog_name` column of its tables).
pub(crate) const DEFAULT_NAME: &str = "cdc";
const NAME_PROP: &str = "name";

/// A connected sqlite catalog.
struct SqlCatalog {
    inner: iceberg_catalog_sql::SqlCatalog,
    /// Its database, for the compare-and-set commits iceberg-rust does not offer.
    pool: sqlx::SqlitePool,
    /// Its name (the `catalog_name` column).
    name: String,
    /// How its tables' storage is reached (credentials for `gs://` warehouses).
    storage: CdcStorageFactory,
    /// The idle check's own read-only connection ([`Backend::metadata_location`]).
    marks: SqlMarks,
}

/// The problems of a `sql` catalog section (named `field`).
pub(crate) fn validate(cfg: &CatalogConfig, field: &str, p: &mut Vec<String>) {
    if cfg.warehouse.as_deref().unwrap_or("").is_empty() {
        p.push(format!("{field}.warehouse: required for a sql catalog (where table files live)"));
    }
    if let Some(uri) = cfg.props.get("uri") {
        if !uri.starts_with("sqlite:") {
            p.push(format!("{field}.uri: `{uri}` — only sqlite: URIs are supported"));
        }
    }
}

/// Connects to (creating when missing) the sqlite database of `cfg`.
pub(crate) async fn connect(cfg: &CatalogConfig, label: &str) -> Result<Box<dyn Backend>> {
    let warehouse = cfg.warehouse.clone().unwrap_or_default();
    let wh = strip_file_scheme(&warehouse);
    if !storage::is_object_store(&wh) {
        std::fs::create_dir_all(&wh).map_err(|e| Error::catalog(label, format!("cannot create warehouse {wh}: {e}"), false).with_cause(e))?;
    }
    let mut props: HashMap<String, String> = cfg.props.clone().into_iter().collect();
    let name = props.remove(NAME_PROP).unwrap_or_else(|| DEFAULT_NAME.to_string());
    let uri = props.remove("uri").unwrap_or_else(|| format!("sqlite:{wh}/catalog.db"));
    // sqlx only creates a missing sqlite file when asked to.
    let uri = if uri.contains('?') || uri.contains(":memory:") { uri } else { format!("{uri}?mode=rwc") };
    props.insert("uri".into(), uri.clone());
    props.insert("warehouse".into(), wh.clone());
    let storage = super::storage_factory(cfg);
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
    Ok(Box::new(SqlCatalog { inner, pool, name, storage, marks: SqlMarks::new(&uri) }))
}

#[async_trait::async_trait]
impl Backend for SqlCatalog {
    async fn storage(&self, _: &Table) -> Result<CdcStorageFactory> {
        Ok(self.storage.clone())
    }

    async fn load_table(&self, ident: &TableIdent) -> Result<Table> {
        self.inner.load_table(ident).await.map_err(|e| load_error("sql", &table_name(ident), e))
    }

    /// One row, read on the caller's task (without sqlx's thread hop); through sqlx when that cannot tell.
    async fn metadata_location(&self, ident: &TableIdent) -> Result<Option<String>> {
        if let Some(found) = self.marks.metadata_location(&self.name, &ident.namespace().join("."), ident.name()) {
            return Ok(found);
        }
        let row: Option<(Option<String>,)> =
            sqlx::query_as("SELECT metadata_location FROM iceberg_tables WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?")
                .bind(&self.name)
                .bind(ident.namespace().join("."))
                .bind(ident.name())
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| Error::catalog("sql", e, true))?;
        Ok(row.and_then(|r| r.0))
    }

    async fn create_table(&self, ident: &TableIdent, creation: TableCreation) -> Result<Table> {
        create_via(&self.inner, ident.namespace(), creation).await
    }

    async fn rename_table(&self, from: &TableIdent, to: &TableIdent) -> Result<()> {
        ensure_namespace(&self.inner, to.namespace()).await?;
        self.inner.rename_table(from, to).await.map_err(|e| load_error("sql", &table_name(from), e))
    }

    async fn drop_table(&self, ident: &TableIdent) -> Result<()> {
        self.inner.drop_table(ident).await.map_err(|e| load_error("sql", &table_name(ident), e))
    }

    /// One query over the catalog's table of tables (views left out where the schema says which are which).
    async fn list_tables(&self) -> Result<(Vec<TableIdent>, usize)> {
        let typed =
            "SELECT table_namespace, table_name FROM iceberg_tables WHERE catalog_name = ? AND (iceberg_type IS NULL OR iceberg_type = 'TABLE')";
        let plain = "SELECT table_namespace, table_name FROM iceberg_tables WHERE catalog_name = ?";
        let rows: Vec<(String, String)> = match sqlx::query_as(typed).bind(&self.name).fetch_all(&self.pool).await {
            Ok(rows) => rows,
            // a catalog created before the column existed (Iceberg's JDBC schema v0)
            Err(_) => sqlx::query_as(plain).bind(&self.name).fetch_all(&self.pool).await.map_err(|e| Error::catalog("sql", e, true))?,
        };
        let idents =
            rows.iter().map(|(ns, t)| TableIdent::from_strs(ns.split('.').chain([t.as_str()]))).collect::<std::result::Result<Vec<_>, _>>()?;
        Ok((idents, 1))
    }

    async fn swap(&self, table: &Table, requirements: Vec<TableRequirement>, updates: Vec<TableUpdate>) -> Result<Swapped> {
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
        .bind(&self.name)
        .bind(ident.namespace().join("."))
        .bind(ident.name())
        .bind(&current)
        .execute(&self.pool)
        .await
        .map_err(|e| Error::catalog("sql", e, true))?;
        if res.rows_affected() == 0 {
            return Err(Error::Conflict { table: ident.to_string(), message: "the table changed since it was loaded".into() });
        }
        // the table as committed: the metadata written, not read back
        Ok(Swapped::Done(super::table_of(ident, new_loc, new_meta, table.file_io().clone())?))
    }
}

//! What the Hive Metastore and the AWS Glue Data Catalog share: an Iceberg table is a metastore table whose
//! parameters say `table_type = ICEBERG` and hold the current metadata file in `metadata_location` (Iceberg Java's
//! convention, which Spark, Hive, Trino, Athena and `cdc` all follow). This module reads that convention and writes
//! it — the parameters of a committed table and the columns tools show — the way Iceberg Java does.
//!
//! The catalog around it is the same for both, written once ([`MetastoreCatalog`]): a load reads the record's
//! pointer and the metadata file it names; a create writes the first metadata file, then the record (the file is
//! deleted when the record is refused); a commit writes the next metadata file, then swaps the pointer — each
//! metastore in its own way ([`Metastore::swap`]: Hive under its table lock, Glue by record version) — deleting the
//! file when the swap was refused and keeping it when its outcome is unknown (the catalog then looks for the commit).
use std::collections::HashMap;

use std::str::FromStr;

use iceberg::io::FileIO;
use iceberg::spec::{PrimitiveType, TableMetadata, TableMetadataBuilder, Type};
use iceberg::table::Table;
use iceberg::{MetadataLocation, TableCreation, TableIdent, TableRequirement, TableUpdate};

use super::{Backend, Swapped};
use crate::error::{Error, Result};
use crate::storage::CdcStorageFactory;

/// What a metastore answers; the catalog around it is [`MetastoreCatalog`]'s, the same for every metastore.
#[async_trait::async_trait]
pub(crate) trait Metastore: Send + Sync + 'static {
    /// Its table record (a Thrift struct, a Glue JSON object).
    type Record: Send;
    /// How messages about its one level of namespace name it ("a Hive Metastore", "the Glue Data Catalog").
    const NAME: &'static str;
    /// Where a missing table was looked for (`hive:thrift://HOST:PORT`, `glue:REGION`).
    fn label(&self) -> String;
    /// The tables' files, with this catalog's storage settings.
    fn file_io(&self) -> FileIO;
    /// How the tables' files are reached.
    fn storage(&self) -> CdcStorageFactory;
    /// The record of `db.name`; `None` when it (or its database) does not exist.
    async fn record(&self, db: &str, name: &str) -> Result<Option<Self::Record>>;
    /// The current metadata file a record names (an error naming the table when it is not an Iceberg table).
    fn location(ident: &TableIdent, record: &Self::Record) -> Result<String>;
    /// The directory new tables of `db` go to, creating the database when missing.
    async fn database_location(&self, db: &str) -> Result<String>;
    /// Creates the record of a new table whose first metadata file is `location`.
    async fn create(&self, ident: &TableIdent, db: &str, name: &str, metadata: &TableMetadata, location: &str) -> Result<()>;
    /// Points the table at the new metadata file when it still points at the one the change was planned on.
    async fn swap(&self, change: &Change<'_>) -> std::result::Result<(), Refusal>;
    /// Every Iceberg table (`table_type = ICEBERG`) of every database, and how many calls that took.
    async fn list_iceberg_tables(&self) -> Result<(Vec<TableIdent>, usize)>;
    /// Renames `from` (database, name) to `to`, creating `to`'s database when missing; the files stay.
    async fn rename(&self, from: (&str, &str), _to: (&str, &str)) -> Result<()> {
        Err(Error::catalog(self.label(), format!("{}.{}: {} cannot rename tables", from.0, from.1, Self::NAME), false))
    }
    /// Removes the record of `db.name` (the files stay); `false` when there was none.
    async fn drop(&self, db: &str, name: &str) -> Result<bool>;
}

/// Whether a table's parameters mark it an Iceberg table (case-insensitively, as Iceberg Java writes and reads it).
pub(crate) fn is_iceberg(parameters: &HashMap<String, String>) -> bool {
    parameters.get(TABLE_TYPE).is_some_and(|t| t.eq_ignore_ascii_case(ICEBERG))
}

/// A commit's change of a metastore table's pointer.
pub(crate) struct Change<'a> {
    /// The table.
    pub ident: &'a TableIdent,
    /// Its database …
    pub db: &'a str,
    /// … and name there.
    pub name: &'a str,
    /// The metadata file the change was planned on, and its metadata.
    pub base: &'a str,
    /// See `base`.
    pub old: &'a TableMetadata,
    /// The new metadata file, already written, and its metadata.
    pub new_location: &'a str,
    /// See `new_location`.
    pub new: &'a TableMetadata,
}

/// How a [`Metastore::swap`] failed.
pub(crate) enum Refusal {
    /// Nothing points at the new metadata file (a conflict, an error before the call): it is deleted.
    Refused(Error),
    /// The swap may have landed ([`Error::CommitUnknown`]): the file stays, and the catalog looks for the commit.
    Unknown(Error),
}

/// A [`Metastore`] as a catalog backend: the skeleton every metastore shares (see the module header).
pub(crate) struct MetastoreCatalog<M>(pub(crate) M);

#[async_trait::async_trait]
impl<M: Metastore> Backend for MetastoreCatalog<M> {
    async fn storage(&self, _: &Table) -> Result<CdcStorageFactory> {
        Ok(self.0.storage())
    }

    /// One metastore call.
    async fn metadata_location(&self, ident: &TableIdent) -> Result<Option<String>> {
        let (db, name) = db_and_name(M::NAME, ident)?;
        match self.0.record(&db, &name).await? {
            Some(r) => Ok(Some(M::location(ident, &r)?)),
            None => Ok(None),
        }
    }

    async fn list_tables(&self) -> Result<(Vec<TableIdent>, usize)> {
        self.0.list_iceberg_tables().await
    }

    async fn rename_table(&self, from: &TableIdent, to: &TableIdent) -> Result<()> {
        let (from, to) = (db_and_name(M::NAME, from)?, db_and_name(M::NAME, to)?);
        self.0.rename((&from.0, &from.1), (&to.0, &to.1)).await
    }

    async fn drop_table(&self, ident: &TableIdent) -> Result<()> {
        let (db, name) = db_and_name(M::NAME, ident)?;
        match self.0.drop(&db, &name).await? {
            true => Ok(()),
            false => Err(Error::TableNotFound { catalog: self.0.label(), table: ident.to_string() }),
        }
    }

    async fn load_table(&self, ident: &TableIdent) -> Result<Table> {
        let location =
            self.metadata_location(ident).await?.ok_or_else(|| Error::TableNotFound { catalog: self.0.label(), table: ident.to_string() })?;
        table_at(self.0.file_io(), ident, &location).await
    }

    async fn create_table(&self, ident: &TableIdent, creation: TableCreation) -> Result<Table> {
        let (db, name) = db_and_name(M::NAME, ident)?;
        let location = match creation.location.clone() {
            Some(l) => l,
            None => format!("{}/{}", self.0.database_location(&db).await?.trim_end_matches('/'), name),
        };
        let io = self.0.file_io();
        let (metadata, meta_loc) = write_first_metadata(&io, creation, location).await?;
        if let Err(e) = self.0.create(ident, &db, &name, &metadata, &meta_loc).await {
            let _ = io.delete(&meta_loc).await;
            return Err(e);
        }
        table_at(io, ident, &meta_loc).await
    }

    async fn swap(&self, table: &Table, requirements: Vec<TableRequirement>, updates: Vec<TableUpdate>) -> Result<Swapped> {
        let ident = table.identifier();
        let (db, name) = db_and_name(M::NAME, ident)?;
        let io = self.0.file_io();
        let (base, new_meta, new_loc) = write_next_metadata(&io, table, &requirements, updates).await?;
        let change = Change { ident, db: &db, name: &name, base: &base, old: table.metadata(), new_location: &new_loc, new: &new_meta };
        match self.0.swap(&change).await {
            // the table as committed: the metadata written, not read back
            Ok(()) => Ok(Swapped::Done(super::table_of(ident, new_loc, new_meta, io)?)),
            Err(Refusal::Refused(e)) => {
                let _ = io.delete(&new_loc).await;
                Err(e)
            }
            Err(Refusal::Unknown(e)) => Ok(Swapped::Unsure(e)),
        }
    }
}

/// Table parameter: the table format (`ICEBERG`).
pub(crate) const TABLE_TYPE: &str = "table_type";
/// Table parameter: the current metadata file.
pub(crate) const METADATA_LOCATION: &str = "metadata_location";
/// Table parameter: the metadata file before the last commit.
pub(crate) const PREVIOUS_METADATA_LOCATION: &str = "previous_metadata_location";
const ICEBERG: &str = "ICEBERG";

/// `ident`'s database and table name; an error when the namespace is not one level (`catalog` names the metastore
/// in it: "a Hive Metastore", "the Glue Data Catalog").
pub(crate) fn db_and_name(catalog: &str, ident: &TableIdent) -> Result<(String, String)> {
    let ns = ident.namespace().as_ref();
    if ns.len() != 1 {
        return Err(Error::Config(vec![format!(
            "table `{ident}`: {catalog} has one level of namespace (`database.table`); `{}` has {}",
            ident.namespace().join("."),
            ns.len()
        )]));
    }
    Ok((ns[0].clone(), ident.name().to_string()))
}

/// The table `ident` whose current metadata file is `location`.
pub(crate) async fn table_at(io: FileIO, ident: &TableIdent, location: &str) -> Result<Table> {
    let metadata =
        TableMetadata::read_from(&io, location).await.map_err(|e| Error::data(location, format!("cannot read table metadata: {e}")).with_cause(e))?;
    super::table_of(ident, location, metadata, io)
}

/// Writes the first metadata file of a table created at `location`; returns the metadata and the file's path.
pub(crate) async fn write_first_metadata(io: &FileIO, creation: TableCreation, location: String) -> Result<(TableMetadata, String)> {
    let creation = TableCreation { location: Some(location.clone()), ..creation };
    let metadata = TableMetadataBuilder::from_table_creation(creation)?.build()?.metadata;
    let file = MetadataLocation::new_with_metadata(&location, &metadata);
    metadata.write_to(io, &file).await?;
    Ok((metadata, file.to_string()))
}

/// Checks `requirements` on `table`, applies `updates` and writes the next metadata file (nothing points at it
/// yet); returns the metadata file the change was planned on, the new metadata and the new file's path.
pub(crate) async fn write_next_metadata(
    io: &FileIO,
    table: &Table,
    requirements: &[TableRequirement],
    updates: Vec<TableUpdate>,
) -> Result<(String, TableMetadata, String)> {
    let base = table.metadata_location_result()?.to_string();
    let new_meta = super::apply_updates(table.metadata(), &base, requirements, updates)?;
    // Iceberg's `NNNNN-<uuid>.metadata.json`; a table whose file is named otherwise (migrated from another catalog)
    // starts a new sequence — the uuid keeps the name fresh either way
    let file = MetadataLocation::from_str(&base)
        .map(|l| l.with_next_version().with_new_metadata(&new_meta))
        .unwrap_or_else(|_| MetadataLocation::new_with_metadata(new_meta.location(), &new_meta));
    new_meta.write_to(io, &file).await?;
    Ok((base, new_meta, file.to_string()))
}

/// The current metadata file of an Iceberg table, from its parameters; an error naming the table when it is not an
/// Iceberg table. `catalog` labels the error ("hive", "glue").
pub(crate) fn iceberg_location(catalog: &str, ident: &TableIdent, params: &HashMap<String, String>) -> Result<String> {
    let kind = params.get(TABLE_TYPE).map(|s| s.to_ascii_uppercase());
    match (kind.as_deref(), params.get(METADATA_LOCATION)) {
        (Some(ICEBERG), Some(loc)) => Ok(loc.clone()),
        (Some(ICEBERG), None) => Err(Error::catalog(catalog, format!("table {ident} is marked ICEBERG but has no `metadata_location` parameter"), false)),
        (k, _) => Err(Error::catalog(
            catalog,
            format!(
                "table {ident} is not an Iceberg table (table_type = {}); `cdc` reads Iceberg tables only — migrate it with Spark's `CALL system.migrate` or `snapshot` first",
                k.unwrap_or("none")
            ),
            false,
        )),
    }
}

/// The parameters of a table after a commit: `params` as they were, minus the table properties the commit removed,
/// plus the new table properties, Iceberg's marker, the pointer (`location`, and `previous`), and the snapshot
/// summary Iceberg Java keeps there — so that `SHOW TBLPROPERTIES` in Hive or Athena tells the truth.
pub(crate) fn parameters(
    mut params: Vec<(String, String)>,
    old: Option<&TableMetadata>,
    new: &TableMetadata,
    location: &str,
    previous: Option<&str>,
) -> Vec<(String, String)> {
    if let Some(old) = old {
        params.retain(|(k, _)| !old.properties().contains_key(k) || new.properties().contains_key(k));
    }
    let mut put = |k: &str, v: String| match params.iter_mut().find(|(pk, _)| pk == k) {
        Some(slot) => slot.1 = v,
        None => params.push((k.to_string(), v)),
    };
    for (k, v) in new.properties() {
        put(k, v.clone());
    }
    put(TABLE_TYPE, ICEBERG.into());
    put("EXTERNAL", "TRUE".into());
    put(METADATA_LOCATION, location.into());
    if let Some(p) = previous {
        put(PREVIOUS_METADATA_LOCATION, p.into());
    }
    put("uuid", new.uuid().to_string());
    if let Some(s) = new.current_snapshot() {
        put("current-snapshot-id", s.snapshot_id().to_string());
        put("current-snapshot-timestamp-ms", s.timestamp_ms().to_string());
    }
    put("snapshot-count", new.snapshots().count().to_string());
    params
}

/// One column as a metastore lists it.
pub(crate) struct Column {
    /// The column's name.
    pub name: String,
    /// Its Hive type name ([`hive_type`]).
    pub hive_type: String,
    /// Its doc string (empty when none).
    pub comment: String,
}

/// The current schema's top-level columns, for tools that list a metastore's columns.
pub(crate) fn columns(metadata: &TableMetadata) -> Vec<Column> {
    metadata
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| Column { name: f.name.clone(), hive_type: hive_type(&f.field_type), comment: f.doc.clone().unwrap_or_default() })
        .collect()
}

/// The Hive type name of an Iceberg type (Iceberg Java's `HiveSchemaUtil` mapping).
pub(crate) fn hive_type(t: &Type) -> String {
    match t {
        Type::Primitive(p) => match p {
            PrimitiveType::Boolean => "boolean".into(),
            PrimitiveType::Int => "int".into(),
            PrimitiveType::Long => "bigint".into(),
            PrimitiveType::Float => "float".into(),
            PrimitiveType::Double => "double".into(),
            PrimitiveType::Decimal { precision, scale } => format!("decimal({precision},{scale})"),
            PrimitiveType::Date => "date".into(),
            PrimitiveType::Timestamp | PrimitiveType::TimestampNs => "timestamp".into(),
            PrimitiveType::Timestamptz | PrimitiveType::TimestamptzNs => "timestamp with local time zone".into(),
            PrimitiveType::Time | PrimitiveType::String | PrimitiveType::Uuid => "string".into(),
            PrimitiveType::Fixed(_) | PrimitiveType::Binary => "binary".into(),
        },
        Type::Struct(s) => {
            format!("struct<{}>", s.fields().iter().map(|f| format!("{}:{}", f.name, hive_type(&f.field_type))).collect::<Vec<_>>().join(","))
        }
        Type::List(l) => format!("array<{}>", hive_type(&l.element_field.field_type)),
        Type::Map(m) => format!("map<{},{}>", hive_type(&m.key_field.field_type), hive_type(&m.value_field.field_type)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::{ListType, MapType, NestedField, StructType};

    #[test]
    fn hive_types_follow_iceberg_java() {
        let t = Type::Struct(StructType::new(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(
                2,
                "tags",
                Type::List(ListType::new(NestedField::list_element(3, Type::Primitive(PrimitiveType::String), false).into())),
            )
            .into(),
            NestedField::optional(
                4,
                "m",
                Type::Map(MapType::new(
                    NestedField::map_key_element(5, Type::Primitive(PrimitiveType::Int)).into(),
                    NestedField::map_value_element(6, Type::Primitive(PrimitiveType::Decimal { precision: 10, scale: 2 }), false).into(),
                )),
            )
            .into(),
        ]));
        assert_eq!(hive_type(&t), "struct<id:bigint,tags:array<string>,m:map<int,decimal(10,2)>>");
        assert_eq!(hive_type(&Type::Primitive(PrimitiveType::Timestamptz)), "timestamp with local time zone");
    }

    #[test]
    fn only_iceberg_tables_have_a_location() {
        let ident = TableIdent::from_strs(["db", "t"]).unwrap();
        let params = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>();
        assert_eq!(iceberg_location("hive", &ident, &params(&[("table_type", "iceberg"), ("metadata_location", "m")])).unwrap(), "m");
        let e = iceberg_location("glue", &ident, &params(&[("EXTERNAL", "TRUE")])).unwrap_err().to_string();
        assert!(e.contains("not an Iceberg table") && e.contains("migrate") && e.contains("glue"), "{e}");
        assert!(iceberg_location("hive", &ident, &params(&[("table_type", "ICEBERG")])).is_err());
    }
}

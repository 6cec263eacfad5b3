//! `cdc quickstart`: the embedded default end to end — a local warehouse with a sqlite catalog, a small `demo.orders`
//! table with inserts, updates (equality delete + new row, merge-on-read) and deletes, and its changes printed.
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, Decimal128Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg::table::Table;
use iceberg::TableCreation;

use crate::catalog::Catalog;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::output::{self, Format};
use crate::pipeline;
use crate::sink::iceberg::{files, rowdelta::RowDelta};

pub const TABLE: &str = "demo.orders";

fn demo_schema() -> Result<Schema> {
    Ok(Schema::builder()
        .with_identifier_field_ids([1])
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(2, "customer", Type::Primitive(PrimitiveType::String)).into(),
            NestedField::optional(3, "amount", Type::Primitive(PrimitiveType::Decimal { precision: 10, scale: 2 })).into(),
            NestedField::optional(4, "updated_at", Type::Primitive(PrimitiveType::Timestamptz)).into(),
        ])
        .build()?)
}

/// Rows (id, customer, amount in cents) in the table's current arrow schema.
pub fn orders_batch(table: &Table, rows: &[(i64, &str, i128)]) -> Result<RecordBatch> {
    let schema = Arc::new(iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema())?);
    let now = chrono::Utc::now().timestamp_micros();
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
        Arc::new(Decimal128Array::from_iter_values(rows.iter().map(|r| r.2)).with_precision_and_scale(10, 2)?),
        Arc::new(TimestampMicrosecondArray::from(vec![now; rows.len()]).with_timezone("+00:00")),
    ];
    Ok(RecordBatch::try_new(schema, cols)?)
}

/// One merge-on-read commit: `upserts` replace rows by key, `deletes` remove keys.
pub async fn commit_changes(catalog: &Catalog, table: &Table, upserts: &[(i64, &str, i128)], deletes: &[i64]) -> Result<Table> {
    let key_ids: Vec<i32> = table.metadata().current_schema().identifier_field_ids().collect();
    let mut delta = RowDelta::new();
    let doomed: Vec<(i64, &str, i128)> = upserts.iter().map(|r| (r.0, "", 0)).chain(deletes.iter().map(|&id| (id, "", 0))).collect();
    if !doomed.is_empty() {
        let b = orders_batch(table, &doomed)?;
        delta = delta.add_delete_files(files::write_equality_deletes(table, key_ids, &[b]).await?);
    }
    if !upserts.is_empty() {
        let b = orders_batch(table, upserts)?;
        delta = delta.add_data_files(files::write_data(table, &[b]).await?);
    }
    let c = delta.set_snapshot_properties(HashMap::from([("cdc.quickstart".to_string(), "true".to_string())])).prepare(table).await?;
    catalog.commit(table, c.requirements, c.updates).await
}

pub async fn run(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let dir = dir.canonicalize()?;
    let warehouse = dir.join("warehouse");
    let config_path = dir.join("cdc.toml");
    let config_text = format!(
        "# written by `cdc quickstart`\n[source]\ntable = \"{TABLE}\"\n\n[source.catalog]\ntype = \"sql\"\nwarehouse = \"{}\"\n",
        warehouse.display()
    );
    std::fs::write(&config_path, &config_text)?;
    let cfg = Config::parse(&config_text)?;
    let catalog = Catalog::connect(&cfg.source.catalog, "source").await?;
    let table = match catalog.load_table(TABLE).await {
        Ok(t) => t,
        Err(Error::TableNotFound { .. }) => {
            let creation =
                TableCreation::builder().name("orders".to_string()).schema(demo_schema()?).format_version(iceberg::spec::FormatVersion::V2).build();
            let t = catalog.create_table(TABLE, creation).await?;
            eprintln!("quickstart: created {TABLE} in {}", warehouse.display());
            let t =
                commit_changes(&catalog, &t, &[(1, "ada", 1250), (2, "grace", 990), (3, "linus", 4200), (4, "ken", 100), (5, "barbara", 7731)], &[])
                    .await?;
            let t = commit_changes(&catalog, &t, &[(2, "grace", 1990), (6, "edsger", 500)], &[4]).await?;
            let t = commit_changes(&catalog, &t, &[(7, "margaret", 3000), (8, "donald", 6400)], &[]).await?;
            commit_changes(&catalog, &t, &[(7, "margaret", 3500), (4, "ken", 150)], &[1]).await?
        }
        Err(e) => return Err(e),
    };
    eprintln!("quickstart: changes of {TABLE} (config: {}):", config_path.display());
    let summary = pipeline::run_changes(&cfg, &table, None, None, |s| output::open(Format::Jsonl, None, s), |_| {}).await?;
    eprintln!(
        "quickstart: {} snapshots, {} insert, {} delete, {} update. Try: cdc snapshots --config {}",
        summary.snapshots,
        summary.inserts,
        summary.deletes,
        summary.update_pairs,
        config_path.display()
    );
    Ok(())
}

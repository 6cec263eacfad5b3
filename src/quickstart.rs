//! `cdc quickstart`: the embedded default end to end — a local warehouse with a sqlite catalog, a small `demo.orders`
//! table with inserts, updates (equality delete + new row, merge-on-read) and deletes, its changes printed, then the
//! main job: the service replicating it into `replica.orders` while two more commits land, and a clean stop.
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, Decimal128Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg::table::Table;
use iceberg::TableCreation;

use crate::catalog::Catalog;
use crate::config::Config;
use crate::error::{AtPath, Error, Result};
use crate::output::{self, Format};
use crate::pipeline;
use crate::sink::iceberg::{files, rowdelta::RowDelta};

/// The demo source table.
pub const TABLE: &str = "demo.orders";

/// The demo table's schema: `id` (the key), `customer`, `amount`, `updated_at`.
pub fn demo_schema() -> Result<Schema> {
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

/// Creates the demo table `demo.orders` in `catalog` with its first four commits (inserts, updates, deletes).
pub(crate) async fn create_demo(catalog: &Catalog) -> Result<Table> {
    let creation =
        TableCreation::builder().name("orders".to_string()).schema(demo_schema()?).format_version(iceberg::spec::FormatVersion::V2).build();
    let t = catalog.create_table(TABLE, creation).await?;
    let t =
        commit_changes(catalog, &t, &[(1, "ada", 1250), (2, "grace", 990), (3, "linus", 4200), (4, "ken", 100), (5, "barbara", 7731)], &[]).await?;
    let t = commit_changes(catalog, &t, &[(2, "grace", 1990), (6, "edsger", 500)], &[4]).await?;
    let t = commit_changes(catalog, &t, &[(7, "margaret", 3000), (8, "donald", 6400)], &[]).await?;
    commit_changes(catalog, &t, &[(7, "margaret", 3500), (4, "ken", 150)], &[1]).await
}

/// Target table of the quickstart's replication (same sqlite catalog, its own namespace).
pub const REPLICA: &str = "replica.orders";

/// Builds the demo (once), prints its changes, and — unless `changes_only` — runs the service on it while
/// committing more changes, showing the replica follow.
pub async fn run(dir: &Path, changes_only: bool) -> Result<()> {
    std::fs::create_dir_all(dir).at(dir)?;
    let dir = dir.canonicalize().at(dir)?;
    let warehouse = dir.join("warehouse");
    let config_path = dir.join("cdc.toml");
    let service_path = dir.join("service.toml");
    let catalog_section = format!("type = \"sql\"\nwarehouse = \"{}\"\n", warehouse.display());
    let config_text = format!(
        "# written by `cdc quickstart`: cdc changes / cdc sync --config this file\n[source]\ntable = \"{TABLE}\"\n\n[source.catalog]\n{catalog_section}\n\
         [target]\ntable = \"{REPLICA}\"\n\n[target.catalog]\n{catalog_section}"
    );
    std::fs::write(&config_path, &config_text).at(&config_path)?;
    let service_text = format!(
        "# written by `cdc quickstart`: cdc run --config this file\n[service]\npoll_interval = \"200ms\"\nmetrics_address = \"off\"\n\n\
         [catalogs.local]\n{catalog_section}\n[[pipelines]]\nname = \"orders\"\nsource = {{ catalog = \"local\", table = \"{TABLE}\" }}\n\n\
         [[pipelines.sinks]]\ntype = \"iceberg\"\ncatalog = \"local\"\ntable = \"{REPLICA}\"\n"
    );
    std::fs::write(&service_path, &service_text).at(&service_path)?;
    let cfg = Config::parse(&config_text)?;
    let catalog = Catalog::connect(&cfg.source.catalog, "source").await?;
    let table = match catalog.load_table(TABLE).await {
        Ok(t) => t,
        Err(Error::TableNotFound { .. }) => {
            let t = create_demo(&catalog).await?;
            eprintln!("quickstart: created {TABLE} in {}", warehouse.display());
            t
        }
        Err(e) => return Err(e),
    };
    eprintln!("quickstart: the changes of {TABLE} so far (`cdc changes --config {}`):", config_path.display());
    let summary = pipeline::run_changes(&cfg, &table, None, None, |s, memory| output::open(Format::Jsonl, None, s, memory), |_| {}).await?;
    eprintln!("quickstart: {} snapshots, {} insert, {} delete, {} update", summary.snapshots, summary.inserts, summary.deletes, summary.update_pairs);
    if changes_only {
        return Ok(());
    }

    // The main job: the service replicates demo.orders into replica.orders while the source keeps changing.
    eprintln!("\nquickstart: starting the service (`cdc run --config {}`), polling every 200 ms", service_path.display());
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let service = tokio::spawn({
        let path = service_path.clone();
        async move { crate::service::run(&path, Default::default(), Some(stop_rx)).await }
    });
    let result = follow(&catalog, table).await;
    let _ = stop.send(true);
    let stopped = service.await.map_err(|e| Error::failed("service task", e))?;
    result?;
    stopped?;
    eprintln!("quickstart: service stopped cleanly. Run it yourself: cdc run --config {}", service_path.display());
    Ok(())
}

/// Commits two more changes to the source while the service runs and shows the replica catching up after each.
async fn follow(catalog: &Catalog, table: Table) -> Result<()> {
    let uuid = table.metadata().uuid().to_string();
    let mut table = table;
    type Change<'a> = (&'a str, &'a [(i64, &'a str, i128)], &'a [i64]);
    let changes: [Change; 3] = [
        ("(nothing new: the first poll copies the table)", &[], &[]),
        ("update barbara, add alan, delete linus", &[(5, "barbara", 8000), (9, "alan", 4100)], &[3]),
        ("update alan again, add frances", &[(9, "alan", 4200), (10, "frances", 2750)], &[]),
    ];
    for (what, upserts, deletes) in changes {
        if !upserts.is_empty() || !deletes.is_empty() {
            table = commit_changes(catalog, &table, upserts, deletes).await?;
        }
        let head = table.metadata().current_snapshot_id();
        let started = std::time::Instant::now();
        let replica = loop {
            if let Ok(r) = catalog.load_table(REPLICA).await {
                if crate::sink::iceberg::progress::read(r.metadata(), &uuid).map(|p| p.source_snapshot_id) == head {
                    break r;
                }
            }
            if started.elapsed() > std::time::Duration::from_secs(30) {
                return Err(Error::Internal("the service did not catch up within 30 s".into()));
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        eprintln!("\nquickstart: source commit: {what}; {REPLICA} caught up in {:.2}s:", started.elapsed().as_secs_f64());
        for row in rows(&replica).await? {
            eprintln!("  {row}");
        }
    }
    Ok(())
}

/// How long one iceberg-rust scan of a small table may take before it counts as stalled.
const SCAN_STALL: std::time::Duration = std::time::Duration::from_secs(20);
/// Scans tried before a stall is an error.
const SCAN_ATTEMPTS: u32 = 3;

/// The rows of `table` at `snapshot_id` (the `columns` given, or all), read with iceberg-rust's scan, which applies
/// equality and position deletes: an independent reader of what `cdc` wrote, for the quickstart and the tests.
///
/// iceberg-rust 0.10 can lose the wakeup of a scan task waiting for a delete file another task is loading (it reads
/// the loading state, then waits on a `Notify` that may already have fired; apache/iceberg-rust#2630 is a second
/// race of that kind), and the scan never ends: a scan stalled for [`SCAN_STALL`] is dropped and started again.
pub async fn scan_snapshot(table: &Table, snapshot_id: i64, columns: Option<&[&str]>) -> Result<Vec<RecordBatch>> {
    use futures::TryStreamExt;
    for _ in 0..SCAN_ATTEMPTS {
        let scan = async {
            let b = table.scan().snapshot_id(snapshot_id);
            let b = match columns {
                Some(c) => b.select(c.iter().copied()),
                None => b.select_all(),
            };
            b.build()?.to_arrow().await?.try_collect::<Vec<_>>().await
        };
        if let Ok(read) = tokio::time::timeout(SCAN_STALL, scan).await {
            return Ok(read?);
        }
        tracing::warn!(table = %table.identifier(), stalled_seconds = SCAN_STALL.as_secs_f64(), "iceberg-rust's scan stalled; scanning again");
    }
    Err(Error::Internal(format!("iceberg-rust's scan of {} stalled {SCAN_ATTEMPTS} times in a row", table.identifier())))
}

/// A table's live rows as `id customer amount`, ordered by id.
pub(crate) async fn rows(table: &Table) -> Result<Vec<String>> {
    let Some(id) = table.metadata().current_snapshot_id() else { return Ok(Vec::new()) };
    let batches = scan_snapshot(table, id, Some(&["id", "customer", "amount"])).await?;
    let mut out = Vec::new();
    for b in batches {
        let ids = b.column(0).as_any().downcast_ref::<Int64Array>().ok_or_else(|| Error::Internal("id column".into()))?;
        let names = b.column(1).as_any().downcast_ref::<StringArray>().ok_or_else(|| Error::Internal("customer column".into()))?;
        let amounts = b.column(2).as_any().downcast_ref::<Decimal128Array>().ok_or_else(|| Error::Internal("amount column".into()))?;
        for i in 0..b.num_rows() {
            out.push((ids.value(i), format!("{:>3} {:<10} {:>9}", ids.value(i), names.value(i), amounts.value_as_string(i))));
        }
    }
    out.sort();
    Ok(out.into_iter().map(|(_, s)| s).collect())
}

//! Runs a changelog scan over a range and hands the change rows to a writer.
use std::time::Instant;

use iceberg::table::Table;
use serde::Serialize;

use crate::catalog::Catalog;
use crate::change::ChangeType;
use crate::config::Config;
use crate::error::Result;
use crate::output::{ChangeWriter, WriterSink};
use crate::source::changelog::{self, ChangelogScan, ScanOptions, SnapshotStats};
use crate::source::lineage::{self, Bound};

#[derive(Debug, Default, Serialize)]
pub struct ChangesSummary {
    pub table: String,
    pub snapshots: usize,
    pub skipped_replace: usize,
    pub inserts: u64,
    pub deletes: u64,
    pub update_pairs: u64,
    pub files_read: u64,
    pub bytes_read: u64,
    pub spilled_bytes: u64,
    pub seconds: f64,
}

pub async fn load_source(cfg: &Config) -> Result<(Catalog, Table)> {
    let catalog = Catalog::connect(&cfg.source.catalog, "source").await?;
    let table = catalog.load_table(&cfg.source.table).await?;
    Ok((catalog, table))
}

pub fn scan_options(cfg: &Config) -> ScanOptions {
    ScanOptions {
        memory_budget: cfg.engine.memory_budget,
        spill_dir: cfg.engine.spill_dir.clone().unwrap_or_else(std::env::temp_dir),
        concurrency: cfg.engine.read_concurrency,
    }
}

/// The change rows of (from, to] written to `writer`.
pub async fn run_changes(
    cfg: &Config,
    table: &Table,
    from: Option<Bound>,
    to: Option<Bound>,
    make_writer: impl FnOnce(arrow_schema::SchemaRef) -> Result<Box<dyn ChangeWriter>>,
    mut on_snapshot: impl FnMut(&SnapshotStats),
) -> Result<ChangesSummary> {
    let started = Instant::now();
    let meta = table.metadata();
    let snapshots = lineage::resolve_range(&cfg.source.table, meta, from, to)?;
    // Output in the schema of the range's end, keys resolved there.
    let out_schema = match snapshots.last().and_then(|s| s.schema_id()).and_then(|id| meta.schema_by_id(id)) {
        Some(s) => s.clone(),
        None => meta.current_schema().clone(),
    };
    let key_ids = changelog::resolve_key(&out_schema, cfg.source.key_columns.as_deref())?;
    let scan = ChangelogScan::new(table, &out_schema, key_ids, scan_options(cfg))?;
    let mut writer = make_writer(scan.output_schema())?;
    let mut summary = ChangesSummary { table: cfg.source.table.clone(), snapshots: snapshots.len(), ..Default::default() };
    // Like Spark's changelog, ordinals count the snapshots that can carry changes: compactions get none.
    let mut ordinal = 0i32;
    for snap in &snapshots {
        let st = scan.scan_snapshot(snap, ordinal, &mut WriterSink(writer.as_mut())).await?;
        if snap.summary().operation != iceberg::spec::Operation::Replace {
            ordinal += 1;
        }
        tracing::debug!(snapshot = st.snapshot_id, op = %st.operation, files = st.files_read, "snapshot scanned");
        if st.operation == "replace" {
            summary.skipped_replace += 1;
        }
        summary.inserts += st.count(ChangeType::Insert);
        summary.deletes += st.count(ChangeType::Delete);
        summary.update_pairs += st.count(ChangeType::UpdateAfter);
        summary.files_read += st.files_read;
        summary.bytes_read += st.bytes_read;
        summary.spilled_bytes += st.net.spilled_bytes;
        on_snapshot(&st);
    }
    writer.finish()?;
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

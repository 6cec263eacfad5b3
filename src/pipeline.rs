//! Runs a changelog scan over a range and hands the change rows to a writer.
use std::time::Instant;

use iceberg::table::Table;
use serde::Serialize;

use crate::catalog::Catalog;
use crate::change::ChangeType;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::sink::iceberg::apply::{CommitStats, CommitWriter};
use crate::sink::iceberg::rowdelta::RowDelta;
use crate::sink::iceberg::{progress, target};
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
    let out_schema = lineage::snapshot_schema(meta, snapshots.last());
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

/// What one `cdc sync` run did.
#[derive(Debug, Default, Serialize)]
pub struct SyncSummary {
    pub source_table: String,
    pub target_table: String,
    pub target_created: bool,
    pub bootstrap: bool,
    pub source_snapshots_applied: usize,
    /// Source snapshot the target is at after the run.
    pub source_snapshot_id: Option<i64>,
    pub target_snapshot_ids: Vec<i64>,
    pub inserts: u64,
    pub deletes: u64,
    pub updates: u64,
    pub files_written: usize,
    pub bytes_written: u64,
    pub seconds: f64,
}

/// One target commit, for progress display.
#[derive(Debug, Clone, Serialize)]
pub struct CommitReport {
    pub first_source_snapshot: i64,
    pub last_source_snapshot: i64,
    pub source_snapshots: usize,
    pub target_snapshot_id: Option<i64>,
    pub stats: CommitStats,
}

enum Start {
    Bootstrap,
    After(i64),
}

fn resolve_bound(table: &str, meta: &iceberg::spec::TableMetadata, b: Bound) -> Result<i64> {
    match b {
        Bound::Snapshot(id) => meta.snapshot_by_id(id).map(|s| s.snapshot_id()).ok_or(Error::SnapshotNotFound { table: table.into(), snapshot: id }),
        Bound::TimestampMs(ts) => lineage::main_lineage(meta)
            .iter()
            .rev()
            .find(|s| s.timestamp_ms() <= ts)
            .map(|s| s.snapshot_id())
            .ok_or_else(|| Error::Range(format!("no snapshot of `{table}` at or before {}", lineage::fmt_ms(ts)))),
    }
}

/// The applier's one-shot run (the daemon loops over it): replicate the source range into the target as
/// merge-on-read commits, each recording the source snapshot it brings the target up to.
pub async fn run_sync(cfg: &Config, from: Option<Bound>, to: Option<Bound>, mut on_commit: impl FnMut(&CommitReport)) -> Result<SyncSummary> {
    let started = Instant::now();
    let tcfg = cfg.target.as_ref().ok_or_else(|| Error::Config(vec!["[target]: required for `cdc sync` (table and catalog to write to)".into()]))?;
    let (_, source) = load_source(cfg).await?;
    let smeta = source.metadata();
    let source_uuid = smeta.uuid().to_string();
    let name = &cfg.source.table;
    let mut summary = SyncSummary { source_table: name.clone(), target_table: tcfg.table.clone(), ..Default::default() };
    let Some(end) = lineage::resolve_range(name, smeta, None, to)?.last().cloned() else {
        summary.seconds = started.elapsed().as_secs_f64();
        return Ok(summary); // a source without snapshots has nothing to copy
    };
    let out_schema = lineage::snapshot_schema(smeta, Some(&end));
    let key_ids = changelog::resolve_key(&out_schema, cfg.source.key_columns.as_deref())?;
    let eq_cols = target::equality_columns(&out_schema, tcfg.equality_columns.as_deref(), &key_ids)?;
    let tcat = Catalog::connect(&tcfg.catalog, "target").await?;
    let (mut target, created) = target::ensure(&tcat, &tcfg.table, smeta, &eq_cols, tcfg.format_version).await?;
    summary.target_created = created;
    let recorded = progress::read(target.metadata(), &source_uuid);

    let start = match (from, recorded) {
        (None, None) => Start::Bootstrap,
        (None, Some(p)) => {
            if smeta.snapshot_by_id(p.source_snapshot_id).is_none() {
                return Err(Error::Range(format!(
                    "the target `{}` is at source snapshot {}, which no longer exists in `{name}` (expired); the changes since then cannot be read — drop the target and sync again to copy the source afresh",
                    tcfg.table, p.source_snapshot_id
                )));
            }
            Start::After(p.source_snapshot_id)
        }
        (Some(b), None) => Start::After(resolve_bound(name, smeta, b)?),
        (Some(b), Some(p)) => {
            let a = resolve_bound(name, smeta, b)?;
            if a == p.source_snapshot_id || lineage::is_ancestor(smeta, a, p.source_snapshot_id) {
                Start::After(p.source_snapshot_id) // what is already applied is skipped
            } else if lineage::is_ancestor(smeta, p.source_snapshot_id, a) {
                return Err(Error::Range(format!(
                    "gap: the target `{}` is at source snapshot {} but --from starts after {a}; the changes in between would be lost. Run without --from to resume, or use --from-snapshot {}",
                    tcfg.table, p.source_snapshot_id, p.source_snapshot_id
                )));
            } else {
                return Err(Error::Range(format!(
                    "the target `{}` is at source snapshot {}, which is not on the history of {a} in `{name}`",
                    tcfg.table, p.source_snapshot_id
                )));
            }
        }
    };
    let scan = ChangelogScan::new(&source, &out_schema, key_ids, scan_options(cfg))?;
    let size = tcfg.target_file_size;
    let props = |s: &iceberg::spec::SnapshotRef| progress::properties(&source_uuid, name, s.snapshot_id(), s.sequence_number());

    match start {
        Start::Bootstrap => {
            let has_rows = target.metadata().current_snapshot().and_then(|s| s.summary().additional_properties.get("total-records").cloned());
            if has_rows.as_deref().is_some_and(|n| n != "0") {
                return Err(Error::Range(format!(
                    "the target `{}` already holds rows but has no progress for `{name}`: give --from-snapshot to apply only changes after a source snapshot, or empty the target",
                    tcfg.table
                )));
            }
            let mut w = CommitWriter::new(&target, &eq_cols, size, true, false)?;
            scan.scan_contents(&end, &mut w).await?;
            let (data, dels, stats) = w.finish().await?;
            let id = commit_with_retry(&tcat, &mut target, tcfg, data, dels, props(&end), &source_uuid, end.sequence_number()).await?;
            summary.bootstrap = true;
            record(&mut summary, std::slice::from_ref(&end), id, stats, &mut on_commit);
        }
        Start::After(a) => {
            let snapshots = lineage::resolve_range(name, smeta, Some(Bound::Snapshot(a)), Some(Bound::Snapshot(end.snapshot_id())))?;
            let chunks: Vec<_> = snapshots.chunks(tcfg.snapshots_per_commit).collect();
            let mut pending: Vec<iceberg::spec::SnapshotRef> = Vec::new();
            for (i, chunk) in chunks.iter().enumerate() {
                let mut w = CommitWriter::new(&target, &eq_cols, size, false, chunk.len() > 1)?;
                for (ordinal, s) in chunk.iter().enumerate() {
                    scan.scan_snapshot(s, ordinal as i32, &mut w).await?;
                }
                pending.extend(chunk.iter().cloned());
                let (data, dels, stats) = w.finish().await?;
                let last = chunk.last().expect("chunks are not empty");
                // Snapshots without changes (compactions) move the progress with the next commit; the last one
                // commits anyway so the recorded progress reaches the end of the range.
                if data.is_empty() && dels.is_empty() && i + 1 < chunks.len() {
                    continue;
                }
                let id = commit_with_retry(&tcat, &mut target, tcfg, data, dels, props(last), &source_uuid, last.sequence_number()).await?;
                record(&mut summary, &pending, id, stats, &mut on_commit);
                pending.clear();
            }
        }
    }
    summary.source_snapshot_id = progress::read(target.metadata(), &source_uuid).map(|p| p.source_snapshot_id);
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

fn record(summary: &mut SyncSummary, snaps: &[iceberg::spec::SnapshotRef], id: Option<i64>, stats: CommitStats, on_commit: &mut impl FnMut(&CommitReport)) {
    summary.source_snapshots_applied += snaps.len();
    summary.inserts += stats.inserts;
    summary.deletes += stats.deletes;
    summary.updates += stats.updates;
    summary.files_written += stats.files;
    summary.bytes_written += stats.bytes;
    summary.target_snapshot_ids.extend(id);
    on_commit(&CommitReport {
        first_source_snapshot: snaps.first().map(|s| s.snapshot_id()).unwrap_or_default(),
        last_source_snapshot: snaps.last().map(|s| s.snapshot_id()).unwrap_or_default(),
        source_snapshots: snaps.len(),
        target_snapshot_id: id,
        stats,
    });
}

/// Commits with optimistic concurrency. On a conflict or a transient failure: back off (exponential, jittered),
/// reload the target, re-check that nobody applied this range meanwhile, and try again with the same files.
/// Returns the new target snapshot, or None when the range turned out to be applied already.
#[allow(clippy::too_many_arguments)]
async fn commit_with_retry(
    catalog: &Catalog,
    target: &mut Table,
    tcfg: &crate::config::TargetConfig,
    data: Vec<iceberg::spec::DataFile>,
    dels: Vec<iceberg::spec::DataFile>,
    props: std::collections::HashMap<String, String>,
    source_uuid: &str,
    source_seq: i64,
) -> Result<Option<i64>> {
    let mut attempt = 0u32;
    test_pause_before_commit();
    loop {
        let prepared = RowDelta::new()
            .add_data_files(data.iter().cloned())
            .add_delete_files(dels.iter().cloned())
            .set_snapshot_properties(props.clone())
            .prepare(target)
            .await?;
        match catalog.commit(target, prepared.requirements, prepared.updates).await {
            Ok(t) => {
                *target = t;
                return Ok(Some(prepared.snapshot_id));
            }
            Err(e) if e.is_retryable() && attempt + 1 < tcfg.commit_retries => {
                attempt += 1;
                let base = tcfg.retry_backoff.as_millis() as u64 * (1u64 << attempt.min(10));
                let jitter = uuid::Uuid::new_v4().as_u64_pair().0 % (base / 2 + 1);
                tracing::warn!(error = %e, attempt, "target commit failed, retrying");
                tokio::time::sleep(std::time::Duration::from_millis(base / 2 + jitter)).await;
                *target = catalog.load_table(&tcfg.table).await?;
                if let Some(p) = progress::read(target.metadata(), source_uuid) {
                    if p.source_sequence_number >= source_seq {
                        tracing::warn!(target_snapshot = p.target_snapshot_id, "another writer already applied this range; skipping");
                        return Ok(None);
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Test hook: with `CDC_TEST_PAUSE_BEFORE_COMMIT=<dir>` the first commit of the process waits, after its files are
/// written, until `<dir>/resume` exists (it creates `<dir>/paused` first). Lets tests put another writer's commit
/// between our plan and our commit.
fn test_pause_before_commit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let Some(dir) = std::env::var_os("CDC_TEST_PAUSE_BEFORE_COMMIT") else { return };
    ONCE.call_once(|| {
        let dir = std::path::PathBuf::from(dir);
        let _ = std::fs::write(dir.join("paused"), b"");
        while !dir.join("resume").exists() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    });
}

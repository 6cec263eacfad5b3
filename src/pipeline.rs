//! Runs a changelog scan over a range and hands the change rows to a writer.
use std::time::Instant;

use arrow_array::RecordBatch;
use iceberg::table::Table;
use serde::Serialize;

use crate::catalog::Catalog;
use crate::change::ChangeType;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::output::{ChangeWriter, WriterSink};
use crate::sink::iceberg::sink::IcebergSink;
use crate::sink::{Chunk, CommitStats, Committed, Initial, Sink, SourceInfo};
use crate::source::changelog::{self, ChangelogScan, DeleteCache, ScanOptions, SnapshotStats};
use crate::spec::lineage::{self, Bound};

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
    /// The least `engine.memory_budget` that matches every copy-on-write rewrite of the range in memory, when one
    /// did not (see [`warn_in_parts`]).
    pub one_pass_memory_budget: Option<u64>,
    pub seconds: f64,
}

pub async fn load_source(cfg: &Config) -> Result<(Catalog, Table)> {
    let catalog = Catalog::connect(&cfg.source.catalog, "source").await?;
    let table = catalog.load_table(&cfg.source.table).await?;
    Ok((catalog, table))
}

/// Warns when carry-over split a snapshot's partition groups into parts (a copy-on-write rewrite too large for the
/// budget: matched in passes over spill files, at more CPU per row), saying which `engine.memory_budget` matches them
/// in one pass. Returns that budget.
fn warn_in_parts(st: &SnapshotStats) -> Option<u64> {
    let p = st.in_parts?;
    tracing::warn!(
        snapshot = st.snapshot_id,
        largest_group_rows = p.largest_group_rows,
        parts = st.carry.parts,
        resident_parts = st.carry.resident_parts,
        spilled_bytes = st.spilled_bytes(),
        "a copy-on-write rewrite was too large to match in memory: its partition groups were split into parts and \
         spilled, at more CPU per row; engine.memory_budget = \"{}MiB\" or more matches them in one pass (so does a \
         finer partitioning of the table)",
        p.one_pass_budget >> 20
    );
    Some(p.one_pass_budget)
}

pub fn scan_options(cfg: &Config) -> ScanOptions {
    ScanOptions {
        memory_budget: cfg.engine.memory_budget,
        configured_budget: cfg.engine.memory_budget,
        spill_dir: cfg.engine.spill_dir.clone().unwrap_or_else(std::env::temp_dir),
        concurrency: cfg.engine.read_concurrency,
        key_order: true,
    }
}

/// The change rows of (from, to] written to `writer`.
pub async fn run_changes(
    cfg: &Config,
    table: &Table,
    from: Option<Bound>,
    to: Option<Bound>,
    make_writer: impl FnOnce(arrow_schema::SchemaRef, u64) -> Result<Box<dyn ChangeWriter>>,
    mut on_snapshot: impl FnMut(&SnapshotStats),
) -> Result<ChangesSummary> {
    let started = Instant::now();
    let meta = table.metadata();
    let snapshots = lineage::resolve_range(&cfg.source.table, meta, from, to)?;
    // Output in the schema of the range's end, keys resolved there.
    let out_schema = lineage::snapshot_schema(meta, snapshots.last());
    let key_ids = changelog::resolve_key(&out_schema, cfg.source.key_columns.as_deref())?;
    // the writer's buffers run beside the scan: it gets its share of the budget, the scan the rest
    let writer_memory = crate::config::share_of(cfg.engine.memory_budget, crate::output::OUTPUT_SHARE);
    let opts = ScanOptions { memory_budget: cfg.engine.memory_budget.saturating_sub(writer_memory).max(1), ..scan_options(cfg) };
    let scan = ChangelogScan::new(table, &out_schema, key_ids, opts)?;
    let mut writer = make_writer(scan.output_schema(), writer_memory)?;
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
        summary.spilled_bytes += st.spilled_bytes();
        summary.one_pass_memory_budget = summary.one_pass_memory_budget.max(warn_in_parts(&st));
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
    /// Target files closed before they were full: more partitions were open at once than the memory budget holds.
    pub files_closed_early: u64,
    /// Source data files read (a file read twice counts twice) and their bytes.
    pub source_files_read: u64,
    pub source_bytes_read: u64,
    /// Bytes the scan wrote to local spill files (netting runs and carry-over parts).
    pub spilled_bytes: u64,
    /// The least `engine.memory_budget` that matches every copy-on-write rewrite of the run in memory, when one did
    /// not (see [`warn_in_parts`]); `null` when they all did.
    pub one_pass_memory_budget: Option<u64>,
    /// The process's peak resident memory so far (Linux `VmHWM`; 0 where unknown): what `engine.memory_budget`
    /// bounds, plus a fixed overhead.
    pub peak_rss_bytes: u64,
    /// Commit attempts repeated after a conflict or a transient failure.
    pub retries: u32,
    /// Times the run planned again because another writer moved the target's progress.
    pub replans: u32,
    pub seconds: f64,
    /// Object-store requests and bytes during this run (zero on local disk; process-wide, so in a service running
    /// several pipelines at once it includes theirs).
    pub object_store: crate::storage::IoStats,
}

/// What a caller that runs syncs repeatedly (the service) hands each run.
#[derive(Default, Clone)]
pub struct RunControl {
    /// A shutdown request: the run abandons its commit before the catalog call.
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
    /// Delete files read by earlier runs (kept across polls, bounded to what the source still references).
    pub cache: Option<std::sync::Arc<DeleteCache>>,
}

/// One target commit, for progress display.
#[derive(Debug, Clone, Serialize)]
pub struct CommitReport {
    pub first_source_snapshot: i64,
    pub last_source_snapshot: i64,
    pub source_snapshots: usize,
    pub target_snapshot_id: Option<i64>,
    pub stats: CommitStats,
    /// Source snapshots the current plan covers, and how many of them are applied with this commit.
    pub planned_snapshots: usize,
    pub done_snapshots: usize,
}

/// Where a sync starts, decided from the target's recorded progress and the user's `--from`.
enum Start {
    /// Copy the source's contents at the end snapshot (the target has no progress and no `--from`).
    Bootstrap,
    /// Apply the changes after this source snapshot.
    After(i64),
    /// Apply every change from the source's first snapshot (a sink that starts at the beginning).
    Beginning,
    /// The target is already at or past the end of the range.
    Done(i64),
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

/// What the source side of a sync needs for every plan: the table, the range end.
struct SyncSource<'a> {
    cfg: &'a Config,
    table: Table,
    end: iceberg::spec::SnapshotRef,
}

impl SyncSource<'_> {
    fn name(&self) -> &str {
        &self.cfg.source.table
    }
    fn schema_at(&self, snapshot: &iceberg::spec::SnapshotRef) -> iceberg::spec::SchemaRef {
        lineage::snapshot_schema(self.table.metadata(), Some(snapshot))
    }
    fn snapshot(&self, id: i64) -> Result<iceberg::spec::SnapshotRef> {
        self.table.metadata().snapshot_by_id(id).cloned().ok_or(Error::SnapshotNotFound { table: self.name().into(), snapshot: id })
    }
}

/// Decides where to start from the recorded progress (source snapshot id) and `--from`.
fn decide_start(src: &SyncSource, target: &str, from: Option<i64>, recorded: Option<i64>, initial: Initial) -> Result<Start> {
    let meta = src.table.metadata();
    let name = src.name();
    let end = src.end.snapshot_id();
    let on_history = |id: i64| lineage::is_ancestor(meta, id, end);
    if let Some(a) = from {
        if a != end && !on_history(a) {
            return Err(if lineage::is_ancestor(meta, end, a) {
                Error::Range(format!("--from snapshot {a} is after the end of the range ({end}); the start must be older than the end"))
            } else {
                Error::Range(format!(
                    "--from snapshot {a} is not on the history of snapshot {end} in `{name}` (rolled back, or on another branch); pick a start from `cdc snapshots`"
                ))
            });
        }
    }
    let Some(p) = recorded else {
        return Ok(match (from, initial) {
            (Some(a), _) => Start::After(a),
            (None, Initial::Copy) => Start::Bootstrap,
            (None, Initial::Beginning) => Start::Beginning,
        });
    };
    if meta.snapshot_by_id(p).is_none() {
        return Err(Error::Range(format!(
            "the target `{target}` is at source snapshot {p}, which no longer exists in `{name}` (expired); the changes since then cannot be read — drop the target and sync again to copy the source afresh"
        )));
    }
    if p == end || lineage::is_ancestor(meta, end, p) {
        return Ok(Start::Done(p)); // already at or past the end
    }
    if !on_history(p) {
        return Err(Error::Range(format!(
            "the target `{target}` is at source snapshot {p}, which is not on the history of {end} in `{name}` (the source was rolled back past it); recreate the target"
        )));
    }
    match from {
        // what is already applied is skipped
        Some(a) if a == p || lineage::is_ancestor(meta, a, p) => Ok(Start::After(p)),
        Some(a) => Err(Error::Range(format!(
            "gap: the target `{target}` is at source snapshot {p} but --from starts after {a}; the changes in between would be lost. Run without --from to resume, or use --from-snapshot {p}"
        ))),
        None => Ok(Start::After(p)),
    }
}

/// The source as sinks see it; `end` is the end of the range (its schema names the keys when the current one
/// lacks them).
pub(crate) fn source_info(cfg: &Config, source: &Table, end: &iceberg::spec::SnapshotRef) -> Result<SourceInfo> {
    let smeta = source.metadata();
    // Keys are named as the user sees the table (its current schema, else the range end's); ids from then on.
    let configured = cfg.source.key_columns.iter().flatten().chain(cfg.target.iter().flat_map(|t| t.equality_columns.iter().flatten()));
    let names_schema = if configured.clone().all(|n| smeta.current_schema().field_by_name(n).is_some()) {
        smeta.current_schema().clone()
    } else {
        lineage::snapshot_schema(smeta, Some(end))
    };
    let key_ids = changelog::resolve_key(&names_schema, cfg.source.key_columns.as_deref())?;
    Ok(SourceInfo { uuid: smeta.uuid().to_string(), name: cfg.source.table.clone(), metadata: source.metadata_ref(), key_ids, names_schema })
}

/// The applier's one-shot run (the daemon loops over it): replicate the source range into the target as
/// merge-on-read commits, each recording the source snapshot it brings the target up to.
///
/// Exactly once under concurrency: a plan starts from the progress the target records, and each commit requires the
/// target head (and schema) it was planned on. When another writer moved the target, the commit fails, the target is
/// reloaded, and if the recorded progress is no longer the plan's start the run re-plans from the new progress —
/// never re-applying a range and never moving the progress backwards.
pub async fn run_sync(cfg: &Config, from: Option<Bound>, to: Option<Bound>, mut on_commit: impl FnMut(&CommitReport)) -> Result<SyncSummary> {
    if cfg.target.is_none() && cfg.kafka.is_none() {
        return Err(Error::Config(vec!["[target] or [kafka]: `cdc sync` needs a destination (an Iceberg table, a Kafka topic, or both)".into()]));
    }
    let (_, source) = load_source(cfg).await?;
    // the republisher: the pipeline of a one-shot sync is named after its source table
    let mut kafka =
        cfg.kafka.as_ref().map(|k| crate::sink::kafka::KafkaSink::new(k.clone(), format!("sync-{}", cfg.source.table), cfg.engine.memory_budget));
    let target = match &cfg.target {
        Some(t) => Some(Catalog::connect(&t.catalog, "target").await?),
        None => None,
    };
    let mut iceberg = cfg.target.as_ref().zip(target.as_ref()).map(|(t, c)| IcebergSink::new(c, t.clone(), cfg.engine.memory_budget));
    let mut summary = match (&mut iceberg, &mut kafka) {
        (Some(i), Some(k)) => {
            // both: one read of the source feeds the two
            let sinks: Vec<&mut dyn Sink> = vec![i, k];
            crate::sink::fanout::run(cfg, &source, sinks, from, to, &RunControl::default(), &mut on_commit).await?
        }
        (Some(i), None) => run_once(cfg, &source, i, from, to, &RunControl::default(), &mut on_commit).await?,
        (None, Some(k)) => run_once(cfg, &source, k, from, to, &RunControl::default(), &mut on_commit).await?,
        (None, None) => unreachable!("checked above"),
    };
    if let Some(t) = &cfg.target {
        summary.target_table = t.table.clone();
    }
    Ok(summary)
}

/// The runner: replicates the source range `(from, to]` into `sink`, one commit per chunk of source snapshots, each
/// recording the source snapshot it brings the sink up to. Where to start is decided from the sink's recorded
/// progress (bootstrap copy / resume / explicit `--from` with the gap rules); when the sink reports that its progress
/// moved under the plan (another writer), the run plans again from what it records. `source` is the source table as
/// the caller loaded it (the service has it from its poll).
pub async fn run_once(
    cfg: &Config,
    source: &Table,
    sink: &mut dyn Sink,
    from: Option<Bound>,
    to: Option<Bound>,
    control: &RunControl,
    mut on_commit: impl FnMut(&CommitReport),
) -> Result<SyncSummary> {
    let started = Instant::now();
    let io0 = crate::storage::io_stats();
    let stop = control.stop.as_ref();
    let smeta = source.metadata();
    let name = &cfg.source.table;
    let mut summary = SyncSummary { source_table: name.clone(), target_table: sink.label(), ..Default::default() };
    let Some(end) = lineage::resolve_range(name, smeta, None, to)?.last().cloned() else {
        summary.seconds = started.elapsed().as_secs_f64();
        return Ok(summary); // a source without snapshots has nothing to copy
    };
    let from_id = from.map(|b| resolve_bound(name, smeta, b)).transpose()?;
    let info = source_info(cfg, source, &end)?;
    let key_ids = info.key_ids.clone();
    let src = SyncSource { cfg, table: source.clone(), end };
    // One scan for the run: its delete cache serves every commit.
    // the sink's writers run beside the scan (a partition-aligned rewrite is written while other groups match): the
    // scan divides what they leave of the budget
    let scan_budget = cfg.engine.memory_budget.saturating_sub(sink.reserved_memory()).max(1);
    let opts = ScanOptions { key_order: sink.needs_key_order(), memory_budget: scan_budget, ..scan_options(cfg) };
    let mut scan = ChangelogScan::new(source, &src.schema_at(&src.end), key_ids, opts)?;
    if let Some(cache) = &control.cache {
        scan = scan.with_cache(cache.clone());
    }
    let label = sink.label();

    let mut replans = 0u32;
    'plan: loop {
        let recorded = sink.recorded(&info).await?;
        let start = decide_start(&src, &label, from_id, recorded, sink.initial())?;
        let (first_schema, bootstrap) = match start {
            Start::Done(p) => {
                if replans == 0 && p != src.end.snapshot_id() {
                    tracing::info!(progress = p, end = src.end.snapshot_id(), "the target is already past the end of the range; nothing to do");
                }
                summary.source_snapshot_id = Some(p);
                break 'plan;
            }
            Start::Bootstrap => (src.schema_at(&src.end), true),
            Start::After(a) => (src.schema_at(&src.snapshot(a)?), false),
            Start::Beginning => (src.schema_at(&src.end), false),
        };
        // Re-check on the state the sink will commit on: it may have changed since `recorded`.
        if sink.prepare(&info, &first_schema, bootstrap).await? != recorded {
            replans += 1;
            continue 'plan;
        }
        let chunks: Vec<Chunk> = match start {
            Start::Bootstrap => {
                vec![Chunk { snapshots: vec![src.end.clone()], bootstrap: true, schema: first_schema, base: None, must_commit: true }]
            }
            Start::After(_) | Start::Beginning => {
                let lower = match start {
                    Start::After(a) => Some(Bound::Snapshot(a)),
                    _ => None,
                };
                let snapshots = lineage::resolve_range(name, smeta, lower, Some(Bound::Snapshot(src.end.snapshot_id())))?;
                let per_commit = sink.snapshots_per_commit().or(cfg.target.as_ref().and_then(|t| t.snapshots_per_commit)).unwrap_or(1);
                let groups: Vec<_> = snapshots.chunks(per_commit).collect();
                let n = groups.len();
                groups
                    .into_iter()
                    .enumerate()
                    .map(|(i, g)| Chunk {
                        snapshots: g.to_vec(),
                        bootstrap: false,
                        schema: src.schema_at(g.last().expect("chunks are not empty")),
                        base: None, // set as commits land
                        must_commit: i + 1 == n,
                    })
                    .collect()
            }
            Start::Done(_) => unreachable!("handled above"),
        };
        let mut base = match start {
            Start::After(a) => Some(a),
            _ => None,
        };
        let mut pending: Vec<iceberg::spec::SnapshotRef> = Vec::new();
        let mut replan = false;
        let planned: usize = chunks.iter().map(|c| c.snapshots.len()).sum();
        let mut done = 0usize;
        for mut chunk in chunks {
            chunk.base = base;
            pending.extend(chunk.snapshots.iter().cloned());
            sink.begin(&info, &chunk).await?;
            scan.set_output(&chunk.schema)?;
            scan.set_removed_columns(sink.removed_columns());
            let scanned: Result<()> = async {
                let mut rows = SinkRows(&mut *sink);
                let mut add = |st: SnapshotStats| {
                    summary.source_files_read += st.files_read;
                    summary.source_bytes_read += st.bytes_read;
                    summary.spilled_bytes += st.spilled_bytes();
                    summary.one_pass_memory_budget = summary.one_pass_memory_budget.max(warn_in_parts(&st));
                };
                if chunk.bootstrap {
                    add(scan.scan_contents(chunk.last(), &mut rows).await?);
                } else {
                    for (ordinal, s) in chunk.snapshots.iter().enumerate() {
                        add(scan.scan_snapshot(s, ordinal as i32, &mut rows).await?);
                    }
                }
                Ok(())
            }
            .await;
            if let Err(e) = scanned {
                sink.abort().await;
                return Err(e);
            }
            match sink.commit(&info, stop).await? {
                Committed::Done { id, stats } => {
                    summary.bootstrap |= chunk.bootstrap;
                    done += pending.len();
                    record(&mut summary, &pending, Some(id), stats, (planned, done), &mut on_commit);
                    pending.clear();
                    base = Some(chunk.last().snapshot_id());
                }
                Committed::Empty => {}
                Committed::Replan => {
                    replan = true;
                    break;
                }
            }
        }
        if !replan {
            // the last chunk always commits: the sink now records exactly what it committed last
            summary.source_snapshot_id = base;
            break;
        }
        replans += 1;
        if replans > MAX_REPLANS {
            return Err(Error::Conflict {
                table: label.clone(),
                message: format!("the target kept moving under {MAX_REPLANS} plans; is another applier syncing it in a loop?"),
            });
        }
        tracing::info!(replans, "another writer moved the target's progress; planning again from what it recorded");
    }
    summary.replans = replans;
    summary.retries = sink.retries();
    summary.target_created = sink.created();
    summary.seconds = started.elapsed().as_secs_f64();
    // process-wide counters: exact for `cdc sync`, an upper bound when a service runs pipelines side by side
    summary.object_store = crate::storage::io_stats().since(&io0);
    summary.peak_rss_bytes = peak_rss_bytes();
    Ok(summary)
}

/// The process's peak resident set size (`VmHWM` in /proc/self/status), 0 where that file does not exist.
fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmHWM:").and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())))
        .map_or(0, |kb| kb * 1024)
}

/// Re-plans allowed in one run: each follows another writer's progress, so this only stops a livelock.
const MAX_REPLANS: u32 = 100;

/// The scan's output going into a sink's open commit.
struct SinkRows<'a>(&'a mut dyn Sink);

impl crate::change::ChangeSink for SinkRows<'_> {
    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        self.0.write(batch).await
    }
}

fn record(
    summary: &mut SyncSummary,
    snaps: &[iceberg::spec::SnapshotRef],
    id: Option<i64>,
    stats: CommitStats,
    (planned_snapshots, done_snapshots): (usize, usize),
    on_commit: &mut impl FnMut(&CommitReport),
) {
    summary.source_snapshots_applied += snaps.len();
    summary.inserts += stats.inserts;
    summary.deletes += stats.deletes;
    summary.updates += stats.updates;
    summary.files_written += stats.files;
    summary.files_closed_early += stats.files_closed_early;
    summary.bytes_written += stats.bytes;
    summary.target_snapshot_ids.extend(id);
    on_commit(&CommitReport {
        first_source_snapshot: snaps.first().map(|s| s.snapshot_id()).unwrap_or_default(),
        last_source_snapshot: snaps.last().map(|s| s.snapshot_id()).unwrap_or_default(),
        source_snapshots: snaps.len(),
        target_snapshot_id: id,
        stats,
        planned_snapshots,
        done_snapshots,
    });
}

//! The only module that drives a source into sinks: it runs changelog scans of the source (`source`) into
//! destinations (`sink`, or an `output` writer for `cdc changes`). (Sinks use the source's readers on their own
//! target tables — compaction, position lookups — never on their pipeline's source; see README "Layout".)
//!
//! One runner serves `cdc sync` and every poll of the service ([`run`]): the decisions are pure functions in
//! [`plan`] (where to start, which commits, how sinks share a read); [`apply`] carries a plan out — begin, feed the
//! scan's rows, commit — and plans again when a sink reports that another writer moved its progress.
pub(crate) mod plan;

use std::time::Instant;

use arrow_array::RecordBatch;
use iceberg::table::Table;
use serde::Serialize;

use crate::catalog::Catalog;
use crate::change::ChangeType;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::output::{ChangeWriter, WriterConsumer};
use crate::sink::fanout::FanOut;
use crate::sink::{Chunk, CommitStats, Committed, Initial, Sink, SourceInfo};
use crate::source::changelog::{self, ChangelogScan, DeleteCache, ScanOptions, SnapshotStats};
use crate::spec::lineage::{self, Bound};

#[derive(Debug, Default, Serialize)]
/// What one `cdc changes` run read and emitted.
pub struct ChangesSummary {
    /// The source table.
    pub table: String,
    /// Snapshots in the range.
    pub snapshots: usize,
    /// Compactions among them (no changes).
    pub skipped_replace: usize,
    /// `INSERT` rows emitted.
    pub inserts: u64,
    /// `DELETE` rows emitted.
    pub deletes: u64,
    /// `UPDATE_BEFORE`/`UPDATE_AFTER` pairs emitted.
    pub update_pairs: u64,
    /// Manifests read to plan the range.
    pub manifests_read: u64,
    /// Source files read.
    pub files_read: u64,
    /// Their bytes.
    pub bytes_read: u64,
    /// Bytes spilled to local disk.
    pub spilled_bytes: u64,
    /// The least `engine.memory_budget` that matches every copy-on-write rewrite of the range in memory, when one
    /// did not (see [`warn_in_parts`]).
    pub one_pass_memory_budget: Option<u64>,
    /// Wall-clock time of the run.
    pub seconds: f64,
}

impl ChangesSummary {
    /// Adds what one scan of a snapshot (or of a state) read and emitted; `inverted`: its rows were emitted
    /// inverted (an undone snapshot: an INSERT counted as a DELETE, and so on).
    fn count(&mut self, st: &SnapshotStats, inverted: bool) {
        let (ins, del) = (st.count(ChangeType::Insert), st.count(ChangeType::Delete));
        let (ins, del) = if inverted { (del, ins) } else { (ins, del) };
        self.inserts += ins;
        self.deletes += del;
        self.update_pairs += st.count(ChangeType::UpdateAfter);
        self.manifests_read += st.manifests_read;
        self.files_read += st.files_read;
        self.bytes_read += st.bytes_read;
        self.spilled_bytes += st.spilled_bytes();
    }
}

/// Connects to the source's catalog and loads the source table.
pub async fn load_source(cfg: &Config) -> Result<(Catalog, Table)> {
    let catalog = Catalog::connect(&cfg.source.catalog, "source").await?;
    let table = catalog.load_table(&cfg.source.table).await?;
    Ok((catalog, table))
}

/// The tables of the source's catalog its patterns match now (one listing of the catalog), sorted; every table when
/// the source names one.
pub async fn matching_tables(cfg: &Config) -> Result<Vec<String>> {
    let Some(patterns) = cfg.source.patterns() else { return Ok(vec![cfg.source.table.clone()]) };
    let catalog = Catalog::connect(&cfg.source.catalog, "source").await?;
    let (names, _) = catalog.list_tables().await?;
    Ok(patterns.select(&names).into_iter().cloned().collect())
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

/// The changelog scan's options from `cfg`'s engine settings (and the size of the cache of parsed manifests).
pub fn scan_options(cfg: &Config) -> ScanOptions {
    crate::source::files::size_manifest_cache(cfg.engine.memory_budget);
    crate::source::changelog::size_caches(cfg.engine.memory_budget);
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
    let (rewrite, snapshots) = match state_difference(&cfg.source.table, meta, from, to)? {
        Some(chunk) => (chunk.rewrite, chunk.snapshots),
        None => (None, lineage::resolve_range(&cfg.source.table, meta, from, to)?),
    };
    // Output in the schema of the range's end, keys resolved there.
    let end = snapshots.last().or(rewrite.as_ref().map(|r| &r.to));
    let out_schema = lineage::snapshot_schema(meta, end);
    let key_ids = changelog::resolve_key(&out_schema, cfg.source.key_columns.as_deref())?;
    // the writer's buffers run beside the scan: it gets its share of the budget, the scan the rest
    let writer_memory = crate::config::share_of(cfg.engine.memory_budget, crate::output::OUTPUT_SHARE);
    let opts = ScanOptions { memory_budget: cfg.engine.memory_budget.saturating_sub(writer_memory).max(1), ..scan_options(cfg) };
    let scan = ChangelogScan::new(table, &out_schema, key_ids, opts)?;
    let mut writer = make_writer(scan.output_schema(), writer_memory)?;
    let mut summary = ChangesSummary { table: cfg.source.table.clone(), snapshots: snapshots.len(), ..Default::default() };
    // Like Spark's changelog, ordinals count the snapshots that can carry changes: compactions get none.
    let mut ordinal = 0i32;
    if let Some(rw) = &rewrite {
        // A not an ancestor of B: the changes that turn A's state into B's (see `plan`)
        summary.snapshots += rw.undo.len();
        let mut out = WriterConsumer(writer.as_mut());
        let mut inverse = crate::change::Inverse::new(&mut out);
        // what was read, counted as what was written: an undone INSERT is a DELETE, and so on
        if let Some(from) = &rw.clear {
            summary.count(&scan.scan_contents(from, &mut inverse).await?, true);
            inverse.flush().await?;
        }
        for snap in &rw.undo {
            summary.count(&scan.scan_snapshot(snap, ordinal, &mut inverse).await?, true);
            inverse.flush().await?;
            if snap.summary().operation != iceberg::spec::Operation::Replace {
                ordinal += 1;
            }
        }
        if rw.copy {
            summary.count(&scan.scan_contents(&rw.to, &mut out).await?, false);
        }
    }
    for snap in &snapshots {
        let st = scan.scan_snapshot(snap, ordinal, &mut WriterConsumer(writer.as_mut())).await?;
        if snap.summary().operation != iceberg::spec::Operation::Replace {
            ordinal += 1;
        }
        tracing::debug!(snapshot = st.snapshot_id, op = %st.operation, files = st.files_read, "snapshot scanned");
        if st.operation == "replace" {
            summary.skipped_replace += 1;
        }
        summary.count(&st, false);
        summary.one_pass_memory_budget = summary.one_pass_memory_budget.max(warn_in_parts(&st));
        on_snapshot(&st);
    }
    writer.finish()?;
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// When `from` is a snapshot that is not an ancestor of the range's end (rolled back, another line of history, a
/// replaced table's): the one chunk whose changes turn the source's state at `from` into its state at the end, as a
/// sink following a rewrite of the history gets it ([`plan::chunks`]). `None`: an ordinary range.
fn state_difference(table: &str, meta: &iceberg::spec::TableMetadata, from: Option<Bound>, to: Option<Bound>) -> Result<Option<Chunk>> {
    let Some(Bound::Snapshot(a)) = from else { return Ok(None) };
    let Some(end) = lineage::resolve_range(table, meta, None, to)?.last().cloned() else { return Ok(None) };
    let on_main = meta.current_snapshot_id().is_some_and(|head| lineage::is_ancestor(meta, a, head));
    if meta.snapshot_by_id(a).is_none() || lineage::is_ancestor(meta, a, end.snapshot_id()) || on_main {
        // expired, an ordinary range, or one given the wrong way round along the main branch: the ordinary path says
        return Ok(None);
    }
    let range = plan::Range { meta, name: table, end: &end };
    let start = plan::decide_start(range, table, None, Some(a), Initial::Copy, crate::config::OnHistoryRewrite::Follow)?;
    Ok(plan::chunks(range, start, 1)?.into_iter().next())
}

/// The live rows of `table`'s current snapshot (deletes of every kind applied), counted by the engine's own reader
/// with `cfg`'s engine settings: what a full read of the table costs, for benches.
pub async fn count_live_rows(cfg: &Config, table: &Table) -> Result<u64> {
    struct Count(u64);
    impl crate::change::ChangeConsumer for Count {
        async fn write(&mut self, batch: RecordBatch) -> Result<()> {
            self.0 += batch.num_rows() as u64;
            Ok(())
        }
    }
    let Some(head) = table.metadata().current_snapshot() else { return Ok(0) };
    let schema = lineage::snapshot_schema(table.metadata(), Some(head));
    let scan = ChangelogScan::new(table, &schema, Vec::new(), scan_options(cfg))?;
    let mut count = Count(0);
    scan.scan_contents(head, &mut count).await?;
    Ok(count.0)
}

/// What one `cdc sync` run did.
#[derive(Debug, Default, Serialize)]
pub struct SyncSummary {
    /// The source table.
    pub source_table: String,
    /// The destination (the Iceberg target table, or the sinks' labels).
    pub target_table: String,
    /// Whether this run created the target table.
    pub target_created: bool,
    /// Whether the run began with a bootstrap copy.
    pub bootstrap: bool,
    /// Source snapshots applied by this run.
    pub source_snapshots_applied: usize,
    /// Source snapshot the target is at after the run.
    pub source_snapshot_id: Option<i64>,
    /// The commits' ids in the destination (target snapshot ids).
    pub target_snapshot_ids: Vec<i64>,
    /// Rows inserted.
    pub inserts: u64,
    /// Rows deleted.
    pub deletes: u64,
    /// Rows updated.
    pub updates: u64,
    /// Files written.
    pub files_written: usize,
    /// Their bytes.
    pub bytes_written: u64,
    /// Target files closed before they were full: more partitions were open at once than the memory budget holds.
    pub files_closed_early: u64,
    /// Target rows deleted by position (position-delete files and deletion vectors).
    pub position_deletes: u64,
    /// `delete_mode = "position"`: target data files read to find the rows to delete by key …
    pub lookup_files_read: u64,
    /// … and the rows read from them.
    pub lookup_rows_read: u64,
    /// Source data files read (a file read twice counts twice) and their bytes.
    pub source_files_read: u64,
    /// Bytes of the source files read.
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
    /// The source's history was rewritten under the destination, and the run followed it (one commit).
    pub history_rewrite: Option<HistoryRewrite>,
    /// Target snapshots the run's commits expired, and the files only they referenced that went with them.
    pub snapshots_expired: u64,
    /// Files deleted with the expired snapshots.
    pub files_deleted: u64,
    /// Small target manifests the run's commits merged into fewer.
    pub manifests_merged: u64,
    /// Compactions of the target after the run's commits.
    pub compactions: u64,
    /// Data and delete files those compactions removed.
    pub files_rewritten: u64,
    /// Wall-clock time of the run.
    pub seconds: f64,
    /// Object-store requests and bytes during this run (zero on local disk; process-wide, so in a service running
    /// several pipelines at once it includes theirs).
    pub object_store: crate::storage::IoStats,
}

/// A rewrite of the source's history that a run followed (see [`plan`]'s module docs).
#[derive(Debug, Clone, Serialize)]
pub struct HistoryRewrite {
    /// rollback, rewrite, replace or recreate.
    pub kind: crate::sink::RewriteKind,
    /// The source snapshot the destination was at (`null`: the progress of a dropped table).
    pub from_snapshot: Option<i64>,
    /// The source snapshot it is at now.
    pub to_snapshot: i64,
    /// Source snapshots whose changes were undone.
    pub undone_snapshots: usize,
    /// Rows the following commit inserted, deleted and updated.
    pub inserts: u64,
    /// See `inserts`.
    pub deletes: u64,
    /// See `inserts`.
    pub updates: u64,
}

impl HistoryRewrite {
    /// Event: the one log line of a followed rewrite (the service counts it in `cdc_history_rewrites_total`).
    fn log(&self, sink: &str, source: &str, target_snapshot: i64) {
        tracing::warn!(
            sink,
            source,
            kind = self.kind.as_str(),
            from_snapshot = self.from_snapshot,
            to_snapshot = self.to_snapshot,
            undone_snapshots = self.undone_snapshots,
            inserts = self.inserts,
            deletes = self.deletes,
            updates = self.updates,
            target_snapshot,
            "the source's history was rewritten ({}); one commit brought the destination to the source's state at snapshot {}",
            self.kind.as_str(),
            self.to_snapshot
        );
    }

    /// The rewrite a landed commit of `chunk` followed, if it followed one.
    fn of(chunk: &Chunk, stats: &CommitStats) -> Option<Self> {
        let (kind, from_snapshot, undone_snapshots) = match &chunk.rewrite {
            Some(rw) => (rw.kind, rw.from, rw.undo.len()),
            None if stats.recreated => (crate::sink::RewriteKind::Recreate, None, 0),
            None => return None,
        };
        Some(HistoryRewrite {
            kind,
            from_snapshot,
            to_snapshot: chunk.last().snapshot_id(),
            undone_snapshots,
            inserts: stats.inserts,
            deletes: stats.deletes,
            updates: stats.updates,
        })
    }
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
    /// The first source snapshot the commit covers.
    pub first_source_snapshot: i64,
    /// The last one: the commit records it as progress.
    pub last_source_snapshot: i64,
    /// How many source snapshots it covers.
    pub source_snapshots: usize,
    /// The commit in the destination.
    pub target_snapshot_id: Option<i64>,
    /// What it wrote.
    pub stats: CommitStats,
    /// Source snapshots the current plan covers, and how many of them are applied with this commit.
    pub planned_snapshots: usize,
    /// Source snapshots of the plan applied so far, this commit included.
    pub done_snapshots: usize,
}

/// The source as sinks see it; `end` is the end of the range (its schema names the keys when the current one
/// lacks them).
pub(crate) fn source_info(cfg: &Config, source: &Table, end: &iceberg::spec::SnapshotRef) -> Result<SourceInfo> {
    let smeta = source.metadata();
    // Keys are named as the user sees the table (its current schema, else the range end's); ids from then on.
    let configured = cfg.source.key_columns.iter().flatten().chain(cfg.targets().flat_map(|t| t.equality_columns.iter().flatten()));
    let names_schema = if configured.clone().all(|n| smeta.current_schema().field_by_name(n).is_some()) {
        smeta.current_schema().clone()
    } else {
        lineage::snapshot_schema(smeta, Some(end))
    };
    let key_ids = changelog::resolve_key(&names_schema, cfg.source.key_columns.as_deref())?;
    Ok(SourceInfo {
        uuid: smeta.uuid().to_string(),
        name: cfg.source.table.clone(),
        metadata: source.metadata_ref(),
        key_ids,
        names_schema,
        on_history_rewrite: cfg.source.on_history_rewrite,
    })
}

/// `cdc sync`: replicates the source range `(from, to]` into `sinks` (from [`crate::sink::open`]) and returns what
/// the run did. Exactly once under concurrency: see [`run`].
pub async fn run_sync(
    cfg: &Config,
    sinks: &mut [Box<dyn Sink>],
    from: Option<Bound>,
    to: Option<Bound>,
    on_commit: impl FnMut(&CommitReport),
) -> Result<SyncSummary> {
    let (_, source) = load_source(cfg).await?;
    let mut summary = run(cfg, &source, sinks, from, to, &RunControl::default(), on_commit).await?;
    if let Some(t) = cfg.targets().next() {
        summary.target_table = t.table.clone();
    }
    Ok(summary)
}

/// The runner, the same for `cdc sync` and every poll of the service: replicates the source range `(from, to]` into
/// `sinks`, one commit per chunk of source snapshots, each recording the source snapshot it brings the sinks up to.
/// Several sinks share one read of the source (a [`FanOut`]); those behind the most advanced one first catch up
/// alone ([`plan::share`]). `source` is the source table as the caller loaded it.
///
/// Exactly once under concurrency: a plan starts from the progress a sink records, and each commit is valid only on
/// that progress. When another writer moved it, the sink answers [`Committed::Replan`] and the run plans again from
/// what it records — never re-applying a range and never moving the progress backwards.
pub async fn run(
    cfg: &Config,
    source: &Table,
    sinks: &mut [Box<dyn Sink>],
    from: Option<Bound>,
    to: Option<Bound>,
    control: &RunControl,
    mut on_commit: impl FnMut(&CommitReport),
) -> Result<SyncSummary> {
    let meta = source.metadata();
    let current = match (sinks.len(), meta.current_snapshot()) {
        (0, _) => return Err(Error::Internal("a run without sinks".into())),
        (1, _) | (_, None) => None,
        (_, Some(c)) => Some(c),
    };
    let Some(current) = current else {
        let mut fan = FanOut::new(sinks.iter_mut().map(|s| s.as_mut() as &mut dyn Sink).collect());
        return run_sink(cfg, source, &mut fan, from, to, control, &mut on_commit).await;
    };
    let info = source_info(cfg, source, current)?;
    let mut recorded = Vec::new();
    for s in sinks.iter_mut() {
        recorded.push(s.recorded(&info).await?);
    }
    let initials: Vec<Initial> = sinks.iter().map(|s| s.profile().initial).collect();
    let mut caught_up = 0;
    match plan::share(meta, &recorded, &initials) {
        plan::Sharing::Separately => {
            let mut last = SyncSummary::default();
            for s in sinks.iter_mut() {
                last = run_sink(cfg, source, s.as_mut(), from, to, control, &mut on_commit).await?;
            }
            return Ok(last);
        }
        plan::Sharing::CatchUp { behind, to: ahead } => {
            for i in behind {
                let s = sinks[i].as_mut();
                tracing::info!(sink = %s.label(), from = recorded[i], to = ahead, "catching up alone before the shared read");
                caught_up += run_sink(cfg, source, s, from, Some(Bound::Snapshot(ahead)), control, &mut on_commit).await?.source_snapshots_applied;
            }
        }
        plan::Sharing::Together => {}
    }
    let mut fan = FanOut::new(sinks.iter_mut().map(|s| s.as_mut() as &mut dyn Sink).collect());
    let mut summary = run_sink(cfg, source, &mut fan, from, to, control, &mut on_commit).await?;
    summary.source_snapshots_applied += caught_up;
    Ok(summary)
}

/// One sink (or one [`FanOut`]) over the range: sets up the scan, then [`apply`] carries out the plans.
async fn run_sink(
    cfg: &Config,
    source: &Table,
    sink: &mut dyn Sink,
    from: Option<Bound>,
    to: Option<Bound>,
    control: &RunControl,
    on_commit: &mut dyn FnMut(&CommitReport),
) -> Result<SyncSummary> {
    let started = Instant::now();
    let io0 = crate::storage::io_stats();
    let (retries0, created0) = (sink.retries(), sink.created());
    let smeta = source.metadata();
    let name = &cfg.source.table;
    let mut summary = SyncSummary { source_table: name.clone(), target_table: sink.label(), ..Default::default() };
    let Some(end) = lineage::resolve_range(name, smeta, None, to)?.last().cloned() else {
        summary.seconds = started.elapsed().as_secs_f64();
        return Ok(summary); // a source without snapshots has nothing to copy
    };
    let from_id = from.map(|b| plan::resolve_bound(name, smeta, b)).transpose()?;
    let info = source_info(cfg, source, &end)?;
    let range = plan::Range { meta: smeta, name, end: &end };
    // One scan for the run: its delete cache serves every commit.
    // the sink's writers run beside the scan (a partition-aligned rewrite is written while other groups match): the
    // scan divides what they leave of the budget
    let profile = sink.profile();
    let scan_budget = cfg.engine.memory_budget.saturating_sub(profile.reserved_memory).max(1);
    let opts = ScanOptions { key_order: profile.needs_key_order, memory_budget: scan_budget, ..scan_options(cfg) };
    let mut scan = ChangelogScan::new(source, &range.schema_at(&end), info.key_ids.clone(), opts)?;
    if let Some(cache) = &control.cache {
        scan = scan.with_cache(cache.clone());
    }
    let mut feed = ScanFeed { scan, stats: ScanTotals::default() };
    let applied = apply(range, sink, &info, from_id, &mut feed, control.stop.as_ref(), &mut summary, on_commit).await;
    let t = feed.stats;
    summary.source_files_read = t.files_read;
    summary.source_bytes_read = t.bytes_read;
    summary.spilled_bytes = t.spilled_bytes;
    summary.one_pass_memory_budget = t.one_pass_memory_budget;
    applied?;
    summary.retries = sink.retries() - retries0;
    summary.target_created = sink.created() && !created0;
    summary.seconds = started.elapsed().as_secs_f64();
    // process-wide counters: exact for `cdc sync`, an upper bound when a service runs pipelines side by side
    summary.object_store = crate::storage::io_stats().since(&io0);
    summary.peak_rss_bytes = peak_rss_bytes();
    Ok(summary)
}

/// Where the rows of a commit come from: the changelog scan in a run; a fake in the apply loop's unit tests.
#[async_trait::async_trait(?Send)]
trait Feed {
    /// Writes the change rows of `chunk` into `sink`'s open commit.
    async fn feed(&mut self, chunk: &Chunk, sink: &mut dyn Sink) -> Result<()>;
}

/// What the scan read over a run.
#[derive(Default)]
struct ScanTotals {
    files_read: u64,
    bytes_read: u64,
    spilled_bytes: u64,
    one_pass_memory_budget: Option<u64>,
}

/// The changelog scan as a [`Feed`].
struct ScanFeed<'t> {
    scan: ChangelogScan<'t>,
    stats: ScanTotals,
}

#[async_trait::async_trait(?Send)]
impl Feed for ScanFeed<'_> {
    async fn feed(&mut self, chunk: &Chunk, sink: &mut dyn Sink) -> Result<()> {
        self.scan.set_output(&chunk.schema)?;
        self.scan.set_removed_columns(sink.removed_columns());
        let mut rows = OpenCommit(sink);
        let stats = &mut self.stats;
        let mut add = |st: SnapshotStats| {
            stats.files_read += st.files_read;
            stats.bytes_read += st.bytes_read;
            stats.spilled_bytes += st.spilled_bytes();
            stats.one_pass_memory_budget = stats.one_pass_memory_budget.max(warn_in_parts(&st));
        };
        let mut ordinal = 0i32;
        if let Some(rw) = &chunk.rewrite {
            // the undone rows become rows to insert again: they are read whole
            self.scan.set_removed_columns(None);
            let mut inverse = crate::change::Inverse::new(&mut rows);
            if let Some(from) = &rw.clear {
                add(self.scan.scan_contents(from, &mut inverse).await?);
                inverse.flush().await?;
            }
            for s in &rw.undo {
                add(self.scan.scan_snapshot(s, ordinal, &mut inverse).await?);
                inverse.flush().await?;
                ordinal += 1;
            }
            if rw.copy {
                add(self.scan.scan_contents(&rw.to, &mut rows).await?);
            }
        }
        if chunk.bootstrap {
            add(self.scan.scan_contents(chunk.last(), &mut rows).await?);
        } else {
            for s in &chunk.snapshots {
                add(self.scan.scan_snapshot(s, ordinal, &mut rows).await?);
                ordinal += 1;
            }
        }
        Ok(())
    }
}

/// The apply loop: plans from what `sink` records ([`plan::decide_start`], [`plan::chunks`]) and carries the plan
/// out — begin, feed, commit per chunk; a failed feed aborts the open commit; [`Committed::Replan`] plans again (at
/// most [`MAX_REPLANS`] times). Fills `summary` with what landed.
#[allow(clippy::too_many_arguments)]
async fn apply(
    range: plan::Range<'_>,
    sink: &mut dyn Sink,
    info: &SourceInfo,
    from: Option<i64>,
    feed: &mut dyn Feed,
    stop: Option<&tokio::sync::watch::Receiver<bool>>,
    summary: &mut SyncSummary,
    on_commit: &mut dyn FnMut(&CommitReport),
) -> Result<()> {
    let (label, profile) = (sink.label(), sink.profile());
    let end = range.end.snapshot_id();
    let mut replans = 0u32;
    loop {
        let recorded = sink.recorded(info).await?;
        let start = plan::decide_start(range, &label, from, recorded, profile.initial, info.on_history_rewrite)?;
        let (first_schema, bootstrap) = match start {
            plan::Start::Done(p) => {
                if replans == 0 && p != end {
                    tracing::info!(progress = p, end, "the target is already past the end of the range; nothing to do");
                }
                summary.source_snapshot_id = Some(p);
                break;
            }
            plan::Start::Bootstrap => (range.schema_at(range.end), true),
            plan::Start::After(a) => (range.schema_at(&range.snapshot(a)?), false),
            plan::Start::Beginning | plan::Start::Rewritten { .. } => (range.schema_at(range.end), false),
        };
        // Re-check on the state the sink will commit on: it may have changed since `recorded`.
        if sink.prepare(info, &first_schema, bootstrap).await? == recorded {
            let mut base = match start {
                plan::Start::After(a) | plan::Start::Rewritten { from: a, .. } => Some(a),
                _ => None,
            };
            let chunks = plan::chunks(range, start, profile.snapshots_per_commit)?;
            let planned: usize = chunks.iter().map(|c| c.snapshots.len()).sum();
            // snapshots of empty commits wait for the next one that lands
            let mut pending: Vec<iceberg::spec::SnapshotRef> = Vec::new();
            let (mut replan, mut done) = (false, 0usize);
            for mut chunk in chunks {
                chunk.base = base;
                pending.extend(chunk.snapshots.iter().cloned());
                sink.begin(info, &chunk).await?;
                if let Err(e) = feed.feed(&chunk, sink).await {
                    sink.abort().await;
                    return Err(e);
                }
                match sink.commit(info, stop).await? {
                    Committed::Done { id, stats } => {
                        summary.bootstrap |= chunk.bootstrap;
                        if let Some(followed) = HistoryRewrite::of(&chunk, &stats) {
                            followed.log(&label, &info.name, id);
                            summary.history_rewrite = Some(followed);
                        }
                        done += pending.len();
                        record(summary, &pending, Some(id), stats, (planned, done), on_commit);
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
    Ok(())
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
struct OpenCommit<'a>(&'a mut dyn Sink);

impl crate::change::ChangeConsumer for OpenCommit<'_> {
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
    on_commit: &mut dyn FnMut(&CommitReport),
) {
    summary.source_snapshots_applied += snaps.len();
    summary.inserts += stats.inserts;
    summary.deletes += stats.deletes;
    summary.updates += stats.updates;
    summary.files_written += stats.files;
    summary.files_closed_early += stats.files_closed_early;
    summary.position_deletes += stats.position_deletes;
    summary.lookup_files_read += stats.lookup_files_read;
    summary.lookup_rows_read += stats.lookup_rows_read;
    summary.bytes_written += stats.bytes;
    summary.snapshots_expired += stats.maintenance.snapshots_expired;
    summary.files_deleted += stats.maintenance.files_deleted;
    summary.manifests_merged += stats.maintenance.manifests_merged;
    summary.compactions += stats.maintenance.compactions;
    summary.files_rewritten += stats.maintenance.files_rewritten;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::testing::metadata;
    use iceberg::spec::SchemaRef;
    use serde_json::json;

    /// A sink that records what the runner asks of it; its progress moves with its commits, or — at commit
    /// `moved_at` — to another writer's `moved_to`, answering `Replan`.
    #[derive(Default)]
    struct FakeSink {
        progress: Option<i64>,
        events: Vec<String>,
        commits: usize,
        moved_at: Option<usize>,
        moved_to: Option<i64>,
        always_replan: bool,
        open: Option<(Vec<i64>, Option<i64>)>,
    }

    #[async_trait::async_trait]
    impl Sink for FakeSink {
        fn label(&self) -> String {
            "fake".into()
        }
        fn profile(&self) -> crate::sink::Profile {
            crate::sink::Profile { initial: Initial::Copy, snapshots_per_commit: 2, reserved_memory: 0, needs_key_order: true }
        }
        async fn recorded(&mut self, _: &SourceInfo) -> Result<Option<i64>> {
            Ok(self.progress)
        }
        async fn prepare(&mut self, _: &SourceInfo, _: &SchemaRef, bootstrap: bool) -> Result<Option<i64>> {
            self.events.push(format!("prepare bootstrap={bootstrap}"));
            Ok(self.progress)
        }
        async fn begin(&mut self, _: &SourceInfo, chunk: &Chunk) -> Result<()> {
            let ids: Vec<i64> = chunk.snapshots.iter().map(|s| s.snapshot_id()).collect();
            self.events.push(format!("begin {ids:?} base={:?}", chunk.base));
            self.open = Some((ids, chunk.base));
            Ok(())
        }
        async fn write(&mut self, _: RecordBatch) -> Result<()> {
            Ok(())
        }
        async fn commit(&mut self, _: &SourceInfo, _: Option<&tokio::sync::watch::Receiver<bool>>) -> Result<Committed> {
            self.commits += 1;
            let (ids, base) = self.open.take().expect("begun");
            Ok(if self.always_replan || self.moved_at == Some(self.commits) {
                self.progress = self.moved_to.or(self.progress);
                self.events.push("replan".into());
                Committed::Replan
            } else {
                assert_eq!(base, self.progress, "a commit is valid only on the progress it was planned from");
                self.progress = ids.last().copied();
                self.events.push("commit".into());
                Committed::Done { id: 100 + self.commits as i64, stats: CommitStats::default() }
            })
        }
        async fn abort(&mut self) {
            self.events.push("abort".into());
        }
        fn retries(&self) -> u32 {
            0
        }
        fn created(&self) -> bool {
            false
        }
    }

    /// Feeds nothing; fails on the chunk holding snapshot `fail_on`.
    struct FakeFeed {
        fail_on: Option<i64>,
    }

    #[async_trait::async_trait(?Send)]
    impl Feed for FakeFeed {
        async fn feed(&mut self, chunk: &Chunk, _: &mut dyn Sink) -> Result<()> {
            if chunk.snapshots.iter().any(|s| Some(s.snapshot_id()) == self.fail_on) {
                Err(Error::Internal("scan failed".into()))
            } else {
                Ok(())
            }
        }
    }

    /// Runs the apply loop over source snapshots 1 ← 2 ← 3 ← 4 (end 4), two per commit (the sink's profile).
    fn apply_to(sink: &mut FakeSink, fail_on: Option<i64>) -> (Result<()>, SyncSummary) {
        let s = |id, parent| (id, parent, id, 1_000 * id, json!({}));
        let meta = metadata(&[s(1, None), s(2, Some(1)), s(3, Some(2)), s(4, Some(3))], json!({}), json!({}), 4);
        let end = meta.snapshot_by_id(4).unwrap().clone();
        let info = SourceInfo {
            uuid: meta.uuid().to_string(),
            name: "db.t".into(),
            names_schema: meta.current_schema().clone(),
            on_history_rewrite: Default::default(),
            metadata: std::sync::Arc::new(meta.clone()),
            key_ids: vec![1],
        };
        let range = plan::Range { meta: &meta, name: "db.t", end: &end };
        let mut summary = SyncSummary::default();
        let mut reports = Vec::new();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let r = rt.block_on(apply(range, sink, &info, None, &mut FakeFeed { fail_on }, None, &mut summary, &mut |c| reports.push(c.clone())));
        assert_eq!(reports.len(), summary.target_snapshot_ids.len(), "one report per landed commit");
        (r, summary)
    }

    #[test]
    fn a_plan_is_carried_out_commit_by_commit_each_on_the_progress_before_it() {
        let mut sink = FakeSink { progress: Some(1), ..Default::default() };
        let (r, summary) = apply_to(&mut sink, None);
        r.unwrap();
        assert_eq!(sink.events, ["prepare bootstrap=false", "begin [2, 3] base=Some(1)", "commit", "begin [4] base=Some(3)", "commit"]);
        assert_eq!((summary.source_snapshot_id, summary.source_snapshots_applied, summary.replans), (Some(4), 3, 0));
        assert_eq!(summary.target_snapshot_ids, [101, 102]);
    }

    #[test]
    fn a_sink_without_progress_gets_a_copy_and_one_at_the_end_has_nothing_to_do() {
        let mut sink = FakeSink::default();
        apply_to(&mut sink, None).0.unwrap();
        assert_eq!(sink.events, ["prepare bootstrap=true", "begin [4] base=None", "commit"]);
        let mut done = FakeSink { progress: Some(4), ..Default::default() };
        let (r, summary) = apply_to(&mut done, None);
        r.unwrap();
        assert!(done.events.is_empty(), "{:?}", done.events);
        assert_eq!(summary.source_snapshot_id, Some(4));
    }

    #[test]
    fn another_writers_progress_makes_the_run_plan_again_from_it() {
        // at the first commit another applier had applied 2 and 3: the run goes on after 3, applying nothing twice
        let mut sink = FakeSink { progress: Some(1), moved_at: Some(1), moved_to: Some(3), ..Default::default() };
        let (r, summary) = apply_to(&mut sink, None);
        r.unwrap();
        assert_eq!(
            sink.events,
            ["prepare bootstrap=false", "begin [2, 3] base=Some(1)", "replan", "prepare bootstrap=false", "begin [4] base=Some(3)", "commit"]
        );
        assert_eq!((summary.source_snapshot_id, summary.source_snapshots_applied, summary.replans), (Some(4), 1, 1));
    }

    #[test]
    fn a_failed_scan_aborts_the_open_commit_and_keeps_what_landed() {
        let mut sink = FakeSink { progress: Some(1), ..Default::default() };
        let (r, summary) = apply_to(&mut sink, Some(4));
        assert!(r.unwrap_err().to_string().contains("scan failed"));
        assert_eq!(sink.events, ["prepare bootstrap=false", "begin [2, 3] base=Some(1)", "commit", "begin [4] base=Some(3)", "abort"]);
        assert_eq!((sink.progress, summary.source_snapshots_applied), (Some(3), 2));
    }

    #[test]
    fn a_target_that_keeps_moving_ends_the_run_with_a_conflict() {
        let mut sink = FakeSink { progress: Some(1), always_replan: true, ..Default::default() };
        let e = apply_to(&mut sink, None).0.unwrap_err();
        assert!(matches!(e, Error::Conflict { .. }) && e.to_string().contains("kept moving"), "{e}");
        assert_eq!(sink.commits, MAX_REPLANS as usize + 1);
    }
}

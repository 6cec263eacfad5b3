//! Runs a changelog scan over a range and hands the change rows to a writer.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use iceberg::table::Table;
use serde::Serialize;

use crate::catalog::Catalog;
use crate::change::ChangeType;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::output::{ChangeWriter, WriterSink};
use crate::sink::iceberg::apply::{CommitStats, CommitWriter, WriterSpec};
use crate::sink::iceberg::evolve::{self, EvolveOptions, FieldMap};
use crate::sink::iceberg::rowdelta::RowDelta;
use crate::sink::iceberg::{progress, target};
use crate::source::changelog::{self, ChangelogScan, ScanOptions, SnapshotStats};
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
    /// Commit attempts repeated after a conflict or a transient failure.
    pub retries: u32,
    /// Times the run planned again because another writer moved the target's progress.
    pub replans: u32,
    pub seconds: f64,
}

/// Catalog connections a sync runs on (the daemon keeps them across polls), and the signal that asks an in-flight
/// run to stop before its next catalog commit.
pub struct SyncContext<'a> {
    pub source: &'a Catalog,
    pub target: &'a Catalog,
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
}

impl SyncContext<'_> {
    fn stopping(&self) -> bool {
        self.stop.as_ref().is_some_and(|s| *s.borrow())
    }
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

/// Where a sync starts, decided from the target's recorded progress and the user's `--from`.
enum Start {
    /// Copy the source's contents at the end snapshot (the target has no progress and no `--from`).
    Bootstrap,
    /// Apply the changes after this source snapshot.
    After(i64),
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

/// What the source side of a sync needs for every plan: the table, the range end, keys by field id.
struct SyncSource<'a> {
    cfg: &'a Config,
    table: Table,
    uuid: String,
    end: iceberg::spec::SnapshotRef,
    key_ids: Vec<i32>,
    equality_ids: Vec<i32>,
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
fn decide_start(src: &SyncSource, target: &str, from: Option<i64>, recorded: Option<i64>) -> Result<Start> {
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
        return Ok(match from {
            Some(a) => Start::After(a),
            None => Start::Bootstrap,
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

/// How one planned commit ended.
enum Committed {
    /// The commit landed as this target snapshot.
    Snapshot(i64, CommitStats),
    /// Nothing to write (compactions only): the progress moves with the next commit.
    Empty,
    /// The target moved under the plan (another applier committed progress, or the schema changed): re-plan.
    Replan,
}

/// The applier's one-shot run (the daemon loops over it): replicate the source range into the target as
/// merge-on-read commits, each recording the source snapshot it brings the target up to.
///
/// Exactly once under concurrency: a plan starts from the progress the target records, and each commit requires the
/// target head (and schema) it was planned on. When another writer moved the target, the commit fails, the target is
/// reloaded, and if the recorded progress is no longer the plan's start the run re-plans from the new progress —
/// never re-applying a range and never moving the progress backwards.
pub async fn run_sync(cfg: &Config, from: Option<Bound>, to: Option<Bound>, on_commit: impl FnMut(&CommitReport)) -> Result<SyncSummary> {
    let tcfg = cfg.target.as_ref().ok_or_else(|| Error::Config(vec!["[target]: required for `cdc sync` (table and catalog to write to)".into()]))?;
    let source = Catalog::connect(&cfg.source.catalog, "source").await?;
    let target = Catalog::connect(&tcfg.catalog, "target").await?;
    run_sync_on(cfg, &SyncContext { source: &source, target: &target, stop: None }, from, to, on_commit).await
}

/// [`run_sync`] on catalogs already connected: what `cdc sync` and every poll of the daemon run.
pub async fn run_sync_on(
    cfg: &Config,
    ctx: &SyncContext<'_>,
    from: Option<Bound>,
    to: Option<Bound>,
    mut on_commit: impl FnMut(&CommitReport),
) -> Result<SyncSummary> {
    let started = Instant::now();
    let tcfg = cfg.target.as_ref().ok_or_else(|| Error::Config(vec!["[target]: required for `cdc sync` (table and catalog to write to)".into()]))?;
    let source = ctx.source.load_table(&cfg.source.table).await?;
    let smeta = source.metadata();
    let name = &cfg.source.table;
    let mut summary = SyncSummary { source_table: name.clone(), target_table: tcfg.table.clone(), ..Default::default() };
    let Some(end) = lineage::resolve_range(name, smeta, None, to)?.last().cloned() else {
        summary.seconds = started.elapsed().as_secs_f64();
        return Ok(summary); // a source without snapshots has nothing to copy
    };
    let from_id = from.map(|b| resolve_bound(name, smeta, b)).transpose()?;
    // Keys are named as the user sees the table (its current schema, else the range end's); ids from then on.
    let names_schema = if cfg
        .source
        .key_columns
        .iter()
        .flatten()
        .chain(tcfg.equality_columns.iter().flatten())
        .all(|n| smeta.current_schema().field_by_name(n).is_some())
    {
        smeta.current_schema().clone()
    } else {
        lineage::snapshot_schema(smeta, Some(&end))
    };
    let key_ids = changelog::resolve_key(&names_schema, cfg.source.key_columns.as_deref())?;
    let equality_ids = target::equality_ids(&names_schema, tcfg.equality_columns.as_deref(), &key_ids)?;
    let src = SyncSource { cfg, uuid: smeta.uuid().to_string(), table: source.clone(), end, key_ids, equality_ids };
    let tcat = ctx.target;
    // One scan for the run: its delete cache serves every commit.
    let mut scan = ChangelogScan::new(&source, &lineage::snapshot_schema(smeta, Some(&src.end)), src.key_ids.clone(), scan_options(cfg))?;

    let mut replans = 0u32;
    'plan: loop {
        let existing = match tcat.load_table(&tcfg.table).await {
            Ok(t) => Some(t),
            Err(Error::TableNotFound { .. }) => None,
            Err(e) => return Err(e),
        };
        let recorded = existing.as_ref().and_then(|t| progress::read(t.metadata(), &src.uuid)).map(|p| p.source_snapshot_id);
        let start = decide_start(&src, &tcfg.table, from_id, recorded)?;
        let first_schema = match start {
            Start::Done(p) => {
                if replans == 0 && p != src.end.snapshot_id() {
                    tracing::info!(
                        target_progress = p,
                        end = src.end.snapshot_id(),
                        "the target is already past the end of the range; nothing to do"
                    );
                }
                summary.source_snapshot_id = Some(p);
                break 'plan;
            }
            Start::Bootstrap => src.schema_at(&src.end),
            Start::After(a) => src.schema_at(&src.snapshot(a)?),
        };
        let t = target::ensure(tcat, &tcfg.table, smeta, &first_schema, &src.key_ids, tcfg.format_version).await?;
        summary.target_created |= t.created;
        let (mut table, mut map) = (t.table, t.map);
        // Re-check on the table we will commit on: it may have changed since the load above.
        if progress::read(table.metadata(), &src.uuid).map(|p| p.source_snapshot_id) != recorded {
            replans += 1;
            continue 'plan;
        }
        let outcome = match start {
            Start::Bootstrap => {
                let has_rows = table.metadata().current_snapshot().and_then(|s| s.summary().additional_properties.get("total-records").cloned());
                if has_rows.as_deref().is_some_and(|n| n != "0") {
                    return Err(Error::Range(format!(
                        "the target `{}` already holds rows but has no progress for `{name}`: give --from-snapshot to apply only changes after a source snapshot, or empty the target",
                        tcfg.table
                    )));
                }
                let chunk = [src.end.clone()];
                let c = commit_chunk(&src, &mut scan, tcfg, ctx, &mut summary.retries, &mut table, &mut map, &chunk, None, true).await?;
                summary.bootstrap |= matches!(c, Committed::Snapshot(..));
                match c {
                    Committed::Snapshot(id, stats) => {
                        record(&mut summary, &chunk, Some(id), stats, &mut on_commit);
                        None
                    }
                    Committed::Empty => None,
                    Committed::Replan => Some(()),
                }
            }
            Start::After(a) => {
                let snapshots = lineage::resolve_range(name, smeta, Some(Bound::Snapshot(a)), Some(Bound::Snapshot(src.end.snapshot_id())))?;
                let chunks: Vec<_> = snapshots.chunks(tcfg.snapshots_per_commit.unwrap_or(1)).collect();
                let mut pending: Vec<iceberg::spec::SnapshotRef> = Vec::new();
                let mut base = a;
                let mut replan = None;
                for (i, chunk) in chunks.iter().enumerate() {
                    pending.extend(chunk.iter().cloned());
                    // Snapshots without changes (compactions) move the progress with the next commit; the last chunk
                    // commits anyway so the recorded progress reaches the end of the range.
                    let must_commit = i + 1 == chunks.len();
                    match commit_chunk(&src, &mut scan, tcfg, ctx, &mut summary.retries, &mut table, &mut map, chunk, Some(base), must_commit).await?
                    {
                        Committed::Snapshot(id, stats) => {
                            record(&mut summary, &pending, Some(id), stats, &mut on_commit);
                            pending.clear();
                            base = chunk.last().expect("chunks are not empty").snapshot_id();
                        }
                        Committed::Empty => {}
                        Committed::Replan => {
                            replan = Some(());
                            break;
                        }
                    }
                }
                replan
            }
            Start::Done(_) => unreachable!("handled above"),
        };
        if outcome.is_none() {
            summary.source_snapshot_id = progress::read(table.metadata(), &src.uuid).map(|p| p.source_snapshot_id);
            break;
        }
        replans += 1;
        if replans > MAX_REPLANS {
            return Err(Error::Conflict {
                table: tcfg.table.clone(),
                message: format!("the target kept moving under {MAX_REPLANS} plans; is another applier syncing it in a loop?"),
            });
        }
        tracing::info!(replans, "another writer moved the target's progress; planning again from what it recorded");
    }
    summary.replans = replans;
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// Re-plans allowed in one run: each follows another writer's progress, so this only stops a livelock.
const MAX_REPLANS: u32 = 100;

/// Reads the changes of `chunk` (or, `base == None`, the contents of its snapshot: the bootstrap copy), evolves the
/// target schema to the chunk's source schema, writes the files and commits them with the progress of the chunk's
/// last snapshot — valid only while the target records `base` and has the schema the plan used.
#[allow(clippy::too_many_arguments)]
async fn commit_chunk(
    src: &SyncSource<'_>,
    scan: &mut ChangelogScan<'_>,
    tcfg: &crate::config::TargetConfig,
    ctx: &SyncContext<'_>,
    retries: &mut u32,
    target: &mut Table,
    map: &mut FieldMap,
    chunk: &[iceberg::spec::SnapshotRef],
    base: Option<i64>,
    must_commit: bool,
) -> Result<Committed> {
    let chunk_started = Instant::now();
    let last = chunk.last().expect("chunks are not empty");
    let bootstrap = base.is_none();
    let schema = src.schema_at(last);
    let tmeta = target.metadata();
    let pinned: HashSet<i32> = tmeta.default_partition_spec().fields().iter().map(|f| f.source_id).collect();
    let opts = EvolveOptions {
        keep_dropped_columns: tcfg.keep_dropped_columns,
        defaults_allowed: tmeta.format_version() >= iceberg::spec::FormatVersion::V3,
    };
    let evo = evolve::evolve(tmeta.current_schema(), tmeta.last_column_id(), map, &schema, &src.key_ids, last.snapshot_id(), &pinned, opts)?;
    if !evo.changes.is_empty() {
        tracing::info!(source_snapshot = last.snapshot_id(), changes = %evo.changes.join("; "), "target schema follows the source");
    }
    let equality_ids = src
        .equality_ids
        .iter()
        .map(|id| evo.map.target_of(*id).ok_or_else(|| Error::Schema(format!("equality column (source field id {id}) has no target column"))))
        .collect::<Result<Vec<_>>>()?;
    let write_schema = Arc::new(evo.schema.clone());
    let spec = WriterSpec {
        schema: write_schema,
        map: &evo.map,
        equality_ids,
        target_file_size: tcfg.target_file_size,
        bootstrap,
        multi_snapshot: chunk.len() > 1,
    };
    let mut w = CommitWriter::new(target, spec)?;
    scan.set_output(&schema)?;
    let scanned: Result<()> = async {
        if bootstrap {
            scan.scan_contents(last, &mut w).await?;
        } else {
            for (ordinal, s) in chunk.iter().enumerate() {
                scan.scan_snapshot(s, ordinal as i32, &mut w).await?;
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = scanned {
        delete_files(target, w.abort()).await;
        return Err(e);
    }
    let (data, dels, stats) = w.finish().await?;
    let map_recorded = FieldMap::read(tmeta, &src.uuid).ok().flatten().as_ref() == Some(&evo.map);
    if data.is_empty() && dels.is_empty() && !evo.changed && map_recorded && !must_commit {
        return Ok(Committed::Empty);
    }
    let files: Vec<String> = data.iter().chain(&dels).map(|f| f.file_path().to_string()).collect();
    let props = progress::properties(&src.uuid, src.name(), last.snapshot_id(), last.sequence_number());
    let table_props = if map_recorded { HashMap::new() } else { HashMap::from([(FieldMap::property_key(&src.uuid), evo.map.to_property())]) };
    let planned_schema = tmeta.current_schema_id();
    let mut attempt = 0u32;
    test_pause_before_commit();
    loop {
        let mut delta = RowDelta::new()
            .add_data_files(data.iter().cloned())
            .add_delete_files(dels.iter().cloned())
            .set_snapshot_properties(props.clone())
            .set_table_properties(table_props.clone());
        if evo.changed {
            delta = delta.set_schema(evo.schema.clone());
        }
        let prepared = delta.prepare(target).await?;
        if ctx.stopping() {
            // shutting down: abandon before the catalog call, so the commit either happened or never will
            delete_files(target, files).await;
            return Err(Error::Cancelled);
        }
        match ctx.target.commit(target, prepared.requirements, prepared.updates).await {
            Ok(t) => {
                *target = t;
                *map = evo.map;
                let stats = CommitStats { seconds: chunk_started.elapsed().as_secs_f64(), ..stats };
                return Ok(Committed::Snapshot(prepared.snapshot_id, stats));
            }
            Err(e) if e.is_retryable() && attempt + 1 < tcfg.commit_retries => {
                attempt += 1;
                *retries += 1;
                let base_ms = tcfg.retry_backoff.as_millis() as u64 * (1u64 << attempt.min(10));
                let jitter = uuid::Uuid::new_v4().as_u64_pair().0 % (base_ms / 2 + 1);
                tracing::warn!(error = %e, attempt, "target commit failed, retrying");
                tokio::time::sleep(std::time::Duration::from_millis(base_ms / 2 + jitter)).await;
                *target = ctx.target.load_table(&tcfg.table).await?;
                let now = progress::read(target.metadata(), &src.uuid).map(|p| p.source_snapshot_id);
                if now != base || target.metadata().current_schema_id() != planned_schema {
                    tracing::warn!(planned_from = ?base, recorded = ?now, "another writer moved the target's progress or schema; discarding this commit's files");
                    delete_files(target, files).await;
                    return Ok(Committed::Replan);
                }
                // Only unrelated commits landed (no progress of ours moved): the same files apply on the new head.
            }
            Err(e) => {
                delete_files(target, files).await;
                return Err(e);
            }
        }
    }
}

/// Removes files a commit wrote but will never reference (best effort: an orphan is harmless, only wasted space).
async fn delete_files(table: &Table, paths: Vec<String>) {
    for p in paths {
        if let Err(e) = table.file_io().delete(&p).await {
            tracing::debug!(path = %p, error = %e, "could not remove an unreferenced file");
        }
    }
}

fn record(
    summary: &mut SyncSummary,
    snaps: &[iceberg::spec::SnapshotRef],
    id: Option<i64>,
    stats: CommitStats,
    on_commit: &mut impl FnMut(&CommitReport),
) {
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

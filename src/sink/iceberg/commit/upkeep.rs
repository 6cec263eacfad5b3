//! Upkeep of an Iceberg target, apart from the commit protocol: when compaction, expiry's file deletion and the orphan
//! sweep run, and where — between commits for a one-shot sync and position-delete targets, on their own tasks beside
//! the next commits for the service's equality-delete targets — and the target's rest ([`Upkeep::rest`]). What each
//! step does is in `compact`, `expire` and `maintain`; this module only schedules them and counts what they did.
//!
//! Invariants: every step is best effort (a failure is logged and counted, replication goes on, the step is tried
//! again when due again); a compaction commits through the target's gate, so it never races the applier's commits.
use std::time::Instant;

use futures::FutureExt;
use iceberg::spec::SnapshotRef;
use iceberg::table::Table;

use super::IcebergSink;
use crate::config::DeleteMode;
use crate::error::Result;
use crate::sink::iceberg::{compact, expire, maintain};
use crate::sink::{Lifetime, MaintenanceStats, Rest, Upkeep};

/// When a target's upkeep runs and what of it is running: the state [`IcebergSink`] keeps for it.
pub(super) struct Schedule {
    /// The target's file totals when compaction was last planned.
    pub(super) compact_mark: compact::Mark,
    /// Whether compaction runs in the background (see [`Lifetime::LongRunning`]).
    pub(super) background: bool,
    /// Whether the files of expired snapshots are deleted in the background ([`Lifetime::LongRunning`], any mode).
    pub(super) long_running: bool,
    /// The compaction running in the background, if one is.
    pub(super) compaction: Option<tokio::task::JoinHandle<Background>>,
    /// The deletion of what an expiry left unreferenced, running in the background (with `long_running`), if one is.
    pub(super) deletion: Option<tokio::task::JoinHandle<(Result<expire::Expired>, f64)>>,
    /// When the target was last swept for orphan files (the first sweep comes one interval after opening).
    pub(super) swept_at: Instant,
    /// The file totals of the target when a compaction at rest last found nothing to do ([`Upkeep::rest`]).
    pub(super) rested_at: Option<compact::Mark>,
    /// What compactions at rest did between commits (compacting inline), until [`Upkeep::take_maintenance`].
    pub(super) rest_stats: MaintenanceStats,
}

impl Schedule {
    /// Nothing run yet; where compaction and deletions run follows from `lifetime` and the delete mode.
    pub(super) fn new(lifetime: Lifetime, delete_mode: DeleteMode) -> Self {
        Schedule {
            compact_mark: compact::Mark::default(),
            background: lifetime == Lifetime::LongRunning && delete_mode == DeleteMode::Equality,
            long_running: lifetime == Lifetime::LongRunning,
            compaction: None,
            deletion: None,
            swept_at: Instant::now(),
            rested_at: None,
            rest_stats: MaintenanceStats::default(),
        }
    }
}

#[async_trait::async_trait]
impl Upkeep for IcebergSink {
    /// A background compaction that finished since the last commit or the last call, and the compactions at rest.
    fn take_maintenance(&mut self) -> MaintenanceStats {
        let mut stats = std::mem::take(&mut self.schedule.rest_stats);
        self.collect_compaction(&mut stats);
        self.collect_deletion(&mut stats);
        stats
    }

    fn rest_after(&self) -> Option<std::time::Duration> {
        (self.cfg.compact && !self.cfg.compact_idle_after.is_zero()).then_some(self.cfg.compact_idle_after)
    }

    /// Compacts the target completely (`compact::Policy::at_rest`), a pass per call — in the background where
    /// the service compacts there, here otherwise — until a pass finds nothing to do on the table as it is; then
    /// merges its manifests (as `cdc maintain` does), and the rest is over.
    async fn rest(&mut self) -> Result<Rest> {
        if self.schedule.compaction.is_some() {
            return Ok(Rest::Working); // running, or finished and waiting for `take_maintenance`
        }
        let Some(table) = self.table.clone().filter(|_| self.cfg.compact) else { return Ok(Rest::Done) };
        let mark = compact::Mark::of(&table);
        if self.schedule.rested_at == Some(mark) {
            return Ok(Rest::Done);
        }
        let policy = compact::Policy::at_rest(&self.cfg);
        if self.schedule.background {
            self.start_compaction(&table, policy, true);
            return Ok(Rest::Working);
        }
        let mut stats = std::mem::take(&mut self.schedule.rest_stats);
        let (mut table, compacted) = self.compact_now(table, &policy, &mut stats).await;
        self.schedule.rest_stats = stats;
        if !compacted {
            // nothing (more) to compact: the manifests are merged too, and the rest is over
            match maintain::rewrite_manifests(&self.catalog, &self.cfg, table.clone()).await {
                Ok(t) => table = t,
                Err(e) => tracing::warn!(table = %self.cfg.table, error = %e, "merging the manifests of a target at rest failed"),
            }
            self.rested(compact::Mark::of(&table));
        }
        self.schedule.compact_mark = compact::Mark::of(&table);
        self.table = Some(table);
        Ok(if compacted { Rest::Working } else { Rest::Done })
    }
}

impl IcebergSink {
    /// The target's rest is over: a compaction at rest found nothing more to do at `mark` (its file totals).
    pub(super) fn rested(&mut self, mark: compact::Mark) {
        tracing::info!(table = %self.cfg.table, "the target is at rest: compacted completely, manifests merged");
        self.schedule.rested_at = Some(mark);
    }

    /// Compacts `table` when due (see `compact`); returns the table as it is afterwards, and counts what it did in
    /// `stats`. Best effort: a failure is logged and counted, and compaction is tried again when due again.
    pub(super) async fn compact_when_due(&mut self, table: Table, stats: &mut MaintenanceStats) -> Table {
        let policy = compact::Policy::of(&self.cfg);
        if !compact::due(self.schedule.compact_mark, compact::Mark::of(&table), &policy) {
            return table;
        }
        let (table, _) = self.compact_now(table, &policy, stats).await;
        self.schedule.compact_mark = compact::Mark::of(&table);
        table
    }

    /// One compaction of `table` under `policy`, here and now; returns the table as it is afterwards and whether
    /// anything was compacted, and counts what it did in `stats`. Best effort, like [`Self::compact_when_due`].
    pub(super) async fn compact_now(&mut self, table: Table, policy: &compact::Policy, stats: &mut MaintenanceStats) -> (Table, bool) {
        let started = Instant::now();
        let result = compact::compact(&self.catalog, &self.cfg, &table, policy, self.memory_budget / 4).await;
        stats.compact_seconds += started.elapsed().as_secs_f64();
        match result {
            Ok(Some((after, c))) => {
                stats.compactions += 1;
                stats.files_rewritten += (c.data_files_rewritten + c.delete_files_removed) as u64;
                stats.bytes_rewritten += c.bytes_rewritten;
                tracing::info!(
                    table = %self.cfg.table, data_files = c.data_files_rewritten, delete_files = c.delete_files_removed,
                    written = c.data_files_written, bytes = c.bytes_rewritten, rows = c.rows, seconds = started.elapsed().as_secs_f64(),
                    "compacted the target"
                );
                // rebased over another writer's commits: the next commit must meet them through its own conflict
                // check (which compares progress), not start from a head that already holds them
                (if sits_on(&after, &table) { after } else { table }, true)
            }
            Ok(None) => (table, false),
            Err(e) => {
                stats.compact_failures += 1;
                tracing::warn!(table = %self.cfg.table, error = %e, "compaction failed; replication goes on, compaction is tried again later");
                (table, false)
            }
        }
    }

    /// Counts a finished background compaction in `stats`, and starts one on `table` when due and none runs (see
    /// [`Lifetime::LongRunning`]): it rewrites on its own task, within a quarter of the memory budget and with at most
    /// [`compactions_at_once`] running in the process, and commits through the gate (rebased on the applier's commits
    /// since, see `compact::commit`). Best effort, like [`Self::compact_when_due`].
    pub(super) fn compact_in_background(&mut self, table: &Table, stats: &mut MaintenanceStats) {
        self.collect_compaction(stats);
        let policy = compact::Policy::of(&self.cfg);
        if self.schedule.compaction.is_some() || !compact::due(self.schedule.compact_mark, compact::Mark::of(table), &policy) {
            return;
        }
        self.schedule.compact_mark = compact::Mark::of(table);
        self.start_compaction(table, policy, false);
    }

    /// Starts a compaction of `table` under `policy` on its own task (see [`Self::compact_in_background`]);
    /// `at_rest`: one of [`Upkeep::rest`]'s passes.
    fn start_compaction(&mut self, table: &Table, policy: compact::Policy, at_rest: bool) {
        let planned = compact::Mark::of(table);
        let (catalog, cfg, table, gate, budget) = (self.catalog.clone(), self.cfg.clone(), table.clone(), self.gate.clone(), self.memory_budget / 4);
        self.schedule.compaction = Some(tokio::spawn(async move {
            let _slot = compactions_at_once().acquire().await;
            let started = Instant::now();
            let result = async {
                let Some(rewritten) = compact::rewrite(&cfg, &table, &policy, budget).await? else {
                    if at_rest {
                        // nothing (more) to compact: a target at rest gets its manifests merged too
                        let mut gate = gate.lock().await;
                        let now = catalog.load_table(&cfg.table).await?;
                        let after = maintain::rewrite_manifests(&catalog, &cfg, now.clone()).await?;
                        if after.metadata().current_snapshot_id() != now.metadata().current_snapshot_id() {
                            *gate = Some(after);
                        }
                    }
                    return Ok(None);
                };
                let mut gate = gate.lock().await;
                let now = catalog.load_table(&cfg.table).await?;
                let Some((after, c)) = compact::commit(&catalog, &cfg, rewritten, now).await? else { return Ok(None) };
                let mark = compact::Mark::of(&after);
                *gate = Some(after);
                Ok(Some((mark, c)))
            }
            .await;
            let seconds = started.elapsed().as_secs_f64();
            match &result {
                Ok(Some((_, c))) => tracing::info!(
                    table = %cfg.table, data_files = c.data_files_rewritten, delete_files = c.delete_files_removed,
                    written = c.data_files_written, bytes = c.bytes_rewritten, rows = c.rows, seconds, at_rest, "compacted the target in the background"
                ),
                Ok(None) => {}
                Err(e) => tracing::warn!(table = %cfg.table, error = %e, "compaction failed; replication goes on, compaction is tried again later"),
            }
            Background { result, seconds, rested_at: at_rest.then_some(planned) }
        }));
    }

    /// The snapshots an applier commit on `target` should remove as well, when an expiry is due (see
    /// `expire::due_now`); none while the last expiry's files are still being deleted in the background.
    pub(super) fn expiring(&self, target: &Table) -> Vec<SnapshotRef> {
        if !self.cfg.expire_snapshots || self.schedule.deletion.as_ref().is_some_and(|t| !t.is_finished()) {
            return Vec::new();
        }
        // this commit's snapshot becomes the head: it is one of the `retain_snapshots`
        let retention = expire::Retention { max_age: self.cfg.snapshot_retention, min_snapshots: self.cfg.retain_snapshots, new_head: true };
        let meta = target.metadata();
        expire::due_now(meta, &retention, false).unwrap_or_default().into_iter().filter_map(|id| meta.snapshot_by_id(id).cloned()).collect()
    }

    /// An applier commit removed old snapshots: deletes what only they referenced — on its own task beside the next
    /// commits in the service ([`Lifetime::LongRunning`]: reading every remaining snapshot's manifest list is most
    /// of an expiry's time), here otherwise.
    pub(super) async fn expired(&mut self, expiry: expire::Expiry, stats: &mut MaintenanceStats) {
        self.collect_deletion(stats);
        stats.snapshots_expired += expiry.snapshots() as u64;
        let name = self.cfg.table.clone();
        let deletion = async move {
            let started = Instant::now();
            let deleted = expiry.delete_unreachable().await;
            match &deleted {
                Ok(e) => tracing::info!(
                    table = %name, snapshots = e.snapshots, manifest_lists = e.manifest_lists, manifests = e.manifests,
                    files = e.files, "expired old target snapshots and deleted the files only they referenced"
                ),
                Err(e) => {
                    tracing::warn!(table = %name, error = %e, "deleting the files of expired snapshots failed; they stay as orphans for the sweep")
                }
            }
            (deleted, started.elapsed().as_secs_f64())
        };
        if self.schedule.long_running {
            self.schedule.deletion = Some(tokio::spawn(deletion));
        } else {
            count_deletion(deletion.await, stats);
        }
    }

    /// Counts the background deletion of an expiry's files in `stats` if it has finished.
    pub(super) fn collect_deletion(&mut self, stats: &mut MaintenanceStats) {
        let Some(done) = self.schedule.deletion.take_if(|t| t.is_finished()).and_then(|t| t.now_or_never()) else { return };
        match done {
            Ok(deleted) => count_deletion(deleted, stats),
            Err(e) => {
                stats.failures += 1;
                tracing::warn!(table = %self.cfg.table, error = %e, "the background deletion of expired files ended abnormally");
            }
        }
    }

    /// Counts the background compaction in `stats` if it has finished.
    pub(super) fn collect_compaction(&mut self, stats: &mut MaintenanceStats) {
        let Some(done) = self.schedule.compaction.take_if(|t| t.is_finished()).and_then(|t| t.now_or_never()) else { return };
        match done {
            Ok(Background { result: Ok(Some((mark, c))), seconds, .. }) => {
                stats.compactions += 1;
                stats.compact_seconds += seconds;
                stats.files_rewritten += (c.data_files_rewritten + c.delete_files_removed) as u64;
                stats.bytes_rewritten += c.bytes_rewritten;
                self.schedule.compact_mark = mark;
            }
            // a pass at rest that found nothing to do (or failed) ends the rest until the table changes
            Ok(Background { result: Ok(None), seconds, rested_at }) => {
                stats.compact_seconds += seconds;
                if let Some(mark) = rested_at {
                    self.rested(mark);
                }
            }
            Ok(Background { result: Err(_), seconds, rested_at }) => {
                stats.compact_seconds += seconds;
                stats.compact_failures += 1;
                self.schedule.rested_at = rested_at.or(self.schedule.rested_at);
            }
            Err(e) => {
                stats.compact_failures += 1;
                tracing::warn!(table = %self.cfg.table, error = %e, "the background compaction ended abnormally");
            }
        }
    }

    /// Deletes the target's orphan files older than `orphan_grace` once every `orphan_sweep_interval` (best effort:
    /// a failure is logged and counted, and the sweep is tried again at the next interval).
    pub(super) async fn sweep_when_due(&mut self, table: &Table, stats: &mut MaintenanceStats) {
        let every = self.cfg.orphan_sweep_interval;
        if every.is_zero() || self.schedule.swept_at.elapsed() < every {
            return;
        }
        self.schedule.swept_at = Instant::now();
        match crate::sink::iceberg::maintain::remove_orphans(&self.catalog, table, self.cfg.orphan_grace).await {
            Ok((deleted, young)) => {
                stats.orphans_deleted += deleted as u64;
                tracing::info!(table = %self.cfg.table, deleted, younger_than_grace = young, "swept the target for orphan files");
            }
            Err(e) => {
                stats.orphan_failures += 1;
                tracing::warn!(table = %self.cfg.table, error = %e, "the orphan file sweep failed; it is tried again at the next interval");
            }
        }
    }
}

/// Counts a finished deletion of an expiry's files (what it deleted, its seconds) in `stats`.
fn count_deletion((deleted, seconds): (Result<expire::Expired>, f64), stats: &mut MaintenanceStats) {
    stats.expire_seconds += seconds;
    match deleted {
        Ok(e) => stats.files_deleted += (e.manifest_lists + e.manifests + e.files) as u64,
        Err(_) => stats.failures += 1,
    }
}

/// Whether `compacted`'s head is a compaction committed directly on `head`'s head. Only then may the applier commit
/// on it as if on its own head: a compaction rebased over other writers' commits carries their progress, which an
/// applier commit planned before them must meet through its conflict check, or it would apply their ranges again.
pub(super) fn sits_on(compacted: &Table, head: &Table) -> bool {
    compacted.metadata().current_snapshot().and_then(|s| s.parent_snapshot_id()) == head.metadata().current_snapshot_id()
}

/// What a background compaction did, and how long it took.
pub(super) struct Background {
    result: Result<Option<(compact::Mark, compact::Compacted)>>,
    seconds: f64,
    /// A pass at rest's ([`Upkeep::rest`]): the file totals of the table it planned on.
    rested_at: Option<compact::Mark>,
}

/// Background compactions that rewrite at once in this process (half the cores, at least one): each holds a quarter
/// of its pipeline's memory budget, and the applier's runs need the rest of the machine.
fn compactions_at_once() -> &'static tokio::sync::Semaphore {
    static SLOTS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    SLOTS.get_or_init(|| tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(1, |n| n.get() / 2).max(1)))
}

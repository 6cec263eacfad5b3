//! Named telemetry events: each event is logged and counted in one place, so logs and metrics never disagree.
//!
//! Metrics (Prometheus text on `/metrics`, units in the names, `_total` on counters), labelled by `pipeline` and
//! `sink`: replication lag in seconds (now − commit time of the oldest source snapshot not yet applied; 0 when
//! caught up) and in snapshots, last successful commit time, rows by change type, commits, commit duration,
//! commit retries, re-plans, errors by kind, bytes and files written, polls, pipeline health.
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::error::Error;
use crate::pipeline::{CommitReport, SyncSummary};
use crate::sink::MaintenanceStats;

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct RunLabels {
    pub pipeline: String,
    pub sink: String,
}

/// A maintenance task of a pipeline's sink: `expire` (snapshot expiry), `merge_manifests`, `compact` or
/// `remove_orphans`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    pipeline: String,
    sink: String,
    task: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RowLabels {
    pipeline: String,
    sink: String,
    change_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DiscoveryLabels {
    /// The pipeline of table patterns, or the catalog listed.
    name: String,
    /// `added`, `gone`; `ok`, `failed`.
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    pipeline: String,
    sink: String,
    kind: String,
}

type HistogramFamily = Family<RunLabels, Histogram, fn() -> Histogram>;

/// How late a loop may be beyond its schedule (a poll due, a loop to start) before it counts as overdue: generous,
/// since an overdue loop stops the systemd watchdog and so restarts the service.
pub(crate) const LIVENESS_SLACK: Duration = Duration::from_secs(30);

/// What `/healthz`, `/readyz`, the watchdog and `STATUS=` read about one pipeline.
#[derive(Debug, Clone)]
pub struct RunStatus {
    /// The last poll finished without error.
    pub healthy: bool,
    /// Stopped for good (a permanent error); stays visible until the configuration changes.
    pub stopped: bool,
    pub last_error: Option<String>,
    /// When the loop last showed progress (a poll began or finished, a commit landed).
    pub heartbeat: Instant,
    pub lag_seconds: f64,
    pub lag_snapshots: u64,
    /// The loop is running (its task started); false from configuration until then.
    pub started: bool,
    /// When the service configured the loop.
    pub registered: Instant,
    /// A poll is under way.
    pub polling: bool,
    /// When the next poll is due (the loop is sleeping until then).
    pub next_poll: Instant,
}

impl RunStatus {
    fn new(now: Instant) -> RunStatus {
        RunStatus {
            healthy: false,
            stopped: false,
            last_error: None,
            heartbeat: now,
            lag_seconds: 0.0,
            lag_snapshots: 0,
            started: false,
            registered: now,
            polling: false,
            next_poll: now,
        }
    }

    /// Why the loop is behind its own schedule at `now`, if it is: not started within [`LIVENESS_SLACK`] of being
    /// configured, a poll running without progress for longer than `stall`, or a poll not begun within
    /// [`LIVENESS_SLACK`] of being due (a loop waiting long for a poll slot, or stuck outside a poll). A loop stopped by a
    /// permanent error is failed, not late: it waits for a reload by design.
    pub fn overdue(&self, now: Instant, stall: Duration) -> Option<String> {
        let since = |t: Instant| now.saturating_duration_since(t).as_secs_f64();
        if self.stopped {
            None
        } else if !self.started {
            (now.saturating_duration_since(self.registered) > LIVENESS_SLACK).then(|| format!("not started for {:.0}s", since(self.registered)))
        } else if self.polling {
            (now.saturating_duration_since(self.heartbeat) > stall)
                .then(|| format!("no progress for {:.0}s in a poll (service.stall_timeout {:?})", since(self.heartbeat), stall))
        } else {
            (now.saturating_duration_since(self.next_poll) > LIVENESS_SLACK).then(|| format!("poll overdue by {:.0}s", since(self.next_poll)))
        }
    }
}

pub struct Telemetry {
    pub registry: Registry,
    lag_seconds: Family<RunLabels, Gauge<f64, AtomicU64>>,
    lag_snapshots: Family<RunLabels, Gauge>,
    last_commit: Family<RunLabels, Gauge<f64, AtomicU64>>,
    reload_failures: Counter,
    last_reload_time: Gauge<f64, AtomicU64>,
    last_reload_success: Gauge,
    last_reload: Mutex<Option<ReloadStatus>>,
    rows: Family<RowLabels, Counter>,
    commits: Family<RunLabels, Counter>,
    commit_duration: HistogramFamily,
    retries: Family<RunLabels, Counter>,
    replans: Family<RunLabels, Counter>,
    history_rewrites: Family<ErrorLabels, Counter>,
    spilled: Family<RunLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    bytes: Family<RunLabels, Counter>,
    files: Family<RunLabels, Counter>,
    polls: Family<RunLabels, Counter>,
    healthy: Family<RunLabels, Gauge>,
    overdue: Family<RunLabels, Gauge>,
    configured: Gauge,
    running: Gauge,
    owned: Family<RunLabels, Gauge>,
    cluster_partitions: Gauge,
    cluster_changes: Counter,
    maintenance_runs: Family<TaskLabels, Counter>,
    maintenance_seconds: Family<TaskLabels, Counter<f64, AtomicU64>>,
    maintenance_failures: Family<TaskLabels, Counter>,
    snapshots_expired: Family<RunLabels, Counter>,
    files_deleted: Family<RunLabels, Counter>,
    manifests_merged: Family<RunLabels, Counter>,
    files_rewritten: Family<RunLabels, Counter>,
    bytes_rewritten: Family<RunLabels, Counter>,
    orphans_deleted: Family<RunLabels, Counter>,
    status: Mutex<BTreeMap<RunLabels, RunStatus>>,
    discovered_tables: Family<DiscoveryLabels, Gauge>,
    discovery_changes: Family<DiscoveryLabels, Counter>,
    discovery_lists: Family<DiscoveryLabels, Counter>,
    discovery_calls: Family<DiscoveryLabels, Counter>,
    discovery_seconds: Family<DiscoveryLabels, Counter<f64, AtomicU64>>,
}

/// The last configuration reload, as `/status` shows it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub(crate) struct ReloadStatus {
    /// When it happened (Unix time).
    pub(crate) at_unix_seconds: f64,
    /// Whether the new configuration was taken.
    pub(crate) taken: bool,
    /// Why it was refused.
    pub(crate) error: Option<String>,
}

fn commit_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 14))
}

impl Telemetry {
    pub fn new() -> Arc<Telemetry> {
        let mut registry = Registry::default();
        let t = Telemetry {
            lag_seconds: Family::default(),
            lag_snapshots: Family::default(),
            last_commit: Family::default(),
            reload_failures: Counter::default(),
            last_reload_time: Gauge::default(),
            last_reload_success: Gauge::default(),
            last_reload: Mutex::new(None),
            rows: Family::default(),
            commits: Family::default(),
            commit_duration: Family::new_with_constructor(commit_histogram as fn() -> Histogram),
            retries: Family::default(),
            replans: Family::default(),
            history_rewrites: Family::default(),
            spilled: Family::default(),
            errors: Family::default(),
            bytes: Family::default(),
            files: Family::default(),
            polls: Family::default(),
            healthy: Family::default(),
            overdue: Family::default(),
            configured: Gauge::default(),
            running: Gauge::default(),
            owned: Family::default(),
            cluster_partitions: Gauge::default(),
            cluster_changes: Counter::default(),
            maintenance_runs: Family::default(),
            maintenance_seconds: Family::default(),
            maintenance_failures: Family::default(),
            snapshots_expired: Family::default(),
            files_deleted: Family::default(),
            manifests_merged: Family::default(),
            files_rewritten: Family::default(),
            bytes_rewritten: Family::default(),
            orphans_deleted: Family::default(),
            status: Mutex::new(BTreeMap::new()),
            discovered_tables: Family::default(),
            discovery_changes: Family::default(),
            discovery_lists: Family::default(),
            discovery_calls: Family::default(),
            discovery_seconds: Family::default(),
            registry: Registry::default(),
        };
        registry.register("cdc_discovered_tables", "Tables a pipeline of table patterns stands for (kind=\"ok\")", t.discovered_tables.clone());
        registry.register(
            "cdc_discovery_table_changes",
            "Tables a pipeline of table patterns gained (kind=\"added\") or lost (kind=\"gone\": dropped, renamed or excluded) at a discovery; destinations renamed with their table (kind=\"renamed\", \"rename_failed\") and dropped after drop_grace (kind=\"dropped\", \"drop_failed\")",
            t.discovery_changes.clone(),
        );
        registry.register("cdc_discovery_lists", "Listings of a catalog's tables for discovery, by outcome (ok, failed)", t.discovery_lists.clone());
        registry.register("cdc_discovery_catalog_calls", "Catalog calls discovery made (list pages, directory listings)", t.discovery_calls.clone());
        registry.register_with_unit("cdc_discovery_duration", "Time spent listing a catalog's tables", Unit::Seconds, t.discovery_seconds.clone());
        registry.register_with_unit(
            "cdc_replication_lag",
            "Now minus the commit time of the oldest source snapshot not yet applied (0 when caught up)",
            Unit::Seconds,
            t.lag_seconds.clone(),
        );
        registry.register("cdc_replication_lag_snapshots", "Source snapshots not yet applied", t.lag_snapshots.clone());
        registry.register_with_unit(
            "cdc_last_commit_timestamp",
            "Unix time of the last successful target commit",
            Unit::Seconds,
            t.last_commit.clone(),
        );
        registry.register(
            "cdc_config_reload_failures",
            "Configuration reloads (SIGHUP) refused: the running configuration stayed",
            t.reload_failures.clone(),
        );
        registry.register_with_unit(
            "cdc_config_last_reload_timestamp",
            "Unix time of the last configuration reload",
            Unit::Seconds,
            t.last_reload_time.clone(),
        );
        registry.register(
            "cdc_config_last_reload_success",
            "Whether the last configuration reload was taken (1) or refused (0)",
            t.last_reload_success.clone(),
        );
        registry.register("cdc_rows", "Change rows applied, by change type", t.rows.clone());
        registry.register("cdc_commits", "Target commits", t.commits.clone());
        registry.register_with_unit(
            "cdc_commit_duration",
            "Time from reading a commit's changes to its commit",
            Unit::Seconds,
            t.commit_duration.clone(),
        );
        registry.register("cdc_commit_retries", "Commit attempts repeated after a conflict or transient failure", t.retries.clone());
        registry.register(
            "cdc_history_rewrites",
            "Rewrites of a source's history (kind: rollback, rewrite, replace, recreate) a pipeline followed with one commit",
            t.history_rewrites.clone(),
        );
        registry.register("cdc_replans", "Runs planned again because another writer moved the target's progress", t.replans.clone());
        registry.register_with_unit(
            "cdc_spilled",
            "Bytes the scan wrote to local spill files (netting runs, carry-over parts): a rewrite larger than the memory budget",
            Unit::Bytes,
            t.spilled.clone(),
        );
        registry.register("cdc_errors", "Failed polls, by kind of error", t.errors.clone());
        registry.register_with_unit("cdc_written", "Bytes of data and delete files written", Unit::Bytes, t.bytes.clone());
        registry.register("cdc_written_files", "Data and delete files written", t.files.clone());
        registry.register("cdc_polls", "Polls of the source", t.polls.clone());
        registry.register("cdc_pipeline_healthy", "1 when the pipeline's last poll succeeded", t.healthy.clone());
        registry.register(
            "cdc_pipeline_overdue",
            "1 when the pipeline is behind its own schedule: not started, a poll not begun when due, or stuck in a poll",
            t.overdue.clone(),
        );
        registry.register("cdc_pipelines_configured", "Pipeline sinks in the configuration", t.configured.clone());
        registry.register("cdc_pipelines_running", "Pipeline sinks whose loop is running", t.running.clone());
        registry.register(
            "cdc_pipeline_owned",
            "1 for each pipeline sink this instance runs (its shard's or its cluster assignment's)",
            t.owned.clone(),
        );
        registry.register(
            "cdc_cluster_partitions_owned",
            "Control-topic partitions the cluster's group assigns this instance",
            t.cluster_partitions.clone(),
        );
        registry.register("cdc_cluster_assignment_changes", "Changes of this instance's cluster assignment", t.cluster_changes.clone());
        registry.register(
            "cdc_maintenance_runs",
            "Maintenance runs that changed the target, by task (expire, merge_manifests, compact, remove_orphans)",
            t.maintenance_runs.clone(),
        );
        registry.register_with_unit("cdc_maintenance", "Time spent in target maintenance, by task", Unit::Seconds, t.maintenance_seconds.clone());
        registry.register("cdc_maintenance_failures", "Maintenance runs that failed (replication went on), by task", t.maintenance_failures.clone());
        registry.register("cdc_maintenance_snapshots_expired", "Target snapshots expired", t.snapshots_expired.clone());
        registry.register(
            "cdc_maintenance_files_deleted",
            "Files deleted because only expired snapshots referenced them (manifest lists, manifests, data and delete files)",
            t.files_deleted.clone(),
        );
        registry.register("cdc_maintenance_manifests_merged", "Small target manifests merged into fewer in commits", t.manifests_merged.clone());
        registry.register(
            "cdc_maintenance_files_rewritten",
            "Files compaction removed from the target: data files rewritten, delete files no longer needed",
            t.files_rewritten.clone(),
        );
        registry.register_with_unit("cdc_maintenance_rewritten", "Bytes of the files compaction removed", Unit::Bytes, t.bytes_rewritten.clone());
        registry.register("cdc_maintenance_orphans_deleted", "Orphan files the periodic sweep deleted from the target", t.orphans_deleted.clone());
        Arc::new(Telemetry { registry, ..t })
    }

    fn with_status(&self, labels: &RunLabels, f: impl FnOnce(&mut RunStatus)) {
        let mut map = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        let st = map.entry(labels.clone()).or_insert_with(|| RunStatus::new(Instant::now()));
        f(st);
    }

    /// Counts the configured and the running loops (on the events that change them: not on every poll).
    fn count_loops(&self) {
        // set under the lock: two loops starting at once must not publish their counts in the other order
        let map = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        let (configured, running) = (map.len(), map.values().filter(|s| s.started).count());
        self.configured.set(configured as i64);
        self.running.set(running as i64);
        drop(map);
    }

    /// Event: the service configured a pipeline loop and is about to start it ("not started" until it runs).
    /// A loop being started again after its thread could not start keeps its first registration time, so that it
    /// turns overdue.
    pub fn registered(&self, l: &RunLabels) {
        self.owned.get_or_create(l).set(1);
        self.with_status(l, |s| {
            if s.started {
                *s = RunStatus::new(Instant::now());
            }
        });
        self.count_loops();
    }

    /// Event: a pipeline loop started (or restarted after a configuration change).
    pub fn started(&self, l: &RunLabels) {
        tracing::info!(pipeline = %l.pipeline, sink = %l.sink, "pipeline started");
        self.with_status(l, |s| {
            s.started = true;
            s.stopped = false;
            s.heartbeat = Instant::now();
            s.next_poll = Instant::now();
        });
        self.count_loops();
    }

    /// Event: a pipeline loop ended (removed from the configuration, or shutdown).
    pub fn removed(&self, l: &RunLabels) {
        tracing::info!(pipeline = %l.pipeline, sink = %l.sink, "pipeline stopped");
        self.status.lock().unwrap_or_else(PoisonError::into_inner).remove(l);
        self.count_loops();
        self.healthy.remove(l);
        self.overdue.remove(l);
        self.owned.remove(l);
    }

    /// Event: the cluster's group changed this instance's assignment, and its loops now follow it.
    pub fn assignment_applied(&self, partitions: usize, loops: usize) {
        tracing::info!(partitions, loops, "cluster assignment applied");
        self.cluster_partitions.set(partitions as i64);
        self.cluster_changes.inc();
    }

    /// Event: a poll began.
    pub fn poll_began(&self, l: &RunLabels) {
        self.with_status(l, |s| {
            s.polling = true;
            s.heartbeat = Instant::now();
        });
    }

    /// Event: the loop sleeps until its next poll, due in `wait`.
    pub fn waiting(&self, l: &RunLabels, wait: Duration) {
        self.with_status(l, |s| {
            s.polling = false;
            s.next_poll = Instant::now() + wait;
        });
    }

    /// Event: the service checked every loop's schedule in `statuses` (late beyond `stall`, see
    /// [`RunStatus::overdue`]; `was`: the late ones at the last check). Counts them in `cdc_pipeline_overdue` and
    /// logs each change: a loop falling behind, a loop back on schedule.
    pub fn schedule_checked(&self, statuses: &[(RunLabels, RunStatus)], stall: Duration, was: &mut BTreeMap<RunLabels, String>) {
        let at = Instant::now();
        let now: BTreeMap<RunLabels, String> = statuses.iter().filter_map(|(l, s)| Some((l.clone(), s.overdue(at, stall)?))).collect();
        for (l, why) in &now {
            if !was.contains_key(l) {
                tracing::error!(pipeline = %l.pipeline, sink = %l.sink, reason = %why, "pipeline overdue: it is not running on schedule");
            }
        }
        for l in was.keys().filter(|l| !now.contains_key(*l)) {
            tracing::info!(pipeline = %l.pipeline, sink = %l.sink, "pipeline back on schedule");
        }
        for (l, _) in statuses {
            self.overdue.get_or_create(l).set(i64::from(now.contains_key(l)));
        }
        *was = now;
    }

    /// Event: a poll finished; `lag` is what is left to apply after it.
    pub fn polled(&self, l: &RunLabels, lag_seconds: f64, lag_snapshots: u64) {
        self.polls.get_or_create(l).inc();
        self.lag_seconds.get_or_create(l).set(lag_seconds);
        self.lag_snapshots.get_or_create(l).set(lag_snapshots as i64);
        self.healthy.get_or_create(l).set(1);
        self.with_status(l, |s| {
            s.healthy = true;
            s.polling = false;
            s.last_error = None;
            s.heartbeat = Instant::now();
            s.lag_seconds = lag_seconds;
            s.lag_snapshots = lag_snapshots;
        });
    }

    /// Event: a target commit landed.
    pub fn committed(&self, l: &RunLabels, r: &CommitReport) {
        tracing::info!(
            pipeline = %l.pipeline, sink = %l.sink,
            source_snapshots = r.source_snapshots, last_source_snapshot = r.last_source_snapshot,
            target_snapshot = ?r.target_snapshot_id, inserts = r.stats.inserts, updates = r.stats.updates,
            deletes = r.stats.deletes, seconds = r.stats.seconds, "committed"
        );
        self.commits.get_or_create(l).inc();
        self.commit_duration.get_or_create(l).observe(r.stats.seconds);
        for (kind, n) in [("INSERT", r.stats.inserts), ("DELETE", r.stats.deletes), ("UPDATE", r.stats.updates)] {
            self.rows.get_or_create(&RowLabels { pipeline: l.pipeline.clone(), sink: l.sink.clone(), change_type: kind.into() }).inc_by(n);
        }
        self.bytes.get_or_create(l).inc_by(r.stats.bytes);
        self.files.get_or_create(l).inc_by(r.stats.files as u64);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
        self.last_commit.get_or_create(l).set(now);
        self.maintained(l, &r.stats.maintenance);
        self.with_status(l, |s| s.heartbeat = Instant::now());
    }

    /// Event: maintenance of the target (expiry, manifest merging, compaction), by a commit or in the background —
    /// counted, and logged by the sink.
    pub(crate) fn maintained(&self, l: &RunLabels, m: &MaintenanceStats) {
        let task = |t: &str| TaskLabels { pipeline: l.pipeline.clone(), sink: l.sink.clone(), task: t.into() };
        // (task, runs that changed the target, failures, seconds spent when the task measures them)
        let tasks = [
            ("expire", (m.snapshots_expired > 0) as u64, m.failures, Some(m.expire_seconds)),
            ("merge_manifests", (m.manifests_merged > 0) as u64, 0, None),
            ("compact", m.compactions, m.compact_failures, Some(m.compact_seconds)),
            ("remove_orphans", (m.orphans_deleted > 0) as u64, m.orphan_failures, None),
        ];
        for (name, runs, failures, seconds) in tasks {
            if let Some(s) = seconds {
                self.maintenance_seconds.get_or_create(&task(name)).inc_by(s);
            }
            if runs > 0 {
                self.maintenance_runs.get_or_create(&task(name)).inc_by(runs);
            }
            if failures > 0 {
                self.maintenance_failures.get_or_create(&task(name)).inc_by(failures);
            }
        }
        let counters = [
            (&self.snapshots_expired, m.snapshots_expired),
            (&self.files_deleted, m.files_deleted),
            (&self.manifests_merged, m.manifests_merged),
            (&self.files_rewritten, m.files_rewritten),
            (&self.bytes_rewritten, m.bytes_rewritten),
            (&self.orphans_deleted, m.orphans_deleted),
        ];
        for (family, n) in counters {
            if n > 0 {
                family.get_or_create(l).inc_by(n);
            }
        }
    }

    /// Event: a configuration reload (SIGHUP) was taken, or refused with `error` (the running configuration stays):
    /// logged, counted, and shown on `/status`.
    pub fn reloaded(&self, error: Option<&Error>) {
        match error {
            Some(e) => {
                tracing::error!(error = %e, "reload refused; the running configuration stays");
                self.reload_failures.inc();
            }
            None => tracing::info!("configuration reloaded"),
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
        self.last_reload_time.set(now);
        self.last_reload_success.set(i64::from(error.is_none()));
        let status = ReloadStatus { at_unix_seconds: now, taken: error.is_none(), error: error.map(|e| e.to_string()) };
        *self.last_reload.lock().unwrap_or_else(|p| p.into_inner()) = Some(status);
    }

    /// Event: discovery listed catalog `catalog` (`Ok`: its table count and catalog calls) in `seconds`.
    pub(crate) fn catalog_listed(&self, catalog: &str, outcome: Result<(usize, usize), &Error>, seconds: f64) {
        let l = |kind: &str| DiscoveryLabels { name: catalog.into(), kind: kind.into() };
        match outcome {
            Ok((tables, calls)) => {
                tracing::debug!(catalog, tables, calls, seconds, "catalog listed for discovery");
                self.discovery_lists.get_or_create(&l("ok")).inc();
                self.discovery_calls.get_or_create(&l("ok")).inc_by(calls as u64);
            }
            Err(e) => {
                tracing::warn!(catalog, error = %e, "discovery could not list the catalog; its pipelines keep the tables found before");
                self.discovery_lists.get_or_create(&l("failed")).inc();
            }
        }
        self.discovery_seconds.get_or_create(&l("ok")).inc_by(seconds);
    }

    /// Event: discovery found `tables` for pipeline `pipeline`, `added` of them new and `gone` no longer there.
    pub(crate) fn tables_discovered(&self, pipeline: &str, tables: usize, added: &[String], gone: &[String]) {
        let l = |kind: &str| DiscoveryLabels { name: pipeline.into(), kind: kind.into() };
        self.discovered_tables.get_or_create(&l("ok")).set(tables as i64);
        for t in added {
            tracing::info!(pipeline, table = %t, "table discovered; its pipeline starts");
        }
        for t in gone {
            tracing::warn!(pipeline, table = %t, "table no longer matched (dropped, renamed or excluded); its pipeline stops and its destination stays");
        }
        self.discovery_changes.get_or_create(&l("added")).inc_by(added.len() as u64);
        self.discovery_changes.get_or_create(&l("gone")).inc_by(gone.len() as u64);
    }

    /// Event: the destination `from` of table `table` of pipeline `pipeline`, renamed in its source to `to`, was
    /// renamed to `renamed` (`error`: it could not be; the new name is then replicated as a new table).
    pub(crate) fn table_renamed(&self, pipeline: &str, table: &str, to: &str, from: &str, renamed: &str, error: Option<&Error>) {
        let l = |kind: &str| DiscoveryLabels { name: pipeline.into(), kind: kind.into() };
        match error {
            None => {
                tracing::info!(
                    pipeline,
                    table,
                    renamed_to = to,
                    destination = from,
                    destination_now = renamed,
                    "source table renamed; its destination renamed with it, replication goes on from its progress"
                );
                self.discovery_changes.get_or_create(&l("renamed")).inc();
            }
            Some(e) => {
                tracing::warn!(pipeline, table, renamed_to = to, destination = from, error = %e, "source table renamed, but its destination could not be renamed; the new name is replicated as a new table and the old destination stays");
                self.discovery_changes.get_or_create(&l("rename_failed")).inc();
            }
        }
    }

    /// Event: destination `destination` of table `table` (gone for its `drop_grace`) was dropped (`error`: it could
    /// not be; tried again at the next discovery).
    pub(crate) fn destination_dropped(&self, pipeline: &str, table: &str, destination: &str, error: Option<&Error>) {
        let l = |kind: &str| DiscoveryLabels { name: pipeline.into(), kind: kind.into() };
        match error {
            None => {
                tracing::warn!(
                    pipeline,
                    table,
                    destination,
                    "the source table has been gone for drop_grace: its destination was dropped (its data files stay)"
                );
                self.discovery_changes.get_or_create(&l("dropped")).inc();
            }
            Some(e) => {
                tracing::warn!(pipeline, table, destination, error = %e, "could not drop the destination of a gone table; trying again at the next discovery");
                self.discovery_changes.get_or_create(&l("drop_failed")).inc();
            }
        }
    }

    /// The last configuration reload, for `/status`.
    pub(crate) fn last_reload(&self) -> Option<ReloadStatus> {
        self.last_reload.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Event: a sync run ended (its retries, re-plans and spilled bytes are counted).
    pub fn synced(&self, l: &RunLabels, s: &SyncSummary) {
        self.retries.get_or_create(l).inc_by(s.retries as u64);
        self.replans.get_or_create(l).inc_by(s.replans as u64);
        if let Some(h) = &s.history_rewrite {
            let kind = h.kind.as_str().into();
            self.history_rewrites.get_or_create(&ErrorLabels { pipeline: l.pipeline.clone(), sink: l.sink.clone(), kind }).inc();
        }
        self.spilled.get_or_create(l).inc_by(s.spilled_bytes);
    }

    /// Event: a poll failed. `permanent`: the pipeline stops until the configuration changes.
    pub fn failed(&self, l: &RunLabels, e: &Error, permanent: bool, retry_in: Option<Duration>) {
        let kind = e.kind();
        if permanent {
            tracing::error!(pipeline = %l.pipeline, sink = %l.sink, kind, error = %e, "pipeline stopped by a permanent error; fix it and reload (SIGHUP)");
        } else {
            tracing::warn!(pipeline = %l.pipeline, sink = %l.sink, kind, error = %e, retry_in_seconds = retry_in.map(|d| d.as_secs_f64()), "poll failed; retrying");
        }
        self.errors.get_or_create(&ErrorLabels { pipeline: l.pipeline.clone(), sink: l.sink.clone(), kind: kind.into() }).inc();
        self.healthy.get_or_create(l).set(0);
        let msg = e.to_string();
        self.with_status(l, |s| {
            s.healthy = false;
            s.polling = false;
            s.stopped = permanent;
            s.last_error = Some(msg);
            // a failing poll is still a loop that runs: the watchdog must not restart the service for it
            s.heartbeat = Instant::now();
        });
    }

    /// Every pipeline's status, for the endpoints, the watchdog and `STATUS=`.
    pub fn statuses(&self) -> Vec<(RunLabels, RunStatus)> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// The loops behind their schedule now, and why (see [`RunStatus::overdue`]).
    pub fn overdue(&self, stall: Duration) -> Vec<(RunLabels, String)> {
        let now = Instant::now();
        self.statuses().into_iter().filter_map(|(l, s)| s.overdue(now, stall).map(|why| (l, why))).collect()
    }

    /// Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALL: Duration = Duration::from_secs(60);

    #[test]
    fn a_loop_is_overdue_only_behind_its_own_schedule() {
        let t0 = Instant::now();
        let later = |s: u64| t0 + Duration::from_secs(s);
        let mut s = RunStatus::new(t0);
        // configured, not started: allowed the slack, then "not started"
        assert_eq!(s.overdue(later(10), STALL), None);
        assert_eq!(s.overdue(later(31), STALL).as_deref(), Some("not started for 31s"));
        // started and sleeping until its next poll: late only past the due time plus the slack
        s.started = true;
        s.next_poll = later(100);
        assert_eq!(s.overdue(later(120), STALL), None);
        assert_eq!(s.overdue(later(131), STALL).as_deref(), Some("poll overdue by 31s"));
        // in a poll: late only after stall_timeout without progress (a commit moves the heartbeat)
        s.polling = true;
        s.heartbeat = later(200);
        assert_eq!(s.overdue(later(259), STALL), None);
        assert!(s.overdue(later(261), STALL).unwrap().starts_with("no progress for 61s in a poll"));
        // stopped by a permanent error: failing, never overdue
        s.stopped = true;
        assert_eq!(s.overdue(later(10_000), STALL), None);
    }

    #[test]
    fn a_loop_restarted_after_a_failed_start_keeps_its_first_registration() {
        let t = Telemetry::new();
        let l = RunLabels { pipeline: "p".into(), sink: "s".into() };
        t.registered(&l);
        let first = t.statuses()[0].1.registered;
        std::thread::sleep(Duration::from_millis(5));
        t.registered(&l);
        assert_eq!(t.statuses()[0].1.registered, first, "a retried start must not reset the clock");
        t.started(&l);
        t.registered(&l);
        assert!(t.statuses()[0].1.registered > first && !t.statuses()[0].1.started, "a restarted loop starts afresh");
        assert!(t.encode().contains("cdc_pipelines_configured 1"), "{}", t.encode());
    }

    /// The shipped Grafana dashboard and Prometheus rules (`docker/`) name only series this service exports: a
    /// renamed metric must take them along.
    #[test]
    fn the_dashboard_and_the_alert_rules_name_only_exported_series() {
        // what the registry is given (an empty family is not encoded at all): each name registered, with the unit's
        // suffix it may carry and the suffixes of its samples
        let source = include_str!("telemetry.rs");
        let mut exported = std::collections::BTreeSet::new();
        for (at, _) in source.match_indices("\"cdc_") {
            let name = &source[at + 1..][..source[at + 1..].find('"').unwrap_or(0)];
            for unit in ["", "_seconds", "_bytes"] {
                for sample in ["", "_total", "_bucket", "_sum", "_count"] {
                    exported.insert(format!("{name}{unit}{sample}"));
                }
            }
        }
        assert!(exported.contains("cdc_replication_lag_seconds") && exported.contains("cdc_commits_total"), "{exported:?}");
        for (file, text) in [
            ("docker/grafana/cdc-dashboard.json", include_str!("../../docker/grafana/cdc-dashboard.json")),
            ("docker/prometheus/cdc-rules.yml", include_str!("../../docker/prometheus/cdc-rules.yml")),
        ] {
            let bytes = text.as_bytes();
            let mut named = 0;
            for (at, _) in text.match_indices("cdc_") {
                let before = at.checked_sub(1).map(|i| bytes[i]);
                if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'/' || b == b'.') {
                    continue; // part of another word (a file name, a uid)
                }
                let end = text[at..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(text.len(), |n| at + n);
                let name = &text[at..end];
                assert!(exported.contains(name), "{file} names `{name}`, which the service does not export");
                named += 1;
            }
            assert!(named >= 8, "{file}: only {named} series named");
        }
    }
}

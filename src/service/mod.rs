//! `cdc run`: the long-running service. A loop per (pipeline, sink) — a Tokio task that sleeps between polls and
//! owns no thread — plus signals plus systemd notify.
//!
//! Threads: an idle poll — the source's and the sinks' cheap marks unchanged since the last poll found nothing to
//! do — is answered on the loop's own task ([`still_idle`]); any other poll runs on Tokio's blocking pool (the changelog scan's futures are not `Send`, and a hadoop
//! catalog's files are read with blocking calls), and returns its thread when done; no loop holds a thread between
//! polls, so thousands of idle loops cost a task and their state each, and a poll stuck in a blocking call holds one
//! thread, not the service. At most [`POLLS_AT_ONCE`] polls run at once (they wait for a slot on their task, not
//! on a thread). Runs that apply changes take one of `service.workers` permits first: the work (and the
//! memory budget each run may use) is bounded, while cheap polls of other pipelines go on. Catalogs are shared
//! between the loops that name the same one ([`Catalog::shared`]). Waits between polls are jittered (±10 %) so
//! that loops started together spread over the interval.
//!
//! Each loop polls its source on its interval with one [`poll`] function, whatever its sinks: a poll loads the
//! source's and the sinks' metadata only (nothing when the cheap marks say nothing moved), and when the source has
//! snapshots beyond a sink's recorded progress it calls the same runner as `cdc sync` ([`crate::pipeline::run`]),
//! coalescing every new snapshot into one commit, at most one commit per
//! `commit_interval`. Once every poll has found nothing to apply for a sink's [`Upkeep::rest_after`], the full poll
//! lets the sinks rest ([`Upkeep::rest`]: an Iceberg target is compacted completely), once per quiet spell.
//! Loops are isolated: a failing one (catalog down, table missing) retries with jittered
//! exponential backoff and is reported; a permanent error (schema the target cannot follow, expired progress) stops
//! that loop only, visibly, until a reload. A panicking loop is restarted; shared state is never poisoned.
//!
//! Signals: SIGHUP reloads the file (added loops start, removed ones stop after their in-flight commit, changed ones
//! restart; a file with errors is refused and the old configuration keeps running). SIGTERM/SIGINT stop polling;
//! in-flight runs finish or abandon their commit before the catalog call; the process exits within
//! `shutdown_timeout`.
//!
//! Liveness is per loop ([`telemetry::RunStatus::overdue`]): a loop not started, a poll not begun when due, or a poll
//! without progress for `stall_timeout` is overdue — named by `/readyz` and `/healthz`, counted, logged.
//!
//! systemd (`Type=notify`): `READY=1` once the configuration is valid and every catalog was tried; `WATCHDOG=1` at
//! half of `WatchdogSec` only while no loop is overdue; `STATUS=` with a one-line lag summary; `STOPPING=1` on
//! shutdown.
#[cfg(feature = "kafka")]
mod cluster;
#[cfg(not(feature = "kafka"))]
#[path = "cluster_off.rs"]
mod cluster;
pub(crate) mod config;
mod discover;
mod http;
mod status;
pub use status::status;
pub(crate) mod telemetry;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use iceberg::table::Table;

use crate::catalog::Catalog;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::pipeline;
use crate::sink::iceberg::progress;
use crate::sink::{Rest, Sink};
use crate::spec::lineage;
pub use config::Shard;
use config::{Run, ServiceConfig};
use telemetry::{RunLabels, Telemetry};

/// Longest wait between retries of a failing loop.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// A running loop: its stop signal and task.
struct Running {
    run: Run,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// What `cdc run`'s command line overrides of the service file, so that every instance of a set can share one file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--shard i/N` (wins over `service.shard`).
    pub shard: Option<Shard>,
    /// `--metrics-address` (wins over `service.metrics_address`): instances on one host need their own.
    pub metrics_address: Option<String>,
}

/// Runs the service until SIGTERM/SIGINT (or `external_stop`, for embedding it, e.g. the quickstart).
pub async fn run(path: &Path, overrides: Overrides, external_stop: Option<watch::Receiver<bool>>) -> Result<()> {
    let cli_shard = overrides.shard;
    let mut cfg = ServiceConfig::load(path)?;
    if let Some(a) = overrides.metrics_address {
        if a != "off" && a.parse::<std::net::SocketAddr>().is_err() {
            return Err(Error::Config(vec![format!("--metrics-address: `{a}` is not host:port (or \"off\")")]));
        }
        cfg.service.metrics_address = a;
    }
    // the command line's shard wins over the file's (one file for every instance of a set)
    let shard = cli_shard.or(cfg.shard());
    let telemetry = Telemetry::new();
    let settings = cfg.service.clone();
    if settings.metrics_address != "off" {
        let addr = settings.metrics_address.parse().map_err(|e| Error::Config(vec![format!("service.metrics_address: {e}")]))?;
        http::serve(addr, telemetry.clone(), settings.stall_timeout, format!("{}@{}", crate::hostname(), settings.metrics_address))?;
    }
    // Every catalog is tried once before READY: a typo'd URI shows up now, not at the first poll.
    for (name, c) in &cfg.catalogs {
        if let Err(e) = Catalog::connect(c, name).await {
            tracing::warn!(catalog = %name, error = %e, "catalog not reachable at start; its pipelines will retry");
        }
    }
    let limits = Limits { polls: Arc::new(Semaphore::new(POLLS_AT_ONCE)), work: Arc::new(Semaphore::new(settings.workers())) };
    let mut ownership = match (&cfg.cluster, cli_shard) {
        (Some(_), Some(_)) => return Err(Error::Config(vec!["--shard and [cluster] both split the pipelines: keep one".into()])),
        (Some(c), None) => Ownership::Cluster(cluster::Membership::join(c, settings.shutdown_timeout, &settings.metrics_address).await?),
        (None, _) => Ownership::Shard(shard),
    };
    // the tables pipelines of patterns stand for (a catalog that cannot be listed now is listed again at the interval)
    let mut found = config::Discovered::new();
    if cfg.has_patterns() {
        found = discover::discover(&cfg, &found, &telemetry).await;
    }
    let mut running: BTreeMap<(String, String), Running> = BTreeMap::new();
    for r in ownership.runs(&cfg, &found) {
        start(&mut running, r, &telemetry, &limits);
    }
    let started = running.len();
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    let owned = running.keys().map(|(pipeline, _)| pipeline).collect::<std::collections::BTreeSet<_>>().len();
    let shard_label = match &ownership {
        Ownership::Cluster(_) => "cluster".into(),
        Ownership::Shard(shard) => shard.map(|s| s.to_string()).unwrap_or_else(|| "all".into()),
    };
    tracing::info!(pipelines = owned, loops = running.len(), started, configured = cfg.pipelines.len(), shard = %shard_label, workers = settings.workers(), config = %path.display(), "cdc service ready");
    // loops behind their schedule at the last tick, and why
    let mut overdue = BTreeMap::new();

    // feed the watchdog at half its interval
    let watchdog = sd_notify::watchdog_enabled().map(|d| d / 2);
    let mut tick = tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(5)).min(Duration::from_secs(5)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut discoverer = discover::Discoverer::start(cfg.clone(), found.clone(), ownership.owner(), telemetry.clone());
    let mut hup = signal(tokio::signal::unix::SignalKind::hangup())?;
    let mut term = signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut external = external_stop;
    let mut settings = settings;
    let mut current = cfg;
    loop {
        tokio::select! {
            owned = ownership.changed() => {
                reload(&mut running, ownership.runs(&current, &found), &telemetry, &limits).await;
                if let Ownership::Cluster(m) = &ownership {
                    m.applied(owned.change);
                }
                telemetry.assignment_applied(owned.partitions.len(), running.len());
            }
            _ = tick.tick() => {
                let statuses = telemetry.statuses();
                telemetry.schedule_checked(&statuses, settings.stall_timeout, &mut overdue);
                // A loop behind its schedule (stuck in a poll, never started, starved) must get the service
                // restarted: stop feeding the watchdog.
                if watchdog.is_some() && overdue.is_empty() {
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                }
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&status_line(&statuses))]);
                // restart loops whose task ended by a panic
                let dead: Vec<_> = running.iter().filter(|(_, r)| r.task.is_finished() && !*r.stop.borrow()).map(|(k, _)| k.clone()).collect();
                for k in dead {
                    if let Some(r) = running.remove(&k) {
                        if let Err(e) = r.task.await {
                            tracing::error!(pipeline = %k.0, sink = %k.1, error = %e, "pipeline task ended abnormally; restarting it");
                        }
                        start(&mut running, r.run, &telemetry, &limits);
                    }
                }
            }
            now = discoverer.changed() => {
                let changes = discover::changes(&found, &now);
                found = now;
                reload(&mut running, ownership.runs(&current, &found), &telemetry, &limits).await;
                // the gone tables' loops have stopped: mark their destinations (off this loop)
                tokio::spawn(discover::mark(current.clone(), changes));
            }
            _ = hup.recv() => {
                match ServiceConfig::load(path) {
                    Err(e) => telemetry.reloaded(Some(&e)),
                    Ok(mut new) => {
                        settings = new.service.clone();
                        match &mut ownership {
                            Ownership::Shard(s) => *s = cli_shard.or(new.shard()),
                            Ownership::Cluster(_) if new.cluster != current.cluster => {
                                tracing::warn!("[cluster] changes take effect when the service restarts; the group it joined stays");
                                new.cluster = current.cluster.clone();
                            }
                            Ownership::Cluster(_) => {}
                        }
                        current = new;
                        // the pipelines as the file says now, with the tables found so far; discovery follows
                        discoverer.reconfigure(current.clone(), ownership.owner());
                        reload(&mut running, ownership.runs(&current, &found), &telemetry, &limits).await;
                        telemetry.reloaded(None);
                    }
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = async { match external.as_mut() { Some(rx) => { let _ = rx.wait_for(|v| *v).await; } None => std::future::pending::<()>().await } } => break,
        }
    }
    // Shutdown follows the data flow: stop polling, let in-flight commits finish (or abandon them before the catalog
    // call), give up at the deadline.
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    tracing::info!(timeout_seconds = settings.shutdown_timeout.as_secs_f64(), "shutting down");
    for r in running.values() {
        let _ = r.stop.send(true);
    }
    let deadline = tokio::time::Instant::now() + settings.shutdown_timeout;
    for (k, r) in running {
        if tokio::time::timeout_at(deadline, r.task).await.is_err() {
            tracing::warn!(pipeline = %k.0, sink = %k.1, "did not stop before the shutdown timeout; abandoned");
        }
        telemetry.removed(&RunLabels { pipeline: k.0, sink: k.1 });
    }
    // leave the cluster's group last: the other instances take the pipelines once their loops here have stopped
    drop(ownership);
    Ok(())
}

/// Which of the file's pipelines this instance runs.
enum Ownership {
    /// A static share (`--shard i/N` or `service.shard`), or every pipeline.
    Shard(Option<Shard>),
    /// The share the cluster's Kafka group assigns (`[cluster]`).
    Cluster(cluster::Membership),
}

impl Ownership {
    /// Whether this instance owns a pipeline (by name), for another task; it follows the cluster's assignment.
    fn owner(&self) -> discover::Owns {
        match self {
            Ownership::Shard(shard) => {
                let shard = *shard;
                Arc::new(move |pipeline: &str| shard.is_none_or(|s| s.owns(pipeline)))
            }
            Ownership::Cluster(m) => Arc::new(m.owner()),
        }
    }

    /// The runs of `cfg` (its patterns' tables as `found`) this instance owns now.
    fn runs(&self, cfg: &ServiceConfig, found: &config::Discovered) -> Vec<Run> {
        match self {
            Ownership::Shard(shard) => cfg.owned_runs(*shard, found),
            Ownership::Cluster(m) => cfg.runs(found).into_iter().filter(|r| m.owns(&r.pipeline)).collect(),
        }
    }

    /// The owned set once the group changes it; never, for a static share.
    async fn changed(&mut self) -> cluster::Owned {
        match self {
            Ownership::Cluster(m) => m.changed().await,
            Ownership::Shard(_) => std::future::pending().await,
        }
    }
}

fn signal(kind: tokio::signal::unix::SignalKind) -> Result<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(kind)
        .map_err(|e| Error::Io { path: "signal handler".into(), message: e.to_string(), retryable: false, cause: None }.with_cause(e))
}

fn status_line(statuses: &[(RunLabels, telemetry::RunStatus)]) -> String {
    let failing = statuses.iter().filter(|(_, s)| !s.healthy).count();
    let max_lag = statuses.iter().map(|(_, s)| s.lag_seconds).fold(0.0, f64::max);
    let behind: u64 = statuses.iter().map(|(_, s)| s.lag_snapshots).sum();
    format!("{} pipelines, {failing} failing, max lag {max_lag:.1}s, {behind} snapshots behind", statuses.len())
}

/// Starts `run`'s loop as a task.
fn start(running: &mut BTreeMap<(String, String), Running>, run: Run, telemetry: &Arc<Telemetry>, limits: &Limits) {
    let (stop, rx) = watch::channel(false);
    let key = (run.pipeline.clone(), run.sink.clone());
    let labels = RunLabels { pipeline: run.pipeline.clone(), sink: run.sink.clone() };
    telemetry.registered(&labels);
    // the task ends when the loop does, with the loop's panic if it panicked (the tick restarts it)
    let task = tokio::spawn(pipeline_loop(run.clone(), rx, telemetry.clone(), limits.clone()));
    running.insert(key, Running { run, stop, task });
}

/// Applies a reloaded configuration: removed loops stop after their in-flight commit, changed ones restart, new ones
/// start; unchanged ones keep running untouched.
async fn reload(running: &mut BTreeMap<(String, String), Running>, runs: Vec<Run>, telemetry: &Arc<Telemetry>, limits: &Limits) {
    let wanted: BTreeMap<(String, String), Run> = runs.into_iter().map(|r| ((r.pipeline.clone(), r.sink.clone()), r)).collect();
    let gone: Vec<_> = running.keys().filter(|k| wanted.get(*k).is_none_or(|w| *w != running[*k].run)).cloned().collect();
    for k in gone {
        if let Some(r) = running.remove(&k) {
            let _ = r.stop.send(true);
            let _ = r.task.await;
            telemetry.removed(&RunLabels { pipeline: k.0.clone(), sink: k.1.clone() });
        }
    }
    for (k, r) in wanted {
        if !running.contains_key(&k) {
            start(running, r, telemetry, limits);
        }
    }
}

/// Sleeps `d`, or less when a stop is requested. Returns whether to stop.
async fn sleep_or_stop(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    if *stop.borrow() {
        return true;
    }
    let stopped = tokio::select! {
        _ = tokio::time::sleep(d) => false,
        r = stop.wait_for(|v| *v) => r.is_ok(),
    };
    stopped || *stop.borrow()
}

/// Polls running at once (each on a blocking-pool thread, waiting there for a worker permit when it has work). Well
/// under Tokio's blocking-pool cap (512): the rest of the pool stays free for the file I/O those polls issue, so that
/// polls waiting for a permit can never starve the run that holds one.
const POLLS_AT_ONCE: usize = 256;

/// The service's bounds, shared by its loops.
#[derive(Clone)]
struct Limits {
    /// [`POLLS_AT_ONCE`] permits: a loop holds one for the duration of a poll.
    polls: Arc<Semaphore>,
    /// `service.workers` permits: a poll that applies changes holds one while it does.
    work: Arc<Semaphore>,
}

/// What a loop carries from poll to poll: moved onto a blocking-pool thread for each poll, and back.
struct LoopState {
    cfg: crate::config::Config,
    run: Run,
    /// The catalogs and clients, kept across polls (a Kafka sink keeps its producer and transactional id).
    pipeline: Option<Pipeline>,
    control: pipeline::RunControl,
    last_commit: Option<Instant>,
    labels: RunLabels,
    telemetry: Arc<Telemetry>,
    /// Permits of `service.workers`: a run that applies changes holds one.
    work: Arc<Semaphore>,
}

/// One pipeline's loop: poll, apply, report; back off on errors; stop on a permanent one.
async fn pipeline_loop(run: Run, mut stop: watch::Receiver<bool>, telemetry: Arc<Telemetry>, limits: Limits) {
    let labels = RunLabels { pipeline: run.pipeline.clone(), sink: run.sink.clone() };
    telemetry.started(&labels);
    let cfg = run.config.clone();
    // delete files stay read across polls (bounded to what the source still references)
    let control = pipeline::RunControl { stop: Some(stop.clone()), cache: Some(Arc::new(crate::source::changelog::DeleteCache::default())) };
    let mut state =
        LoopState { cfg, run, pipeline: None, control, last_commit: None, labels: labels.clone(), telemetry: telemetry.clone(), work: limits.work };
    let mut failures = 0u32;
    loop {
        if *stop.borrow() {
            break;
        }
        telemetry.poll_began(&labels);
        let result = if still_idle(&mut state).await {
            telemetry.polled(&labels, 0.0, 0);
            Ok(())
        } else {
            // wait for a poll slot here, on the task, not on a blocking-pool thread
            let Ok(slot) = limits.polls.clone().acquire_owned().await else { break };
            let polled = poll_on_blocking_pool(state).await;
            drop(slot);
            let Some((back, result)) = polled else { break }; // the runtime is shutting down
            state = back;
            result
        };
        let interval = state.run.poll_interval;
        let wait = match result {
            Ok(()) => {
                failures = 0;
                jittered(interval)
            }
            Err(Error::Cancelled) => break,
            Err(e) if e.is_permanent() => {
                telemetry.failed(&labels, &e, true, None);
                // stay visible (and stopped) until a reload replaces this loop
                let _ = stop.wait_for(|v| *v).await;
                break;
            }
            Err(e) => {
                if matches!(e, Error::Catalog { .. } | Error::Kafka { .. }) {
                    // reconnect next time (a new Kafka producer aborts what the failed one left open)
                    state.pipeline = None;
                }
                failures += 1;
                let base = interval.max(Duration::from_millis(500)).saturating_mul(1 << failures.min(10)).min(MAX_BACKOFF);
                let jitter = Duration::from_millis(crate::backoff::random_up_to(base.as_millis() as u64 / 4));
                let wait = base / 2 + jitter;
                telemetry.failed(&labels, &e, false, Some(wait));
                wait
            }
        };
        telemetry.waiting(&labels, wait);
        if sleep_or_stop(&mut stop, wait).await {
            break;
        }
    }
}

/// Whether a poll that began at `now` may commit, the poll that last committed having begun at `last` (`None`: none
/// did yet): at most one commit per `commit_interval`, counted on the poll cadence. Polls are [`jittered`] by up to a
/// tenth of `poll_interval`, so a poll that comes that much early still counts as a full interval on: by default
/// (`commit_interval` = `poll_interval`) every poll that finds changes commits them. Counted from the end of the
/// commit instead (as before), a poll came early about every other time and skipped a commit it was meant to make —
/// two poll intervals of latency for the commits it left (issue 51: busy P99 2.1 s at a 1 s poll). Pure.
fn commit_due(last: Option<Instant>, now: Instant, commit_interval: Duration, poll_interval: Duration) -> bool {
    last.is_none_or(|t| now.saturating_duration_since(t) + jitter(poll_interval) >= commit_interval)
}

/// How far [`jittered`] moves a poll interval either way: a tenth of it.
fn jitter(interval: Duration) -> Duration {
    Duration::from_millis(interval.as_millis() as u64 / 10)
}

/// `interval` ± [`jitter`]: loops started together drift apart instead of polling in lockstep.
fn jittered(interval: Duration) -> Duration {
    let tenth = jitter(interval);
    interval.saturating_sub(tenth) + Duration::from_millis(crate::backoff::random_up_to(2 * tenth.as_millis() as u64))
}

/// Runs one [`poll`] on a thread of Tokio's blocking pool, driving its (non-`Send`) futures there. A panic in the
/// poll panics the loop's task (the tick restarts the loop); `None` when the runtime is shutting down.
async fn poll_on_blocking_pool(mut s: LoopState) -> Option<(LoopState, Result<()>)> {
    let handle = tokio::runtime::Handle::current();
    let job = tokio::task::spawn_blocking(move || {
        let result = handle.block_on(s.poll());
        (s, result)
    });
    match job.await {
        Ok(v) => Some(v),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => None,
    }
}

/// The source as a poll last loaded it: where its metadata was, how its files are reached, and the table itself while
/// it is small (trimmed, or a short history) — a loop never holds a long history between polls.
struct LastSource {
    location: Option<String>,
    io: iceberg::io::FileIO,
    ident: iceberg::TableIdent,
    /// The loaded table and whether snapshots were left out of it; `None` when it was too large to keep.
    table: Option<(Table, bool)>,
    /// What the walk of its metadata file leaves for the next one's ([`crate::spec::recent::Memo`]).
    memo: Option<crate::spec::recent::Memo>,
}

/// A loaded source is kept between polls when it holds at most this many snapshots (or was trimmed).
const KEEP_SOURCE_SNAPSHOTS: usize = 64;

/// What a loop keeps between polls.
struct Pipeline {
    /// The source's catalog (shared with the other loops that name it).
    source: Arc<Catalog>,
    /// The destinations, each with its catalog or client ([`crate::sink::open`]).
    sinks: Vec<Box<dyn Sink>>,
    /// The marks (source metadata location, then each sink's [`Sink::mark`]) of the last poll that found nothing to
    /// do.
    idle: Option<Vec<Option<String>>>,
    /// Whether that poll found the source without a snapshot: then nothing is to do whatever the sinks' marks say
    /// (a sink's destination is only created with the first snapshot, so its mark is unknown until then).
    idle_empty: bool,
    /// Since when every poll has found nothing to apply (`None`: the last one found something).
    idle_since: Option<Instant>,
    /// Whether every sink answered [`Rest::Done`] since then.
    rested: bool,
    /// The shortest [`Upkeep::rest_after`] of the sinks (`None`: none rests).
    rest_after: Option<Duration>,
    /// The source as the last poll loaded it, and whether snapshots were left out of it.
    last_source: Option<LastSource>,
    /// The sequence number of the oldest snapshot a sink recorded at the last poll: what the next load keeps from
    /// ([`Catalog::load_recent`]); `None`: load in full.
    since: Option<i64>,
}

impl Pipeline {
    /// The source's metadata location, then each sink's [`Sink::mark`]: cheap tokens that change when anything a poll
    /// looks at may have.
    async fn marks(&mut self, source_table: &str) -> Result<Vec<Option<String>>> {
        let mut marks = vec![self.source.cheap_metadata_location(source_table).await?];
        for s in self.sinks.iter_mut() {
            marks.push(s.mark().await?);
        }
        Ok(marks)
    }

    /// The source as of metadata location `at` (this poll's mark) and each sink's recorded progress.
    ///
    /// Following a table costs what changed, not its history: the last load serves while the location has not moved;
    /// after that, only the snapshots from the oldest one a sink recorded are kept ([`crate::spec::recent`]). When a
    /// sink's progress is not on the kept lineage (a first poll, a rollback of the source, a sink that moved back),
    /// the source is loaded in full and judged as before.
    async fn source_and_progress(&mut self, cfg: &Config, at: Option<&str>) -> Result<(Table, bool, Vec<Option<i64>>)> {
        let name = &cfg.source.table;
        let mut memo = None;
        let (mut source, mut trimmed) = match (&self.last_source, at, self.since) {
            _ if self.source.is_server() => (self.source.load_table(name).await?, false), // a load renews what it vends
            (Some(LastSource { location, table: Some((prev, trimmed)), memo: last_memo, .. }), Some(at), _) if location.as_deref() == Some(at) => {
                memo = last_memo.clone();
                (prev.clone(), *trimmed)
            }
            (Some(last), Some(at), Some(since)) => {
                let (t, dropped, next) = self.source.load_recent(name, &last.io, &last.ident, at, since, last.memo.as_ref()).await?;
                memo = next;
                (t, dropped > 0)
            }
            _ => (self.source.load_table(name).await?, false),
        };
        loop {
            let mut recorded = Vec::with_capacity(self.sinks.len());
            if let Some(head) = source.metadata().current_snapshot() {
                let info = pipeline::source_info(cfg, &source, head)?;
                for s in self.sinks.iter_mut() {
                    recorded.push(s.recorded(&info).await?);
                }
            }
            if trimmed && !crate::spec::recent::holds_lineage(source.metadata(), &recorded) {
                (source, trimmed, memo) = (self.source.load_table(name).await?, false, None);
                continue;
            }
            let meta = source.metadata();
            self.since = recorded.iter().map(|r| r.and_then(|id| meta.snapshot_by_id(id)).map(|s| s.sequence_number())).min().flatten();
            let small = trimmed || meta.snapshots().len() <= KEEP_SOURCE_SNAPSHOTS;
            self.last_source = Some(LastSource {
                location: source.metadata_location().map(str::to_string),
                io: source.file_io().clone(),
                ident: source.identifier().clone(),
                table: small.then(|| (source.clone(), trimmed)),
                memo: memo.take(),
            });
            return Ok((source, trimmed, recorded));
        }
    }

    /// Whether `marks` say nothing moved since a poll found every sink caught up (and no sink's rest is due).
    fn still_idle(&self, marks: &[Option<String>]) -> bool {
        let Some(idle) = self.idle.as_deref() else { return false };
        let unchanged = if self.idle_empty {
            marks.first().is_some_and(Option::is_some) && idle.first() == marks.first()
        } else {
            marks.iter().all(Option::is_some) && idle == marks
        };
        unchanged && !self.rest_due(Instant::now())
    }

    /// Whether the sinks' rest ([`Upkeep::rest`]) is due at `now`.
    fn rest_due(&self, now: Instant) -> bool {
        rest_due(self.idle_since, self.rested, self.rest_after, now)
    }
}

/// Whether the sinks' rest is due at `now`: every poll since `idle_since` found nothing to apply, for at least
/// `after` (the shortest [`Upkeep::rest_after`]; `None`: no sink rests), and they have not `rested` since. Pure.
fn rest_due(idle_since: Option<Instant>, rested: bool, after: Option<Duration>, now: Instant) -> bool {
    match (idle_since, after) {
        (Some(since), Some(after)) => !rested && now.saturating_duration_since(since) >= after,
        _ => false,
    }
}

/// The idle check of a poll, on the loop's own task: when the marks say nothing moved since the last poll found
/// nothing to do, the poll ends here — no blocking-pool thread, no poll slot. `false`: a full [`poll`] is needed
/// (something moved, a mark is unknown or could not be read — the full poll reports the error).
async fn still_idle(state: &mut LoopState) -> bool {
    let Some(p) = state.pipeline.as_mut().filter(|p| p.idle.is_some()) else { return false };
    match p.marks(&state.cfg.source.table).await {
        Ok(marks) => p.still_idle(&marks),
        Err(_) => false,
    }
}

impl LoopState {
    /// One poll, whatever the sinks: when the source has snapshots beyond the least advanced sink's progress, run the
    /// same runner as `cdc sync` over them (at most one commit per `commit_interval`).
    async fn poll(&mut self) -> Result<()> {
        let began = Instant::now();
        let LoopState { cfg, run, pipeline: state, control, last_commit, labels, telemetry, work } = self;
        if state.is_none() {
            let source = Catalog::shared(&cfg.source.catalog, "source").await?;
            let mut sinks = crate::sink::open(cfg, &run.pipeline, crate::sink::Lifetime::LongRunning).await?;
            let rest_after = sinks.iter_mut().filter_map(|s| s.upkeep().and_then(|u| u.rest_after())).min();
            *state = Some(Pipeline {
                source,
                sinks,
                idle: None,
                idle_since: None,
                rested: false,
                rest_after,
                last_source: None,
                since: None,
                idle_empty: false,
            });
        }
        let p = state.as_mut().expect("just connected");
        // Nothing moved since a poll that found every sink caught up: skip loading any metadata. (Marks are read before
        // the progress they stand for: a change in between shows as a new mark next time.)
        let marks = p.marks(&cfg.source.table).await?;
        if p.still_idle(&marks) {
            telemetry.polled(labels, 0.0, 0);
            return Ok(());
        }
        p.idle = None;
        for s in p.sinks.iter_mut() {
            if let Some(u) = s.upkeep() {
                telemetry.maintained(labels, &u.take_maintenance());
            }
        }
        let (source, trimmed, recorded) = p.source_and_progress(cfg, marks[0].as_deref()).await?;
        let meta = source.metadata();
        p.idle_empty = meta.current_snapshot().is_none();
        if p.idle_empty {
            telemetry.polled(labels, 0.0, 0);
            p.idle = Some(marks);
            return Ok(()); // nothing to replicate yet
        }
        // the least advanced sink decides what is pending
        let mut pending = Vec::new();
        for r in recorded {
            let behind = pending_snapshots(meta, r);
            if behind.len() > pending.len() {
                pending = behind;
            }
        }
        if pending.is_empty() {
            p.idle_since.get_or_insert_with(Instant::now);
            // caught up long enough: the sinks' maintenance that would cost latency while changes flow
            if p.rest_due(Instant::now()) {
                let mut working = false;
                for s in p.sinks.iter_mut() {
                    if let Some(u) = s.upkeep() {
                        working |= u.rest().await? == Rest::Working;
                    }
                }
                p.rested = !working;
            }
        } else {
            (p.idle_since, p.rested) = (None, false);
        }
        if pending.is_empty() || !commit_due(*last_commit, began, run.commit_interval, run.poll_interval) {
            let (secs, n) = lag(&pending);
            telemetry.polled(labels, secs, n);
            if pending.is_empty() {
                p.idle = Some(marks);
            }
            return Ok(());
        }
        // a run that applies changes waits for a worker permit (the bound on concurrent work and its memory)
        let _permit = work.acquire().await.map_err(|_| Error::Cancelled)?;
        let mut summary = pipeline::run(cfg, &source, &mut p.sinks, None, None, control, |r| telemetry.committed(labels, r)).await;
        if summary.is_err() && trimmed {
            // a sink's progress moved off the kept snapshots meanwhile: judge with the whole history (a rerun is
            // exactly once like any other; a trimmed view never fails a poll a full one would pass)
            p.since = None;
            let full = p.source.load_table(&cfg.source.table).await?;
            summary = pipeline::run(cfg, &full, &mut p.sinks, None, None, control, |r| telemetry.committed(labels, r)).await;
        }
        let summary = summary?;
        telemetry.synced(labels, &summary);
        if !summary.target_snapshot_ids.is_empty() {
            *last_commit = Some(began);
        }
        // what is left of this poll's view of the source (commits that landed meanwhile show at the next poll)
        let left = match summary.source_snapshot_id {
            Some(at) => pending_snapshots(meta, Some(at)),
            None => pending,
        };
        let (secs, n) = lag(&left);
        telemetry.polled(labels, secs, n);
        Ok(())
    }
}

/// A sink's lag behind `pending` (its source snapshots not yet applied): seconds since the oldest was committed, and
/// how many there are.
fn lag(pending: &[iceberg::spec::SnapshotRef]) -> (f64, u64) {
    let oldest = pending.first().map(|s| s.timestamp_ms());
    let now = chrono::Utc::now().timestamp_millis();
    (oldest.map(|t| (now - t).max(0) as f64 / 1000.0).unwrap_or(0.0), pending.len() as u64)
}

/// Main-branch snapshots after `progress` (all of them without progress), oldest first.
fn pending_snapshots(meta: &iceberg::spec::TableMetadata, progress: Option<i64>) -> Vec<iceberg::spec::SnapshotRef> {
    let all = lineage::main_lineage(meta);
    match progress {
        None => all,
        Some(p) => match all.iter().position(|s| s.snapshot_id() == p) {
            Some(i) => all[i + 1..].to_vec(),
            // progress off the lineage (rolled back, expired): the runner reports it
            None => all,
        },
    }
}

/// `cdc check`: validates the file and reaches every catalog and table (`matches_only`: only lists what the
/// pipelines of patterns match). One line per pipeline; `Ok(false)` when any failed.
pub async fn check(path: &Path, matches_only: bool) -> Result<bool> {
    let cfg = ServiceConfig::load(path)?;
    let mut failed = 0;
    // what each pipeline of patterns matches now (one listing per catalog)
    let mut listings = BTreeMap::new();
    for (name, listed, seconds) in discover::list_catalogs(&cfg).await {
        match listed {
            Ok((tables, calls)) => {
                println!("ok    catalog {name}: {} tables listed in {calls} calls, {:.1} ms", tables.len(), seconds * 1e3);
                listings.insert(name, Some(tables));
            }
            Err(e) => {
                failed += 1;
                println!("FAIL  catalog {name}: cannot list its tables: {e}");
                listings.insert(name, None);
            }
        }
    }
    let found = discover::select(&cfg, &listings, &config::Discovered::new());
    for (pipeline, tables) in &found {
        let shown = tables.iter().take(20).cloned().collect::<Vec<_>>().join(", ");
        let more = if tables.len() > 20 { format!(", … {} more", tables.len() - 20) } else { String::new() };
        println!("match {pipeline}: {} tables{}{shown}{more}", tables.len(), if tables.is_empty() { "" } else { ": " });
    }
    if matches_only {
        return Ok(failed == 0);
    }
    let runs = cfg.runs(&found);
    for r in &runs {
        let line = async {
            let s = Catalog::connect(&r.config.source.catalog, "source").await?;
            let source = s.load_table(&r.config.source.table).await?;
            let meta = source.metadata();
            let head = meta.current_snapshot_id().map(|h| h.to_string()).unwrap_or("-".into());
            // a Kafka-only run: reaching the source is what can be checked without taking over the pipeline (a
            // producer with its transactional id would fence a running instance)
            let Some(tcfg) = r.config.targets().next() else {
                return Ok::<_, Error>(format!("source {} at snapshot {head}", r.config.source.table));
            };
            let t = Catalog::connect(&tcfg.catalog, "target").await?;
            let target = match t.load_table(&tcfg.table).await {
                Ok(tt) => match progress::read(tt.metadata(), &meta.uuid().to_string()) {
                    Some(p) => {
                        let behind = pending_snapshots(meta, Some(p.source_snapshot_id)).len();
                        format!("target {} at source snapshot {} ({behind} behind)", tcfg.table, p.source_snapshot_id)
                    }
                    None => format!("target {} exists, not synced yet", tcfg.table),
                },
                Err(Error::TableNotFound { .. }) => format!("target {} will be created", tcfg.table),
                Err(e) => return Err(e),
            };
            Ok(format!("source {} at snapshot {head}; {target}", r.config.source.table))
        }
        .await;
        match line {
            Ok(l) => println!("ok    {} ({}): {l}", r.pipeline, r.sink),
            Err(e) => {
                failed += 1;
                println!("FAIL  {} ({}): {e}", r.pipeline, r.sink);
            }
        }
    }
    println!(
        "{} pipelines, {} loops (one per sink; `cdc run` starts every one): {} ok, {failed} failed",
        cfg.pipeline_tables(&found).len(),
        runs.len(),
        (runs.len() + listings.len()).saturating_sub(failed)
    );
    Ok(failed == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sinks_rest_once_per_quiet_spell_after_the_shortest_rest_after() {
        let t0 = Instant::now();
        let (s5, s6) = (Duration::from_secs(5), Duration::from_secs(6));
        assert!(!rest_due(Some(t0), false, Some(s5), t0 + Duration::from_secs(4)), "not quiet long enough");
        assert!(rest_due(Some(t0), false, Some(s5), t0 + s5));
        assert!(!rest_due(Some(t0), true, Some(s5), t0 + s6), "rested since");
        assert!(!rest_due(None, false, Some(s5), t0 + s6), "the last poll found something to apply");
        assert!(!rest_due(Some(t0), false, None, t0 + s6), "no sink rests");
        // quiet time is measured from `idle_since`, never before it
        assert!(!rest_due(Some(t0 + s6), false, Some(s5), t0 + s6));
    }

    #[test]
    fn every_poll_may_commit_by_default_and_a_longer_commit_interval_counts_on_the_poll_cadence() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let second = Duration::from_secs(1);
        assert!(commit_due(None, t0, second, second), "nothing committed yet");
        // polls come every 0.9–1.1 s (jittered) after the last one ended: each one may commit by default
        for _ in 0..1_000 {
            let next = t0 + ms(20) + jittered(second);
            assert!(commit_due(Some(t0), next, second, second), "{:?} after the committing poll began", next - t0);
        }
        // a poll that comes sooner than that (a reload, a restart of the loop) does not
        assert!(!commit_due(Some(t0), t0 + ms(850), second, second));
        // commit_interval 5 s at a 1 s poll: the polls 4.9 s and more after, not 4.8 s
        assert!(!commit_due(Some(t0), t0 + ms(4_800), Duration::from_secs(5), second));
        assert!(commit_due(Some(t0), t0 + ms(4_900), Duration::from_secs(5), second));
    }
}

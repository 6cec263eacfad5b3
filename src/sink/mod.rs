//! The write side: destinations of change rows. Each implements [`Sink`], which the runner in `pipeline` drives the
//! same way for every destination (the Iceberg applier, the Kafka republisher), in `cdc sync` and in the service:
//!
//! 1. [`Sink::recorded`]: the source snapshot the sink's own recorded progress is at;
//! 2. [`Sink::prepare`]: create what is missing (a target table from the schema the sync starts from);
//! 3. per commit: [`Sink::begin`] → [`Sink::write`] (the change rows, in order) → [`Sink::commit`] (atomically with
//!    the progress of the commit's last source snapshot, valid only on the progress it was planned from) or
//!    [`Sink::abort`].
//!
//! A sink that finds its progress moved by another writer answers [`Committed::Replan`]; the runner then plans again
//! from what the sink records — never re-applying a range, never moving progress backwards.
//!
//! What the runner plans by is a sink's [`Profile`] (one value, so that a wrapper passes all of it on); upkeep of the
//! destination between commits is the separate [`Upkeep`] capability, which the service drives.
//!
//! [`open`] is the one place that turns a pipeline's configuration into its destinations; each sink owns its catalog
//! or client. Adding a destination: a folder here implementing [`Sink`], its keys as a [`SinkConfig`] variant, and
//! one arm in [`open`].
pub mod fanout;
pub mod iceberg;
pub mod jsonl;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod testing;

use ::iceberg::spec::{SchemaRef, SnapshotRef, TableMetadataRef};
use arrow_array::RecordBatch;

use crate::config::{Config, SinkConfig};
use crate::error::{Error, Result};

/// The destinations `cfg` lists, in commit order (Iceberg tables before the others), each owning its catalog or
/// client. `pipeline` names the pipeline (a Kafka sink's transactional id derives from it).
pub async fn open(cfg: &Config, pipeline: &str, lifetime: Lifetime) -> Result<Vec<Box<dyn Sink>>> {
    let _ = pipeline; // only a Kafka sink's transactional id uses it
    if cfg.sinks.is_empty() {
        return Err(Error::Config(vec![
            "[target], [kafka] or [[sinks]]: a run needs a destination (an Iceberg table, a Kafka topic, or both)".into()
        ]));
    }
    let mut ordered: Vec<&SinkConfig> = cfg.sinks.iter().collect();
    ordered.sort_by_key(|s| !matches!(s, SinkConfig::Iceberg(_)));
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    for s in ordered {
        sinks.push(match s {
            SinkConfig::Iceberg(t) => Box::new(iceberg::IcebergSink::open(t.clone(), cfg.engine.memory_budget, lifetime).await?),
            #[cfg(feature = "kafka")]
            SinkConfig::Kafka(k) => Box::new(kafka::KafkaSink::new(k.clone(), pipeline.to_string(), cfg.engine.memory_budget)),
            #[cfg(not(feature = "kafka"))]
            SinkConfig::Kafka(_) => return Err(Error::Config(vec![crate::config::LEFT_OUT_KAFKA.into()])),
            SinkConfig::Jsonl(j) => Box::new(jsonl::JsonlSink::new(j.clone(), cfg.engine.memory_budget)),
        });
    }
    Ok(sinks)
}

/// How long the sinks [`open`] returns live: it decides where an Iceberg target's compaction runs, and how many source
/// snapshots a commit covers by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// One `cdc sync`: compaction runs between its commits, so the target is compacted when the sync ends.
    OneShot,
    /// The service's loops, run after run: compaction rewrites in the background and commits between the applier's
    /// commits, off the replication path (equality-delete targets; position-delete targets compact between commits,
    /// since the applier's positions hold only on the head it looked them up in). An expiry commits with the
    /// applier's commit, and the files it left unreferenced are deleted beside the next commits.
    LongRunning,
}

/// Source snapshots one commit may coalesce at most when a sink's `snapshots_per_commit` is not set and it coalesces
/// (the service's Iceberg targets, every Kafka sink).
pub const MAX_SNAPSHOTS_PER_COMMIT: usize = 1000;

impl Lifetime {
    /// Source snapshots one commit of an Iceberg target covers when `snapshots_per_commit` is not set: one per
    /// commit for `cdc sync` (the target's history mirrors the source's), every new one of a poll in the service.
    pub fn snapshots_per_commit(self) -> usize {
        match self {
            Lifetime::OneShot => 1,
            Lifetime::LongRunning => MAX_SNAPSHOTS_PER_COMMIT,
        }
    }
}

/// The source a sink serves, as the runner resolved it.
#[derive(Debug, Clone)]
pub struct SourceInfo {
    /// The source table's uuid: progress is recorded per source table.
    pub uuid: String,
    /// `namespace.table`, for messages and summaries.
    pub name: String,
    /// The source table's metadata as the run loaded it.
    pub metadata: TableMetadataRef,
    /// Key columns as source field ids, in key order (empty: whole-row identity).
    pub key_ids: Vec<i32>,
    /// The schema whose column names the user's configuration uses (equality columns are resolved in it).
    pub names_schema: SchemaRef,
    /// What a destination does when the source's history was rewritten under it.
    pub on_history_rewrite: crate::config::OnHistoryRewrite,
}

/// One commit the runner asks of a sink.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// Source snapshots the commit covers, oldest first (for a bootstrap copy: the copied snapshot).
    pub snapshots: Vec<SnapshotRef>,
    /// The rows are the full contents of the snapshot and the sink is empty: nothing needs deleting.
    pub bootstrap: bool,
    /// The schema the rows come in (the last snapshot's).
    pub schema: SchemaRef,
    /// The progress (source snapshot id) the commit is valid on; `None` for a bootstrap.
    pub base: Option<i64>,
    /// Commit even when nothing changed: the last commit of a run records how far it got.
    pub must_commit: bool,
    /// The commit follows a rewrite of the source's history: what it undoes before the changes of `snapshots`.
    pub rewrite: Option<Rewrite>,
}

impl Chunk {
    /// The last source snapshot of the commit (its progress).
    pub fn last(&self) -> &SnapshotRef {
        self.snapshots.last().or(self.rewrite.as_ref().map(|r| &r.to)).expect("a chunk has snapshots")
    }

    /// How many source snapshots' changes the commit carries (undone ones included): above one, a key may change
    /// more than once in it.
    pub fn steps(&self) -> usize {
        self.snapshots.len() + self.rewrite.as_ref().map_or(0, |r| r.undo.len() + usize::from(r.clear.is_some()))
    }
}

/// What a commit that follows a rewrite of the source's history undoes: the changes the source no longer has, newest
/// first, or — without a common history — every row of the snapshot the destination was at. The commit then applies
/// the chunk's snapshots (or, with `copy`, the rows of `to`), so the destination ends equal to the source at `to`.
#[derive(Debug, Clone)]
pub struct Rewrite {
    /// What happened to the source.
    pub kind: RewriteKind,
    /// The source snapshot the destination was at (`None`: a dropped table's, not known here).
    pub from: Option<i64>,
    /// The snapshot the commit brings the destination to (its progress).
    pub to: SnapshotRef,
    /// Snapshots whose changes are undone (inverted), newest first: those after the common ancestor up to `from`.
    pub undo: Vec<SnapshotRef>,
    /// No common history: every row of this snapshot (`from`) is deleted …
    pub clear: Option<SnapshotRef>,
    /// … and every row of `to` inserted.
    pub copy: bool,
}

/// What happened to a source's history under a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RewriteKind {
    /// The source went back to an ancestor of the destination's progress (`rollback_to_snapshot`, …).
    Rollback,
    /// The source went to another line of history that shares an ancestor with the progress (a rollback followed
    /// by new commits, a cherry-pick onto another line, `set_current_snapshot` to an orphan).
    Rewrite,
    /// The source's new history shares nothing with the progress (`CREATE OR REPLACE TABLE`).
    Replace,
    /// Another table now has the source's name (`DROP TABLE` + `CREATE TABLE`: a new table uuid).
    Recreate,
}

impl RewriteKind {
    /// The name in summaries, logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            RewriteKind::Rollback => "rollback",
            RewriteKind::Rewrite => "rewrite",
            RewriteKind::Replace => "replace",
            RewriteKind::Recreate => "recreate",
        }
    }
}

/// What one commit did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct CommitStats {
    /// Rows inserted.
    pub inserts: u64,
    /// Rows deleted.
    pub deletes: u64,
    /// Rows updated.
    pub updates: u64,
    /// Rows in the data files written.
    pub data_rows: u64,
    /// Rows in the equality-delete files written.
    pub equality_delete_rows: u64,
    /// Positions deleted (position-delete files and deletion vectors).
    pub position_deletes: u64,
    /// `delete_mode = "position"`: target data files read to find the rows of the keys the commit deletes …
    pub lookup_files_read: u64,
    /// … and the rows read from them.
    pub lookup_rows_read: u64,
    /// Files written.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Files closed before they were full because more partitions were open at once than the memory budget holds.
    pub files_closed_early: u64,
    /// From reading the commit's changes to the commit landing.
    pub seconds: f64,
    /// What the sink's maintenance of its destination did with this commit.
    pub maintenance: MaintenanceStats,
    /// The commit replaced every row of a dropped source table of the same name with a copy of the new one.
    #[serde(skip)]
    pub recreated: bool,
}

/// Maintenance a sink did to its destination with a commit — snapshot expiry, manifest merging, compaction — for metrics and
/// summaries.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct MaintenanceStats {
    /// Snapshots expired.
    pub snapshots_expired: u64,
    /// Files deleted because only expired snapshots referenced them (manifest lists, manifests, data and delete
    /// files).
    pub files_deleted: u64,
    /// Time spent expiring.
    pub expire_seconds: f64,
    /// Small manifests merged into fewer, in the commit.
    pub manifests_merged: u64,
    /// Manifests the merging wrote.
    pub manifests_written: u64,
    /// Compactions committed.
    pub compactions: u64,
    /// Data and delete files those compactions removed (rewritten data files, delete files no longer needed).
    pub files_rewritten: u64,
    /// Bytes of those files.
    pub bytes_rewritten: u64,
    /// Time spent compacting (planning, reading, writing, committing).
    pub compact_seconds: f64,
    /// Compactions that failed (replication went on; compaction is tried again when due again).
    pub compact_failures: u64,
    /// Orphan files the periodic sweep deleted.
    pub orphans_deleted: u64,
    /// Orphan sweeps that failed (tried again at the next interval).
    pub orphan_failures: u64,
    /// Maintenance steps that failed (replication went on; they are retried after a later commit).
    pub failures: u64,
}

/// How a commit ended.
#[derive(Debug, Clone)]
// one value per commit, moved once: boxing the stats would buy nothing
#[allow(clippy::large_enum_variant)]
pub enum Committed {
    /// It landed; `id` names it in the sink (a target snapshot id).
    Done {
        /// The commit's id in the sink.
        id: i64,
        /// What it wrote.
        stats: CommitStats,
    },
    /// Nothing to write (compactions only): the progress moves with the next commit.
    Empty,
    /// The sink's progress moved under the plan (another writer): plan again.
    Replan,
}

/// What a sink at rest is doing (see [`Upkeep::rest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rest {
    /// Maintenance is under way: ask again at the next poll.
    Working,
    /// Nothing (more) to do until the sink has committed again.
    Done,
}

/// Where a sink without recorded progress starts (when the run has no `--from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Initial {
    /// A copy of the source at the end of the range, then its changes.
    Copy,
    /// Every change from the source's first snapshot.
    Beginning,
}

/// How the runner plans a sink's commits and sizes the scan that feeds them: fixed for the sink's life, given as one
/// value so that a wrapper passes all of it on or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Where to start without recorded progress.
    pub initial: Initial,
    /// Source snapshots one commit may cover.
    pub snapshots_per_commit: usize,
    /// Bytes of `engine.memory_budget` the sink's own buffers may hold while the scan runs (its writers); the scan
    /// divides the rest, so that the two together stay within the budget.
    pub reserved_memory: u64,
    /// Whether the change rows of each snapshot must come in key order. A sink that applies a snapshot as a whole
    /// does not need it (each key's rows still come together, netted); one that resumes inside a snapshot by
    /// counting rows does (Kafka).
    pub needs_key_order: bool,
}

impl Profile {
    /// The profile of sinks fed together by one read ([`fanout::FanOut`]): the first one's start, the fewest
    /// snapshots per commit, every reservation, key order if any needs it.
    pub fn together(all: &[Profile]) -> Profile {
        Profile {
            initial: all.first().map_or(Initial::Copy, |p| p.initial),
            snapshots_per_commit: all.iter().map(|p| p.snapshots_per_commit).min().unwrap_or(1),
            reserved_memory: all.iter().map(|p| p.reserved_memory).sum(),
            needs_key_order: all.iter().any(|p| p.needs_key_order),
        }
    }
}

/// A destination of change rows, driven by the runner: the exactly-once protocol (see the module header). What the
/// runner plans by is the sink's [`Profile`]; upkeep of the destination between commits is a capability of its own
/// ([`Sink::upkeep`]). Object-safe: the runner holds a `&mut dyn Sink`.
#[async_trait::async_trait]
pub trait Sink: Send {
    /// How the sink is named in logs, metrics and summaries (`iceberg:<table>`).
    fn label(&self) -> String;
    /// What the runner plans this sink's commits by.
    fn profile(&self) -> Profile;
    /// The sink's upkeep of its destination, if it does any (the service drives it between polls).
    fn upkeep(&mut self) -> Option<&mut dyn Upkeep> {
        None
    }
    /// A cheap token that changes whenever the sink's recorded progress may have changed (a metadata location, the
    /// progress it wrote last); `None`: unknown. A poll that finds the source and every sink's mark as they were when
    /// it last found nothing to do skips loading any metadata.
    async fn mark(&mut self) -> Result<Option<String>> {
        Ok(None)
    }
    /// Reloads the sink's state; the source snapshot its recorded progress is at (`None`: nothing recorded).
    async fn recorded(&mut self, source: &SourceInfo) -> Result<Option<i64>>;
    /// Makes the sink ready for commits starting from rows of `schema`, creating what is missing. `bootstrap`: the
    /// first commit will be a full copy, refused when the sink holds rows without progress. Returns the progress of
    /// the state it will commit on (the runner plans again when it differs from [`Sink::recorded`]'s).
    async fn prepare(&mut self, source: &SourceInfo, schema: &SchemaRef, bootstrap: bool) -> Result<Option<i64>>;
    /// Opens a commit for `chunk`.
    async fn begin(&mut self, source: &SourceInfo, chunk: &Chunk) -> Result<()>;
    /// The columns of removed rows (`DELETE`, `UPDATE_BEFORE`) the open commit reads, as source field ids besides
    /// the key; `None`: all of them. The scan may then carry removed rows with only these columns, the others
    /// as placeholders (zero values): a copy-on-write rewrite's removed side then holds and
    /// spills a fraction of each row.
    fn removed_columns(&self) -> Option<Vec<i32>> {
        None
    }
    /// Change rows of the open commit, in order.
    async fn write(&mut self, batch: RecordBatch) -> Result<()>;
    /// Commits the open commit with its progress. `stop`: a shutdown request abandons it before the final call.
    async fn commit(&mut self, source: &SourceInfo, stop: Option<&tokio::sync::watch::Receiver<bool>>) -> Result<Committed>;
    /// Abandons the open commit and removes what it wrote.
    async fn abort(&mut self);
    /// Commit attempts repeated so far (conflicts, transient failures).
    fn retries(&self) -> u32;
    /// Whether this sink created its destination (a target table) in this run.
    fn created(&self) -> bool;
}

/// Upkeep of a destination besides the commits (an Iceberg target's compaction, expiry, orphan sweep), driven by the
/// service between polls.
#[async_trait::async_trait]
pub trait Upkeep: Send {
    /// Maintenance done outside the commits since the last commit or call (a compaction in the background), for
    /// telemetry; a commit's own is in its [`CommitStats`].
    fn take_maintenance(&mut self) -> MaintenanceStats;
    /// How long the service must have found nothing to apply before [`Upkeep::rest`] is called (`None`: never).
    fn rest_after(&self) -> Option<std::time::Duration>;
    /// Maintenance for a destination at rest — the service found nothing to apply for [`Upkeep::rest_after`] — that
    /// would cost replication latency while changes flow. Called on the next polls again while it answers
    /// [`Rest::Working`]; not again until after the next commit once it answered [`Rest::Done`]. What it did is
    /// counted by [`Upkeep::take_maintenance`].
    async fn rest(&mut self) -> Result<Rest>;
}

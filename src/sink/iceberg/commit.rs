//! The Iceberg target as a [`Sink`]: a table in any catalog, written as merge-on-read commits.
//!
//! Per commit: evolve the target schema to the chunk's source schema (by field id, see `evolve`), write data and
//! delete files with a [`CommitWriter`], and commit them as one row delta that also records the progress (snapshot
//! summary) and, when it changed, the field-id mapping (table property) and the new schema. The commit requires the
//! target head and schema it was planned on; on a conflict or a transient failure it backs off, reloads, and either
//! commits the same files on the new head (only unrelated commits landed) or answers [`Committed::Replan`] (the
//! recorded progress or the schema moved) after removing its files.
//!
//! A commit whose answer was lost (a 5xx other than 503, a timeout) may land later — a gateway gives up while the
//! server works on. So every attempt is remembered: when a reload shows one of them, that is our commit (not another
//! writer's progress) and it is done; and files are removed only when no attempt can land any more — refused, or
//! its required head gone. Otherwise they stay (orphans at worst); deleting files a commit is about to reference
//! would corrupt the target.
//!
//! Expiry, when due, rides on the commit (one more `remove-snapshots` update); what only the expired snapshots
//! referenced is deleted after it lands — beside the next commits in the service. After a commit, maintenance when
//! due: the orphan sweep and compaction — between commits for a one-shot sync and position-delete targets, in the
//! background for the service's equality-delete targets. A target at rest (the service found nothing to apply for
//! `compact_idle_after`) is compacted completely and its manifests merged ([`Upkeep::rest`]). Every commit to one table
//! from this process, the applier's and the background compaction's, goes through one gate, so the two never race:
//! the compaction commits between applier commits, and the applier's next commit builds on the table it left.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use iceberg::spec::{DataFile, SchemaRef, SnapshotRef, UnboundPartitionSpec};
use iceberg::table::Table;
use iceberg::{TableRequirement, TableUpdate};

use crate::catalog::Catalog;
use crate::config::{DeleteMode, TargetConfig};
use crate::error::{Error, Result};
use crate::sink::iceberg::apply::{CommitFiles, CommitWriter, WriterSpec};
use crate::sink::iceberg::evolve::{self, Evolution, EvolveOptions, FieldMap};
use crate::sink::iceberg::files::remove_unreferenced;
use crate::sink::iceberg::rowdelta::RowDelta;
use crate::sink::iceberg::{expire, progress, target};
use crate::sink::{Chunk, CommitStats, Committed, Initial, Lifetime, Profile, Sink, SourceInfo, Upkeep};

mod upkeep;
use upkeep::{sits_on, Schedule};

/// Times a commit is prepared again because the target moved under it (see `do_commit`) before its error stands.
const MAX_STALE_PREPARES: u32 = 5;

/// An Iceberg target table, with the catalog it lives in.
pub struct IcebergSink {
    catalog: Arc<Catalog>,
    cfg: TargetConfig,
    table: Option<Table>,
    map: FieldMap,
    /// Equality columns as source field ids (resolved in `prepare`).
    equality_ids: Vec<i32>,
    open: Option<Open>,
    retries: u32,
    created: bool,
    /// The engine's memory budget; a quarter of it buffers the files being written.
    memory_budget: u64,
    /// Source snapshots one commit may cover (`snapshots_per_commit`, or the lifetime's default).
    snapshots_per_commit: usize,
    /// When the target's upkeep runs, and what is running (see `upkeep`).
    schedule: Schedule,
    /// Taken by whoever commits to the target from this process — the applier's commits and the background
    /// compaction's, of this sink and any other writing the same table ([`gate_for`]) — so that they never race
    /// each other. Holds the table a compaction's commit left behind, which the applier's next commit builds on
    /// (instead of conflicting with it).
    gate: Arc<tokio::sync::Mutex<Option<Table>>>,
    /// The target holds the rows of a dropped source table of the same name (uuid, its last snapshot applied): the
    /// bootstrap of the new one replaces them all (`on_history_rewrite = "follow"`).
    recreate: Option<(String, i64)>,
}

/// The commit being written.
struct Open {
    writer: CommitWriter,
    evolution: Evolution,
    last_snapshot_id: i64,
    last_sequence_number: i64,
    base: Option<i64>,
    must_commit: bool,
    started: Instant,
    planned_schema_id: i32,
    planned_spec_id: i32,
    /// Summary entries saying which rewrite of the source's history the commit follows.
    rewrite: HashMap<String, String>,
    /// Every live file of the target goes with this commit (a recreated source's bootstrap).
    remove_all: bool,
}

impl IcebergSink {
    /// A sink writing to `cfg`'s table, connected to its catalog; its writers' buffers are bounded by a share of
    /// `memory_budget`.
    pub async fn open(cfg: TargetConfig, memory_budget: u64, lifetime: Lifetime) -> Result<Self> {
        let catalog = Catalog::shared(&cfg.catalog, "target").await?;
        let cfg_snapshots = cfg.snapshots_per_commit.unwrap_or(lifetime.snapshots_per_commit());
        Ok(IcebergSink {
            schedule: Schedule::new(lifetime, cfg.delete_mode),
            gate: gate_for(&cfg),
            catalog,
            cfg,
            table: None,
            map: FieldMap::default(),
            equality_ids: Vec::new(),
            open: None,
            retries: 0,
            created: false,
            memory_budget,
            snapshots_per_commit: cfg_snapshots,
            recreate: None,
        })
    }

    fn table(&self) -> Result<&Table> {
        self.table.as_ref().ok_or_else(|| Error::Internal("the Iceberg sink was used before prepare".into()))
    }

    /// Brings the target's partition specs where this commit needs them, before any file is written (a spec with no
    /// data yet is invisible to readers, so these metadata-only commits need not share the row delta's commit):
    /// - `follow_partition_spec`: the source's default spec (by target field ids) becomes the target's default;
    /// - once the target has more than one spec, equality deletes must reach rows of every spec, and a partitioned
    ///   equality delete only applies to files of its own spec: they are written global, in an unpartitioned spec,
    ///   which is added when missing.
    async fn align_specs(&mut self, source: &SourceInfo) -> Result<()> {
        for attempt in 0..self.cfg.commit_retries.max(1) {
            let table = self.table()?.clone();
            let meta = table.metadata();
            let schema = meta.current_schema();
            let mut updates = Vec::new();
            // catalogs assign their own spec ids, but Iceberg Java's REST server refuses a spec without one
            let next_spec_id = meta.partition_specs_iter().map(|s| s.spec_id()).max().unwrap_or(0) + 1;
            if self.cfg.follow_partition_spec {
                let src_spec = source.metadata.default_partition_spec();
                // columns the target does not have yet (added by this very commit) join the spec with the next one
                let wanted: Vec<(i32, iceberg::spec::Transform, String)> = src_spec
                    .fields()
                    .iter()
                    .filter_map(|f| {
                        self.map.target_of(f.source_id).filter(|id| schema.field_by_id(*id).is_some()).map(|id| (id, f.transform, f.name.clone()))
                    })
                    .collect();
                let have: Vec<(i32, iceberg::spec::Transform, String)> =
                    meta.default_partition_spec().fields().iter().map(|f| (f.source_id, f.transform, f.name.clone())).collect();
                if wanted != have {
                    // partition field ids are table-wide in v2: an equivalent field of an earlier spec keeps its id,
                    // a new one takes the next (Iceberg Java's REST server numbers fields sent without ids from 1000
                    // in every spec, which then conflict)
                    let mut next_field_id = meta.last_partition_id();
                    let mut b = UnboundPartitionSpec::builder();
                    for (id, transform, name) in &wanted {
                        let existing = meta
                            .partition_specs_iter()
                            .flat_map(|s| s.fields().iter())
                            .find(|f| f.source_id == *id && f.transform == *transform)
                            .map(|f| f.field_id);
                        let field_id = existing.unwrap_or_else(|| {
                            next_field_id += 1;
                            next_field_id
                        });
                        let field = iceberg::spec::UnboundPartitionField {
                            source_id: *id,
                            field_id: Some(field_id),
                            name: name.clone(),
                            transform: *transform,
                        };
                        b = b.add_partition_fields([field])?;
                    }
                    tracing::info!(table = %self.cfg.table, "the target's partition spec follows the source's");
                    updates.push(TableUpdate::AddSpec { spec: b.build().with_spec_id(next_spec_id) });
                    updates.push(TableUpdate::SetDefaultSpec { spec_id: -1 });
                }
            }
            let specs_after = meta.partition_specs_iter().len() + usize::from(!updates.is_empty());
            let has_unpartitioned = meta.partition_specs_iter().any(|s| s.is_unpartitioned());
            if specs_after > 1 && !has_unpartitioned {
                updates.push(TableUpdate::AddSpec { spec: UnboundPartitionSpec::builder().with_spec_id(next_spec_id + 1).build() });
                if updates.len() == 1 {
                    // keep the default spec (the added one is only for global equality deletes)
                } else {
                    // AddSpec(new default), SetDefaultSpec(-1), AddSpec(unpartitioned): the last added must not become default
                    let unpartitioned = updates.pop().expect("just pushed");
                    updates.insert(0, unpartitioned);
                }
            }
            if updates.is_empty() {
                return Ok(());
            }
            let requirements = vec![
                TableRequirement::UuidMatch { uuid: meta.uuid() },
                TableRequirement::DefaultSpecIdMatch { default_spec_id: meta.default_partition_spec_id() },
            ];
            match self.catalog.commit(&table, requirements, updates).await {
                Ok(t) => {
                    self.table = Some(t);
                    return Ok(());
                }
                Err(e) if e.is_retryable() && attempt + 1 < self.cfg.commit_retries => {
                    self.retries += 1;
                    tokio::time::sleep(self.cfg.retry_backoff).await;
                    self.table = Some(self.catalog.load_table(&self.cfg.table).await?);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The spec equality deletes are written in: global (unpartitioned) once the target has several specs.
    fn delete_spec(table: &Table) -> iceberg::spec::PartitionSpecRef {
        let meta = table.metadata();
        if meta.partition_specs_iter().len() > 1 {
            if let Some(s) = meta.partition_specs_iter().find(|s| s.is_unpartitioned()) {
                return s.clone();
            }
        }
        meta.default_partition_spec().clone()
    }

    async fn do_begin(&mut self, source: &SourceInfo, chunk: &Chunk) -> Result<()> {
        self.align_specs(source).await?;
        let table = self.table()?;
        let tmeta = table.metadata();
        let last = chunk.last();
        let pinned: HashSet<i32> = tmeta.default_partition_spec().fields().iter().map(|f| f.source_id).collect();
        let opts = EvolveOptions {
            keep_dropped_columns: self.cfg.keep_dropped_columns,
            defaults_allowed: tmeta.format_version() >= iceberg::spec::FormatVersion::V3,
        };
        let evolution = evolve::evolve(
            tmeta.current_schema(),
            tmeta.last_column_id(),
            &self.map,
            &chunk.schema,
            &source.key_ids,
            last.snapshot_id(),
            &pinned,
            opts,
        )?;
        if !evolution.changes.is_empty() {
            tracing::info!(source_snapshot = last.snapshot_id(), changes = %evolution.changes.join("; "), "target schema follows the source");
        }
        let equality_ids = self
            .equality_ids
            .iter()
            .map(|id| {
                evolution.map.target_of(*id).ok_or_else(|| Error::Schema(format!("equality column (source field id {id}) has no target column")))
            })
            .collect::<Result<Vec<_>>>()?;
        let spec = WriterSpec {
            schema: Arc::new(evolution.schema.clone()),
            map: &evolution.map,
            equality_ids,
            target_file_size: self.cfg.target_file_size,
            write_budget: self.profile().reserved_memory,
            bootstrap: chunk.bootstrap,
            multi_snapshot: chunk.steps() > 1,
            delete_spec: Self::delete_spec(table),
            delete_mode: self.cfg.delete_mode,
        };
        let writer = CommitWriter::new(table, spec)?;
        self.open = Some(Open {
            writer,
            planned_schema_id: tmeta.current_schema_id(),
            planned_spec_id: tmeta.default_partition_spec_id(),
            evolution,
            last_snapshot_id: last.snapshot_id(),
            last_sequence_number: last.sequence_number(),
            base: chunk.base,
            must_commit: chunk.must_commit,
            started: Instant::now(),
            rewrite: match (&chunk.rewrite, &self.recreate) {
                (Some(rw), _) => progress::rewrite_properties(rw),
                (None, Some((uuid, snapshot))) if chunk.bootstrap => progress::recreate_properties(uuid, *snapshot),
                _ => HashMap::new(),
            },
            remove_all: chunk.bootstrap && self.recreate.is_some(),
        });
        Ok(())
    }

    async fn do_commit(&mut self, source: &SourceInfo, stop: Option<&tokio::sync::watch::Receiver<bool>>) -> Result<Committed> {
        let open = self.open.take().ok_or_else(|| Error::Internal("commit without begin".into()))?;
        let CommitFiles { data, deletes: dels, replaced_deletes_of, stats } = open.writer.finish().await?;
        let mut target = self.table.clone().ok_or_else(|| Error::Internal("the Iceberg sink was used before prepare".into()))?;
        // a background compaction commits only while no applier commit is under way
        let gate = self.gate.clone();
        let mut gate = gate.lock().await;
        if let Some(compacted) = gate.take().filter(|c| sits_on(c, &target)) {
            // it landed on the head this commit was planned on: build on it rather than conflict with it
            target = compacted;
        }
        let evo = open.evolution;
        let map_recorded = FieldMap::read(target.metadata(), &source.uuid).ok().flatten().as_ref() == Some(&evo.map);
        if data.is_empty() && dels.is_empty() && !evo.changed && map_recorded && !open.must_commit {
            return Ok(Committed::Empty);
        }
        let files: Vec<String> = data.iter().chain(dels.iter().map(|(_, f)| f)).map(|f| f.file_path().to_string()).collect();
        let mut props = progress::properties(&source.uuid, &source.name, open.last_snapshot_id, open.last_sequence_number);
        props.extend(open.rewrite);
        let table_props = if map_recorded { HashMap::new() } else { HashMap::from([(FieldMap::property_key(&source.uuid), evo.map.to_property())]) };
        let mut attempts: Vec<Attempt> = Vec::new();
        let mut stale_prepares = 0u32;
        loop {
            let mut delta =
                row_delta(self.cfg.merge_manifests, &data, &dels, &props, &table_props, &evo).replace_deletes_of(replaced_deletes_of.iter().cloned());
            if open.remove_all {
                delta = delta.remove_all();
            }
            let mut prepared = match delta.prepare(&target).await {
                Ok(p) => p,
                Err(e) => {
                    // A file of the head the commit builds on may be gone because another writer moved the table
                    // meanwhile (`cdc maintain` expiring that head and deleting its files): then this is a lost race,
                    // not a broken table — prepare again on the new head, or plan again when our progress moved.
                    let moved = match self.catalog.load_table(&self.cfg.table).await {
                        Ok(t) if t.metadata().current_snapshot_id() != target.metadata().current_snapshot_id() => Some(t),
                        _ => None,
                    };
                    let Some(now) = moved.filter(|_| stale_prepares < MAX_STALE_PREPARES) else {
                        discard(target.file_io(), None, files, &attempts).await;
                        return Err(e);
                    };
                    stale_prepares += 1;
                    tracing::warn!(error = %e, "the target moved while this commit was prepared (another writer or maintenance); preparing it again on the new head");
                    target = now;
                    self.table = Some(target.clone());
                    let recorded = progress::read(target.metadata(), &source.uuid).map(|p| p.source_snapshot_id);
                    let reshaped = target.metadata().current_schema_id() != open.planned_schema_id
                        || target.metadata().default_partition_spec_id() != open.planned_spec_id;
                    if recorded != open.base || reshaped || self.cfg.delete_mode == DeleteMode::Position {
                        discard(target.file_io(), Some(&TargetState::of(target.metadata())), files, &attempts).await;
                        return Ok(Committed::Replan);
                    }
                    continue;
                }
            };
            let source_at = (open.last_snapshot_id, open.last_sequence_number);
            prepared.updates.push(progress::property_update(&source.uuid, source_at, prepared.snapshot_id, prepared.sequence_number));
            // an expiry when due rides along: no commit of its own
            let expiring = self.expiring(&target);
            if !expiring.is_empty() {
                prepared.updates.push(TableUpdate::RemoveSnapshots { snapshot_ids: expiring.iter().map(|s| s.snapshot_id()).collect() });
            }
            attempts.push(Attempt {
                snapshot_id: prepared.snapshot_id,
                parent: target.metadata().current_snapshot_id(),
                metadata_files: prepared.metadata_files,
                outcome_unknown: false,
                expiring,
            });
            if stop.is_some_and(|s| *s.borrow()) {
                // shutting down: abandon before the catalog call, so the commit either happened or never will
                discard(target.file_io(), Some(&TargetState::of(target.metadata())), files, &attempts).await;
                return Err(Error::Cancelled);
            }
            let e = match self.catalog.commit(&target, prepared.requirements, prepared.updates).await {
                Ok(t) => {
                    let id = prepared.snapshot_id;
                    let mut stats = CommitStats { seconds: open.started.elapsed().as_secs_f64(), recreated: open.remove_all, ..stats };
                    (stats.maintenance.manifests_merged, stats.maintenance.manifests_written) = (prepared.merged.0 as u64, prepared.merged.1 as u64);
                    return Ok(self.landed(t, id, attempts, evo.map, stats).await);
                }
                Err(e) => e,
            };
            let last = attempts.last_mut().expect("pushed above");
            last.outcome_unknown = matches!(e, Error::CommitUnknown { .. });
            let retry = e.is_retryable() && attempts.len() < self.cfg.commit_retries as usize;
            if !retry && !attempts.iter().any(|a| a.outcome_unknown) {
                // every attempt was refused: none landed or can, nothing to reload
                discard(target.file_io(), None, files, &attempts).await;
                return Err(e);
            }
            if retry {
                self.retries += 1;
                tracing::warn!(error = %e, attempt = attempts.len(), "target commit failed, retrying");
                tokio::time::sleep(crate::backoff::delay(self.cfg.retry_backoff, attempts.len() as u32)).await;
            }
            // what the target holds now decides: an attempt whose answer was lost may have landed since
            target = match self.catalog.load_table(&self.cfg.table).await {
                Ok(t) => t,
                Err(reload) if retry => return Err(reload),
                Err(_) => {
                    discard(target.file_io(), None, files, &attempts).await;
                    return Err(e);
                }
            };
            self.table = Some(target.clone());
            let now = TargetState::of(target.metadata());
            if let Some(id) = landed(&attempts, &now) {
                tracing::info!(snapshot_id = id, "a commit whose answer was lost had landed");
                return Ok(self.landed(target, id, attempts, evo.map, CommitStats { seconds: open.started.elapsed().as_secs_f64(), ..stats }).await);
            }
            if let Some(id) = landed_then_expired(&target, &attempts, &files).await? {
                tracing::info!(snapshot_id = id, "a commit whose answer was lost had landed (its snapshot was expired since)");
                // which attempt landed is not known here: every attempt's manifests stay
                return Ok(self
                    .landed(target, id, Vec::new(), evo.map, CommitStats { seconds: open.started.elapsed().as_secs_f64(), ..stats })
                    .await);
            }
            if !retry {
                discard(target.file_io(), Some(&now), files, &attempts).await;
                return Err(e);
            }
            let recorded = progress::read(target.metadata(), &source.uuid).map(|p| p.source_snapshot_id);
            let moved = target.metadata().current_schema_id() != open.planned_schema_id
                || target.metadata().default_partition_spec_id() != open.planned_spec_id;
            // positions were found in the planned head: on any other, rows may have moved (a compaction)
            let positions_stale = self.cfg.delete_mode == DeleteMode::Position && target.metadata().current_snapshot_id() != attempts[0].parent;
            if recorded != open.base || moved || positions_stale {
                let why = if recorded != open.base || moved {
                    "another writer moved the target's progress, schema or partition spec"
                } else {
                    "another writer committed to the target, and rows deleted by position may have moved"
                };
                tracing::warn!(planned_from = open.base, recorded = recorded, "{why}; discarding this commit's files and planning again");
                discard(target.file_io(), Some(&now), files, &attempts).await;
                return Ok(Committed::Replan);
            }
            // Only unrelated commits landed (no progress of ours moved): the same files apply on the new head.
        }
    }

    /// Attempt `id` landed on `table`: the others can no longer (the head moved past what they require), so their
    /// manifests go; the table and the field mapping become current. When the commit expired old snapshots too,
    /// what only they referenced is deleted (best effort: what is left behind is an orphan for the sweep).
    async fn landed(&mut self, table: Table, id: i64, attempts: Vec<Attempt>, map: FieldMap, mut stats: CommitStats) -> Committed {
        let (mine, others): (Vec<Attempt>, Vec<Attempt>) = attempts.into_iter().partition(|a| a.snapshot_id == id);
        remove_unreferenced(table.file_io(), others.into_iter().flat_map(|a| a.metadata_files).collect()).await;
        if let Some(expired) = mine.into_iter().next().map(|a| a.expiring).filter(|e| !e.is_empty()) {
            self.expired(expire::Expiry::committed(expired, &table), &mut stats.maintenance).await;
        }
        let table = match (self.cfg.compact, self.schedule.background) {
            (false, _) => table,
            (true, false) => self.compact_when_due(table, &mut stats.maintenance).await,
            (true, true) => {
                self.compact_in_background(&table, &mut stats.maintenance);
                table
            }
        };
        self.sweep_when_due(&table, &mut stats.maintenance).await;
        self.table = Some(table);
        self.map = map;
        Committed::Done { id, stats }
    }
}

/// The gate of `cfg`'s target table, shared by every sink of this process that writes it while any holds it: after
/// a configuration reload the new sink's commits wait for a background compaction the old one left running, and two
/// pipelines writing one table never race each other's commits.
fn gate_for(cfg: &TargetConfig) -> Arc<tokio::sync::Mutex<Option<Table>>> {
    use std::sync::{Mutex, OnceLock, Weak};
    type Gate = tokio::sync::Mutex<Option<Table>>;
    static GATES: OnceLock<Mutex<HashMap<String, Weak<Gate>>>> = OnceLock::new();
    let key = format!("{:?}\u{0}{}", cfg.catalog, cfg.table);
    let mut gates = GATES.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner());
    gates.retain(|_, g| g.strong_count() > 0);
    if let Some(g) = gates.get(&key).and_then(Weak::upgrade) {
        return g;
    }
    let g = Arc::new(Gate::default());
    gates.insert(key, Arc::downgrade(&g));
    g
}

/// One commit request sent to the catalog (or about to be), remembered until the commit ends.
struct Attempt {
    snapshot_id: i64,
    /// The head it requires (`RefSnapshotIdMatch` on main).
    parent: Option<i64>,
    metadata_files: Vec<String>,
    /// The catalog did not say whether it applied it (see [`Error::CommitUnknown`]).
    outcome_unknown: bool,
    /// Old snapshots it removes too (an expiry carried by the commit, see `expire::due_now`).
    expiring: Vec<SnapshotRef>,
}

/// What decides the fate of earlier attempts: the target's main head and the snapshots it holds.
#[derive(Debug, Default)]
struct TargetState {
    head: Option<i64>,
    snapshots: HashSet<i64>,
}

impl TargetState {
    fn of(meta: &iceberg::spec::TableMetadata) -> Self {
        TargetState { head: meta.current_snapshot_id(), snapshots: meta.snapshots().map(|s| s.snapshot_id()).collect() }
    }
}

/// The attempt the target holds, if one landed after all.
fn landed(attempts: &[Attempt], now: &TargetState) -> Option<i64> {
    attempts.iter().map(|a| a.snapshot_id).find(|id| now.snapshots.contains(id))
}

/// An attempt whose outcome was unknown can have landed and had its snapshot expired since (by this process's expiry
/// or the owner's maintenance), before this run reloaded the target: its snapshot is gone, yet the head references
/// its files, and deleting them would break the table. Reads the head's manifests (only on this rare path) and
/// answers with the attempt taken to have landed. A failed read is an error: the files then stay (orphans at worst).
async fn landed_then_expired(target: &Table, attempts: &[Attempt], files: &[String]) -> Result<Option<i64>> {
    let meta = target.metadata();
    // a landed attempt moved the head past the parent it required: while the head is that parent, none landed
    let gone = |a: &&Attempt| a.outcome_unknown && meta.snapshot_by_id(a.snapshot_id).is_none() && meta.current_snapshot_id() != a.parent;
    let Some(unknown) = attempts.iter().rev().find(gone) else { return Ok(None) };
    let Some(head) = meta.current_snapshot() else { return Ok(None) };
    if files.is_empty() {
        return Ok(None);
    }
    let live = expire::live_files_of(target, std::slice::from_ref(head)).await?;
    Ok(files.iter().any(|f| live.contains(f)).then_some(unknown.snapshot_id))
}

/// Whether an attempt may still land on a target in state `now` (`None`: unknown): only one whose outcome is
/// unknown — a request that may still be in flight — and only while the head is the one it requires.
fn may_still_land(a: &Attempt, now: Option<&TargetState>) -> bool {
    a.outcome_unknown && now.is_none_or(|t| t.head == a.parent && !t.snapshots.contains(&a.snapshot_id))
}

/// Removes what a commit that will not land wrote — its data and delete files and every attempt's manifests — unless
/// an attempt may still land: deleting files a table is about to reference would corrupt it, while files kept are
/// only orphans (`remove_orphan_files` finds them).
async fn discard(io: &iceberg::io::FileIO, now: Option<&TargetState>, files: Vec<String>, attempts: &[Attempt]) {
    let pending: Vec<i64> = attempts.iter().filter(|a| may_still_land(a, now)).map(|a| a.snapshot_id).collect();
    if !pending.is_empty() {
        tracing::warn!(
            snapshot_ids = ?pending,
            files = files.len(),
            "the catalog never said whether a commit applied, and it may still: its files are kept (orphans if it never lands)"
        );
        return;
    }
    remove_unreferenced(io, files.into_iter().chain(attempts.iter().flat_map(|a| a.metadata_files.iter().cloned())).collect()).await;
}

fn row_delta(
    merge: bool,
    data: &[DataFile],
    dels: &[(i32, DataFile)],
    props: &HashMap<String, String>,
    table_props: &HashMap<String, String>,
    evo: &Evolution,
) -> RowDelta {
    let mut delta = RowDelta::new()
        .add_data_files(data.iter().cloned())
        .set_snapshot_properties(props.clone())
        .set_table_properties(table_props.clone())
        .merge_manifests(merge);
    for (spec, f) in dels {
        delta = delta.add_delete_files_in_spec(*spec, [f.clone()]);
    }
    if evo.changed {
        delta.set_schema(evo.schema.clone())
    } else {
        delta
    }
}

#[async_trait::async_trait]
impl Sink for IcebergSink {
    fn label(&self) -> String {
        format!("iceberg:{}", self.cfg.table)
    }

    /// Reserves the writers' share, a quarter of the budget (row groups being built, dictionaries, open files); rows
    /// may come group by group (a commit's equality deletes and rows apply whole, each key's together).
    fn profile(&self) -> Profile {
        Profile {
            initial: Initial::Copy,
            snapshots_per_commit: self.snapshots_per_commit,
            reserved_memory: self.memory_budget / 4,
            needs_key_order: false,
        }
    }

    fn upkeep(&mut self) -> Option<&mut dyn Upkeep> {
        Some(self)
    }

    /// A removed row becomes an equality delete: its equality columns, written in the partition of the row (the
    /// source columns of every partition spec the target has had). Nothing else of it is read.
    fn removed_columns(&self) -> Option<Vec<i32>> {
        let (open, table) = (self.open.as_ref()?, self.table.as_ref()?);
        let to_source = open.evolution.map.inverse();
        let mut ids = self.equality_ids.clone();
        for spec in table.metadata().partition_specs_iter() {
            // a partition column the source does not have is null in every row: nothing to carry
            ids.extend(spec.fields().iter().filter_map(|f| to_source.get(&f.source_id).copied()));
        }
        ids.sort_unstable();
        ids.dedup();
        Some(ids)
    }

    /// The table's metadata location, where the catalog tells it without loading the metadata; unknown while a
    /// finished background compaction or deletion of expired files waits to be counted (the poll then reaches
    /// [`Upkeep::take_maintenance`]).
    async fn mark(&mut self) -> Result<Option<String>> {
        if self.schedule.compaction.as_ref().is_some_and(|t| t.is_finished()) || self.schedule.deletion.as_ref().is_some_and(|t| t.is_finished()) {
            return Ok(None);
        }
        self.catalog.cheap_metadata_location(&self.cfg.table).await
    }

    async fn recorded(&mut self, source: &SourceInfo) -> Result<Option<i64>> {
        // the table this sink holds (its own last commit, or the last load) is the head when the catalog's cheap
        // mark names its metadata file (metadata files never change): no load — a streaming poll's commit then
        // costs one target load less. Not on REST: a load there also renews vended storage credentials.
        if let Some(t) = self.table.as_ref().filter(|_| !self.catalog.is_server()) {
            let held = t.metadata_location().map(super::maintain::normalize);
            let current = self.catalog.cheap_metadata_location(&self.cfg.table).await.ok().flatten();
            if held.is_some() && current.as_deref().map(super::maintain::normalize) == held {
                tracing::trace!(target_table = %self.cfg.table, "the target's head is the table this sink holds; not loaded again");
                return Ok(progress::read(t.metadata(), &source.uuid).map(|p| p.source_snapshot_id));
            }
        }
        match self.catalog.load_table(&self.cfg.table).await {
            Ok(t) => {
                let p = progress::read(t.metadata(), &source.uuid).map(|p| p.source_snapshot_id);
                self.table = Some(t);
                Ok(p)
            }
            Err(Error::TableNotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn prepare(&mut self, source: &SourceInfo, schema: &SchemaRef, bootstrap: bool) -> Result<Option<i64>> {
        self.equality_ids = target::equality_ids(&source.names_schema, self.cfg.equality_columns.as_deref(), &source.key_ids)?;
        self.recreate = None;
        // the table `recorded` just loaded, if it exists: no second load
        let existing = self.table.take();
        let t = target::ensure(&self.catalog, &self.cfg.table, existing, &source.metadata, schema, &source.key_ids, self.cfg.format_version).await?;
        self.created |= t.created;
        let recorded = progress::read(t.table.metadata(), &source.uuid).map(|p| p.source_snapshot_id);
        if bootstrap && recorded.is_none() {
            let rows = t.table.metadata().current_snapshot().and_then(|s| s.summary().additional_properties.get("total-records").cloned());
            if rows.as_deref().is_some_and(|n| n != "0") {
                if let Some((uuid, snapshot)) = progress::dropped_source(t.table.metadata(), &source.uuid, &source.name) {
                    if source.on_history_rewrite == crate::config::OnHistoryRewrite::Stop {
                        return Err(Error::HistoryRewritten {
                            table: source.name.clone(),
                            target: self.label(),
                            kind: crate::sink::RewriteKind::Recreate.as_str(),
                            from: format!("{snapshot} of the dropped table {uuid}"),
                            to: source.metadata.current_snapshot_id().unwrap_or_default(),
                        });
                    }
                    tracing::warn!(
                        target_table = %self.cfg.table, source = %source.name, dropped_uuid = %uuid, new_uuid = %source.uuid,
                        "the source table was dropped and created again under its name: the target's rows are replaced by a copy of the new table in one commit"
                    );
                    self.recreate = Some((uuid, snapshot));
                    self.table = Some(t.table);
                    self.map = t.map;
                    return Ok(recorded);
                }
                return Err(Error::Range(format!(
                    "the target `{}` already holds rows but has no progress for `{}`: give --from-snapshot to apply only changes after a source snapshot, or empty the target",
                    self.cfg.table, source.name
                )));
            }
        }
        self.table = Some(t.table);
        self.map = t.map;
        Ok(recorded)
    }

    async fn begin(&mut self, source: &SourceInfo, chunk: &Chunk) -> Result<()> {
        self.do_begin(source, chunk).await
    }

    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        let open = self.open.as_mut().ok_or_else(|| Error::Internal("write without begin".into()))?;
        open.writer.write_changes(&batch).await
    }

    async fn commit(&mut self, source: &SourceInfo, stop: Option<&tokio::sync::watch::Receiver<bool>>) -> Result<Committed> {
        self.do_commit(source, stop).await
    }

    async fn abort(&mut self) {
        if let (Some(open), Some(table)) = (self.open.take(), self.table.as_ref()) {
            remove_unreferenced(table.file_io(), open.writer.abort().await).await;
        }
    }

    fn retries(&self) -> u32 {
        self.retries
    }

    fn created(&self) -> bool {
        self.created
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(snapshot_id: i64, parent: Option<i64>, outcome_unknown: bool) -> Attempt {
        Attempt { snapshot_id, parent, metadata_files: vec![format!("m-{snapshot_id}.avro")], outcome_unknown, expiring: Vec::new() }
    }
    fn state(head: Option<i64>, snapshots: &[i64]) -> TargetState {
        TargetState { head, snapshots: snapshots.iter().copied().collect() }
    }

    #[test]
    fn an_attempt_with_an_unknown_outcome_may_land_while_the_head_is_its_parent() {
        let unknown = attempt(7, Some(1), true);
        assert!(may_still_land(&unknown, Some(&state(Some(1), &[1]))), "in flight, head unchanged");
        assert!(may_still_land(&unknown, None), "the target's state is unknown");
        assert!(!may_still_land(&unknown, Some(&state(Some(2), &[1, 2]))), "the head moved: its requirement fails");
        assert!(!may_still_land(&unknown, Some(&state(Some(7), &[1, 7]))), "it landed");
        // a refused request (409, 503, a connect error) never lands, whatever the head
        assert!(!may_still_land(&attempt(8, Some(1), false), Some(&state(Some(1), &[1]))));
        assert!(!may_still_land(&attempt(8, None, false), None));
        // on an empty target the head is None, the parent an attempt requires too
        assert!(may_still_land(&attempt(9, None, true), Some(&state(None, &[]))));
    }

    #[test]
    fn sinks_of_one_target_share_its_gate_while_any_holds_it() {
        let cfg = |table: &str| -> TargetConfig {
            toml::from_str(&format!("table = \"{table}\"\n[catalog]\ntype = \"hadoop\"\nwarehouse = \"/w\"\n")).unwrap()
        };
        let (a, b) = (gate_for(&cfg("ns.gate_a")), gate_for(&cfg("ns.gate_a")));
        assert!(Arc::ptr_eq(&a, &b), "a reloaded sink waits for the old one's compaction");
        assert!(!Arc::ptr_eq(&a, &gate_for(&cfg("ns.gate_b"))), "other tables do not wait");
        let other_catalog: TargetConfig = toml::from_str("table = \"ns.gate_a\"\n[catalog]\ntype = \"hadoop\"\nwarehouse = \"/v\"\n").unwrap();
        assert!(!Arc::ptr_eq(&a, &gate_for(&other_catalog)));
        let weak = Arc::downgrade(&a);
        drop((a, b));
        assert!(weak.upgrade().is_none(), "no sink holds it: it goes");
    }

    #[test]
    fn a_landed_attempt_is_found_among_the_targets_snapshots() {
        let attempts = [attempt(7, Some(1), true), attempt(8, Some(1), true)];
        assert_eq!(landed(&attempts, &state(Some(1), &[1])), None);
        assert_eq!(landed(&attempts, &state(Some(7), &[1, 7])), Some(7));
        // the first landed, another writer committed on top: still ours
        assert_eq!(landed(&attempts, &state(Some(9), &[1, 7, 9])), Some(7));
    }
}

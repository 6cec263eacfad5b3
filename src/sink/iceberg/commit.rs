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
//! `compact_idle_after`) is compacted completely and its manifests merged ([`Sink::rest`]). Every commit to one table
//! from this process, the applier's and the background compaction's, goes through one gate, so the two never race:
//! the compaction commits between applier commits, and the applier's next commit builds on the table it left.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use futures::future::BoxFuture;
use futures::FutureExt;
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
use crate::sink::iceberg::{compact, expire, maintain, progress, target};
use crate::sink::{Chunk, CommitStats, Committed, Lifetime, MaintenanceStats, Rest, Sink, SourceInfo};

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
    /// The target's file totals when compaction was last planned.
    compact_mark: compact::Mark,
    /// Whether compaction runs in the background (see [`Lifetime::LongRunning`]).
    background: bool,
    /// Whether the files of expired snapshots are deleted in the background ([`Lifetime::LongRunning`], any mode).
    long_running: bool,
    /// The compaction running in the background, if one is.
    compaction: Option<tokio::task::JoinHandle<Background>>,
    /// The deletion of what an expiry left unreferenced, running in the background (with `long_running`), if one is.
    deletion: Option<tokio::task::JoinHandle<(Result<expire::Expired>, f64)>>,
    /// Taken by whoever commits to the target from this process — the applier's commits and the background
    /// compaction's, of this sink and any other writing the same table ([`gate_for`]) — so that they never race
    /// each other. Holds the table a compaction's commit left behind, which the applier's next commit builds on
    /// (instead of conflicting with it).
    gate: Arc<tokio::sync::Mutex<Option<Table>>>,
    /// When the target was last swept for orphan files (the first sweep comes one interval after opening).
    swept_at: Instant,
    /// The file totals of the target when a compaction at rest last found nothing to do ([`Sink::rest`]).
    rested_at: Option<compact::Mark>,
    /// What compactions at rest did between commits (compacting inline), until [`Sink::take_maintenance`].
    rest_stats: MaintenanceStats,
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
        Ok(IcebergSink {
            background: lifetime == Lifetime::LongRunning && cfg.delete_mode == DeleteMode::Equality,
            long_running: lifetime == Lifetime::LongRunning,
            compaction: None,
            deletion: None,
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
            compact_mark: compact::Mark::default(),
            swept_at: Instant::now(),
            rested_at: None,
            rest_stats: MaintenanceStats::default(),
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
            write_budget: self.reserved_memory(),
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
        let table = match (self.cfg.compact, self.background) {
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

impl IcebergSink {
    /// The target's rest is over: a compaction at rest found nothing more to do at `mark` (its file totals).
    fn rested(&mut self, mark: compact::Mark) {
        tracing::info!(table = %self.cfg.table, "the target is at rest: compacted completely, manifests merged");
        self.rested_at = Some(mark);
    }

    /// Compacts `table` when due (see `compact`); returns the table as it is afterwards, and counts what it did in
    /// `stats`. Best effort: a failure is logged and counted, and compaction is tried again when due again.
    async fn compact_when_due(&mut self, table: Table, stats: &mut MaintenanceStats) -> Table {
        let policy = compact::Policy::of(&self.cfg);
        if !compact::due(self.compact_mark, compact::Mark::of(&table), &policy) {
            return table;
        }
        let (table, _) = self.compact_now(table, &policy, stats).await;
        self.compact_mark = compact::Mark::of(&table);
        table
    }

    /// One compaction of `table` under `policy`, here and now; returns the table as it is afterwards and whether
    /// anything was compacted, and counts what it did in `stats`. Best effort, like [`Self::compact_when_due`].
    async fn compact_now(&mut self, table: Table, policy: &compact::Policy, stats: &mut MaintenanceStats) -> (Table, bool) {
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
    fn compact_in_background(&mut self, table: &Table, stats: &mut MaintenanceStats) {
        self.collect_compaction(stats);
        let policy = compact::Policy::of(&self.cfg);
        if self.compaction.is_some() || !compact::due(self.compact_mark, compact::Mark::of(table), &policy) {
            return;
        }
        self.compact_mark = compact::Mark::of(table);
        self.start_compaction(table, policy, false);
    }

    /// Starts a compaction of `table` under `policy` on its own task (see [`Self::compact_in_background`]);
    /// `at_rest`: one of [`Sink::rest`]'s passes.
    fn start_compaction(&mut self, table: &Table, policy: compact::Policy, at_rest: bool) {
        let planned = compact::Mark::of(table);
        let (catalog, cfg, table, gate, budget) = (self.catalog.clone(), self.cfg.clone(), table.clone(), self.gate.clone(), self.memory_budget / 4);
        self.compaction = Some(tokio::spawn(async move {
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
    fn expiring(&self, target: &Table) -> Vec<SnapshotRef> {
        if !self.cfg.expire_snapshots || self.deletion.as_ref().is_some_and(|t| !t.is_finished()) {
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
    async fn expired(&mut self, expiry: expire::Expiry, stats: &mut MaintenanceStats) {
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
        if self.long_running {
            self.deletion = Some(tokio::spawn(deletion));
        } else {
            count_deletion(deletion.await, stats);
        }
    }

    /// Counts the background deletion of an expiry's files in `stats` if it has finished.
    fn collect_deletion(&mut self, stats: &mut MaintenanceStats) {
        let Some(done) = self.deletion.take_if(|t| t.is_finished()).and_then(|t| t.now_or_never()) else { return };
        match done {
            Ok(deleted) => count_deletion(deleted, stats),
            Err(e) => {
                stats.failures += 1;
                tracing::warn!(table = %self.cfg.table, error = %e, "the background deletion of expired files ended abnormally");
            }
        }
    }

    /// Counts the background compaction in `stats` if it has finished.
    fn collect_compaction(&mut self, stats: &mut MaintenanceStats) {
        let Some(done) = self.compaction.take_if(|t| t.is_finished()).and_then(|t| t.now_or_never()) else { return };
        match done {
            Ok(Background { result: Ok(Some((mark, c))), seconds, .. }) => {
                stats.compactions += 1;
                stats.compact_seconds += seconds;
                stats.files_rewritten += (c.data_files_rewritten + c.delete_files_removed) as u64;
                stats.bytes_rewritten += c.bytes_rewritten;
                self.compact_mark = mark;
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
                self.rested_at = rested_at.or(self.rested_at);
            }
            Err(e) => {
                stats.compact_failures += 1;
                tracing::warn!(table = %self.cfg.table, error = %e, "the background compaction ended abnormally");
            }
        }
    }

    /// Deletes the target's orphan files older than `orphan_grace` once every `orphan_sweep_interval` (best effort:
    /// a failure is logged and counted, and the sweep is tried again at the next interval).
    async fn sweep_when_due(&mut self, table: &Table, stats: &mut MaintenanceStats) {
        let every = self.cfg.orphan_sweep_interval;
        if every.is_zero() || self.swept_at.elapsed() < every {
            return;
        }
        self.swept_at = Instant::now();
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
fn sits_on(compacted: &Table, head: &Table) -> bool {
    compacted.metadata().current_snapshot().and_then(|s| s.parent_snapshot_id()) == head.metadata().current_snapshot_id()
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

/// What a background compaction did, and how long it took.
struct Background {
    result: Result<Option<(compact::Mark, compact::Compacted)>>,
    seconds: f64,
    /// A pass at rest's ([`Sink::rest`]): the file totals of the table it planned on.
    rested_at: Option<compact::Mark>,
}

/// Background compactions that rewrite at once in this process (half the cores, at least one): each holds a quarter
/// of its pipeline's memory budget, and the applier's runs need the rest of the machine.
fn compactions_at_once() -> &'static tokio::sync::Semaphore {
    static SLOTS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    SLOTS.get_or_init(|| tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(1, |n| n.get() / 2).max(1)))
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

impl Sink for IcebergSink {
    fn label(&self) -> String {
        format!("iceberg:{}", self.cfg.table)
    }

    fn snapshots_per_commit(&self) -> Option<usize> {
        self.cfg.snapshots_per_commit
    }

    /// The writers' share: a quarter of the budget (row groups being built, dictionaries, open files).
    fn reserved_memory(&self) -> u64 {
        self.memory_budget / 4
    }

    /// A commit's equality deletes and rows apply whole: rows may come group by group (each key's together).
    fn needs_key_order(&self) -> bool {
        false
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
    /// [`Sink::take_maintenance`]).
    fn mark(&mut self) -> BoxFuture<'_, Result<Option<String>>> {
        async move {
            if self.compaction.as_ref().is_some_and(|t| t.is_finished()) || self.deletion.as_ref().is_some_and(|t| t.is_finished()) {
                return Ok(None);
            }
            self.catalog.cheap_metadata_location(&self.cfg.table).await
        }
        .boxed()
    }

    fn recorded<'a>(&'a mut self, source: &'a SourceInfo) -> BoxFuture<'a, Result<Option<i64>>> {
        async move {
            // the table this sink holds (its own last commit, or the last load) is the head when the catalog's cheap
            // mark names its metadata file (metadata files never change): no load — a streaming poll's commit then
            // costs one target load less. Not on REST: a load there also renews vended storage credentials.
            if let Some(t) = self.table.as_ref().filter(|_| !matches!(*self.catalog, Catalog::Rest(_))) {
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
        .boxed()
    }

    fn prepare<'a>(&'a mut self, source: &'a SourceInfo, schema: &'a SchemaRef, bootstrap: bool) -> BoxFuture<'a, Result<Option<i64>>> {
        async move {
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
        .boxed()
    }

    fn begin<'a>(&'a mut self, source: &'a SourceInfo, chunk: &'a Chunk) -> BoxFuture<'a, Result<()>> {
        self.do_begin(source, chunk).boxed()
    }

    fn write(&mut self, batch: RecordBatch) -> BoxFuture<'_, Result<()>> {
        async move {
            let open = self.open.as_mut().ok_or_else(|| Error::Internal("write without begin".into()))?;
            open.writer.write_changes(&batch).await
        }
        .boxed()
    }

    fn commit<'a>(&'a mut self, source: &'a SourceInfo, stop: Option<&'a tokio::sync::watch::Receiver<bool>>) -> BoxFuture<'a, Result<Committed>> {
        self.do_commit(source, stop).boxed()
    }

    fn abort(&mut self) -> BoxFuture<'_, ()> {
        async move {
            if let (Some(open), Some(table)) = (self.open.take(), self.table.as_ref()) {
                remove_unreferenced(table.file_io(), open.writer.abort().await).await;
            }
        }
        .boxed()
    }

    /// A background compaction that finished since the last commit or the last call, and the compactions at rest.
    fn take_maintenance(&mut self) -> MaintenanceStats {
        let mut stats = std::mem::take(&mut self.rest_stats);
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
    fn rest(&mut self) -> BoxFuture<'_, Result<Rest>> {
        async move {
            if self.compaction.is_some() {
                return Ok(Rest::Working); // running, or finished and waiting for `take_maintenance`
            }
            let Some(table) = self.table.clone().filter(|_| self.cfg.compact) else { return Ok(Rest::Done) };
            let mark = compact::Mark::of(&table);
            if self.rested_at == Some(mark) {
                return Ok(Rest::Done);
            }
            let policy = compact::Policy::at_rest(&self.cfg);
            if self.background {
                self.start_compaction(&table, policy, true);
                return Ok(Rest::Working);
            }
            let mut stats = std::mem::take(&mut self.rest_stats);
            let (mut table, compacted) = self.compact_now(table, &policy, &mut stats).await;
            self.rest_stats = stats;
            if !compacted {
                // nothing (more) to compact: the manifests are merged too, and the rest is over
                match maintain::rewrite_manifests(&self.catalog, &self.cfg, table.clone()).await {
                    Ok(t) => table = t,
                    Err(e) => tracing::warn!(table = %self.cfg.table, error = %e, "merging the manifests of a target at rest failed"),
                }
                self.rested(compact::Mark::of(&table));
            }
            self.compact_mark = compact::Mark::of(&table);
            self.table = Some(table);
            Ok(if compacted { Rest::Working } else { Rest::Done })
        }
        .boxed()
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

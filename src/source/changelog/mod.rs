//! The changelog scan: for each snapshot of a range, the rows it removed and added, netted into change rows.
//!
//! For every data file a snapshot touches (added, removed, or given new/removed delete files), the rows live before
//! and after the snapshot are compared position by position: live before and not after → removed; live after and not
//! before → added. "Live" applies the delete files of that state by the spec's rules (position deletes and DVs with
//! sequence ≥ the file's, equality deletes with sequence > the file's, in its partition or globally). This single rule
//! covers appends, copy-on-write rewrites, position deletes, deletion vectors (including a DV replacing an older one),
//! equality deletes and rows added and deleted in the same snapshot.
//!
//! A copy-on-write rewrite first cancels the rows it removed and re-added unchanged, per partition group
//! ([`super::carry`]); the survivors are netted into change rows ([`super::net`]): for the whole snapshot at once,
//! which puts it in key order, or — when every row of a key lives in one partition and the consumer applies the
//! snapshot whole (`ScanOptions::key_order` false) — per group, each group's rows handed on as it finishes.
//! Size: ~870 lines of code — the scan's control flow (per-snapshot planning, reading, carry-over groups, delivery) is
//! one type's methods; the parts that stand alone live in `state`, `groups` and `diff`.
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use arrow_array::{BooleanArray, RecordBatch};
use arrow_row::RowConverter;
use arrow_schema::SchemaRef;
use futures::{StreamExt, TryStreamExt};
use iceberg::io::FileIO;
use iceberg::spec::{DataContentType, Operation, PrimitiveType, Schema, SnapshotRef, Type};
use iceberg::table::Table;
use roaring::RoaringTreemap;

use crate::change::{self, ChangeConsumer, ChangeType, CommitInfo};
use crate::config::share_of;
use crate::error::{Error, Result};
use crate::source::carry::{least_bytes, CarryOver, CarryStats, Finished, MAX_MATCHER_ROWS};
use crate::source::files::{self, FileEntry};
use crate::source::fingerprint::Fingerprinter;
use crate::source::net::{NetStats, Netter, Side};
use crate::source::reader::{self, EqDeletes};
use crate::source::slim::Slim;
use crate::spec::lineage;

mod dead;
mod diff;
mod groups;
mod keys;
mod state;

use diff::*;
pub use groups::InParts;
use groups::*;
pub(crate) use state::FileDeletes;
use state::*;

/// Sizes the process-wide caches of data files' compared columns ([`keys`]) and of the rows their equality deletes
/// remove ([`dead`]) within `memory_budget` (`engine.memory_budget`); call once the configuration is loaded.
pub(crate) fn size_caches(memory_budget: u64) {
    keys::size(memory_budget);
    dead::size(memory_budget);
}

/// How a scan divides `engine.memory_budget` (numerator, denominator). The parts run at the same time — readers hold
/// fetched row groups while carry-over holds fingerprints and rows and the netter buffers change rows — so each set
/// sums to the whole budget: row groups fetched by the readers (the read gate) …
const READ_SHARE: (u64, u64) = (4, 16);
/// … + carry-over (all groups at once) + the netter beside it, for a snapshot that rewrites files …
const CARRY_SHARE: (u64, u64) = (9, 16);
const NET_SHARE_BESIDE_CARRY: (u64, u64) = (3, 16);
/// … or + the netter alone, for every other snapshot.
const NET_SHARE: (u64, u64) = (12, 16);

#[derive(Debug, Clone)]
pub struct ScanOptions {
    /// The scan's part of `engine.memory_budget` (a sink's or writer's buffers take the rest): what it divides.
    pub memory_budget: u64,
    /// `engine.memory_budget` as configured, of which `memory_budget` is a fixed part: the budget messages name.
    pub configured_budget: u64,
    pub spill_dir: PathBuf,
    pub concurrency: usize,
    /// The change rows of a snapshot in key order (`cdc changes`, and Kafka, which resumes inside a snapshot by
    /// counting rows). `false` lets a sink that applies each snapshot whole take the rows of a partition-aligned
    /// copy-on-write rewrite group by group, as each group finishes: netted per group, in key order within it.
    pub key_order: bool,
}

impl ScanOptions {
    /// The configured budget that gives the scan `scan_budget`: every part is a fixed fraction of it, so it scales
    /// like the scan's part; rounded up to the MiB, as configs name it.
    fn configured_for(&self, scan_budget: u64) -> u64 {
        const MIB: u128 = 1 << 20;
        let scaled = (scan_budget as u128 * self.configured_budget.max(1) as u128).div_ceil(self.memory_budget.max(1) as u128);
        u64::try_from(scaled.div_ceil(MIB) * MIB).unwrap_or(u64::MAX)
    }
}

#[derive(Debug, Default, Clone)]
pub struct SnapshotStats {
    pub snapshot_id: i64,
    pub operation: String,
    /// Manifests read to plan the snapshot.
    pub manifests_read: u64,
    pub files_read: u64,
    pub rows_read: u64,
    pub bytes_read: u64,
    pub counts: [u64; 4],
    pub net: NetStats,
    /// Copy-on-write carry-over cancellation (all groups of the snapshot).
    pub carry: CarryStats,
    /// Set when carry-over split groups into parts: a larger budget would have matched them in one pass.
    pub in_parts: Option<InParts>,
}

impl SnapshotStats {
    pub fn count(&self, t: ChangeType) -> u64 {
        self.counts[t as usize]
    }

    /// Bytes written to local spill files (netting runs and carry-over parts).
    pub fn spilled_bytes(&self) -> u64 {
        self.net.spilled_bytes + self.carry.spilled_bytes
    }
}

/// Key columns as field ids: the configured names, else the identifier fields; empty = no key (whole-row identity).
pub fn resolve_key(schema: &Schema, configured: Option<&[String]>) -> Result<Vec<i32>> {
    let ids: Vec<i32> = match configured {
        Some(names) => names
            .iter()
            .map(|n| {
                schema.field_by_name(n).map(|f| f.id).ok_or_else(|| {
                    let cols: Vec<_> = schema.as_struct().fields().iter().map(|f| f.name.clone()).collect();
                    Error::Key(format!("column `{n}` does not exist (columns: {})", cols.join(", ")))
                })
            })
            .collect::<Result<_>>()?,
        // Identifier fields are a set: order them as the schema does, so every run sorts keys alike.
        None => {
            let mut ids: Vec<i32> = schema.identifier_field_ids().collect();
            let order = schema_order(schema);
            ids.sort_by_key(|id| order.iter().position(|o| o == id).unwrap_or(usize::MAX));
            ids
        }
    };
    for id in &ids {
        let f = schema.field_by_id(*id).ok_or_else(|| Error::Key(format!("field id {id} not in schema")))?;
        match f.field_type.as_ref() {
            Type::Primitive(PrimitiveType::Float | PrimitiveType::Double) => {
                return Err(Error::Key(format!("column `{}` is {}; float and double columns cannot be keys", f.name, f.field_type)))
            }
            Type::Primitive(_) => {}
            other => return Err(Error::Key(format!("column `{}` is {other}; keys must be primitive columns", f.name))),
        }
    }
    Ok(ids)
}

/// Every field id of `schema`, depth first in column order.
fn schema_order(schema: &Schema) -> Vec<i32> {
    fn walk(fields: &[iceberg::spec::NestedFieldRef], out: &mut Vec<i32>) {
        for f in fields {
            out.push(f.id);
            if let Type::Struct(s) = f.field_type.as_ref() {
                walk(s.fields(), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(schema.as_struct().fields(), &mut out);
    out
}

pub fn arrow_schema(schema: &Schema) -> Result<SchemaRef> {
    Ok(reader::relax(&Arc::new(iceberg::arrow::schema_to_arrow_schema(schema)?)))
}

/// The Arrow schema change rows are written in: like [`arrow_schema`], with `uuid` columns (at any depth) marked
/// with Arrow's canonical uuid extension type, which Arrow alone cannot tell from `fixed(16)`.
pub fn output_arrow_schema(schema: &Schema) -> Result<SchemaRef> {
    use arrow_schema::{DataType, Field};
    let uuids: HashSet<i32> = schema
        .field_id_to_fields()
        .iter()
        .filter(|(_, f)| matches!(f.field_type.as_ref(), Type::Primitive(PrimitiveType::Uuid)))
        .map(|(id, _)| *id)
        .collect();
    let arrow = arrow_schema(schema)?;
    if uuids.is_empty() {
        return Ok(arrow);
    }
    fn mark(f: &Field, uuids: &HashSet<i32>) -> Field {
        let dt = match f.data_type() {
            DataType::Struct(fs) => DataType::Struct(fs.iter().map(|c| Arc::new(mark(c, uuids))).collect()),
            DataType::List(e) => DataType::List(Arc::new(mark(e, uuids))),
            DataType::Map(e, sorted) => DataType::Map(Arc::new(mark(e, uuids)), *sorted),
            other => other.clone(),
        };
        let mut f = f.clone().with_data_type(dt);
        if reader::field_id(&f).is_some_and(|id| uuids.contains(&id)) {
            let mut md = f.metadata().clone();
            md.insert("ARROW:extension:name".to_string(), "arrow.uuid".to_string());
            f = f.with_metadata(md);
        }
        f
    }
    let fields: Vec<Field> = arrow.fields().iter().map(|f| mark(f, &uuids)).collect();
    Ok(Arc::new(arrow_schema::Schema::new_with_metadata(fields, arrow.metadata().clone())))
}

/// Delete files by path (ahash: looked up once per data file and delete file that applies to it).
type ByPath<T> = HashMap<String, T, ahash::RandomState>;
/// A delete file as read, once read: filled by the first task that needs it while the others wait (two tasks must
/// not read the same file at once — an equality-delete file of a million keys is ~36 MB, twice). A failed read
/// leaves it empty, for the next task to try again.
type Cell<T> = Arc<tokio::sync::OnceCell<Arc<T>>>;
/// An equality-delete file's keys, encoded with the types of each schema id that read it.
type BySchema = Vec<(i32, EqCell)>;
/// An equality-delete file's keys as one schema id reads them ([`BySchema`]).
type EqCell = Cell<EqDeletes>;

/// Delete files already read (position deletes, deletion vectors, equality-delete keys), shared by every snapshot
/// that still references them. Bounded: each scanned snapshot drops what it no longer references. A service loop
/// keeps one across polls ([`ChangelogScan::with_cache`]). Entries are immutable once inserted, so a panic elsewhere
/// never leaves one half-written: a poisoned lock is taken over, not propagated.
#[derive(Default)]
pub struct DeleteCache {
    /// By path: the positions each data file loses.
    pos: Mutex<ByPath<Cell<HashMap<String, RoaringTreemap>>>>,
    /// By path and blob offset.
    dv: Mutex<HashMap<(String, i64), Cell<RoaringTreemap>, ahash::RandomState>>,
    /// By path: the keys as encoded with each schema id's types.
    eq: Mutex<ByPath<BySchema>>,
}

impl DeleteCache {
    /// Drops what the current snapshot no longer references (keeps memory proportional to live deletes).
    fn retain(&self, live: &HashSet<&str>) {
        self.pos.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|k, _| live.contains(k.as_str()));
        self.dv.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|k, _| live.contains(k.0.as_str()));
        self.eq.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|k, _| live.contains(k.as_str()));
    }
}

/// The deletes of one state (before or after) that apply to one data file; equality deletes grouped by the columns
/// they compare ([`EqGroup`]), so that a batch's keys are encoded once per group, not once per delete file.
#[derive(Default)]
struct StateDeletes {
    exists: bool,
    positions: RoaringTreemap,
    eq: Vec<EqGroup>,
    /// The positions the equality deletes of `eq` remove, when kept from an earlier pass over the file ([`dead`]):
    /// then no row is looked up in them.
    eq_removed: Option<Arc<RoaringTreemap>>,
}

/// Equality-delete files that compare the same columns (their positions in the reading schema), with the row
/// converter that encodes those columns, built once per file.
struct EqGroup {
    /// The field ids compared, as the delete files list them.
    field_ids: Vec<i32>,
    idx: Vec<usize>,
    conv: RowConverter,
    sets: Vec<Arc<EqDeletes>>,
}

pub struct ChangelogScan<'a> {
    table: &'a Table,
    key_ids: Vec<i32>,
    out_schema: SchemaRef,
    opts: ScanOptions,
    cache: Arc<DeleteCache>,
    /// Shared by every file this scan reads: the source row groups held at once stay within [`READ_SHARE`].
    gate: reader::ReadGate,
    /// Matcher tables handed from one carry-over group to the next (of one snapshot).
    matchers: Arc<std::sync::Mutex<Vec<crate::source::matcher::Matcher>>>,
    /// What the sink reads of removed rows besides the key (source field ids; `None`: everything), see
    /// [`ChangelogScan::set_removed_columns`].
    removed_columns: Option<Vec<i32>>,
}

impl<'a> ChangelogScan<'a> {
    /// `output`: the Iceberg schema change rows are written in (the end snapshot's).
    pub fn new(table: &'a Table, output: &Schema, key_ids: Vec<i32>, opts: ScanOptions) -> Result<Self> {
        let gate = reader::ReadGate::new(share_of(opts.memory_budget, READ_SHARE));
        Ok(ChangelogScan {
            table,
            key_ids,
            out_schema: change::change_schema(&output_arrow_schema(output)?),
            opts,
            cache: Default::default(),
            gate,
            matchers: Default::default(),
            removed_columns: None,
        })
    }

    /// The columns the sink reads of removed rows besides the key, as source field ids (`None`, the default: all
    /// of them; [`crate::sink::Sink::removed_columns`]). A copy-on-write rewrite then carries its removed rows with
    /// only these columns ([`super::slim`]), whether it is netted group by group or whole.
    pub fn set_removed_columns(&mut self, ids: Option<Vec<i32>>) {
        self.removed_columns = ids;
    }

    /// Changes the schema change rows are written in (a sync reads each commit's snapshots in the schema of its
    /// last one); the delete cache is kept.
    pub fn set_output(&mut self, output: &Schema) -> Result<()> {
        self.out_schema = change::change_schema(&output_arrow_schema(output)?);
        Ok(())
    }

    /// Uses `cache` (kept by the caller, e.g. across a service's polls) instead of a fresh one.
    pub fn with_cache(mut self, cache: Arc<DeleteCache>) -> Self {
        self.cache = cache;
        self
    }

    pub fn output_schema(&self) -> SchemaRef {
        self.out_schema.clone()
    }

    /// Emits the change rows of one snapshot, in key order.
    pub async fn scan_snapshot(&self, snapshot: &SnapshotRef, ordinal: i32, sink: &mut impl ChangeConsumer) -> Result<SnapshotStats> {
        let meta = self.table.metadata();
        let mut stats =
            SnapshotStats { snapshot_id: snapshot.snapshot_id(), operation: snapshot.summary().operation.as_str().to_string(), ..Default::default() };
        // Compaction and other rewrites change files, never rows.
        if snapshot.summary().operation == Operation::Replace {
            return Ok(stats);
        }
        let schema = lineage::snapshot_schema(meta, Some(snapshot));
        // files written without field ids (a table migrated from Hive) are read through the table's name mapping
        let data_schema = crate::spec::name_mapping::attach(arrow_schema(&schema)?, meta.properties());
        let data_schema = crate::spec::integrity::require(data_schema, crate::spec::integrity::required_ids(&schema));
        let schema_id = schema.schema_id();
        let key_idx = self
            .key_ids
            .iter()
            .map(|id| {
                data_schema
                    .fields()
                    .iter()
                    .position(|f| reader::field_id(f) == Some(*id))
                    .ok_or_else(|| Error::Key(format!("key field id {id} does not exist in the schema of snapshot {}", snapshot.snapshot_id())))
            })
            .collect::<Result<Vec<_>>>()?;

        let plan = files::plan_changes(self.table, snapshot, self.opts.concurrency).await?;
        let live: HashSet<&str> = plan.deletes_before.iter().chain(&plan.deletes_after).map(|d| d.path()).collect();
        self.cache.retain(&live);
        let touched = plan.touched();
        stats.manifests_read = plan.manifests_read as u64;

        let jobs: Vec<FileJob> = touched
            .into_iter()
            .map(|f| {
                let (before, after) = plan.deletes_applying(&f);
                let (in_before, in_after) = (plan.data_before.contains_key(f.path()), plan.data_after.contains_key(f.path()));
                FileJob { file: f, before: (in_before, before), after: (in_after, after) }
            })
            .collect();
        // Carry-over (identical rows removed and re-added) needs new data files and removed rows in one snapshot:
        // a copy-on-write rewrite. It is cancelled by fingerprint before netting, so the sort only sees real changes.
        let carry_over = plan.added_data > 0 && (plan.removed_data > 0 || !plan.changed_deletes.is_empty());
        // beside carry-over cancellation the netter gets a small share: it only sees the real changes
        let netting_budget = share_of(self.opts.memory_budget, if carry_over { NET_SHARE_BESIDE_CARRY } else { NET_SHARE });
        let commit = CommitInfo {
            snapshot_id: snapshot.snapshot_id(),
            sequence_number: snapshot.sequence_number(),
            timestamp_ms: snapshot.timestamp_ms(),
            ordinal,
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<RecordBatch>(2);
        // removed rows with only what the sink reads of them, when it says so (see `super::slim`)
        let slim = if carry_over { self.removed_columns.as_ref().and_then(|ids| Slim::new(&data_schema, &key_idx, ids)).map(Arc::new) } else { None };
        if carry_over && !self.opts.key_order && self.partition_aligned(&jobs) {
            // Every row of a key is in one partition: each group nets its own survivors and hands them on as it
            // finishes, so the sink writes while other groups still match, and no snapshot-wide sort is needed.
            tracing::debug!(snapshot = snapshot.snapshot_id(), "netting by partition group: every row of a key is in one partition");
            let net = GroupNet::Own { data_schema: data_schema.clone(), key_idx, budget: netting_budget, tx, slim };
            let pushing = self.push_without_carry_over(snapshot, &jobs, &data_schema, schema_id, net);
            let (pushed, counts) = futures::future::try_join(pushing, self.deliver(rx, commit, sink)).await?;
            (stats.files_read, stats.rows_read, stats.bytes_read) = pushed.totals;
            (stats.carry, stats.net, stats.counts, stats.in_parts) = (pushed.carry, pushed.net, counts, pushed.in_parts);
            return Ok(stats);
        }
        let mut netter = Netter::new(data_schema.clone(), key_idx, netting_budget, &self.opts.spill_dir)?;
        if carry_over {
            // identical pairs are carry-over's to cancel: the netter then compares rows by key only
            netter = netter.without_cancelling();
        }
        let totals = if carry_over {
            let shared = Arc::new(std::sync::Mutex::new(netter));
            let net = GroupNet::Shared(shared.clone(), slim);
            let pushed = self.push_without_carry_over(snapshot, &jobs, &data_schema, schema_id, net).await?;
            (stats.carry, stats.in_parts) = (pushed.carry, pushed.in_parts);
            netter = Arc::try_unwrap(shared)
                .map_err(|_| Error::Internal("a carry-over worker still holds the netter".into()))?
                .into_inner()
                .map_err(|_| Error::Internal("a carry-over worker panicked while netting".into()))?;
            pushed.totals
        } else {
            let read = ReadSpec { schema: &data_schema, schema_id, fingerprint: false, views: false };
            self.push_rows(snapshot, jobs, &read, self.opts.concurrency, async |rows| netter.push(rows.side, rows.batch)).await?
        };
        (stats.files_read, stats.rows_read, stats.bytes_read) = totals;

        // the merge of the sorted runs runs on a thread of its own, so that it overlaps with the sink's writing
        let merging = tokio::task::spawn_blocking(move || {
            // finishing may merge spilled runs in passes first: that is blocking work too
            let mut merge = netter.finish()?;
            while let Some(b) = merge.next_batch()? {
                if tx.blocking_send(b).is_err() {
                    break; // the sink failed: its error is reported below
                }
            }
            Ok::<_, Error>(merge.stats())
        });
        stats.counts = self.deliver(rx, commit, sink).await?;
        stats.net = merging.await.map_err(|e| Error::failed("merging change rows", e))??;
        Ok(stats)
    }

    /// Hands netted batches (data columns + `_change_type` code) to `sink` with the commit's metadata columns, in
    /// the schema of the output; counts the rows per change type.
    async fn deliver(
        &self,
        mut rx: tokio::sync::mpsc::Receiver<RecordBatch>,
        commit: CommitInfo,
        sink: &mut impl ChangeConsumer,
    ) -> Result<[u64; 4]> {
        let out_data_schema = data_part(&self.out_schema);
        let mut counts = [0u64; 4];
        while let Some(b) = rx.recv().await {
            let n = b.num_columns();
            let types = b.column(n - 1).clone();
            let data = RecordBatch::try_new(b.schema().project(&(0..n - 1).collect::<Vec<_>>()).map(Arc::new)?, b.columns()[..n - 1].to_vec())?;
            let projected = reader::project(&data, &out_data_schema)?;
            let batch = change::with_metadata(&self.out_schema, projected.columns().to_vec(), types, commit)?;
            if let Some(t) = change::change_types(&batch) {
                for v in t.iter().flatten() {
                    if let Some(ct) = ChangeType::from_code(v) {
                        counts[ct as usize] += 1;
                    }
                }
            }
            sink.write(batch).await?;
        }
        Ok(counts)
    }

    /// Whether every row of a key lives in one partition, so that a snapshot's rows of one key all meet in one
    /// carry-over group: every file has the same partitioned spec and each of its fields derives from a key column
    /// (any transform of the key is a function of it), or the table has no key (the whole row is the key).
    fn partition_aligned(&self, jobs: &[FileJob]) -> bool {
        let Some(first) = jobs.first() else {
            return false;
        };
        if first.file.unpartitioned || jobs.iter().any(|j| j.file.spec_id != first.file.spec_id) {
            return false;
        }
        if self.key_ids.is_empty() {
            return true;
        }
        let Some(spec) = self.table.metadata().partition_spec_by_id(first.file.spec_id) else {
            return false;
        };
        spec.fields().iter().all(|f| self.key_ids.contains(&f.source_id))
    }
}

/// What a read decodes: the schema (its id keys equality-delete converters) and whether rows come with their
/// fingerprints.
#[derive(Clone, Copy)]
struct ReadSpec<'s> {
    schema: &'s SchemaRef,
    schema_id: i32,
    fingerprint: bool,
    /// Top-level strings as views where the file has no deletes (see `diff_file`).
    views: bool,
}

/// One data file to read, with the deletes of the state before and after.
#[derive(Clone)]
struct FileJob {
    file: Arc<FileEntry>,
    before: (bool, Vec<Arc<FileEntry>>),
    after: (bool, Vec<Arc<FileEntry>>),
}

impl FileJob {
    /// Rows can appear only in a new file, or when a delete that applied before is gone.
    fn can_add(&self) -> bool {
        self.after.0 && (!self.before.0 || !is_subset(&self.before.1, &self.after.1))
    }
    /// Rows can disappear only from a removed file, or through a delete that is new.
    fn can_remove(&self) -> bool {
        self.before.0 && (!self.after.0 || !is_subset(&self.after.1, &self.before.1))
    }
}

/// Every delete file of `a` is also in `b` (same file, same blob). This runs per data file and poll, and an upsert
/// stream's files each have a delete per later commit, so it avoids hashing: a delete file in both states of a
/// snapshot is one entry of its plan, listed in the same order in both, so `a`'s entries are found walking `b` once
/// by pointer. The few that are not (a delete added or dropped, the usual reason to ask) are looked for in all of
/// `b`, by pointer or path; more than a few (another order) are looked up in sets.
fn is_subset(a: &[Arc<FileEntry>], b: &[Arc<FileEntry>]) -> bool {
    const FEW: usize = 8;
    fn id(f: &Arc<FileEntry>) -> (&str, Option<i64>) {
        (f.path(), f.file.content_offset())
    }
    let (mut at, mut missed) = (0, Vec::new());
    for x in a {
        match b[at..].iter().position(|y| Arc::ptr_eq(x, y)) {
            Some(i) => at += i + 1,
            None if missed.len() < FEW => missed.push(x),
            None => {
                let entries: HashSet<*const FileEntry> = b.iter().map(Arc::as_ptr).collect();
                let ids: HashSet<_> = b.iter().map(id).collect();
                return a.iter().all(|f| entries.contains(&Arc::as_ptr(f)) || ids.contains(&id(f)));
            }
        }
    }
    missed.iter().all(|x| b.iter().any(|y| id(x) == id(y)))
}

/// Rows one file lost or gained, with their whole-row fingerprints when the read asked for them.
struct FileRows {
    side: Side,
    batch: RecordBatch,
    fps: Option<Vec<u128>>,
}

type RowsRx = tokio::sync::mpsc::Receiver<Result<FileRows>>;
type ReadTotals = tokio::task::JoinHandle<Result<(u64, u64, u64)>>;

impl ChangelogScan<'_> {
    /// Reads the files concurrently (each its own task, so decoding — and fingerprinting when `fingerprint` — runs
    /// on all cores, at most `concurrency` at once); rows they lose/gain arrive on the channel, the first error too.
    /// The handle yields (files, rows, bytes).
    fn read_files(&self, jobs: Vec<FileJob>, read: &ReadSpec<'_>, concurrency: usize) -> (RowsRx, ReadTotals) {
        let (schema, schema_id, fingerprint, views) = (read.schema.clone(), read.schema_id, read.fingerprint, read.views);
        let concurrency = concurrency.max(1);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<FileRows>>(concurrency * 2);
        let shared = Arc::new(FileReads {
            file_io: self.table.file_io().clone(),
            cache: self.cache.clone(),
            gate: self.gate.clone(),
            read_as: dead::read_as(&schema),
        });
        let tasks: Vec<_> = jobs
            .into_iter()
            .map(|job| {
                let (shared, tx, schema) = (shared.clone(), tx.clone(), schema.clone());
                async move {
                    let f = job.file.clone();
                    match diff_file(&shared, job, schema, schema_id, fingerprint, views, &tx).await {
                        Ok(read) => Ok((read.rows, read.bytes)),
                        Err(e) => {
                            // the receiver reports the first error; the driver only needs to stop
                            let _ = tx.send(Err(e)).await;
                            Err(Error::Internal(format!("reading {} failed", f.path())))
                        }
                    }
                }
            })
            .collect();
        let driver = tokio::spawn(async move {
            let mut set = tokio::task::JoinSet::new();
            let mut pending = tasks.into_iter();
            let (mut n, mut rows, mut bytes) = (0u64, 0u64, 0u64);
            loop {
                while set.len() < concurrency {
                    match pending.next() {
                        Some(t) => {
                            set.spawn(t);
                        }
                        None => break,
                    }
                }
                match set.join_next().await {
                    None => break,
                    Some(r) => {
                        let (r, b) = r.map_err(|e| Error::failed("reader task", e))??;
                        n += 1;
                        rows += r;
                        bytes += b;
                    }
                }
            }
            Ok((n, rows, bytes))
        });
        (rx, driver)
    }

    /// Reads `jobs` (at most `concurrency` files at once) and hands every [`FileRows`] to `push`. Returns (files,
    /// rows, bytes) read.
    async fn push_rows(
        &self,
        snapshot: &SnapshotRef,
        jobs: Vec<FileJob>,
        read: &ReadSpec<'_>,
        concurrency: usize,
        mut push: impl AsyncFnMut(FileRows) -> Result<()>,
    ) -> Result<(u64, u64, u64)> {
        let (mut rx, driver) = self.read_files(jobs, read, concurrency);
        let mut failed = None;
        while let Some(item) = rx.recv().await {
            let pushed = match item {
                Ok(rows) => push(rows).await,
                Err(e) => Err(e),
            };
            if let Err(e) = pushed {
                failed = Some(e);
                break;
            }
        }
        drop(rx);
        let driven = driver.await.map_err(|e| Error::failed("scan driver task", e))?;
        if let Some(e) = failed {
            return Err(self.explain(snapshot, e));
        }
        driven
    }

    /// Pushes the snapshot's removed and added rows minus the pairs of identical rows between them ([`carry`]).
    ///
    /// Identical rows have identical partition values, so when every file involved has the same partitioned spec
    /// the pairs can only form inside one partition: each partition is a group with its own small fingerprint
    /// table, and up to `concurrency` groups run at once, sharing 9/16 of the budget (the netting has 3/16). Each
    /// group matches in a task of its own (see `cancel_group`) and hands its survivors to `net`: the snapshot's
    /// netter, or, when the partition follows the key, a netter of the group's own that sends its netted rows on.
    /// Otherwise (unpartitioned tables, files of several specs) all files form one group. No identical pair is
    /// missed by the grouping (a partition value is a function of the row, under one spec), so the netter after it
    /// needs no cancelling — and must not cancel when removed rows hold placeholders (`GroupNet::slim`).
    async fn push_without_carry_over(
        &self,
        snapshot: &SnapshotRef,
        jobs: &[FileJob],
        schema: &SchemaRef,
        schema_id: i32,
        net: GroupNet,
    ) -> Result<CarryPushed> {
        let groups = carry_over_groups(jobs);
        // groups are CPU work (decode, fingerprint): as many at once as there are cores, within the read concurrency
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let k = self.opts.concurrency.min(cores).clamp(1, groups.len().max(1));
        let first = net.first_side();
        let rows: Vec<u64> = groups.iter().map(|g| side_upper(g, first)).collect();
        let GroupPlan { share, solo, one_pass } = GroupPlan::new(&rows, self.opts.memory_budget, k);
        tracing::debug!(groups = groups.len(), concurrent = k, solo, "carry-over groups");
        let in_parts = (!one_pass).then(|| InParts {
            largest_group_rows: rows.iter().copied().max().unwrap_or(0),
            one_pass_budget: self.opts.configured_for(GroupPlan::least_one_pass_budget(&rows, k)),
        });
        // a group no plan fits stops the scan before anything is read, saying what would do
        for g in &groups {
            self.check_group_fits(snapshot, g, share, first)?;
        }
        let turns = solo.then(|| Arc::new(tokio::sync::Semaphore::new(1)));
        let reads = (self.opts.concurrency / k).max(1);
        let read = ReadSpec { schema, schema_id, fingerprint: true, views: false };
        // a netter per group shares the netting budget like the groups share theirs
        let net = match net {
            GroupNet::Own { data_schema, key_idx, budget, tx, slim } => {
                GroupNet::Own { data_schema, key_idx, budget: (budget / k as u64).max(1), tx, slim }
            }
            shared => shared,
        };
        let done: Vec<GroupDone> = futures::stream::iter(
            groups.into_iter().map(|g| self.cancel_group(snapshot, g, &read, GroupBudget { share, reads, turn: turns.clone() }, &net)),
        )
        .buffer_unordered(k)
        .try_collect()
        .await?;
        // The tables handed between groups are freed with the last group: kept, they held ~50 MB at 10 M rows
        // through the merge and the sink's writing, where the scan's peak memory is.
        if let Ok(mut pool) = self.matchers.lock() {
            pool.clear();
        }
        let mut pushed = CarryPushed { in_parts, ..Default::default() };
        for g in done {
            let (t, p) = (g.totals, pushed.totals);
            pushed.totals = (p.0 + t.0, p.1 + t.1, p.2 + t.2);
            pushed.carry.absorb(g.carry);
            pushed.net.absorb(g.net);
        }
        Ok(pushed)
    }

    /// Whether carry-over can match group `jobs` with `share` bytes: rows a side within what it numbers, and a plan
    /// that fits ([`CarryOver::parts_for`]). Else the error says which budget would do, or that the partition is too
    /// large for one rewrite.
    fn check_group_fits(&self, snapshot: &SnapshotRef, jobs: &[FileJob], share: u64, first: Side) -> Result<()> {
        let rows = GroupRowsBound { first: side_upper(jobs, first), second: side_upper(jobs, first.other()) };
        group_fits(rows, share, &self.opts).map_err(|fix| Error::TooLarge {
            what: format!(
                "snapshot {} of `{}` rewrites {} rows of one partition (copy-on-write; an unpartitioned table is one partition)",
                snapshot.snapshot_id(),
                self.table.identifier(),
                rows.first.max(rows.second)
            ),
            fix,
        })
    }

    /// Carry-over cancellation of one group of files, each read once: the files that gain rows, then those that
    /// lose rows; survivors go to the netter. When the group nets on its own and the sink reads only some columns
    /// of removed rows (`GroupNet::slim`), the other way round: the removed rows first, held with those columns
    /// only, then the added rows, decided as they stream through — at 10 M rows nothing is spilled, at 100 M the
    /// side spilled whole is a key column instead of whole rows.
    ///
    /// Matching is CPU work of its own (a third of a sync at 10 M rows, most of it cache misses): it runs in a task
    /// per group, fed through a small channel, so that two groups match on two workers beside their files' decoding.
    /// Polled inside the scan's own task, all matching shared one core, and the decoders waited on it (perf: the
    /// polling thread 69 % busy, each worker 38 %). Groups hand their matcher tables on (`matchers`).
    async fn cancel_group(
        &self,
        snapshot: &SnapshotRef,
        jobs: Vec<FileJob>,
        read: &ReadSpec<'_>,
        budget: GroupBudget,
        net: &GroupNet,
    ) -> Result<GroupDone> {
        let GroupBudget { share, reads: concurrency, turn } = budget;
        let mut permit = match turn {
            Some(t) => Some(t.acquire_owned().await.map_err(|_| Error::Internal("carry-over turns were closed".into()))?),
            None => None,
        };
        // carry-over takes one side whole before the other streams through: the added rows, or, when removed rows
        // are slim (see `super::slim`), the removed ones — then the sides of what it emits are swapped back
        let first = net.first_side();
        let slim = net.slim();
        let is_slim = slim.is_some();
        let first_upper = side_upper(&jobs, first);
        let (mut firsts, mut seconds) = (Vec::new(), Vec::new());
        for j in jobs {
            if j.can_add() {
                (if first == Side::Added { &mut firsts } else { &mut seconds }).push(j.clone());
            }
            if j.can_remove() {
                (if first == Side::Removed { &mut firsts } else { &mut seconds }).push(j);
            }
        }
        // a group held in memory drops most rows it reads: its strings are read as views and only the survivors
        // converted back; a group in parts spills every row, converted first, so views would only add a copy
        let read = &ReadSpec { views: CarryOver::parts_for(first_upper, share) == Some(1), ..*read };
        let (schema, spill_dir) = (read.schema.clone(), self.opts.spill_dir.clone());
        let (tx, mut rx) = tokio::sync::mpsc::channel::<GroupRows>(2);
        let (net, pool) = (net.clone(), self.matchers.clone());
        // Ok(None): the feed stopped early (a read failed; its error is the one reported)
        let worker = tokio::spawn(async move {
            // built here, on the worker: its entries are written where the rows are matched
            let recycled = pool.lock().ok().and_then(|mut p| p.pop());
            let mut carry = CarryOver::new(schema, first_upper, share, &spill_dir, recycled)?;
            if let Some(s) = &slim {
                carry = carry.with_first_schema(s.schema().clone());
            }
            let mut survivors = Survivors::new(net, &spill_dir)?;
            let mut emit = |side: Side, b: RecordBatch| match &slim {
                None => survivors.push(side, b),
                // carry-over's first side holds the slim removed rows
                Some(s) => s.restore(side, b).and_then(|(side, b)| survivors.push(side, b)),
            };
            while let Some(msg) = rx.recv().await {
                let rows = match msg {
                    GroupRows::Rows(rows) => rows,
                    GroupRows::Done => {
                        if carry.release_resident()? {
                            // what is left of this group fits in little memory: the next group may start
                            drop(permit.take());
                        }
                        let Finished { stats, matcher } = carry.finish(&mut emit)?;
                        drop(permit);
                        if let Ok(mut p) = pool.lock() {
                            p.push(matcher);
                        }
                        // None: the sink failed, and its error is the one reported
                        return Ok(survivors.finish().await?.map(|netted| (stats, netted)));
                    }
                };
                let fps = rows.fps.unwrap_or_default();
                if rows.side != first {
                    carry.remove(rows.batch, fps, &mut emit)?;
                    continue;
                }
                match &slim {
                    // fingerprinted whole, held without the columns the sink does not read
                    Some(s) => carry.add(s.slim(&rows.batch)?, fps)?,
                    None => carry.add(rows.batch, fps)?,
                }
            }
            Ok::<_, Error>(None)
        });
        let send = async |msg: GroupRows| tx.send(msg).await.map_err(|_| Error::Internal("the carry-over worker stopped".into()));
        // every row of the first side before the first of the other: the carry-over protocol
        let feed = async |want: Side, rows: FileRows| if rows.side == want { send(GroupRows::Rows(rows)).await } else { Ok(()) };
        let second = first.other();
        let fed = async {
            let a = self.push_rows(snapshot, firsts, read, concurrency, async |rows| feed(first, rows).await).await?;
            let r = self.push_rows(snapshot, seconds, read, concurrency, async |rows| feed(second, rows).await).await?;
            send(GroupRows::Done).await?;
            Ok::<_, Error>((a, r))
        }
        .await;
        drop(tx);
        let worked = worker.await.map_err(|e| Error::failed("carry-over worker", e))?;
        let (a, r, stats, net) = match (fed, worked) {
            // the worker's own failure, which also explains a feed that could not send
            (_, Err(e)) | (Err(e), Ok(_)) => return Err(e),
            (Ok(_), Ok(None)) => return Err(Error::Internal("the carry-over worker stopped before the end".into())),
            (Ok((a, r)), Ok(Some((stats, net)))) => (a, r, stats, net),
        };
        tracing::debug!(
            first_upper,
            slim = is_slim,
            share,
            parts = stats.parts,
            resident = stats.resident_parts,
            spilled = stats.spilled_bytes,
            cancelled = stats.cancelled,
            "carry-over group done"
        );
        Ok(GroupDone { totals: (a.0 + r.0, a.1 + r.1, a.2 + r.2), carry: stats, net })
    }

    /// Every live row of `snapshot`, as INSERT change rows (a bootstrap copy). Not netted, not ordered by key.
    pub async fn scan_contents(&self, snapshot: &SnapshotRef, sink: &mut impl ChangeConsumer) -> Result<SnapshotStats> {
        let plan = files::plan(self.table, snapshot, self.opts.concurrency).await?;
        files::remember_live(self.table, snapshot, &plan);
        let commit = CommitInfo {
            snapshot_id: snapshot.snapshot_id(),
            sequence_number: snapshot.sequence_number(),
            timestamp_ms: snapshot.timestamp_ms(),
            ordinal: 0,
        };
        let mut inserts = Inserts { sink, schema: self.out_schema.clone(), commit };
        let stats = self.scan_live(snapshot, &plan, None, false, &mut inserts).await?;
        Ok(SnapshotStats { manifests_read: plan.manifests_read as u64, ..stats })
    }

    /// The live rows of the data files named in `only` (all of them when `None`) of `snapshot`, whose files `plan`
    /// lists, as table rows: the output schema's data columns, then — with `lineage` (a v3 table) — each row's
    /// `_row_id` and `_last_updated_sequence_number`, stored or inherited (`spec::row_lineage`). What a compaction
    /// rewrites. Not netted, not ordered by key; counted as inserts.
    pub(crate) async fn scan_live(
        &self,
        snapshot: &SnapshotRef,
        plan: &files::SnapshotFiles,
        only: Option<&std::collections::HashSet<String>>,
        lineage: bool,
        sink: &mut impl ChangeConsumer,
    ) -> Result<SnapshotStats> {
        let meta = self.table.metadata();
        let schema = lineage::snapshot_schema(meta, Some(snapshot));
        let read_schema = if lineage { Arc::new(crate::spec::row_lineage::with_lineage_columns(&schema)?) } else { schema.clone() };
        // files written without field ids (a table migrated from Hive) are read through the table's name mapping
        let data_schema = crate::spec::name_mapping::attach(arrow_schema(&read_schema)?, meta.properties());
        let data_schema = crate::spec::integrity::require(data_schema, crate::spec::integrity::required_ids(&read_schema));
        let mut live: Vec<_> = plan.data_after.values().filter(|f| only.is_none_or(|o| o.contains(f.path()))).cloned().collect();
        live.sort_by(|a, b| a.path().cmp(b.path()));
        let jobs = live
            .into_iter()
            .map(|f| {
                let after: Vec<_> = plan.deletes_after.iter().filter(|d| files::delete_applies(d, &f)).cloned().collect();
                FileJob { file: f, before: (false, Vec::new()), after: (true, after) }
            })
            .collect();
        let read = ReadSpec { schema: &data_schema, schema_id: schema.schema_id(), fingerprint: false, views: false };
        let (mut rx, driver) = self.read_files(jobs, &read, self.opts.concurrency);
        let mut out_fields: Vec<_> = data_part(&self.out_schema).fields().iter().cloned().collect();
        if let Some((id, seq)) = crate::spec::row_lineage::lineage_columns(&data_schema) {
            out_fields.extend([data_schema.field(id).clone(), data_schema.field(seq).clone()].map(Arc::new));
        }
        let out_rows_schema = Arc::new(arrow_schema::Schema::new(out_fields));
        let mut stats = SnapshotStats { snapshot_id: snapshot.snapshot_id(), operation: "bootstrap".into(), ..Default::default() };
        let mut failed = None;
        while let Some(item) = rx.recv().await {
            let batch = match item {
                Ok(rows) => rows.batch,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            stats.counts[ChangeType::Insert as usize] += batch.num_rows() as u64;
            if let Err(e) = sink.write(reader::project(&batch, &out_rows_schema)?).await {
                failed = Some(e);
                break;
            }
        }
        drop(rx);
        let driven = driver.await.map_err(|e| Error::failed("scan driver task", e))?;
        if let Some(e) = failed {
            return Err(e);
        }
        let (f, r, b) = driven?;
        (stats.files_read, stats.rows_read, stats.bytes_read) = (f, r, b);
        Ok(stats)
    }

    /// A missing file under a snapshot whose parent was expired is an expiry problem, not corruption.
    fn explain(&self, snapshot: &SnapshotRef, e: Error) -> Error {
        match (e, snapshot.parent_snapshot_id()) {
            (Error::MissingFile { path }, Some(parent)) if self.table.metadata().snapshot_by_id(parent).is_none() => {
                Error::ExpiredParent { table: self.table.identifier().to_string(), snapshot: snapshot.snapshot_id(), parent, path }
            }
            (e, _) => e,
        }
    }
}

/// Table rows handed on as INSERT change rows of one commit (a bootstrap copy).
struct Inserts<'c, C> {
    sink: &'c mut C,
    /// The change schema.
    schema: SchemaRef,
    commit: CommitInfo,
}

impl<C: ChangeConsumer> ChangeConsumer for Inserts<'_, C> {
    async fn write(&mut self, rows: RecordBatch) -> Result<()> {
        let types = change::change_type_column(ChangeType::Insert, rows.num_rows());
        self.sink.write(change::with_metadata(&self.schema, rows.columns().to_vec(), types, self.commit)?).await
    }
}

/// The table columns of a change schema (everything before `_change_type`).
fn data_part(change_schema: &SchemaRef) -> SchemaRef {
    let n = change_schema.index_of(change::CHANGE_TYPE).unwrap_or(change_schema.fields().len());
    Arc::new(change_schema.project(&(0..n).collect::<Vec<_>>()).expect("indices in range"))
}

/// The groups of files whose rows can cancel each other: one per partition when every file has the same
/// partitioned spec, else one. Groups come in a stable order (by their first path).
fn carry_over_groups(jobs: &[FileJob]) -> Vec<Vec<FileJob>> {
    let one_spec = jobs.windows(2).all(|w| w[0].file.spec_id == w[1].file.spec_id);
    if !one_spec || jobs.first().is_none_or(|j| j.file.unpartitioned) {
        return vec![jobs.to_vec()];
    }
    let mut groups: HashMap<&iceberg::spec::Struct, Vec<FileJob>> = HashMap::new();
    for j in jobs {
        groups.entry(j.file.partition()).or_default().push(j.clone());
    }
    let mut out: Vec<Vec<FileJob>> = groups.into_values().collect();
    out.sort_by(|a, b| a[0].file.path().cmp(b[0].file.path()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group too large for its share is refused with the budget that does, and that budget's share has a plan; a
    /// side beyond 32-bit row numbers is refused with the advice to partition; ordinary groups pass.
    #[test]
    fn a_group_that_does_not_fit_says_what_would() {
        let rows = |first, second| GroupRowsBound { first, second };
        let budget = 256u64 << 20;
        let share = share_of(budget, CARRY_SHARE);
        assert_eq!(group_fits(rows(100_000, 100_000), share, &opts(budget, budget)), Ok(()));
        assert_eq!(group_fits(rows(1_000_000_000, 1_000_000_000), share, &opts(budget, budget)), Ok(()));
        let too_many = group_fits(rows(1_000_000_000, 5_000_000_000), share, &opts(budget, budget)).unwrap_err();
        assert!(too_many.contains("partition the table"), "{too_many}");
        // at the 1 MiB minimum, 20 M rows in one group: no plan; the budget named has one
        let (budget, n) = (1u64 << 20, 20_000_000);
        let share = share_of(budget, CARRY_SHARE);
        let named = |fix: &str| -> u64 {
            fix.split("memory_budget = \"").nth(1).and_then(|r| r.split("MiB").next()).and_then(|m| m.parse().ok()).expect(fix)
        };
        let fix = group_fits(rows(n, n), share, &opts(budget, budget)).unwrap_err();
        let mib = named(&fix);
        assert!(mib > 1 && fix.contains("it is 1 MiB"), "{fix}");
        let enough = mib << 20;
        assert_eq!(group_fits(rows(n, n), share_of(enough, CARRY_SHARE), &opts(enough, enough)), Ok(()));
        let less = enough - (1 << 20);
        assert!(group_fits(rows(n, n), share_of(less, CARRY_SHARE), &opts(less, less)).is_err(), "{mib} MiB is not the least");
        // the scan has three quarters of the configured budget (a sink's writers the rest): the budget named is the
        // configured one, whose three quarters have a plan
        let fix = group_fits(rows(n, n), share_of(budget / 4 * 3, CARRY_SHARE), &opts(budget / 4 * 3, budget)).unwrap_err();
        let scan = (named(&fix) << 20) / 4 * 3;
        assert_eq!(group_fits(rows(n, n), share_of(scan, CARRY_SHARE), &opts(scan, named(&fix) << 20)), Ok(()));
        assert!(named(&fix) > mib, "{fix}");
    }

    /// Delete files are the same by entry (pointer) or by path and blob offset; a DV's other blob is another file.
    #[test]
    fn delete_sets_compare_by_entry_then_by_path_and_blob() {
        let delete = |path: &str, offset: Option<i64>| {
            let mut b = iceberg::spec::DataFileBuilder::default();
            b.content(DataContentType::PositionDeletes)
                .file_path(path.to_string())
                .file_format(iceberg::spec::DataFileFormat::Puffin)
                .record_count(1)
                .file_size_in_bytes(10)
                .content_offset(offset)
                .content_size_in_bytes(offset.map(|_| 5));
            Arc::new(FileEntry { file: b.build().unwrap(), seq: 2, spec_id: 0, unpartitioned: true, first_row_id: None })
        };
        let (a, b, dv) = (delete("a", None), delete("b", None), delete("dv", Some(4)));
        let (a_again, dv_other_blob) = (delete("a", None), delete("dv", Some(40)));
        assert!(is_subset(std::slice::from_ref(&a), &[b.clone(), a.clone()]));
        assert!(is_subset(&[], std::slice::from_ref(&a)));
        assert!(is_subset(&[a_again, dv.clone()], &[a.clone(), b.clone(), delete("dv", Some(4))]), "another entry of the same file");
        assert!(!is_subset(&[a.clone(), b.clone()], std::slice::from_ref(&a)));
        assert!(!is_subset(&[dv_other_blob], std::slice::from_ref(&dv)), "another blob of the same Puffin file");
        // in another order, and more than a few: looked up in sets
        let many: Vec<_> = (0..20).map(|i| delete(&format!("m{i}"), None)).collect();
        let reversed: Vec<_> = many.iter().rev().cloned().collect();
        assert!(is_subset(&reversed, &many) && is_subset(&many[..3], &reversed));
        let mut one_more = reversed.clone();
        one_more.push(delete("m20", None));
        assert!(!is_subset(&one_more, &many));
    }

    fn opts(memory_budget: u64, configured_budget: u64) -> ScanOptions {
        ScanOptions { memory_budget, configured_budget, spill_dir: std::env::temp_dir(), concurrency: 2, key_order: true }
    }

    #[test]
    fn the_budget_named_scales_with_the_scans_part_and_rounds_up() {
        const MIB: u64 = 1 << 20;
        // the scan had three quarters of 256 MiB and needed 300 MiB: 400 MiB
        assert_eq!(opts(192 * MIB, 256 * MIB).configured_for(300 * MIB), 400 * MIB);
        // a byte more rounds up to the next MiB
        assert_eq!(opts(192 * MIB, 256 * MIB).configured_for(300 * MIB + 1), 401 * MIB);
        assert_eq!(opts(1, u64::MAX).configured_for(u64::MAX), u64::MAX);
    }

    /// Groups that fit share the carry-over part evenly; groups that would be split take turns with a larger share;
    /// the least one-pass budget is exactly where every group starts to match in one part.
    #[test]
    fn groups_take_turns_and_name_the_least_budget_for_one_pass() {
        let budget = 192u64 << 20; // the scan's part of 256 MiB beside the Iceberg sink's writers
        let carry = share_of(budget, CARRY_SHARE);
        // 10 M rows in 16 partitions: 625 k a group, two at once, each in memory
        let small = GroupPlan::new(&[625_000; 16], budget, 2);
        assert_eq!(small, GroupPlan { share: carry / 2, solo: false, one_pass: true });
        // 100 M rows: 6.25 M a group, too many for half the share and for three quarters of it
        let large = GroupPlan::new(&[6_250_000; 16], budget, 2);
        assert_eq!(large, GroupPlan { share: carry - carry / 4, solo: true, one_pass: false });
        let least = GroupPlan::least_one_pass_budget(&[6_250_000; 16], 2);
        assert!(GroupPlan::new(&[6_250_000; 16], least, 2).one_pass);
        assert!(!GroupPlan::new(&[6_250_000; 16], least - 1, 2).one_pass);
        // the largest group decides; the others change nothing
        assert_eq!(GroupPlan::least_one_pass_budget(&[6_250_000, 10, 625_000], 2), least);
        // about 18 bytes a row of matcher in three quarters of 9/16 of the budget
        assert!((150 << 20..300 << 20).contains(&least), "{least}");
    }
}

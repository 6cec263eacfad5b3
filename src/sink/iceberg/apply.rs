//! Turns change rows into the files of one merge-on-read target commit.
//!
//! - `INSERT`/`UPDATE_AFTER` rows become data rows.
//! - Every key the commit touches gets one equality delete on the equality columns, written in the partition of the
//!   row it removes (the old row of `DELETE`/`UPDATE_BEFORE`; for `INSERT` the new row's, in case the key was already
//!   there): the target stays one row per key.
//! - With `delete_mode = "position"` no equality delete is written: the keys the commit touches are collected, looked
//!   up in the target's head when the commit's files are finished ([`super::locate`]), and their live rows deleted by
//!   position like the rows below. On v3 a data file's new deletion vector is merged with its current one, which the
//!   commit replaces (one vector per data file, as the spec requires).
//! - A row this commit wrote and a later source snapshot of the same commit changes again is deleted by position
//!   (position-delete file on v2, deletion vector on v3): an equality delete only reaches strictly older data.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::{Array, RecordBatch, UInt32Array};
use arrow_row::{RowConverter, SortField};
use arrow_schema::SchemaRef;
use iceberg::spec::{DataFile, FormatVersion, PartitionKey, Struct};
use iceberg::table::Table;
use roaring::RoaringTreemap;

use crate::change::{self, ChangeType};
use crate::config::DeleteMode;
use crate::error::{Error, Result};
use crate::sink::iceberg::deletes::{self, Partition};
use crate::sink::iceberg::evolve::FieldMap;
use crate::sink::iceberg::files::{remove_unreferenced, Content, PartitionedWriter, WriteLimits};
use crate::sink::iceberg::locate::Lookup;

pub use crate::sink::CommitStats;

/// A row this commit wrote: (data file, position, source snapshot it came from).
type Written = (Arc<str>, u64, i64);

pub struct CommitWriter {
    table: Table,
    schema: iceberg::spec::SchemaRef,
    arrow: SchemaRef,
    /// target field id → source field id: change rows are projected onto the target by id, never by name
    to_source: HashMap<i32, i32>,
    data: PartitionedWriter,
    eq: Option<EqTask>,
    key_idx: Vec<usize>,
    keys: RowConverter,
    /// Keys this commit already deletes by equality (commits of several snapshots only).
    deleted: crate::spec::rowenc::KeySet,
    /// The last key deleted by equality (single-snapshot commits: repeats are adjacent).
    last_deleted: Option<Box<[u8]>>,
    /// Rows this commit wrote: key → (file, position, source snapshot).
    written: HashMap<Box<[u8]>, Vec<Written>, ahash::RandomState>,
    /// `delete_mode = "position"`: the keys whose rows in the target this commit deletes.
    lookup: Option<Wanted>,
    /// Positions to delete: data file → (positions, its partition).
    positions: BTreeMap<Arc<str>, (RoaringTreemap, Partition)>,
    /// v3: target data files (not written by this commit) with positions to delete → the positions their deletes
    /// already delete (the new deletion vector holds both, and replaces theirs).
    deleted_before: HashMap<Arc<str>, RoaringTreemap>,
    file_partitions: HashMap<Arc<str>, Option<Struct>>,
    track_positions: bool,
    pub stats: CommitStats,
}

/// Keys to look up in the target (`delete_mode = "position"`).
#[derive(Default)]
struct Wanted {
    keys: crate::spec::rowenc::KeySet,
    /// Some key column held a null.
    nulls: bool,
}

/// What a [`CommitWriter`] writes with.
pub struct WriterSpec<'a> {
    /// The target schema of the commit (the current one, or the one the commit adds).
    pub schema: iceberg::spec::SchemaRef,
    /// Source field id → target field id.
    pub map: &'a FieldMap,
    /// Equality columns as target field ids.
    pub equality_ids: Vec<i32>,
    pub target_file_size: u64,
    /// Bytes the commit's open data and delete files may buffer together.
    pub write_budget: u64,
    /// The target is empty and rows come from a full copy: no equality deletes are needed.
    pub bootstrap: bool,
    /// The commit covers several source snapshots, so a key may change twice in it.
    pub multi_snapshot: bool,
    /// The partition spec equality deletes are written in: the default one, or the unpartitioned spec (global
    /// deletes) once the table holds data of more than one spec.
    pub delete_spec: iceberg::spec::PartitionSpecRef,
    /// How target rows are deleted.
    pub delete_mode: DeleteMode,
}

/// The files of one commit: data files, and delete files with the partition spec each was written in.
pub struct CommitFiles {
    pub data: Vec<DataFile>,
    pub deletes: Vec<(i32, DataFile)>,
    /// Target data files whose deletion vectors (and position-delete files of theirs alone) the new deletion vectors
    /// replace: the commit removes those.
    pub replaced_deletes_of: Vec<String>,
    pub stats: CommitStats,
}

impl CommitWriter {
    pub fn new(table: &Table, spec: WriterSpec<'_>) -> Result<Self> {
        let schema = spec.schema.clone();
        let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema)?);
        let mut key_idx = Vec::new();
        for id in &spec.equality_ids {
            let i = arrow
                .fields()
                .iter()
                .position(|f| crate::spec::projection::field_id(f) == Some(*id))
                .ok_or_else(|| Error::Schema(format!("equality field id {id} is not a top-level target column")))?;
            key_idx.push(i);
        }
        let keys = RowConverter::new(key_idx.iter().map(|&i| SortField::new(arrow.field(i).data_type().clone())).collect())?;
        let size = spec.target_file_size as usize;
        // data files get most of the write budget: delete files hold only the key columns
        // a bootstrap copies the source file by file (clustered by partition); change rows come in key order
        let rg = WriteLimits::within(spec.write_budget * 3 / 4, arrow.fields().len(), spec.bootstrap);
        let rg_deletes = WriteLimits::within(spec.write_budget / 4, key_idx.len(), false);
        Ok(CommitWriter {
            table: table.clone(),
            data: PartitionedWriter::new(table, &schema, table.metadata().default_partition_spec(), Content::Data, size, rg, &spec.equality_ids)?,
            eq: if spec.bootstrap || spec.delete_mode == DeleteMode::Position {
                None
            } else {
                Some(EqTask::spawn(PartitionedWriter::new(
                    table,
                    &schema,
                    &spec.delete_spec,
                    Content::EqualityDeletes(spec.equality_ids.clone()),
                    size,
                    rg_deletes,
                    &spec.equality_ids,
                )?))
            },
            schema,
            arrow,
            to_source: spec.map.inverse(),
            key_idx,
            keys,
            deleted: Default::default(),
            last_deleted: None,
            written: Default::default(),
            lookup: (!spec.bootstrap && spec.delete_mode == DeleteMode::Position).then(Wanted::default),
            positions: BTreeMap::new(),
            deleted_before: HashMap::new(),
            file_partitions: HashMap::new(),
            track_positions: spec.multi_snapshot,
            stats: CommitStats::default(),
        })
    }

    /// Change rows in the source's change schema; columns are matched to the target by field id.
    pub async fn write_changes(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let types = change::change_types(batch).ok_or_else(|| Error::Internal("change batch without _change_type".into()))?.clone();
        let snapshot_ids = batch
            .column_by_name(change::COMMIT_SNAPSHOT_ID)
            .and_then(|c| c.as_any().downcast_ref::<arrow_array::Int64Array>().cloned())
            .ok_or_else(|| Error::Internal("change batch without _commit_snapshot_id".into()))?;
        let rows = to_target(batch, &self.arrow, &self.to_source)?;
        let key_cols: Vec<_> = self.key_idx.iter().map(|&i| rows.column(i).clone()).collect();
        let keys = self.keys.convert_columns(&key_cols)?;
        if let Some(w) = self.lookup.as_mut() {
            w.nulls |= key_cols.iter().any(|c| c.null_count() > 0);
        }
        let default_spec = self.table.metadata().default_partition_spec_id();

        let mut eq_rows = Vec::new();
        let mut data_rows = Vec::new();
        for i in 0..rows.num_rows() {
            let t = ChangeType::from_code(types.value(i)).ok_or_else(|| Error::Internal(format!("unknown change type code {}", types.value(i))))?;
            match t {
                ChangeType::Insert => self.stats.inserts += 1,
                ChangeType::Delete => self.stats.deletes += 1,
                ChangeType::UpdateAfter => self.stats.updates += 1,
                ChangeType::UpdateBefore => {}
            }
            let row = keys.row(i);
            let key: &[u8] = row.as_ref();
            let snap = snapshot_ids.value(i);
            if self.track_positions {
                // rows written by an earlier snapshot of this commit are now stale
                if let Some(w) = self.written.get_mut(key) {
                    let (stale, keep): (Vec<_>, Vec<_>) = w.drain(..).partition(|(_, _, s)| *s != snap);
                    *w = keep;
                    for (path, pos, _) in stale {
                        let value = self.file_partitions.get(&path).cloned().flatten().unwrap_or_else(Struct::empty);
                        let part = Partition { spec_id: default_spec, value };
                        self.positions.entry(path).or_insert_with(|| (RoaringTreemap::new(), part)).0.insert(pos);
                        self.stats.position_deletes += 1;
                    }
                }
            }
            if t != ChangeType::UpdateAfter {
                if let Some(w) = self.lookup.as_mut() {
                    if !w.keys.contains(key) {
                        w.keys.insert(key.into());
                    }
                } else if self.eq.is_some() && self.first_delete_of(key) {
                    eq_rows.push(i as u32);
                }
            }
            if matches!(t, ChangeType::Insert | ChangeType::UpdateAfter) {
                data_rows.push(i as u32);
            }
        }
        if let Some(eq) = self.eq.as_mut() {
            if !eq_rows.is_empty() {
                let b = arrow_select::take::take_record_batch(&rows, &UInt32Array::from(eq_rows))?;
                self.stats.equality_delete_rows += b.num_rows() as u64;
                eq.write(b).await?;
            }
        }
        if !data_rows.is_empty() {
            let idx = UInt32Array::from(data_rows);
            let b = arrow_select::take::take_record_batch(&rows, &idx)?;
            self.stats.data_rows += b.num_rows() as u64;
            let placements = self.data.write(&b).await?;
            if self.track_positions {
                // placements come per partition slice; keys are recomputed from the slice itself
                for p in placements {
                    let cols: Vec<_> = self.key_idx.iter().map(|&i| p.batch.column(i).clone()).collect();
                    let ks = self.keys.convert_columns(&cols)?;
                    self.file_partitions.entry(p.path.clone()).or_insert(p.partition);
                    // all rows of a change batch come from one snapshot
                    let snap = snapshot_ids.value(0);
                    for r in 0..p.rows {
                        self.written.entry(ks.row(r).as_ref().into()).or_default().push((p.path.clone(), p.first_pos + r as u64, snap));
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether `key` gets its equality delete now (false when it already has one in this commit). One source
    /// snapshot's change rows come in key order, so within a single-snapshot commit a repeat can only follow its
    /// previous row: comparing with the last key keeps memory flat however many keys the commit touches. Only a
    /// commit of several snapshots remembers every key.
    fn first_delete_of(&mut self, key: &[u8]) -> bool {
        if !self.track_positions {
            if self.last_deleted.as_deref() == Some(key) {
                return false;
            }
            self.last_deleted = Some(key.into());
            return true;
        }
        self.deleted.insert(key.into())
    }

    /// Gives up the commit: the paths of every file written so far, for the caller to remove.
    pub async fn abort(mut self) -> Vec<String> {
        if let Some(eq) = &mut self.eq {
            let _ = eq.join().await;
        }
        self.opened()
    }

    /// Every data and equality-delete file this commit created, finished or not (the equality-delete task joined).
    fn opened(&self) -> Vec<String> {
        let mut paths = self.data.opened().to_vec();
        if let Some(eq) = self.eq.as_ref().and_then(|e| e.writer.as_ref()) {
            paths.extend_from_slice(eq.opened());
        }
        paths
    }

    /// Closes all files: data files and delete files (equality, then position deletes or deletion vectors). On a
    /// failure the files written so far are removed.
    pub async fn finish(mut self) -> Result<CommitFiles> {
        let joined = match &mut self.eq {
            Some(eq) => eq.join().await,
            None => Ok(()),
        };
        let io = self.table.file_io().clone();
        let opened = self.opened();
        let done = match joined {
            Ok(()) => self.finish_files().await,
            Err(e) => Err(e),
        };
        if done.is_err() {
            remove_unreferenced(&io, opened).await;
        }
        done
    }

    async fn finish_files(mut self) -> Result<CommitFiles> {
        self.locate().await?;
        self.positions.retain(|_, (bm, _)| !bm.is_empty());
        let positional = if self.positions.is_empty() { Vec::new() } else { self.position_delete_files().await? };
        let replaced_deletes_of = self.deleted_before.keys().map(|p| p.to_string()).collect();
        let io = self.table.file_io().clone();
        let CommitWriter { data, eq, mut stats, .. } = self;
        stats.files_closed_early = data.evicted();
        let closed = async {
            let data = data.finish().await?;
            let deletes: Vec<(i32, DataFile)> = match eq.and_then(|e| e.writer) {
                Some(eq) => {
                    stats.files_closed_early += eq.evicted();
                    let spec = eq.spec_id();
                    eq.finish().await?.into_iter().map(|f| (spec, f)).collect()
                }
                None => Vec::new(),
            };
            Ok::<_, Error>((data, deletes))
        }
        .await;
        let (data, mut deletes) = match closed {
            Ok(v) => v,
            Err(e) => {
                // the position deletes are written already; the data and equality-delete files were opened
                // (`finish` removes those)
                remove_unreferenced(&io, positional.iter().map(|(_, f)| f.file_path().to_string()).collect()).await;
                return Err(e);
            }
        };
        deletes.extend(positional);
        if stats.files_closed_early > 0 {
            tracing::info!(
                files_closed_early = stats.files_closed_early,
                "the commit touched more partitions at once than engine.memory_budget keeps files open for; files were \
                 closed early (more, smaller files). A larger engine.memory_budget writes fewer, larger files"
            );
        }
        stats.files = data.len() + deletes.len();
        stats.bytes = data.iter().chain(deletes.iter().map(|(_, f)| f)).map(|f| f.file_size_in_bytes()).sum();
        Ok(CommitFiles { data, deletes, replaced_deletes_of, stats })
    }

    /// `delete_mode = "position"`: finds the live rows of the keys this commit touches in the target's head, and
    /// adds their positions to those to delete.
    async fn locate(&mut self) -> Result<()> {
        let Some(wanted) = self.lookup.take().filter(|w| !w.keys.is_empty()) else { return Ok(()) };
        let key_fields = self.key_idx.iter().map(|&i| Arc::new(self.arrow.field(i).clone())).collect();
        let lookup = Lookup { table: &self.table, key_fields, nulls: wanted.nulls };
        let located = lookup.locate(&wanted.keys).await?;
        (self.stats.lookup_files_read, self.stats.lookup_rows_read) = (located.files_read, located.rows_read);
        let vectors = self.table.metadata().format_version() >= FormatVersion::V3;
        for f in located.files {
            let path: Arc<str> = f.data.path().into();
            self.stats.position_deletes += f.positions.len();
            let part = Partition { spec_id: f.data.spec_id, value: f.data.partition().clone() };
            self.positions.entry(path.clone()).or_insert_with(|| (RoaringTreemap::new(), part)).0 |= f.positions;
            if vectors {
                self.deleted_before.insert(path, f.deleted);
            }
        }
        Ok(())
    }

    /// The position-delete files (v2: one per partition) or the deletion vectors (v3: one per data file, all in one
    /// Puffin file, each merged with what the file's current deletes delete), with the spec of each.
    async fn position_delete_files(&mut self) -> Result<Vec<(i32, DataFile)>> {
        let meta = self.table.metadata();
        let locations = super::location::Locations::new(meta);
        let name = |kind: &str, ext: &str| format!("cdc-{}-{kind}.{ext}", uuid::Uuid::new_v4());
        let location = |part: Option<&Partition>, file: &str| -> Result<String> {
            let key = match part {
                Some(p) if !p.value.fields().is_empty() => {
                    let spec = meta
                        .partition_spec_by_id(p.spec_id)
                        .ok_or_else(|| Error::Internal(format!("partition spec {} of a target data file is not in the table", p.spec_id)))?;
                    Some(PartitionKey::new(spec.as_ref().clone(), self.schema.clone(), p.value.clone()))
                }
                _ => None,
            };
            Ok(locations.file(key.as_ref(), file))
        };
        let io = self.table.file_io().clone();
        let mut out = Vec::new();
        if meta.format_version() >= FormatVersion::V3 {
            let vectors: Vec<(String, Partition, RoaringTreemap)> = self
                .positions
                .iter()
                .map(|(path, (bm, part))| {
                    let merged = match self.deleted_before.get(path) {
                        Some(before) => bm | before,
                        None => bm.clone(),
                    };
                    (path.to_string(), part.clone(), merged)
                })
                .collect();
            let path = location(None, &name("dv", "puffin"))?;
            match deletes::write_dv_file(&io, &path, &vectors).await {
                Ok(files) => out.extend(vectors.iter().map(|(_, p, _)| p.spec_id).zip(files)),
                Err(e) => {
                    // what part of the file a failed write (a full disk) left
                    remove_unreferenced(&io, vec![path]).await;
                    return Err(e);
                }
            }
        } else {
            let mut by_part: HashMap<(i32, Struct), BTreeMap<String, RoaringTreemap>> = HashMap::new();
            for (path, (bm, part)) in &self.positions {
                by_part.entry((part.spec_id, part.value.clone())).or_default().insert(path.to_string(), bm.clone());
            }
            for ((spec_id, value), files) in by_part {
                let part = Partition { spec_id, value };
                let path = location(Some(&part), &name("pos-deletes", "parquet"))?;
                match deletes::write_position_delete_file(&io, &path, &part, &files).await {
                    Ok(f) => out.push((part.spec_id, f)),
                    Err(e) => {
                        // the files of this commit's other partitions, and what part of this one a failed write left
                        let written = out.iter().map(|(_, f)| f.file_path().to_string()).chain([path]).collect();
                        remove_unreferenced(&io, written).await;
                        return Err(e);
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The equality-delete writer on its own task, so that its files encode while the data files do (the write phase of
/// a commit uses two cores). Batches reach it through a small channel; joining closes the channel and takes the
/// writer back (to finish it, or to know its files when the commit is abandoned).
struct EqTask {
    tx: Option<tokio::sync::mpsc::Sender<RecordBatch>>,
    task: Option<tokio::task::JoinHandle<(PartitionedWriter, Result<()>)>>,
    /// The writer, once joined.
    writer: Option<PartitionedWriter>,
}

impl EqTask {
    fn spawn(mut w: PartitionedWriter) -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<RecordBatch>(2);
        let task = tokio::spawn(async move {
            while let Some(b) = rx.recv().await {
                if let Err(e) = w.write(&b).await {
                    return (w, Err(e));
                }
            }
            (w, Ok(()))
        });
        EqTask { tx: Some(tx), task: Some(task), writer: None }
    }

    /// Hands `batch` to the task; when the task has stopped, its error.
    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        if let Some(tx) = &self.tx {
            if tx.send(batch).await.is_ok() {
                return Ok(());
            }
        }
        self.join().await?;
        Err(Error::Internal("the equality-delete writer has stopped".into()))
    }

    /// Waits for every batch sent to be written and takes the writer back; the first write error, if any.
    async fn join(&mut self) -> Result<()> {
        self.tx = None;
        let Some(task) = self.task.take() else { return Ok(()) };
        let (w, r) = task.await.map_err(|e| Error::failed("the equality-delete writer", e))?;
        self.writer = Some(w);
        r
    }
}

/// Change rows → the target's arrow schema, by field id at every level (types cast where promoted).
fn to_target(batch: &RecordBatch, target: &SchemaRef, to_source: &HashMap<i32, i32>) -> Result<RecordBatch> {
    let relaxed = crate::spec::projection::relax(target);
    let projected = crate::spec::projection::project_batch(batch, &relaxed, &|id| to_source.get(&id).copied())?;
    let cols = projected.columns().to_vec();
    // required target columns: nulls would be a schema error the validation should have caught
    for (f, c) in target.fields().iter().zip(&cols) {
        if !f.is_nullable() && c.null_count() > 0 {
            return Err(Error::Schema(format!("column `{}` is required in the target but a change row has null", f.name())));
        }
    }
    Ok(RecordBatch::try_new(target.clone(), cols)?)
}

impl crate::change::ChangeConsumer for CommitWriter {
    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        self.write_changes(&batch).await
    }
}

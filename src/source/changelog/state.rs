//! Delete states: which rows of a data file are live before and after a snapshot (position deletes, deletion
//! vectors, equality deletes by the spec's sequence-number rules), and which positions a snapshot changed.
//!
//! Equality deletes are grouped by the columns they compare, so a batch's keys are encoded once per group (and once
//! for both states, [`live_masks`]), not once per delete file. When every delete of the state before is also one of
//! the state after (deletes were only added, as in an upsert stream), the rows live before are tried against the
//! added deletes alone: a file that many upserts reached costs a lookup per delete file for its live rows once, not
//! twice plus an encoding per delete file. The rows the state before removes may come from the last poll's pass
//! ([`super::dead`]); then no row is looked up in its deletes at all.
//!
//! Invariant: a state's `eq_removed`, when set, is exactly what its equality deletes remove (the masks are the same
//! with and without it; a randomized test replays histories to check it).
use super::*;

pub(super) async fn load_state(
    file_io: &FileIO,
    cache: &DeleteCache,
    data: &FileEntry,
    exists: bool,
    deletes: &[Arc<FileEntry>],
    schema: &SchemaRef,
    schema_id: i32,
) -> Result<StateDeletes> {
    let mut st = StateDeletes { exists, ..Default::default() };
    if !exists {
        return Ok(st);
    }
    // the cells of the equality-delete keys, taken under one lock (there is one delete per later commit in an upsert
    // stream); a cell not filled yet is filled below by the first task to get there, the others wait for it (as for
    // position deletes and deletion vectors)
    let mut eq_cells: Vec<Option<super::EqCell>> = {
        let mut eq = cache.eq.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        deletes
            .iter()
            .map(|d| {
                if d.file.content_type() != DataContentType::EqualityDeletes {
                    return None;
                }
                let by_schema = match eq.get_mut(d.path()) {
                    Some(b) => b,
                    None => eq.entry(d.path().to_string()).or_default(),
                };
                Some(match by_schema.iter().find(|(id, _)| *id == schema_id) {
                    Some((_, cell)) => cell.clone(),
                    None => {
                        let cell = super::EqCell::default();
                        by_schema.push((schema_id, cell.clone()));
                        cell
                    }
                })
            })
            .collect()
    };
    for (d, cell) in deletes.iter().zip(eq_cells.iter_mut()) {
        match d.file.content_type() {
            DataContentType::PositionDeletes if d.is_dv() => {
                let key = (d.path().to_string(), d.file.content_offset().unwrap_or(0));
                let cell = cache.dv.lock().unwrap_or_else(std::sync::PoisonError::into_inner).entry(key).or_default().clone();
                let bm = cell.get_or_try_init(|| async { reader::read_dv(file_io, d).await.map(Arc::new) }).await?;
                st.positions |= bm.as_ref();
            }
            DataContentType::PositionDeletes => {
                let cell = {
                    let mut pos = cache.pos.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    match pos.get(d.path()) {
                        Some(c) => c.clone(),
                        None => pos.entry(d.path().to_string()).or_default().clone(),
                    }
                };
                let read = || async { reader::read_position_deletes(file_io, d.path(), d.file.file_format()).await.map(Arc::new) };
                if let Some(bm) = cell.get_or_try_init(read).await?.get(data.path()) {
                    st.positions |= bm;
                }
            }
            DataContentType::EqualityDeletes => {
                // keys are encoded with the reading schema's types; a failed read leaves the cell empty (tried again)
                let cell = cell.take().expect("a cell per equality delete");
                let e = cell.get_or_try_init(|| async { reader::read_equality_deletes(file_io, d, schema).await.map(Arc::new) }).await?;
                st.add_eq(e.clone(), schema)?;
            }
            DataContentType::Data => {}
        }
    }
    Ok(st)
}

/// Where the rows of a batch sit in their file.
#[derive(Clone, Copy)]
pub(super) enum At<'a> {
    /// Consecutive rows from this position on (a whole-file read).
    From(u64),
    /// These positions, one per row (a read of selected rows).
    Positions(&'a [u64]),
}

impl At<'_> {
    pub(super) fn position(&self, i: usize) -> u64 {
        match self {
            At::From(offset) => offset + i as u64,
            At::Positions(p) => p[i],
        }
    }
}

impl StateDeletes {
    /// Adds equality deletes `e`, compared on the columns of `schema`, to the group comparing the same columns.
    pub(super) fn add_eq(&mut self, e: Arc<EqDeletes>, schema: &SchemaRef) -> Result<()> {
        match self.eq.iter_mut().find(|g| g.field_ids == e.field_ids) {
            Some(g) => g.sets.push(e),
            None => {
                let idx = e.columns(schema)?;
                let conv = reader::key_converter(schema, &idx)?;
                self.eq.push(EqGroup { field_ids: e.field_ids.clone(), idx, conv, sets: vec![e] });
            }
        }
        Ok(())
    }

    /// Per column group of `self`, its equality-delete files that `before` does not have — or `None` when `before`
    /// has one that `self` does not (then a row removed before need not be removed in `self`). Files are compared
    /// by identity: walked in order (states of one plan list their files alike), else looked up.
    fn eq_added_since<'s>(&'s self, before: &StateDeletes) -> Option<Vec<Vec<&'s EqDeletes>>> {
        let mut matched = 0;
        let mut added = Vec::with_capacity(self.eq.len());
        for g in &self.eq {
            let theirs = before.eq.iter().find(|b| b.field_ids == g.field_ids).map_or(&[][..], |b| &b.sets[..]);
            matched += theirs.len();
            // one walk: `theirs` found in order (a subsequence), what it skips is added
            let mut rest = theirs.iter().peekable();
            let mine: Vec<&EqDeletes> = g.sets.iter().filter(|e| rest.next_if(|t| Arc::ptr_eq(t, e)).is_none()).map(|e| e.as_ref()).collect();
            if rest.peek().is_none() {
                added.push(mine);
            } else {
                let known: HashSet<*const EqDeletes> = theirs.iter().map(Arc::as_ptr).collect();
                let mine: HashSet<*const EqDeletes> = g.sets.iter().map(Arc::as_ptr).collect();
                if !known.iter().all(|k| mine.contains(k)) {
                    return None;
                }
                added.push(g.sets.iter().filter(|e| !known.contains(&Arc::as_ptr(e))).map(|e| e.as_ref()).collect());
            }
        }
        // a group of `before` that `self` lacks
        (matched == before.eq.iter().map(|g| g.sets.len()).sum::<usize>()).then_some(added)
    }

    /// The rows of `batch` (at `at` in the file) these equality deletes remove: from [`StateDeletes::eq_removed`]
    /// when known, else looked up. `base`: rows already known removed by the others of these deletes, and per
    /// column group the deletes left to try ([`StateDeletes::eq_added_since`]), tried against the rows left. `keys`
    /// holds each column group's encoded rows of the batch, encoded once and shared by both states.
    fn eq_removed_rows(
        &self,
        batch: &RecordBatch,
        at: At<'_>,
        base: Option<(&[bool], &[Vec<&EqDeletes>])>,
        keys: &mut Vec<(Vec<usize>, arrow_row::Rows)>,
    ) -> Result<Vec<bool>> {
        if let Some(removed) = &self.eq_removed {
            return Ok((0..batch.num_rows()).map(|i| removed.contains(at.position(i))).collect());
        }
        let mut removed = base.map_or_else(|| vec![false; batch.num_rows()], |(rows, _)| rows.to_vec());
        for (n, group) in self.eq.iter().enumerate() {
            let sets: Vec<&EqDeletes> = match base {
                Some((_, added)) => added[n].clone(),
                None => group.sets.iter().map(|e| e.as_ref()).collect(),
            };
            if sets.is_empty() || !removed.contains(&false) {
                continue;
            }
            let k = match keys.iter().position(|(idx, _)| *idx == group.idx) {
                Some(k) => k,
                None => {
                    let cols: Vec<_> = group.idx.iter().map(|&i| batch.column(i).clone()).collect();
                    keys.push((group.idx.clone(), group.conv.convert_columns(&cols)?));
                    keys.len() - 1
                }
            };
            for (i, r) in keys[k].1.iter().enumerate() {
                if !removed[i] && sets.iter().any(|e| e.keys.contains(r.as_ref())) {
                    removed[i] = true;
                }
            }
        }
        Ok(removed)
    }

    /// Which rows are live in this state, given the rows its equality deletes remove.
    fn live(&self, eq_removed: &[bool], at: At<'_>) -> Vec<bool> {
        eq_removed.iter().enumerate().map(|(i, r)| self.exists && !r && !self.positions.contains(at.position(i))).collect()
    }
}

/// Live mask of one batch whose rows sit at `at` in the file.
pub(super) fn live_mask(st: &StateDeletes, batch: &RecordBatch, at: At<'_>) -> Result<Vec<bool>> {
    if !st.exists {
        return Ok(vec![false; batch.num_rows()]);
    }
    let removed = st.eq_removed_rows(batch, at, None, &mut Vec::new())?;
    Ok(st.live(&removed, at))
}

/// The masks of one batch in both states of its file.
pub(super) struct Masks {
    /// Live before.
    pub(super) before: Vec<bool>,
    /// Live after.
    pub(super) after: Vec<bool>,
    /// Removed by the equality deletes of the state after ([`dead::Found`] keeps them for the next poll).
    pub(super) eq_removed_after: Vec<bool>,
}

/// The masks of one batch (at `at` in the file) before and after. The keys of each column group are encoded once
/// for both; when every equality delete before is also one after (deletes only added, the common case), the rows
/// the state before removes — kept from the last poll ([`dead`]) or looked up — are the start of the state after's,
/// and only the rows left are tried against the deletes added.
pub(super) fn live_masks(before: &StateDeletes, after: &StateDeletes, batch: &RecordBatch, at: At<'_>) -> Result<Masks> {
    let (mut keys, n) = (Vec::new(), batch.num_rows());
    let eb = if before.exists { before.eq_removed_rows(batch, at, None, &mut keys)? } else { vec![false; n] };
    let added = if before.exists && after.exists { after.eq_added_since(before) } else { None };
    let ea = match added {
        _ if !after.exists => vec![false; n],
        Some(added) => after.eq_removed_rows(batch, at, Some((&eb, &added)), &mut keys)?,
        None => after.eq_removed_rows(batch, at, None, &mut keys)?,
    };
    Ok(Masks { before: before.live(&eb, at), after: after.live(&ea, at), eq_removed_after: ea })
}

/// Whether the equality deletes that differ between the two states of a job's file hold few enough keys (at most
/// one per [`KEY_FIRST_ROWS_PER_KEY`] rows of the file) that reading the compared columns first, then the matching
/// rows by position, costs less than reading the file once. Denser deletes touch nearly every page, so the second
/// read would decode the file again (measured: 12 % of the rows deleted made it 1.2× the bytes and +12 % CPU).
pub(super) fn few_equality_keys(job: &FileJob) -> bool {
    let (before, after) = (equality_deletes(&job.before.1), equality_deletes(&job.after.1));
    let keys: u64 = before.iter().chain(&after).filter(|(p, _)| before.contains_key(*p) != after.contains_key(*p)).map(|(_, n)| n).sum();
    keys.saturating_mul(KEY_FIRST_ROWS_PER_KEY) <= job.file.file.record_count()
}

/// The equality-delete files among `deletes`: path → rows (keys) it holds.
pub(super) fn equality_deletes(deletes: &[Arc<FileEntry>]) -> HashMap<&str, u64> {
    deletes.iter().filter(|d| d.file.content_type() == DataContentType::EqualityDeletes).map(|d| (d.path(), d.file.record_count())).collect()
}

/// See [`few_equality_keys`].
pub(super) const KEY_FIRST_ROWS_PER_KEY: u64 = 64;

/// The positions whose rows can change, when nothing but position deletes (files or DVs) differs between the two
/// states of a file that is in both: exactly the positions deleted in one state and not in the other. `None` when
/// the file is added or removed, or its equality deletes differ (those can change rows anywhere in it).
pub(super) fn positional_change(job: &FileJob, before: &StateDeletes, after: &StateDeletes) -> Option<RoaringTreemap> {
    if !(before.exists && after.exists) {
        return None;
    }
    same_equality_deletes(&job.before.1, &job.after.1).then(|| &before.positions ^ &after.positions)
}

/// Whether `a` and `b` hold the same equality-delete files.
fn same_equality_deletes(a: &[Arc<FileEntry>], b: &[Arc<FileEntry>]) -> bool {
    let eq = |v: &[Arc<FileEntry>]| -> Vec<Arc<FileEntry>> {
        v.iter().filter(|d| d.file.content_type() == DataContentType::EqualityDeletes).cloned().collect()
    };
    let (a, b) = (eq(a), eq(b));
    a.len() == b.len() && is_subset(&a, &b)
}

/// The deletes that apply to one data file at a snapshot, read and ready to mask its rows: how a writer that deletes
/// by position (`delete_mode = "position"`) finds the rows still live in its target.
pub(crate) struct FileDeletes(StateDeletes);

impl FileDeletes {
    /// Reads (through `cache`) the delete files of `deletes` that apply to `data`; equality-delete keys are encoded
    /// with the types of `schema` (which must hold their columns), cached under `schema_id`.
    pub(crate) async fn load(
        file_io: &FileIO,
        cache: &DeleteCache,
        data: &FileEntry,
        deletes: &[Arc<FileEntry>],
        schema: &SchemaRef,
        schema_id: i32,
    ) -> Result<Self> {
        Ok(FileDeletes(load_state(file_io, cache, data, true, deletes, schema, schema_id).await?))
    }

    /// The positions deleted by position-delete files and deletion vectors.
    pub(crate) fn positions(&self) -> &RoaringTreemap {
        &self.0.positions
    }

    /// Which rows of `batch` (rows of the file from position `first` on, in `schema`) are live.
    pub(crate) fn live(&self, batch: &RecordBatch, first: u64) -> Result<Vec<bool>> {
        live_mask(&self.0, batch, At::From(first))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    fn field(name: &str, dt: DataType, id: i32) -> Field {
        Field::new(name, dt, true).with_metadata(HashMap::from([(parquet::arrow::PARQUET_FIELD_ID_META_KEY.to_string(), id.to_string())]))
    }

    /// Equality deletes on `field_ids` of the rows with these ids (and names, when the name is compared).
    fn eq_deletes(schema: &SchemaRef, field_ids: Vec<i32>, rows: &[(i64, &str)]) -> Arc<EqDeletes> {
        let mut e = EqDeletes { field_ids, keys: Default::default(), id: rand_id() };
        let (conv, idx) = e.converter(schema).unwrap();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))), Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1)))],
        )
        .unwrap();
        let cols: Vec<_> = idx.iter().map(|&i| batch.column(i).clone()).collect();
        for r in conv.convert_columns(&cols).unwrap().iter() {
            e.keys.insert(r.as_ref().into());
        }
        Arc::new(e)
    }

    fn state(schema: &SchemaRef, exists: bool, positions: &[u64], eq: &[&Arc<EqDeletes>]) -> StateDeletes {
        let mut st = StateDeletes { exists, positions: positions.iter().copied().collect(), ..Default::default() };
        for e in eq {
            st.add_eq((*e).clone(), schema).unwrap();
        }
        st
    }

    /// An equality-delete file on local disk deleting ids `0..n` (field id 1), and its manifest entry; the entry of
    /// a copy at `copy` (not written).
    fn eq_delete_file(dir: &std::path::Path, n: i64, copy: &std::path::Path) -> (FileIO, Arc<FileEntry>, Arc<FileEntry>) {
        let schema = Arc::new(Schema::new(vec![field("id", DataType::Int64, 1)]));
        let path = dir.join("eq.parquet");
        let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema.clone(), None).unwrap();
        w.write(&RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(0..n))]).unwrap()).unwrap();
        w.close().unwrap();
        let size = std::fs::metadata(&path).unwrap().len();
        let entry = |p: &std::path::Path| {
            let file = iceberg::spec::DataFileBuilder::default()
                .content(DataContentType::EqualityDeletes)
                .file_path(p.to_string_lossy().into_owned())
                .file_format(iceberg::spec::DataFileFormat::Parquet)
                .record_count(n as u64)
                .file_size_in_bytes(size)
                .equality_ids(Some(vec![1]))
                .build()
                .unwrap();
            Arc::new(FileEntry { file, seq: 2, spec_id: 0, unpartitioned: true, first_row_id: None })
        };
        let io = crate::storage::file_io(crate::storage::CdcStorageFactory::default(), &HashMap::new());
        (io, entry(&path), entry(copy))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn files_loaded_at_once_share_one_read_of_a_delete_file() {
        let dir = tempfile::tempdir().unwrap();
        let (io, eq, gone) = eq_delete_file(dir.path(), 50_000, &dir.path().join("gone.parquet"));
        let schema: SchemaRef = Arc::new(Schema::new(vec![field("id", DataType::Int64, 1), field("name", DataType::Utf8, 2)]));
        let cache = DeleteCache::default();
        let data = |k: usize| {
            let file = iceberg::spec::DataFileBuilder::default()
                .content(DataContentType::Data)
                .file_path(format!("data-{k}.parquet"))
                .file_format(iceberg::spec::DataFileFormat::Parquet)
                .record_count(10)
                .file_size_in_bytes(100)
                .build()
                .unwrap();
            FileEntry { file, seq: 1, spec_id: 0, unpartitioned: true, first_row_id: None }
        };
        let files: Vec<FileEntry> = (0..8).map(data).collect();
        let deletes = [eq.clone()];
        let loads = files.iter().map(|f| load_state(&io, &cache, f, true, &deletes, &schema, 0));
        let states = futures::future::try_join_all(loads).await.unwrap();
        let sets: Vec<&Arc<EqDeletes>> = states.iter().map(|st| &st.eq[0].sets[0]).collect();
        assert_eq!(sets[0].keys.len(), 50_000);
        assert!(sets.iter().all(|e| Arc::ptr_eq(e, sets[0])), "one read, shared by every file loaded at once");
        assert_eq!(cache.eq.lock().unwrap().get(eq.path()).map(Vec::len), Some(1), "one cell per schema id");
        // another schema id reads the file again, into a cell of its own
        let other = load_state(&io, &cache, &files[0], true, &deletes, &schema, 1).await.unwrap();
        assert!(!Arc::ptr_eq(&other.eq[0].sets[0], sets[0]));
        assert_eq!(cache.eq.lock().unwrap().get(eq.path()).map(Vec::len), Some(2));
        // a position-delete file: one read too, each file taking its own positions
        let pos_path = dir.path().join("pos.parquet");
        let pos_schema = Arc::new(Schema::new(vec![
            field("file_path", DataType::Utf8, crate::source::reader::POS_DELETE_FILE_PATH_ID),
            field("pos", DataType::Int64, crate::source::reader::POS_DELETE_POS_ID),
        ]));
        let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&pos_path).unwrap(), pos_schema.clone(), None).unwrap();
        let paths = StringArray::from_iter_values((0..8).map(|k| format!("data-{k}.parquet")));
        w.write(&RecordBatch::try_new(pos_schema, vec![Arc::new(paths), Arc::new(Int64Array::from_iter_values(0..8))]).unwrap()).unwrap();
        w.close().unwrap();
        let pos = iceberg::spec::DataFileBuilder::default()
            .content(DataContentType::PositionDeletes)
            .file_path(pos_path.to_string_lossy().into_owned())
            .file_format(iceberg::spec::DataFileFormat::Parquet)
            .record_count(8)
            .file_size_in_bytes(std::fs::metadata(&pos_path).unwrap().len())
            .build()
            .unwrap();
        let pos = [Arc::new(FileEntry { file: pos, seq: 2, spec_id: 0, unpartitioned: true, first_row_id: None })];
        let states = futures::future::try_join_all(files.iter().map(|f| load_state(&io, &cache, f, true, &pos, &schema, 0))).await.unwrap();
        for (k, st) in states.iter().enumerate() {
            assert_eq!(st.positions.iter().collect::<Vec<_>>(), vec![k as u64]);
        }
        let cell = cache.pos.lock().unwrap().get(pos[0].path()).cloned().unwrap();
        assert_eq!(cell.get().map(|m| m.len()), Some(8), "one read, every file's positions");
        // a file that cannot be read is an error, and the next load reads it again
        assert!(load_state(&io, &cache, &files[0], true, std::slice::from_ref(&gone), &schema, 0).await.is_err());
        std::fs::copy(eq.path(), gone.path()).unwrap();
        assert_eq!(load_state(&io, &cache, &files[0], true, &[gone], &schema, 0).await.unwrap().eq[0].sets[0].keys.len(), 50_000);
    }

    fn rand_id() -> u128 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        crate::source::reader::hash128(&NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }

    /// The masks of both states at once, as a pair.
    fn both(before: &StateDeletes, after: &StateDeletes, batch: &RecordBatch, at: At<'_>) -> (Vec<bool>, Vec<bool>) {
        let m = live_masks(before, after, batch, at).unwrap();
        (m.before, m.after)
    }

    /// Both masks at once are each state's mask on its own, whether the state after holds every delete of the one
    /// before (only the added deletes are tried) or not; deletes comparing the same columns share one group.
    #[test]
    fn both_states_masked_at_once_are_each_state_masked_alone() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![field("id", DataType::Int64, 1), field("name", DataType::Utf8, 2)]));
        let ids: Vec<i64> = (0..40).collect();
        let names: Vec<String> = ids.iter().map(|i| format!("n{}", i % 7)).collect();
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(ids.clone())), Arc::new(StringArray::from(names.clone()))]).unwrap();
        let by_id = |ks: &[i64]| eq_deletes(&schema, vec![1], &ks.iter().map(|k| (*k, "")).collect::<Vec<_>>());
        let (a, b, c) = (by_id(&[1, 2, 3, 30]), by_id(&[3, 4, 5]), by_id(&[10, 11, 39]));
        let by_both = eq_deletes(&schema, vec![1, 2], &[(20, "n6"), (21, "n0"), (22, "wrong")]);
        let states = [
            state(&schema, true, &[], &[]),
            state(&schema, true, &[0, 7], &[&a]),
            state(&schema, true, &[0, 7, 8], &[&a, &b, &by_both]),
            state(&schema, true, &[7], &[&b, &c]),
            state(&schema, false, &[], &[&a]),
        ];
        assert_eq!(states[2].eq.len(), 2, "deletes on the same columns share a group");
        for (i, before) in states.iter().enumerate() {
            for (j, after) in states.iter().enumerate() {
                for at in [At::From(0), At::From(5)] {
                    let alone = (live_mask(before, &batch, at).unwrap(), live_mask(after, &batch, at).unwrap());
                    assert_eq!(both(before, after, &batch, at), alone, "states {i} → {j}");
                }
            }
        }
        let live = live_mask(&states[2], &batch, At::From(0)).unwrap();
        let dead: Vec<usize> = live.iter().enumerate().filter(|(_, l)| !**l).map(|(i, _)| i).collect();
        assert_eq!(dead, [0, 1, 2, 3, 4, 5, 7, 8, 20, 21, 30]);
        let added = |a: &StateDeletes, b: &StateDeletes| b.eq_added_since(a).map(|gs| gs.iter().map(Vec::len).collect::<Vec<_>>());
        assert_eq!(added(&states[1], &states[2]), Some(vec![1, 1]), "b added to a's group, by_both a group of its own");
        assert_eq!(added(&states[2], &states[1]), None);
        assert_eq!(added(&states[1], &states[3]), None);
        assert_eq!(added(&states[0], &states[3]), Some(vec![2]));
        // listed in another order: looked up
        assert_eq!(added(&states[3], &state(&schema, true, &[], &[&c, &a, &b])), Some(vec![1]));
    }

    /// Random histories of one file, state after state as polls see them, the rows each state's equality deletes
    /// remove carried from one pass to the next (as [`super::super::dead`] keeps them): every mask is the one found
    /// without them, and what is carried is exactly what the state's deletes remove, position deletes or not.
    #[test]
    fn masks_from_the_rows_kept_of_the_last_pass_are_the_masks_looked_up() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![field("id", DataType::Int64, 1), field("name", DataType::Utf8, 2)]));
        let n = 300i64;
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from_iter_values(0..n)), Arc::new(StringArray::from_iter_values((0..n).map(|i| format!("n{}", i % 5))))],
        )
        .unwrap();
        let mut rng = crate::test_rng::Rng(0x2545_f491_4f6c_dd1d);
        let mut next = |m: u64| rng.below(m);
        for history in 0..40 {
            let mut sets: Vec<Arc<EqDeletes>> = Vec::new();
            let mut positions: Vec<u64> = Vec::new();
            let mut kept: Option<Arc<RoaringTreemap>> = None;
            let mut before = state(&schema, true, &[], &[]);
            let at = At::From(next(3) * 100);
            for step in 0..12 {
                // mostly deletes added (an upsert stream); sometimes one dropped (a rewritten history), sometimes a
                // position delete added or dropped
                match next(10) {
                    0 if !sets.is_empty() => {
                        sets.remove(next(sets.len() as u64) as usize);
                    }
                    1 => positions.push(next(n as u64)),
                    2 => {
                        positions.pop();
                    }
                    _ => {
                        let keys: Vec<(i64, String)> = (0..next(6)).map(|_| (next(n as u64 + 20) as i64, format!("n{}", next(6)))).collect();
                        let rows: Vec<(i64, &str)> = keys.iter().map(|(k, v)| (*k, v.as_str())).collect();
                        let ids = if next(4) == 0 { vec![1, 2] } else { vec![1] };
                        sets.push(eq_deletes(&schema, ids, &rows));
                    }
                }
                let after = state(&schema, next(12) != 0, &positions, &sets.iter().collect::<Vec<_>>());
                let looked_up = both(&before, &after, &batch, at);
                before.eq_removed = kept.clone();
                let m = live_masks(&before, &after, &batch, at).unwrap();
                assert_eq!((m.before.clone(), m.after.clone()), looked_up, "history {history}, step {step}");
                // what is kept is what the deletes after remove, looked up row by row on their own
                let alone = state(&schema, true, &[], &sets.iter().collect::<Vec<_>>());
                let removed: Vec<bool> = live_mask(&alone, &batch, at).unwrap().iter().map(|l| !l).collect();
                if after.exists {
                    assert_eq!(m.eq_removed_after, removed, "history {history}, step {step}");
                }
                kept = after.exists.then(|| Arc::new(removed.iter().enumerate().filter(|(_, r)| **r).map(|(i, _)| at.position(i)).collect()));
                before = after;
            }
        }
    }
}

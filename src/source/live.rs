//! The live files of a snapshot, known without reading its older manifests, and what finds the ones a delete can
//! reach without trying each.
//!
//! [`LiveFiles`] holds a snapshot's live data and delete files. It is seeded by a full plan and derived snapshot by
//! snapshot from the parent's: minus what a snapshot's own manifests remove, plus what they add (by the spec they
//! hold every file it adds or removes). The process keeps the sets by (table uuid, snapshot id) in [`LiveSets`]; a
//! snapshot's files never change, and a set is moved from parent to child, never copied.
//!
//! A plan then needs, of the live files its own manifests do not list, the data files one of its changed deletes
//! applies to and the delete files at or above a sequence number. Trying every live file costs what the history
//! costs (a table that is only appended to has as many files as commits), so a set keeps two orderings beside its
//! maps:
//! - **delete files by data sequence number**: those at or above one are a range;
//! - **data files by the bounds of an equality field** ([`KeyIndex`]: a delete is looked up by the first field it
//!   compares whose bounds can be ordered; one index per such field, built the first time a delete is looked up by
//!   it and kept up as files come and go). An equality delete whose values of the field lie in
//!   `[lo, hi]` can only apply to a file whose upper bound is at least `lo` (a range of the index) and whose lower
//!   bound is at most `hi`. A file whose bounds cannot be ordered (none, a type without an order kept here, a null
//!   count not known to be zero) is kept aside and always tried.
//!
//! A position delete that names its data file (`referenced_data_file`, or `file_path` bounds of one path) reaches
//! that file alone. Anything else reaches every live file, as before.
//!
//! **Memory.** A set keeps of each data file only what planning and reading need ([`Stats::BoundsOf`]): the bounds
//! and null counts of the fields an equality delete compares — the table's identifier fields and those its live
//! equality deletes name — and none of the other statistics, which are most of a wide table's entry. A delete that
//! compares another field has the snapshot planned from the manifests, and the set learned again with that field.
//! A set counts its bytes as the allocator sees them ([`heap_bytes`]); the process keeps the sets within an eighth
//! of `memory_budget` ([`size`]), the one kept longest ago out first, and a table whose set alone would not fit is
//! planned from the manifests (remembered, so it is not tried at every snapshot).
//!
//! Invariant: these orderings only narrow what is tried. Every data file they yield is still judged by
//! [`delete_applies`], and none they leave out could pass it, so a plan is the same as by trying every file.
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use iceberg::spec::{DataContentType, Datum, PrimitiveLiteral, PrimitiveType, SnapshotRef};
use iceberg::table::Table;

use super::files::{delete_applies, FileEntry, SnapshotFiles};
use crate::spec::data_file::{heap_bytes, Stats};

/// The least a live file takes in a set (a data file's entry with the bounds of one field, its path, its slot):
/// what a table's file count is weighed by before its set is built.
const LEAST_FILE_BYTES: u64 = 1024;

/// What a file takes in a set beside its entry and path: the map's slot, the `Arc`'s counts.
const SLOT_BYTES: u64 = 64;

/// What a file takes in one [`KeyIndex`] beside its path: two bounds and tree slots.
const INDEX_BYTES: u64 = 120;

/// Bytes the process's live-file sets may take ([`size`]); 32 MiB until sized.
static LIVE_BYTES: AtomicU64 = AtomicU64::new(32 << 20);

/// Sizes the live-file sets to an eighth of `memory_budget` (the structure that keeps following a long history
/// cheap: a table of 10 000 live files takes ~18 MB of it).
pub(super) fn size(memory_budget: u64) {
    LIVE_BYTES.store((memory_budget / 8).max(1 << 20), Relaxed);
}

type ByPath = HashMap<String, Arc<FileEntry>, ahash::RandomState>;

/// The live files of one snapshot of a table, with orderings that find what a delete can reach, each data file
/// with the statistics of `fields` only (see the module header). Kept process-wide within an eighth of
/// `memory_budget`, the set kept longest ago out first; a snapshot without one is planned from the manifests.
#[derive(Debug, Default)]
pub(crate) struct LiveFiles {
    data: ByPath,
    deletes: ByPath,
    /// `deletes` by (data sequence number, path).
    deletes_by_seq: BTreeSet<(i64, String)>,
    /// `data` by the bounds of each equality field id a delete has named.
    keys: HashMap<i32, KeyIndex>,
    /// The field ids whose bounds and null counts the data files keep.
    fields: BTreeSet<i32>,
    /// What the entries of `data` and `deletes` take with their paths and slots ([`Self::file_bytes`], [`Self::delete_bytes`]).
    entry_bytes: u64,
    /// The length of every data file's path (each index holds each again).
    data_path_bytes: u64,
}

impl LiveFiles {
    /// Keeps the live files after `snapshot` from its full plan when they fit (a table too large is planned from
    /// its manifests, as before). Its data files keep the bounds of the table's identifier fields and of every
    /// field its live equality deletes compare.
    pub(super) fn remember(table: &Table, snapshot: &SnapshotRef, full: &SnapshotFiles) {
        if !Self::would_fit(table, snapshot) {
            return;
        }
        let fields = table.metadata().current_schema().identifier_field_ids().collect();
        let mut live = LiveFiles { fields, ..Default::default() };
        for d in full.deletes_before.iter().chain(&full.deletes_after) {
            live.fields.extend(d.file.equality_ids().unwrap_or_default());
        }
        for (p, f) in &full.data_after {
            live.insert_data(p, f);
        }
        for d in &full.deletes_after {
            live.insert_delete(d);
        }
        let uuid = table.metadata().uuid().to_string();
        let mut sets = Self::sets().lock().unwrap_or_else(|e| e.into_inner());
        if live.bytes() > LIVE_BYTES.load(Relaxed) {
            tracing::debug!(table = %uuid, files = live.data.len() + live.deletes.len(), bytes = live.bytes(), "the table's live files would take more than the live-file sets may; planning it from its manifests");
            sets.too_large.insert(uuid, (live.data.len() + live.deletes.len()) as u64);
            return;
        }
        sets.too_large.remove(&uuid);
        sets.keep((uuid, snapshot.snapshot_id()), live, LIVE_BYTES.load(Relaxed));
    }

    /// Whether the live files of `snapshot` (by its summary's totals) can fit the sets: at [`LEAST_FILE_BYTES`] a
    /// file, and fewer than this table had when its set last came out too large.
    pub(super) fn would_fit(table: &Table, snapshot: &SnapshotRef) -> bool {
        let total = |k: &str| snapshot.summary().additional_properties.get(k).and_then(|v| v.parse::<u64>().ok());
        let Some(files) = total("total-data-files").map(|data| data + total("total-delete-files").unwrap_or(0)) else { return false };
        let refused = Self::sets().lock().unwrap_or_else(|e| e.into_inner()).too_large.get(&table.metadata().uuid().to_string()).copied();
        files * LEAST_FILE_BYTES <= LIVE_BYTES.load(Relaxed) && refused.is_none_or(|n| files < n)
    }

    /// Whether every equality delete of `deletes` compares only fields whose bounds the data files keep (if not,
    /// the set cannot tell which files it reaches as a plan from the manifests would).
    pub(super) fn keeps_bounds_for(&self, deletes: &[Arc<FileEntry>]) -> bool {
        deletes
            .iter()
            .filter(|d| d.file.content_type() == DataContentType::EqualityDeletes)
            .all(|d| d.file.equality_ids().unwrap_or_default().iter().all(|id| self.fields.contains(id)))
    }

    /// Turns these live files of a snapshot's parent into the snapshot's, by what its own manifests gave (`own`).
    pub(super) fn advance(&mut self, own: &SnapshotFiles) {
        for path in own.data_before.keys().filter(|p| !own.data_after.contains_key(*p)) {
            self.remove_data(path);
        }
        for (path, f) in &own.data_after {
            self.insert_data(path, f);
        }
        for d in &own.deletes_before {
            self.remove_delete(d.path());
        }
        for d in &own.deletes_after {
            self.insert_delete(d);
        }
    }

    /// The live files (of the snapshot or its parent: the same but for what the snapshot's own manifests list) that
    /// its own manifests do not list, as steps 2–3 of `plan_changes` would read them from the older manifests:
    /// the data files a changed delete applies to, then the delete files that can apply to a data file of the plan
    /// (data sequence number at or above the lowest among them).
    pub(super) fn add_older_to(&mut self, out: &mut SnapshotFiles) {
        if !out.changed_deletes.is_empty() {
            let reach = self.reach(&out.changed_deletes);
            let tried: Box<dyn Iterator<Item = (&String, &Arc<FileEntry>)>> = match &reach {
                Some(paths) => Box::new(paths.iter().filter_map(|p| self.data.get_key_value(p.as_str()))),
                None => Box::new(self.data.iter()),
            };
            for (path, f) in tried {
                let own = out.data_before.contains_key(path) || out.data_after.contains_key(path);
                if !own && out.changed_deletes.iter().any(|d| delete_applies(d, f)) {
                    out.data_before.insert(path.clone(), f.clone());
                    out.data_after.insert(path.clone(), f.clone());
                }
            }
        }
        let Some(lowest) = out.data_before.values().chain(out.data_after.values()).map(|f| f.seq).min() else { return };
        let own: HashSet<&str> = out.deletes_before.iter().chain(&out.deletes_after).map(|d| d.path()).collect();
        let older: Vec<_> = self
            .deletes_by_seq
            .range((lowest, String::new())..)
            .filter(|(_, p)| !own.contains(p.as_str()))
            .filter_map(|(_, p)| self.deletes.get(p).cloned())
            .collect();
        out.deletes_before.extend(older.iter().cloned());
        out.deletes_after.extend(older);
    }

    /// The paths of the live data files `deletes` can reach, a superset of those one of them applies to; `None`:
    /// every file (a delete no ordering narrows).
    fn reach(&mut self, deletes: &[Arc<FileEntry>]) -> Option<HashSet<String>> {
        let mut paths = HashSet::new();
        for d in deletes {
            match d.file.content_type() {
                DataContentType::PositionDeletes => paths.insert(named_data_file(d)?),
                DataContentType::EqualityDeletes => {
                    // the first compared field whose bounds this delete has and the index can order
                    let (field, ty, lo, hi) = d.file.equality_ids()?.into_iter().find_map(|field| {
                        let (lo, hi) = (d.file.lower_bounds().get(&field)?, d.file.upper_bounds().get(&field)?);
                        let ty = lo.data_type();
                        Some((field, ty.clone(), Key::of(lo, ty)?, Key::of(hi, ty)?))
                    })?;
                    let Self { data, keys, .. } = self;
                    let index = keys.entry(field).or_insert_with(|| KeyIndex::new(field, ty.clone(), data));
                    if index.ty != ty {
                        return None;
                    }
                    paths.extend(index.reach(lo, hi));
                    continue;
                }
                DataContentType::Data => continue,
            };
        }
        Some(paths)
    }

    /// Adds data file `f` at `path`, with only the statistics of `fields` (a copy that fails keeps them all).
    fn insert_data(&mut self, path: &str, f: &Arc<FileEntry>) {
        self.remove_data(path);
        let f = self.slim(f);
        for index in self.keys.values_mut() {
            index.insert(path, &f);
        }
        self.entry_bytes += Self::file_bytes(path, &f);
        self.data_path_bytes += path.len() as u64;
        self.data.insert(path.to_string(), f);
    }

    /// `f` with the statistics of `fields` only, or `f` itself when it has no others.
    fn slim(&self, f: &Arc<FileEntry>) -> Arc<FileEntry> {
        let d = &f.file;
        let slim = d.column_sizes().is_empty()
            && d.value_counts().is_empty()
            && d.nan_value_counts().is_empty()
            && d.split_offsets().is_none()
            && d.lower_bounds().keys().chain(d.upper_bounds().keys()).chain(d.null_value_counts().keys()).all(|id| self.fields.contains(id));
        if slim {
            return f.clone();
        }
        match crate::spec::data_file::copy(d, f.spec_id, d.first_row_id(), Stats::BoundsOf(&self.fields)) {
            Ok(file) => Arc::new(FileEntry { file, seq: f.seq, spec_id: f.spec_id, unpartitioned: f.unpartitioned, first_row_id: f.first_row_id }),
            Err(_) => f.clone(),
        }
    }

    fn remove_data(&mut self, path: &str) {
        if let Some(f) = self.data.remove(path) {
            for index in self.keys.values_mut() {
                index.remove(path, &f);
            }
            self.entry_bytes -= Self::file_bytes(path, &f);
            self.data_path_bytes -= path.len() as u64;
        }
    }

    fn insert_delete(&mut self, d: &Arc<FileEntry>) {
        self.remove_delete(d.path());
        self.deletes_by_seq.insert((d.seq, d.path().to_string()));
        // a delete file is kept whole: its bounds say what it reaches, and a table has few
        self.entry_bytes += Self::delete_bytes(d.path(), d);
        self.deletes.insert(d.path().to_string(), d.clone());
    }

    fn remove_delete(&mut self, path: &str) {
        if let Some(d) = self.deletes.remove(path) {
            self.deletes_by_seq.remove(&(d.seq, path.to_string()));
            self.entry_bytes -= Self::delete_bytes(path, &d);
        }
    }

    /// What a file at `path` takes in the set: its entry, its path as the key, the slot.
    fn file_bytes(path: &str, f: &FileEntry) -> u64 {
        heap_bytes(&f.file)
            + (std::mem::size_of::<FileEntry>() - std::mem::size_of::<iceberg::spec::DataFile>()) as u64
            + path.len() as u64
            + SLOT_BYTES
    }

    /// What a delete file takes: as a file, and its place by sequence number.
    fn delete_bytes(path: &str, d: &FileEntry) -> u64 {
        Self::file_bytes(path, d) + path.len() as u64 + SLOT_BYTES
    }

    /// What this set takes in memory, as the budget counts it: its files and each index's place for every data
    /// file.
    fn bytes(&self) -> u64 {
        self.entry_bytes + self.keys.len() as u64 * (self.data.len() as u64 * INDEX_BYTES + self.data_path_bytes)
    }

    /// The process's live-file sets by (table uuid, snapshot id), each with the tick it was last kept at. A plain map
    /// under a mutex (held for a lookup, never across an await): a set is moved out and back in, never copied.
    fn sets() -> &'static std::sync::Mutex<LiveSets> {
        static LIVE: std::sync::OnceLock<std::sync::Mutex<LiveSets>> = std::sync::OnceLock::new();
        LIVE.get_or_init(Default::default)
    }

    /// Keeps `live` as the live files of `snapshot` (see [`LiveSets::keep`]).
    pub(super) fn keep(table: &Table, snapshot: i64, live: LiveFiles) {
        let limit = LIVE_BYTES.load(Relaxed);
        Self::sets().lock().unwrap_or_else(|e| e.into_inner()).keep((table.metadata().uuid().to_string(), snapshot), live, limit);
    }

    /// The live files of `snapshot`, taken out (whoever plans its child next owns them).
    pub(super) fn take(table: &Table, snapshot: i64) -> Option<LiveFiles> {
        Self::sets().lock().unwrap_or_else(|e| e.into_inner()).take(&(table.metadata().uuid().to_string(), snapshot))
    }
}

/// The one data file a position delete can apply to, when it says: its `referenced_data_file`, or the path its
/// `file_path` bounds both give (a truncated bound is never equal to the other: the upper one is rounded up).
fn named_data_file(d: &FileEntry) -> Option<String> {
    if let Some(r) = d.file.referenced_data_file() {
        return Some(r);
    }
    let id = crate::spec::POS_DELETE_FILE_PATH_ID;
    match (d.file.lower_bounds().get(&id)?.literal(), d.file.upper_bounds().get(&id)?.literal()) {
        (PrimitiveLiteral::String(lo), PrimitiveLiteral::String(hi)) if lo == hi => Some(lo.clone()),
        _ => None,
    }
}

/// A bound as the index orders it: the order [`Datum`] gives values of one type.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Int(i64),
    Str(String),
}

impl Key {
    /// `d` as a key when it is of type `ty` and `ty` is ordered here (integers, dates, times, timestamps, strings;
    /// not floats — a NaN lies outside bounds — nor decimals, uuids, binaries, booleans).
    fn of(d: &Datum, ty: &PrimitiveType) -> Option<Key> {
        if d.data_type() != ty {
            return None;
        }
        use PrimitiveType as T;
        match (ty, d.literal()) {
            (T::Int | T::Date, PrimitiveLiteral::Int(v)) => Some(Key::Int(i64::from(*v))),
            (T::Long | T::Time | T::Timestamp | T::Timestamptz | T::TimestampNs | T::TimestamptzNs, PrimitiveLiteral::Long(v)) => Some(Key::Int(*v)),
            (T::String, PrimitiveLiteral::String(s)) => Some(Key::Str(s.clone())),
            _ => None,
        }
    }
}

/// Data files by their bounds of one field (see the module header): those with bounds of the index's type and no
/// null in the field ordered by upper bound (each with its lower one), the others aside.
#[derive(Debug)]
struct KeyIndex {
    field: i32,
    ty: PrimitiveType,
    by_upper: BTreeMap<(Key, String), Key>,
    aside: HashSet<String>,
}

impl KeyIndex {
    /// The index of `field` with bounds of type `ty` over `data`.
    fn new(field: i32, ty: PrimitiveType, data: &ByPath) -> KeyIndex {
        let mut index = KeyIndex { field, ty, by_upper: BTreeMap::new(), aside: HashSet::new() };
        for (path, f) in data {
            index.insert(path, f);
        }
        index
    }

    /// A file's place: its (upper, lower) keys, or `None` when it goes aside.
    fn place(&self, f: &FileEntry) -> Option<(Key, Key)> {
        if f.file.null_value_counts().get(&self.field) != Some(&0) {
            return None;
        }
        let lo = Key::of(f.file.lower_bounds().get(&self.field)?, &self.ty)?;
        let hi = Key::of(f.file.upper_bounds().get(&self.field)?, &self.ty)?;
        Some((hi, lo))
    }

    fn insert(&mut self, path: &str, f: &FileEntry) {
        match self.place(f) {
            Some((hi, lo)) => {
                self.by_upper.insert((hi, path.to_string()), lo);
            }
            None => {
                self.aside.insert(path.to_string());
            }
        }
    }

    fn remove(&mut self, path: &str, f: &FileEntry) {
        match self.place(f) {
            Some((hi, _)) => {
                self.by_upper.remove(&(hi, path.to_string()));
            }
            None => {
                self.aside.remove(path);
            }
        }
    }

    /// The files a delete whose values of the field lie in `[lo, hi]` can reach: those aside and those whose bounds
    /// meet `[lo, hi]`.
    fn reach(&self, lo: Key, hi: Key) -> impl Iterator<Item = String> + '_ {
        let meeting = self.by_upper.range((lo, String::new())..).filter(move |(_, file_lo)| **file_lo <= hi).map(|((_, p), _)| p.clone());
        self.aside.iter().cloned().chain(meeting)
    }
}

/// The live-file sets a process keeps ([`LiveFiles::sets`]), by (table uuid, snapshot id).
#[derive(Debug, Default)]
pub(super) struct LiveSets {
    by_snapshot: HashMap<(String, i64), (u64, LiveFiles)>,
    /// What they take, by [`LiveFiles::bytes`].
    bytes: u64,
    /// Tables whose set came out larger than the sets may take, with the number of live files it had: planned
    /// from the manifests while they have as many.
    too_large: HashMap<String, u64>,
    /// Counts `keep`s: the order sets were kept in.
    tick: u64,
}

impl LiveSets {
    /// Keeps `live` under `key`; while the sets take more than `limit` bytes, the one kept longest ago goes (a table
    /// gone idle frees its share).
    fn keep(&mut self, key: (String, i64), live: LiveFiles, limit: u64) {
        self.tick += 1;
        self.bytes += live.bytes();
        if let Some((_, old)) = self.by_snapshot.insert(key, (self.tick, live)) {
            self.bytes -= old.bytes();
        }
        while self.bytes > limit {
            let Some(oldest) = self.by_snapshot.iter().min_by_key(|(_, (t, _))| *t).map(|(k, _)| k.clone()) else { break };
            if let Some((_, gone)) = self.by_snapshot.remove(&oldest) {
                self.bytes -= gone.bytes();
            }
        }
    }

    /// The set under `key`, taken out.
    fn take(&mut self, key: &(String, i64)) -> Option<LiveFiles> {
        let (_, live) = self.by_snapshot.remove(key)?;
        self.bytes -= live.bytes();
        Some(live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;
    use iceberg::spec::{DataFile, DataFileBuilder, DataFileFormat};

    /// The live files of a table whose equality deletes compare field 1.
    fn keyed() -> LiveFiles {
        LiveFiles { fields: BTreeSet::from([1]), ..Default::default() }
    }

    /// A file entry: `bounds` of field 1 (lower, upper), its null count, sequence number `seq`; a data file also
    /// with statistics of field 2 (bounds that rule out every delete here, sizes, counts), which a set leaves out.
    fn entry(content: DataContentType, path: &str, bounds: Option<(Datum, Datum)>, nulls: Option<u64>, seq: i64) -> Arc<FileEntry> {
        let mut b = DataFileBuilder::default();
        b.content(content).file_path(path.to_string()).file_format(DataFileFormat::Parquet).record_count(10).file_size_in_bytes(100);
        let mut lower = HashMap::new();
        let mut upper = HashMap::new();
        if let Some((lo, hi)) = bounds {
            lower.insert(1, lo);
            upper.insert(1, hi);
        }
        let mut null_counts: HashMap<i32, u64> = nulls.map(|n| HashMap::from([(1, n)])).unwrap_or_default();
        if content == DataContentType::Data {
            lower.insert(2, Datum::long(-9));
            upper.insert(2, Datum::long(-9));
            null_counts.insert(2, 0);
            b.column_sizes(HashMap::from([(1, 8), (2, 8)])).value_counts(HashMap::from([(1, 10), (2, 10)])).split_offsets(Some(vec![4]));
        }
        b.lower_bounds(lower).upper_bounds(upper).null_value_counts(null_counts);
        if content == DataContentType::EqualityDeletes {
            b.equality_ids(Some(vec![1]));
        }
        let file: DataFile = b.build().unwrap();
        Arc::new(FileEntry { file, seq, spec_id: 0, unpartitioned: true, first_row_id: None })
    }

    fn position_delete(path: &str, referenced: Option<&str>, bounds: Option<(&str, &str)>, seq: i64) -> Arc<FileEntry> {
        let id = crate::spec::POS_DELETE_FILE_PATH_ID;
        let mut b = DataFileBuilder::default();
        b.content(DataContentType::PositionDeletes)
            .file_path(path.to_string())
            .file_format(DataFileFormat::Parquet)
            .record_count(1)
            .file_size_in_bytes(1)
            .referenced_data_file(referenced.map(str::to_string));
        if let Some((lo, hi)) = bounds {
            b.lower_bounds(HashMap::from([(id, Datum::string(lo))])).upper_bounds(HashMap::from([(id, Datum::string(hi))]));
        }
        Arc::new(FileEntry { file: b.build().unwrap(), seq, spec_id: 0, unpartitioned: true, first_row_id: None })
    }

    /// Bounds of field 1 as a writer may leave them: longs mostly, now and then none, ints (a promoted column),
    /// strings, doubles, a reversed pair.
    fn bounds(rng: &mut Rng) -> Option<(Datum, Datum)> {
        let lo = rng.below(200) as i64;
        let hi = lo + rng.below(30) as i64;
        match rng.below(20) {
            0 => None,
            1 => Some((Datum::int(lo as i32), Datum::int(hi as i32))),
            2 => Some((Datum::string(format!("k{lo:03}")), Datum::string(format!("k{hi:03}")))),
            3 => Some((Datum::double(lo as f64), Datum::double(hi as f64))),
            4 => Some((Datum::long(hi), Datum::long(lo))),
            _ => Some((Datum::long(lo), Datum::long(hi))),
        }
    }

    fn nulls(rng: &mut Rng) -> Option<u64> {
        match rng.below(8) {
            0 => None,
            1 => Some(2),
            _ => Some(0),
        }
    }

    /// What trying every live file gives (the plan before these orderings): the paths of the data files a changed
    /// delete applies to, and the delete files at or above the lowest sequence number of the plan's data files.
    /// `originals`: each data file's entry as its manifest gave it (a set keeps a slimmer copy).
    fn by_trying_all(live: &LiveFiles, originals: &HashMap<String, Arc<FileEntry>>, out: &SnapshotFiles) -> (Vec<String>, Vec<String>) {
        let mut data: Vec<String> = live
            .data
            .keys()
            .map(|p| (p, &originals[p]))
            .filter(|(p, f)| !out.data_after.contains_key(*p) && out.changed_deletes.iter().any(|d| delete_applies(d, f)))
            .map(|(p, _)| p.clone())
            .collect();
        data.sort();
        let lowest = live
            .data
            .iter()
            .filter(|(p, _)| data.contains(p))
            .map(|(_, f)| f.seq)
            .chain(out.data_after.values().map(|f| f.seq))
            .min()
            .unwrap_or(i64::MAX);
        let mut deletes: Vec<String> = live.deletes.values().filter(|d| d.seq >= lowest).map(|d| d.path().to_string()).collect();
        deletes.sort();
        (data, deletes)
    }

    /// Random histories of files coming and going, each step with random changed deletes (equality deletes of all
    /// kinds of bounds, position deletes naming a file or not): what the orderings find is what trying every live
    /// file finds, and the indexes stay in step with the set.
    #[test]
    fn what_a_delete_reaches_is_what_trying_every_live_file_gives() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut narrowed = 0;
        for round in 0..40 {
            let mut live = keyed();
            let mut originals = HashMap::new();
            let mut next = 0;
            for step in 0..30i64 {
                // files come and go as a snapshot's own manifests say
                let mut own = SnapshotFiles::default();
                for _ in 0..rng.below(6) {
                    next += 1;
                    let f = entry(DataContentType::Data, &format!("d{next}"), bounds(&mut rng), nulls(&mut rng), step);
                    originals.insert(f.path().to_string(), f.clone());
                    own.data_after.insert(f.path().to_string(), f);
                }
                let paths: Vec<String> = live.data.keys().cloned().collect();
                for p in paths.iter().filter(|_| rng.below(10) == 0) {
                    own.data_before.insert(p.clone(), live.data[p].clone());
                }
                for d in live.deletes.values().filter(|_| rng.below(6) == 0) {
                    own.deletes_before.push(d.clone());
                }
                for _ in 0..rng.below(3) {
                    next += 1;
                    own.deletes_after.push(entry(DataContentType::EqualityDeletes, &format!("e{next}"), bounds(&mut rng), nulls(&mut rng), step));
                }
                live.advance(&own);
                // this snapshot's changed deletes
                let mut out = SnapshotFiles::default();
                let mut data: Vec<&String> = live.data.keys().collect();
                data.sort();
                for _ in 0..1 + rng.below(3) {
                    next += 1;
                    let d = match rng.below(6) {
                        0 if !data.is_empty() => {
                            let target = data[rng.below(data.len() as u64) as usize];
                            position_delete(&format!("p{next}"), Some(target), None, step + 1)
                        }
                        1 if !data.is_empty() => {
                            let target = data[rng.below(data.len() as u64) as usize];
                            position_delete(&format!("p{next}"), None, Some((target, target)), step + 1)
                        }
                        2 => position_delete(&format!("p{next}"), None, Some(("d1", "d9")), step + 1),
                        _ => entry(DataContentType::EqualityDeletes, &format!("e{next}"), bounds(&mut rng), nulls(&mut rng), step + 1),
                    };
                    out.changed_deletes.push(d);
                }
                assert!(live.keeps_bounds_for(&out.changed_deletes));
                let expected = by_trying_all(&live, &originals, &out);
                narrowed += usize::from(live.reach(&out.changed_deletes).is_some_and(|r| r.len() < live.data.len()));
                live.add_older_to(&mut out);
                let mut data: Vec<String> = out.data_after.keys().cloned().collect();
                data.sort();
                let mut deletes: Vec<String> = out.deletes_after.iter().map(|d| d.path().to_string()).collect();
                deletes.sort();
                assert_eq!((data, deletes), expected, "round {round}, step {step}");
                for index in live.keys.values() {
                    assert_eq!(index.by_upper.len() + index.aside.len(), live.data.len(), "the index holds every live data file");
                }
                assert_eq!(live.deletes_by_seq.len(), live.deletes.len());
                for f in live.data.values() {
                    assert!(f.file.lower_bounds().keys().all(|id| *id == 1) && f.file.column_sizes().is_empty(), "only field 1's bounds are kept");
                }
            }
            // what a set counts is what its files add up to, and nothing once they are gone
            let counted = live.bytes();
            let mut again = keyed();
            for (p, f) in &live.data {
                again.insert_data(p, f);
            }
            for d in live.deletes.values() {
                again.insert_delete(d);
            }
            assert_eq!(
                (again.bytes(), again.entry_bytes),
                (counted - (live.keys.len() as u64 * (live.data.len() as u64 * INDEX_BYTES + live.data_path_bytes)), live.entry_bytes)
            );
            let everything = SnapshotFiles {
                data_before: live.data.iter().map(|(p, f)| (p.clone(), f.clone())).collect(),
                deletes_before: live.deletes.values().cloned().collect(),
                ..Default::default()
            };
            live.advance(&everything);
            assert_eq!((live.bytes(), live.data_path_bytes), (0, 0), "round {round}");
        }
        assert!(narrowed > 300, "the orderings narrowed what is tried in {narrowed} steps");
    }

    /// Files appended with growing keys, an equality delete of recent keys: the index yields the files whose
    /// ranges meet the delete's (and those aside), not the history.
    #[test]
    fn an_equality_delete_of_recent_keys_reaches_only_the_recent_files() {
        let mut live = keyed();
        for i in 0..10_000i64 {
            let f = entry(DataContentType::Data, &format!("d{i}"), Some((Datum::long(i * 50), Datum::long(i * 50 + 49))), Some(0), i);
            live.insert_data(f.path(), &f);
        }
        let aside = entry(DataContentType::Data, "no-stats", None, None, 1);
        live.insert_data("no-stats", &aside);
        let d = entry(DataContentType::EqualityDeletes, "e", Some((Datum::long(499_930), Datum::long(499_960))), Some(0), 10_001);
        let mut reach: Vec<String> = live.reach(&[d]).unwrap().into_iter().collect();
        reach.sort();
        assert_eq!(reach, ["d9998", "d9999", "no-stats"]);
        // a delete with bounds of another type than the index's reaches every file
        let other = entry(DataContentType::EqualityDeletes, "e2", Some((Datum::int(1), Datum::int(2))), Some(0), 10_002);
        assert!(live.reach(&[other]).is_none());
        // bounds the index cannot order (a float field) build no index
        let mut floats = keyed();
        floats.insert_data("no-stats", &aside);
        let f = entry(DataContentType::EqualityDeletes, "e3", Some((Datum::double(1.0), Datum::double(2.0))), Some(0), 2);
        assert!(floats.reach(&[f]).is_none() && floats.keys.is_empty());
    }

    #[test]
    fn live_file_sets_are_handed_over_and_the_one_kept_longest_ago_goes_first() {
        let set = |files: usize| {
            let mut live = LiveFiles::default();
            for i in 0..files {
                let mut b = DataFileBuilder::default();
                b.content(DataContentType::Data)
                    .file_path(format!("f{i}"))
                    .file_format(DataFileFormat::Parquet)
                    .record_count(1)
                    .file_size_in_bytes(1);
                let f = FileEntry { file: b.build().unwrap(), seq: 1, spec_id: 0, unpartitioned: true, first_row_id: None };
                live.insert_data(&format!("f{i}"), &Arc::new(f));
            }
            live
        };
        let key = |t: &str, s: i64| (t.to_string(), s);
        let mut sets = LiveSets::default();
        assert_eq!(set(2).bytes(), 2 * set(1).bytes());
        let limit = 5 * set(1).bytes();
        let file = set(1).bytes();
        sets.keep(key("a", 1), set(2), limit);
        sets.keep(key("b", 1), set(2), limit);
        assert_eq!(sets.bytes, 4 * file);
        // a's next snapshot: its parent's set taken out and kept again, now the most recent
        let a = sets.take(&key("a", 1)).expect("a's set");
        assert!(sets.take(&key("a", 1)).is_none(), "taken sets are gone");
        sets.keep(key("a", 2), a, limit);
        // one more set over the limit: b, kept longest ago, goes; a stays
        sets.keep(key("c", 1), set(2), limit);
        assert_eq!(sets.bytes, 4 * file);
        assert!(sets.take(&key("b", 1)).is_none());
        assert_eq!(sets.take(&key("a", 2)).map(|l| l.data.len()), Some(2));
        // a set kept again under the same key replaces the old one's bytes
        sets.keep(key("c", 1), set(3), limit);
        assert_eq!(sets.bytes, 3 * file);
    }
}

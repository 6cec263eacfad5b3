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
//! Invariant: these orderings only narrow what is tried. Every data file they yield is still judged by
//! [`delete_applies`], and none they leave out could pass it, so a plan is the same as by trying every file.
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use iceberg::spec::{DataContentType, Datum, PrimitiveLiteral, PrimitiveType, SnapshotRef};
use iceberg::table::Table;

use super::files::{delete_applies, FileEntry, SnapshotFiles, CACHE_BYTES};

/// What a file entry takes in memory, as the caches estimate it (its stats, path and map slot).
pub(super) const FILE_BYTES: u64 = 512;

/// What a file takes in one [`KeyIndex`] (its path again, two bounds, tree slots).
const INDEX_BYTES: u64 = 160;

type ByPath = HashMap<String, Arc<FileEntry>, ahash::RandomState>;

/// The live files of one snapshot of a table, with orderings that find what a delete can reach (see the module
/// header). Kept process-wide within a size as large as the manifest cache's (a sixteenth of `memory_budget`), the
/// set kept longest ago out first. A table whose live files would take more than a quarter of it gets none; a
/// snapshot without one is planned from the manifests.
#[derive(Debug, Default)]
pub(crate) struct LiveFiles {
    data: ByPath,
    deletes: ByPath,
    /// `deletes` by (data sequence number, path).
    deletes_by_seq: BTreeSet<(i64, String)>,
    /// `data` by the bounds of each equality field id a delete has named.
    keys: HashMap<i32, KeyIndex>,
}

impl LiveFiles {
    /// Keeps the live files after `snapshot` from its full plan when they fit the cache (a table too large for it
    /// is planned from its manifests, as before).
    pub(super) fn remember(table: &Table, snapshot: &SnapshotRef, full: &SnapshotFiles) {
        if Self::would_fit(snapshot) {
            let mut live = LiveFiles::default();
            for (p, f) in &full.data_after {
                live.insert_data(p, f);
            }
            for d in &full.deletes_after {
                live.insert_delete(d);
            }
            Self::keep(table, snapshot.snapshot_id(), live);
        }
    }

    /// Whether the live files of `snapshot` (by its summary's totals) take at most a quarter of the cache.
    pub(super) fn would_fit(snapshot: &SnapshotRef) -> bool {
        let total = |k: &str| snapshot.summary().additional_properties.get(k).and_then(|v| v.parse::<u64>().ok());
        match (total("total-data-files"), total("total-delete-files")) {
            (Some(data), deletes) => (data + deletes.unwrap_or(0)) * FILE_BYTES * 4 <= CACHE_BYTES.load(std::sync::atomic::Ordering::Relaxed),
            (None, _) => false,
        }
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

    fn insert_data(&mut self, path: &str, f: &Arc<FileEntry>) {
        self.remove_data(path);
        for index in self.keys.values_mut() {
            index.insert(path, f);
        }
        self.data.insert(path.to_string(), f.clone());
    }

    fn remove_data(&mut self, path: &str) {
        if let Some(f) = self.data.remove(path) {
            for index in self.keys.values_mut() {
                index.remove(path, &f);
            }
        }
    }

    fn insert_delete(&mut self, d: &Arc<FileEntry>) {
        self.remove_delete(d.path());
        self.deletes_by_seq.insert((d.seq, d.path().to_string()));
        self.deletes.insert(d.path().to_string(), d.clone());
    }

    fn remove_delete(&mut self, path: &str) {
        if let Some(d) = self.deletes.remove(path) {
            self.deletes_by_seq.remove(&(d.seq, path.to_string()));
        }
    }

    /// What this set takes in memory, as the budget counts it ([`FILE_BYTES`] a file, [`INDEX_BYTES`] a file in
    /// each index).
    fn bytes(&self) -> u64 {
        (self.data.len() + self.deletes.len()) as u64 * FILE_BYTES + (self.keys.len() * self.data.len()) as u64 * INDEX_BYTES
    }

    /// The process's live-file sets by (table uuid, snapshot id), each with the tick it was last kept at. A plain map
    /// under a mutex (held for a lookup, never across an await): a set is moved out and back in, never copied.
    fn sets() -> &'static std::sync::Mutex<LiveSets> {
        static LIVE: std::sync::OnceLock<std::sync::Mutex<LiveSets>> = std::sync::OnceLock::new();
        LIVE.get_or_init(Default::default)
    }

    /// Keeps `live` as the live files of `snapshot` (see [`LiveSets::keep`]).
    pub(super) fn keep(table: &Table, snapshot: i64, live: LiveFiles) {
        let limit = CACHE_BYTES.load(std::sync::atomic::Ordering::Relaxed);
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

    /// A file entry: `bounds` of field 1 (lower, upper), its null count, sequence number `seq`.
    fn entry(content: DataContentType, path: &str, bounds: Option<(Datum, Datum)>, nulls: Option<u64>, seq: i64) -> Arc<FileEntry> {
        let mut b = DataFileBuilder::default();
        b.content(content).file_path(path.to_string()).file_format(DataFileFormat::Parquet).record_count(10).file_size_in_bytes(100);
        if let Some((lo, hi)) = bounds {
            b.lower_bounds(HashMap::from([(1, lo)])).upper_bounds(HashMap::from([(1, hi)]));
        }
        b.null_value_counts(nulls.map(|n| HashMap::from([(1, n)])).unwrap_or_default());
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
    fn by_trying_all(live: &LiveFiles, out: &SnapshotFiles) -> (Vec<String>, Vec<String>) {
        let mut data: Vec<String> = live
            .data
            .iter()
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
            let mut live = LiveFiles::default();
            let mut next = 0;
            for step in 0..30i64 {
                // files come and go as a snapshot's own manifests say
                let mut own = SnapshotFiles::default();
                for _ in 0..rng.below(6) {
                    next += 1;
                    let f = entry(DataContentType::Data, &format!("d{next}"), bounds(&mut rng), nulls(&mut rng), step);
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
                let expected = by_trying_all(&live, &out);
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
            }
        }
        assert!(narrowed > 300, "the orderings narrowed what is tried in {narrowed} steps");
    }

    /// Files appended with growing keys, an equality delete of recent keys: the index yields the files whose
    /// ranges meet the delete's (and those aside), not the history.
    #[test]
    fn an_equality_delete_of_recent_keys_reaches_only_the_recent_files() {
        let mut live = LiveFiles::default();
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
        let mut floats = LiveFiles::default();
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
                live.data.insert(format!("f{i}"), Arc::new(f));
            }
            live
        };
        let key = |t: &str, s: i64| (t.to_string(), s);
        let mut sets = LiveSets::default();
        let limit = 5 * FILE_BYTES;
        sets.keep(key("a", 1), set(2), limit);
        sets.keep(key("b", 1), set(2), limit);
        assert_eq!(sets.bytes, 4 * FILE_BYTES);
        // a's next snapshot: its parent's set taken out and kept again, now the most recent
        let a = sets.take(&key("a", 1)).expect("a's set");
        assert!(sets.take(&key("a", 1)).is_none(), "taken sets are gone");
        sets.keep(key("a", 2), a, limit);
        // one more set over the limit: b, kept longest ago, goes; a stays
        sets.keep(key("c", 1), set(2), limit);
        assert_eq!(sets.bytes, 4 * FILE_BYTES);
        assert!(sets.take(&key("b", 1)).is_none());
        assert_eq!(sets.take(&key("a", 2)).map(|l| l.data.len()), Some(2));
        // a set kept again under the same key replaces the old one's bytes
        sets.keep(key("c", 1), set(3), limit);
        assert_eq!(sets.bytes, 3 * FILE_BYTES);
    }
}

//! Per-snapshot file planning from one snapshot's manifests.
//!
//! A snapshot's manifests list its live files plus, with status DELETED, the files it removed. So the file sets
//! before (at the parent) and after the snapshot both follow from the snapshot alone — an expired parent does not
//! matter:  before = live-and-not-added ∪ removed,  after = live.
//!
//! [`plan`] reads every manifest (all live files); [`plan_changes`] reads only what a changelog of the snapshot
//! needs — the manifests it wrote, and older ones only where its deletes can reach — so following one small commit
//! costs the same however long the table's history and however many unmerged manifests it left. Where its deletes
//! reach many older manifests, it reads them all once and keeps the live files they give ([`LiveFiles`]); each later
//! snapshot derives its own from its parent's and its own manifests, reads no older manifest, and decodes only its
//! own entries of its manifest list.
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use iceberg::spec::{
    DataContentType, DataFile, Datum, FieldSummary, Literal, Manifest, ManifestContentType, ManifestFile, ManifestStatus, PrimitiveType, SnapshotRef,
    Struct, StructType,
};
use iceberg::table::Table;

use super::live::LiveFiles;
use crate::error::{Error, Result};

/// One file as the planner sees it.
#[derive(Debug, Clone)]
pub struct FileEntry {
    pub file: DataFile,
    /// Data sequence number (inherited from the manifest when the entry left it null).
    pub seq: i64,
    pub spec_id: i32,
    /// Whether `spec_id` is an unpartitioned spec (equality deletes then apply globally).
    pub unpartitioned: bool,
    /// The `_row_id` of the file's first row (format v3 row lineage; inherited from the manifest when the entry left
    /// it null): a row not stored with one has this plus its position. `None` outside v3 and for delete files.
    pub first_row_id: Option<i64>,
}

impl FileEntry {
    pub fn path(&self) -> &str {
        self.file.file_path()
    }
    pub fn partition(&self) -> &Struct {
        self.file.partition()
    }
    pub fn is_dv(&self) -> bool {
        self.file.content_type() == DataContentType::PositionDeletes && self.file.content_offset().is_some()
    }
}

#[derive(Debug, Default)]
pub struct SnapshotFiles {
    /// Data files live after the snapshot.
    pub data_after: HashMap<String, Arc<FileEntry>>,
    /// Data files live before the snapshot.
    pub data_before: HashMap<String, Arc<FileEntry>>,
    pub deletes_after: Vec<Arc<FileEntry>>,
    pub deletes_before: Vec<Arc<FileEntry>>,
    /// Delete files added or removed by this snapshot.
    pub changed_deletes: Vec<Arc<FileEntry>>,
    pub added_data: usize,
    pub removed_data: usize,
    /// Delete files among `changed_deletes` that the snapshot added (the rest it removed).
    pub added_deletes: usize,
    /// Manifests read to plan it.
    pub manifests_read: usize,
}

impl SnapshotFiles {
    /// The delete files of each state that apply to `f` (before, after), in plan order. The deletes both states
    /// list last — the same entries, those older than the snapshot — are tried once for both: in an upsert stream
    /// that is a delete per later commit, for each file a snapshot touches.
    pub fn deletes_applying(&self, f: &FileEntry) -> (Vec<Arc<FileEntry>>, Vec<Arc<FileEntry>>) {
        let (b, a) = (&self.deletes_before, &self.deletes_after);
        let shared = b.iter().rev().zip(a.iter().rev()).take_while(|(x, y)| Arc::ptr_eq(x, y)).count();
        let pick = |v: &[Arc<FileEntry>]| -> Vec<Arc<FileEntry>> { v.iter().filter(|d| delete_applies(d, f)).cloned().collect() };
        let tail = pick(&b[b.len() - shared..]);
        let (mut before, mut after) = (pick(&b[..b.len() - shared]), pick(&a[..a.len() - shared]));
        before.extend(tail.iter().cloned());
        after.extend(tail);
        (before, after)
    }
}

/// Every file of `snapshot`: all its manifests read (a compaction, a bootstrap copy, a target's position lookups).
pub async fn plan(table: &Table, snapshot: &SnapshotRef, concurrency: usize) -> Result<SnapshotFiles> {
    let list = manifest_list(table, snapshot).await?;
    let mut out = SnapshotFiles { manifests_read: list.len(), ..Default::default() };
    for (mf, manifest) in load(table, list.to_vec(), concurrency).await? {
        add_entries(&mut out, table, &mf, &manifest, snapshot.snapshot_id(), None)?;
    }
    Ok(out)
}

/// The files a changelog of `snapshot` needs, read from as few manifests as that allows (the cost of a snapshot
/// then follows what it changed, not the table's history):
///
/// 1. the manifests the snapshot wrote (`added_snapshot_id`): by the spec, the only ones holding the files it added
///    or removed (status ADDED/DELETED with its id);
/// 2. when it added or removed delete files, the older data manifests whose partition bounds can hold a file one of
///    them applies to (a global equality delete: every older data manifest);
/// 3. the older delete manifests that can hold a delete applying to a file of 1–2: added at a sequence number at or
///    above the lowest data sequence number among those files (a delete applies only to data not newer than it).
///
/// Complete for every data file whose live rows the snapshot can change, with every delete file that applies to
/// one; other live files are left out. When the snapshot's summary counts disagree with what its own manifests
/// hold (a writer that reused another snapshot's manifests), every manifest is read, as [`plan`] does.
///
/// Steps 2–3 read no manifest when the live files of the snapshot's parent are known ([`LiveFiles`]): the older
/// manifests hold exactly the parent's live files that the snapshot's own manifests do not list.
pub async fn plan_changes(table: &Table, snapshot: &SnapshotRef, concurrency: usize) -> Result<SnapshotFiles> {
    let sid = snapshot.snapshot_id();
    // the parent's live files, when known, stand for every older manifest: of the list, only the snapshot's own
    // entries are decoded
    let parent = snapshot.parent_snapshot_id().and_then(|p| LiveFiles::take(table, p));
    let list = match parent {
        Some(_) => None,
        None => Some(manifest_list(table, snapshot).await?),
    };
    let (own, older): (Vec<ManifestFile>, Vec<&ManifestFile>) = match &list {
        None => (crate::spec::manifest_list::read_own(table.file_io(), snapshot, table.metadata().format_version()).await?, Vec::new()),
        Some(list) => {
            let (own, older): (Vec<&ManifestFile>, Vec<_>) = list.iter().partition(|mf| mf.added_snapshot_id == sid);
            (own.into_iter().cloned().collect(), older)
        }
    };
    let mut out = SnapshotFiles { manifests_read: own.len(), ..Default::default() };
    for (mf, manifest) in load(table, own, concurrency).await? {
        add_entries(&mut out, table, &mf, &manifest, sid, None)?;
    }
    if !summary_agrees(snapshot, &out) {
        tracing::debug!(snapshot = sid, "the snapshot's own manifests do not hold what its summary counts; reading every manifest");
        return plan_learning_live(table, snapshot, concurrency).await;
    }
    if let Some(mut live) = parent {
        if !live.keeps_bounds_for(&out.changed_deletes) {
            // a delete compares a field whose bounds the set left out: learn the live files again, with it
            return plan_learning_live(table, snapshot, concurrency).await;
        }
        // the parent's set becomes the snapshot's, changed in place (another loop at the same parent meanwhile plans
        // from the manifests)
        live.advance(&out);
        live.add_older_to(&mut out);
        LiveFiles::keep(table, sid, live);
        return Ok(out);
    }
    if !out.changed_deletes.is_empty() && older.len() > LIVE_FILES_AFTER && LiveFiles::would_fit(table, snapshot) {
        // the older manifests would be read anyway: read them all once, and the next snapshots read none
        return plan_learning_live(table, snapshot, concurrency).await;
    }
    let (data, deletes): (Vec<_>, Vec<_>) = older.into_iter().partition(|mf| mf.content == ManifestContentType::Data);
    if !out.changed_deletes.is_empty() {
        let meta = table.metadata();
        let wanted: Vec<_> = data.into_iter().filter(|mf| out.changed_deletes.iter().any(|d| may_hold_applicable(meta, mf, d))).cloned().collect();
        out.manifests_read += wanted.len();
        // of these older files, only those a changed delete applies to can change (the others are left out before
        // anything of them is copied: a global equality delete reaches every manifest, rarely every file)
        let changed = out.changed_deletes.clone();
        for (mf, manifest) in load(table, wanted, concurrency).await? {
            add_entries(&mut out, table, &mf, &manifest, sid, Some(&changed))?;
        }
    }
    let Some(lowest) = out.data_before.values().chain(out.data_after.values()).map(|f| f.seq).min() else { return Ok(out) };
    let wanted: Vec<_> = deletes.into_iter().filter(|mf| mf.sequence_number >= lowest).cloned().collect();
    out.manifests_read += wanted.len();
    for (mf, manifest) in load(table, wanted, concurrency).await? {
        add_entries(&mut out, table, &mf, &manifest, sid, None)?;
    }
    Ok(out)
}

/// Every file of `snapshot` ([`plan`]), its live files then kept for the snapshots after it ([`LiveFiles`]).
async fn plan_learning_live(table: &Table, snapshot: &SnapshotRef, concurrency: usize) -> Result<SnapshotFiles> {
    let full = plan(table, snapshot, concurrency).await?;
    LiveFiles::remember(table, snapshot, &full);
    Ok(full)
}

/// Keeps the live files a full plan of `snapshot` found (see [`LiveFiles`]) when the table has more manifests than
/// a delete's plan would read one by one: a bootstrap copy reads them all anyway, and the snapshots after it then
/// read no older manifest — not even at the first delete, which would otherwise read them all again.
pub(crate) fn remember_live(table: &Table, snapshot: &SnapshotRef, full: &SnapshotFiles) {
    if full.manifests_read > LIVE_FILES_AFTER {
        LiveFiles::remember(table, snapshot, full);
    }
}

/// Older manifests a snapshot's deletes must reach beyond which its plan reads every manifest once to learn the
/// table's live files ([`LiveFiles`]), so that the snapshots after it read none.
const LIVE_FILES_AFTER: usize = 16;

/// Whether the files a snapshot added and removed, as its own manifests hold them, match the counts its summary
/// gives (where it gives them; writers leave zero counts out).
fn summary_agrees(snapshot: &SnapshotRef, out: &SnapshotFiles) -> bool {
    let props = &snapshot.summary().additional_properties;
    let count = |k: &str| props.get(k).and_then(|v| v.parse::<usize>().ok());
    [
        ("added-data-files", out.added_data),
        ("deleted-data-files", out.removed_data),
        ("added-delete-files", out.added_deletes),
        ("removed-delete-files", out.changed_deletes.len() - out.added_deletes),
    ]
    .into_iter()
    .all(|(k, n)| count(k).is_none_or(|c| c == n))
}

/// Whether data manifest `mf` can hold a file that delete file `d` applies to, judged by the partition bounds the
/// manifest list gives: always, unless both share a partitioned spec and a partition value of `d` lies outside
/// the manifest's bounds for that field.
fn may_hold_applicable(meta: &iceberg::spec::TableMetadata, mf: &ManifestFile, d: &FileEntry) -> bool {
    if d.unpartitioned || d.spec_id != mf.partition_spec_id {
        return true;
    }
    let (Some(summaries), Some(spec)) = (&mf.partitions, meta.partition_spec_by_id(mf.partition_spec_id)) else { return true };
    let Ok(partition_type) = spec.partition_type(meta.current_schema()) else { return true };
    partition_may_hold(&partition_type, summaries, d.partition())
}

/// Whether a manifest whose partition field summaries are `summaries` (of `partition_type`) can hold a file of
/// partition `value`: no field's value lies outside its bounds (a null needs `contains_null`); bounds that do not
/// decode never rule a manifest out.
fn partition_may_hold(partition_type: &StructType, summaries: &[FieldSummary], value: &Struct) -> bool {
    partition_type.fields().iter().zip(summaries).enumerate().all(|(i, (field, summary))| {
        let Some(ty) = field.field_type.as_primitive_type() else { return true };
        match value.fields().get(i) {
            None | Some(None) => summary.contains_null,
            Some(Some(Literal::Primitive(v))) => {
                let bound = |b: &Option<iceberg::spec::ByteBuf>| b.as_ref().and_then(|b| Datum::try_from_bytes(b, ty.clone()).ok());
                let below = bound(&summary.lower_bound).is_some_and(|lo| v.partial_cmp(lo.literal()) == Some(Ordering::Less));
                let above = bound(&summary.upper_bound).is_some_and(|hi| v.partial_cmp(hi.literal()) == Some(Ordering::Greater));
                !(below || above)
            }
            Some(Some(_)) => true,
        }
    })
}

/// The manifests `snapshot`'s manifest list names ([`crate::spec::manifest_list`]: decoded lean, cached by path).
async fn manifest_list(table: &Table, snapshot: &SnapshotRef) -> Result<Arc<Vec<ManifestFile>>> {
    crate::spec::manifest_list::read(table.file_io(), snapshot, table.metadata().format_version()).await
}

/// Reads `manifests`, `concurrency` at a time, through the process's cache of parsed manifests ([`cached`]).
async fn load(table: &Table, manifests: Vec<ManifestFile>, concurrency: usize) -> Result<Vec<(ManifestFile, Arc<Manifest>)>> {
    let file_io = table.file_io().clone();
    futures::stream::iter(manifests.into_iter().map(|mf| {
        let file_io = file_io.clone();
        async move {
            let m = manifest(&file_io, &mf).await?;
            Ok::<_, Error>((mf, m))
        }
    }))
    .buffer_unordered(concurrency.max(1))
    .try_collect()
    .await
}

/// The parsed manifest `mf` names, from the process's cache ([`cached`]) or read and parsed once.
pub(crate) async fn manifest(file_io: &iceberg::io::FileIO, mf: &ManifestFile) -> Result<Arc<Manifest>> {
    let path = mf.manifest_path.clone();
    cached()
        .try_get_with(path.clone(), async { crate::spec::manifest::load(file_io, mf).await.map(Arc::new) })
        .await
        .map_err(|e| Error::data_from(path, e))
}

/// Bytes of parsed manifests the process keeps ([`size_manifest_cache`]); 16 MiB until sized.
static CACHE_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(16 << 20);
/// What a manifest entry takes beside its data file: status, snapshot id, sequence numbers, `Arc` counts.
const ENTRY_BYTES: u64 = 64;
/// What a parsed manifest takes beside its entries: its schema, partition spec and their maps.
const MANIFEST_BYTES: u64 = 2048;
static CACHE: std::sync::OnceLock<moka::future::Cache<String, Arc<Manifest>>> = std::sync::OnceLock::new();

/// Sizes the cache of parsed manifests to a sixteenth of `memory_budget` and the live-file sets to an eighth
/// ([`super::live::size`]); effective only before the first manifest is read (the service and `cdc sync` call it
/// once the configuration is loaded).
pub fn size_manifest_cache(memory_budget: u64) {
    CACHE_BYTES.store((memory_budget / 16).max(1 << 20), std::sync::atomic::Ordering::Relaxed);
    super::live::size(memory_budget);
}

/// The process's parsed manifests, by path, least recently used out first. A manifest file never changes once
/// written (a new one gets a new name), so an entry never goes stale; a poll that reads the manifests it read
/// before — the unmerged manifests an equality delete can reach, a compaction's plan — decodes none of them again.
fn cached() -> &'static moka::future::Cache<String, Arc<Manifest>> {
    CACHE.get_or_init(|| {
        moka::future::Cache::builder()
            .weigher(|path: &String, m: &Arc<Manifest>| {
                // what the allocator holds for it: each entry (its data file as `heap_bytes` counts it, the entry's
                // own fields and `Arc`), and the manifest's schema and spec
                let entries: u64 = m.entries().iter().map(|e| ENTRY_BYTES + crate::spec::data_file::heap_bytes(e.data_file())).sum();
                u32::try_from(path.len() as u64 + MANIFEST_BYTES + entries).unwrap_or(u32::MAX)
            })
            .max_capacity(CACHE_BYTES.load(std::sync::atomic::Ordering::Relaxed))
            .build()
    })
}

/// Adds the entries of one manifest of snapshot `sid` to `out`: whether each file is live before and after `sid`.
/// Adds the entries of `manifest` (listed as `mf`) to `out`, as of snapshot `sid`. With `changed_by`, data files none
/// of those deletes applies to are left out (their live rows cannot change).
fn add_entries(
    out: &mut SnapshotFiles,
    table: &Table,
    mf: &ManifestFile,
    manifest: &Manifest,
    sid: i64,
    changed_by: Option<&[Arc<FileEntry>]>,
) -> Result<()> {
    let meta = table.metadata();
    let spec_id = mf.partition_spec_id;
    let unpartitioned = meta.partition_spec_by_id(spec_id).map(|s| s.is_unpartitioned()).unwrap_or(true);
    let row_ids = crate::spec::row_lineage::first_row_ids(meta.format_version(), mf, manifest);
    for (entry, first_row_id) in manifest.entries().iter().zip(row_ids) {
        let seq = entry
            .sequence_number()
            .ok_or_else(|| Error::data(entry.file_path(), "manifest entry has no sequence number (v1 tables are not supported)"))?;
        let is_data = entry.content_type() == DataContentType::Data;
        if is_data && changed_by.is_some_and(|ds| !ds.iter().any(|d| applies(d, entry.data_file(), seq, spec_id))) {
            continue;
        }
        check_format(entry.data_file())?;
        let fe = Arc::new(FileEntry { file: entry.data_file().clone(), seq, spec_id, unpartitioned, first_row_id });
        let (before, after) = match entry.status() {
            ManifestStatus::Deleted if entry.snapshot_id() == Some(sid) => (true, false),
            ManifestStatus::Deleted => continue, // removed by an earlier snapshot
            ManifestStatus::Added if entry.snapshot_id() == Some(sid) => (false, true),
            _ => (true, true),
        };
        if is_data {
            if before {
                out.data_before.insert(fe.path().to_string(), fe.clone());
            }
            if after {
                out.data_after.insert(fe.path().to_string(), fe.clone());
            }
            out.added_data += (after && !before) as usize;
            out.removed_data += (before && !after) as usize;
        } else {
            if before {
                out.deletes_before.push(fe.clone());
            }
            if after {
                out.deletes_after.push(fe.clone());
            }
            if before != after {
                out.added_deletes += after as usize;
                out.changed_deletes.push(fe);
            }
        }
    }
    Ok(())
}

impl SnapshotFiles {
    /// Data files whose live rows may differ before and after the snapshot, by path.
    pub fn touched(&self) -> Vec<Arc<FileEntry>> {
        let mut out: HashMap<&str, Arc<FileEntry>> = HashMap::new();
        for (p, f) in &self.data_after {
            if !self.data_before.contains_key(p) {
                out.insert(p, f.clone());
            }
        }
        for (p, f) in &self.data_before {
            if !self.data_after.contains_key(p) {
                out.insert(p, f.clone());
            }
        }
        if !self.changed_deletes.is_empty() {
            for (p, f) in &self.data_before {
                if self.data_after.contains_key(p) && self.changed_deletes.iter().any(|d| delete_applies(d, f)) {
                    out.insert(p, f.clone());
                }
            }
        }
        let mut v: Vec<_> = out.into_values().collect();
        v.sort_by(|a, b| a.path().cmp(b.path()));
        v
    }
}

/// Refuses a file `cdc` cannot read, naming its format and content, before anything reads it and calls it corrupt:
/// Parquet, ORC and Avro data and delete files, and deletion vectors in Puffin files, are read; anything else
/// (a Puffin file given as equality deletes, a format this build does not know) is not.
fn check_format(f: &DataFile) -> Result<()> {
    use iceberg::spec::DataFileFormat;
    match (f.file_format(), f.content_type()) {
        (DataFileFormat::Parquet | DataFileFormat::Orc | DataFileFormat::Avro, _) | (DataFileFormat::Puffin, DataContentType::PositionDeletes) => {
            Ok(())
        }
        (format, content) => Err(Error::UnsupportedFormat {
            path: f.file_path().to_string(),
            format: format!("{format:?}").to_uppercase(),
            content: match content {
                DataContentType::Data => "data",
                DataContentType::PositionDeletes => "position deletes",
                DataContentType::EqualityDeletes => "equality deletes",
            }
            .to_string(),
        }),
    }
}

/// Whether a delete file applies to a data file, by the spec's sequence-number and partition rules.
pub fn delete_applies(delete: &FileEntry, data: &FileEntry) -> bool {
    applies(delete, &data.file, data.seq, data.spec_id)
}

/// [`delete_applies`] to data file `data` of data sequence number `seq` and partition spec `spec_id`.
fn applies(delete: &FileEntry, data: &DataFile, seq: i64, spec_id: i32) -> bool {
    match delete.file.content_type() {
        DataContentType::PositionDeletes => {
            if delete.seq < seq {
                return false;
            }
            match delete.file.referenced_data_file() {
                Some(r) => r == data.file_path(),
                // A v2 position-delete file may hold several data files: same partition, within the bounds of its
                // `file_path` column, checked by path later.
                None => delete.spec_id == spec_id && delete.partition() == data.partition() && path_within_bounds(&delete.file, data.file_path()),
            }
        }
        DataContentType::EqualityDeletes => {
            delete.seq > seq
                && (delete.unpartitioned || (delete.spec_id == spec_id && delete.partition() == data.partition()))
                && equality_ranges_overlap(&delete.file, data)
        }
        DataContentType::Data => false,
    }
}

/// Whether `path` lies within the bounds of a position-delete file's `file_path` column (true when it has none).
/// Truncated bounds stay bounds: the lower one is a prefix, the upper one rounded up.
fn path_within_bounds(delete: &DataFile, path: &str) -> bool {
    let id = crate::spec::POS_DELETE_FILE_PATH_ID;
    let p = iceberg::spec::Datum::string(path);
    let below = delete.lower_bounds().get(&id).is_some_and(|lo| p.partial_cmp(lo) == Some(Ordering::Less));
    let above = delete.upper_bounds().get(&id).is_some_and(|hi| p.partial_cmp(hi) == Some(Ordering::Greater));
    !(below || above)
}

/// Whether an equality-delete file can match a row of a data file, judged by the column bounds and null counts of
/// their manifest entries (as Iceberg's own delete index judges it). It cannot when, for one of the compared columns,
/// the two value ranges are disjoint and no null can meet a null: a row must equal a delete row in every column. An
/// equality delete of recent keys then leaves the older files of the same partition (or, unpartitioned, of the
/// table) alone instead of costing a read of each. Missing bounds or counts, float columns (NaN lies outside
/// bounds) and bounds of different types (a promoted column) never rule a file out; truncated string bounds are
/// still bounds (the lower one is a prefix, the upper one rounded up).
pub(crate) fn equality_ranges_overlap(delete: &DataFile, data: &DataFile) -> bool {
    let Some(ids) = delete.equality_ids() else { return true };
    !ids.iter().any(|id| ranges_disjoint(delete, data, *id))
}

fn ranges_disjoint(delete: &DataFile, data: &DataFile, id: i32) -> bool {
    let no_null_meets_null = delete.null_value_counts().get(&id) == Some(&0) || data.null_value_counts().get(&id) == Some(&0);
    if !no_null_meets_null {
        return false;
    }
    fn bounds(f: &DataFile, id: i32) -> Option<(&Datum, &Datum)> {
        Some((f.lower_bounds().get(&id)?, f.upper_bounds().get(&id)?))
    }
    let (Some((del_lo, del_hi)), Some((lo, hi))) = (bounds(delete, id), bounds(data, id)) else {
        return false;
    };
    if matches!(del_lo.data_type(), PrimitiveType::Float | PrimitiveType::Double) {
        return false;
    }
    del_hi.partial_cmp(lo) == Some(Ordering::Less) || del_lo.partial_cmp(hi) == Some(Ordering::Greater)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::{DataFileBuilder, DataFileFormat, Datum};

    fn file(content: DataContentType, lo: Datum, hi: Datum, nulls: Option<u64>) -> DataFile {
        let mut b = DataFileBuilder::default();
        b.content(content)
            .file_path("f.parquet".to_string())
            .file_format(DataFileFormat::Parquet)
            .record_count(10)
            .file_size_in_bytes(100)
            .lower_bounds(HashMap::from([(1, lo)]))
            .upper_bounds(HashMap::from([(1, hi)]))
            .null_value_counts(nulls.map(|n| HashMap::from([(1, n)])).unwrap_or_default());
        if content == DataContentType::EqualityDeletes {
            b.equality_ids(Some(vec![1]));
        }
        b.build().unwrap()
    }

    /// The deletes applying to a file are those of each state filtered one by one, in the same order, whether the
    /// states share their last entries or not.
    #[test]
    fn deletes_applying_are_each_state_filtered() {
        let eq = |lo: i64, hi: i64, seq: i64| {
            let mut b = DataFileBuilder::default();
            b.content(DataContentType::EqualityDeletes)
                .file_path(format!("d-{lo}-{hi}-{seq}.parquet"))
                .file_format(DataFileFormat::Parquet)
                .record_count(1)
                .file_size_in_bytes(10)
                .lower_bounds(HashMap::from([(1, Datum::long(lo))]))
                .upper_bounds(HashMap::from([(1, Datum::long(hi))]))
                .null_value_counts(HashMap::from([(1, 0)]))
                .equality_ids(Some(vec![1]));
            let f = b.build().unwrap();
            Arc::new(FileEntry { file: f, seq, spec_id: 0, unpartitioned: true, first_row_id: None })
        };
        let data = FileEntry {
            file: file(DataContentType::Data, Datum::long(10), Datum::long(20), Some(0)),
            seq: 3,
            spec_id: 0,
            unpartitioned: true,
            first_row_id: None,
        };
        let older: Vec<_> = [(0, 5, 4), (12, 13, 4), (15, 30, 2), (19, 40, 9), (21, 22, 9)].map(|(lo, hi, s)| eq(lo, hi, s)).to_vec();
        let (removed, added) = (eq(11, 11, 5), eq(14, 14, 10));
        let mut plan = SnapshotFiles {
            deletes_before: std::iter::once(removed.clone()).chain(older.iter().cloned()).collect(),
            deletes_after: std::iter::once(added.clone()).chain(older.iter().cloned()).collect(),
            ..Default::default()
        };
        let one_by_one =
            |v: &[Arc<FileEntry>]| -> Vec<String> { v.iter().filter(|d| delete_applies(d, &data)).map(|d| d.path().to_string()).collect() };
        let paths = |v: Vec<Arc<FileEntry>>| -> Vec<String> { v.iter().map(|d| d.path().to_string()).collect() };
        for shared_tail in [true, false] {
            if !shared_tail {
                // the same files as other entries: nothing shared, each state filtered on its own
                plan.deletes_after = std::iter::once(added.clone()).chain(older.iter().map(|d| Arc::new((**d).clone()))).collect();
            }
            let (before, after) = plan.deletes_applying(&data);
            assert_eq!(paths(before), one_by_one(&plan.deletes_before));
            assert_eq!(paths(after), one_by_one(&plan.deletes_after));
        }
        assert_eq!(one_by_one(&plan.deletes_before), ["d-11-11-5.parquet", "d-12-13-4.parquet", "d-19-40-9.parquet"]);
    }

    #[test]
    fn a_position_delete_file_applies_only_within_its_file_path_bounds() {
        let id = crate::spec::POS_DELETE_FILE_PATH_ID;
        let entry = |file: DataFile, seq| FileEntry { file, seq, spec_id: 0, unpartitioned: true, first_row_id: None };
        let mut b = DataFileBuilder::default();
        b.content(DataContentType::PositionDeletes)
            .file_path("d.parquet".to_string())
            .file_format(DataFileFormat::Parquet)
            .record_count(2)
            .file_size_in_bytes(10)
            .lower_bounds(HashMap::from([(id, Datum::string("s3://b/t/data/c.parquet"))]))
            .upper_bounds(HashMap::from([(id, Datum::string("s3://b/t/data/f.parquet"))]));
        let del = entry(b.build().unwrap(), 5);
        let data = |p: &str| {
            let mut b = DataFileBuilder::default();
            b.content(DataContentType::Data).file_path(p.to_string()).file_format(DataFileFormat::Parquet).record_count(1).file_size_in_bytes(1);
            entry(b.build().unwrap(), 1)
        };
        assert!(delete_applies(&del, &data("s3://b/t/data/c.parquet")) && delete_applies(&del, &data("s3://b/t/data/e.parquet")));
        assert!(delete_applies(&del, &data("s3://b/t/data/f.parquet")));
        assert!(!delete_applies(&del, &data("s3://b/t/data/a.parquet")) && !delete_applies(&del, &data("s3://b/t/data/g.parquet")));
    }

    #[test]
    fn equality_deletes_skip_files_whose_key_range_they_miss() {
        let data = file(DataContentType::Data, Datum::long(100), Datum::long(200), Some(0));
        let del = |lo, hi, nulls| file(DataContentType::EqualityDeletes, Datum::long(lo), Datum::long(hi), nulls);
        assert!(!equality_ranges_overlap(&del(1, 99, Some(0)), &data), "below the file's range");
        assert!(!equality_ranges_overlap(&del(201, 300, Some(0)), &data), "above it");
        assert!(equality_ranges_overlap(&del(1, 100, Some(0)), &data), "touching its lower bound");
        assert!(equality_ranges_overlap(&del(200, 300, Some(0)), &data), "touching its upper bound");
        assert!(equality_ranges_overlap(&del(150, 150, Some(0)), &data), "inside");
        // a null key in the delete meets null keys of a file whose null count is unknown
        let unknown = file(DataContentType::Data, Datum::long(100), Datum::long(200), None);
        assert!(equality_ranges_overlap(&del(1, 5, Some(1)), &unknown));
        assert!(equality_ranges_overlap(&del(1, 5, None), &unknown));
        assert!(!equality_ranges_overlap(&del(1, 5, Some(0)), &unknown), "no null in the delete: the ranges decide");
        assert!(!equality_ranges_overlap(&del(1, 5, Some(3)), &data), "no null in the file: the ranges decide");
        // floats and mismatched types are never ruled out
        let fdata = file(DataContentType::Data, Datum::double(1.0), Datum::double(2.0), Some(0));
        let fdel = file(DataContentType::EqualityDeletes, Datum::double(5.0), Datum::double(6.0), Some(0));
        assert!(equality_ranges_overlap(&fdel, &fdata));
        let idel = file(DataContentType::EqualityDeletes, Datum::int(1), Datum::int(5), Some(0));
        assert!(equality_ranges_overlap(&idel, &data), "int bounds against long bounds: not comparable");
        // strings compare bytewise
        let sdata = file(DataContentType::Data, Datum::string("m"), Datum::string("p"), Some(0));
        let sdel = |lo: &str, hi: &str| file(DataContentType::EqualityDeletes, Datum::string(lo), Datum::string(hi), Some(0));
        assert!(!equality_ranges_overlap(&sdel("a", "lz"), &sdata));
        assert!(equality_ranges_overlap(&sdel("a", "m"), &sdata));
        assert!(!equality_ranges_overlap(&sdel("pa", "z"), &sdata));
    }

    /// What a changelog needs of a plan: the touched files, whether each is live before and after, and the delete
    /// files (by path) that apply to it in each state.
    /// A touched file's path, whether it is live before and after, and the deletes applying before and after.
    type Need = (String, bool, bool, Vec<String>, Vec<String>);

    fn needs(plan: &SnapshotFiles) -> Vec<Need> {
        plan.touched()
            .iter()
            .map(|f| {
                let applying = |ds: &[Arc<FileEntry>]| {
                    let mut v: Vec<String> = ds.iter().filter(|d| delete_applies(d, f)).map(|d| d.path().to_string()).collect();
                    v.sort();
                    v
                };
                let (before, after) = (plan.data_before.contains_key(f.path()), plan.data_after.contains_key(f.path()));
                (f.path().to_string(), before, after, applying(&plan.deletes_before), applying(&plan.deletes_after))
            })
            .collect()
    }

    /// The quickstart's demo table in a fresh sql catalog under `dir`.
    async fn demo(dir: &std::path::Path) -> (crate::catalog::Catalog, Table) {
        let cfg: crate::config::CatalogConfig = toml::from_str(&format!("type = \"sql\"\nwarehouse = \"{}\"\n", dir.join("wh").display())).unwrap();
        let catalog = crate::catalog::Catalog::connect(&cfg, "source").await.unwrap();
        let t = crate::quickstart::create_demo(&catalog).await.unwrap();
        (catalog, t)
    }

    /// `t` after an append of one row with `id`, in a manifest of its own.
    async fn append(catalog: &crate::catalog::Catalog, t: &Table, id: i64) -> Table {
        let b = crate::quickstart::orders_batch(t, &[(id, "append", 1)]).unwrap();
        let files = crate::sink::iceberg::files::write_data(t, &[b]).await.unwrap();
        let c = crate::sink::iceberg::rowdelta::RowDelta::new().add_data_files(files).prepare(t).await.unwrap();
        catalog.commit(t, c.requirements, c.updates).await.unwrap()
    }

    /// A history of upserts and deletes by equality deletes (one new manifest per commit, never merged) and plain
    /// appends: for every snapshot, the changes plan holds exactly what the full plan holds for the changelog — also
    /// where it comes from the live files derived snapshot by snapshot ([`LiveFiles`]) — and an append at the end of
    /// the history reads its own manifest only, however long the history.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_changes_plan_reads_only_what_the_snapshot_can_change_and_misses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, mut t) = demo(dir.path()).await;
        for i in 0..12i64 {
            t = crate::quickstart::commit_changes(&catalog, &t, &[(20 + i, "new", 100), (1 + i % 5, "upd", i as i128)], &[20 + i - 2]).await.unwrap();
            if i % 4 == 3 {
                t = append(&catalog, &t, 100 + i).await;
            }
        }
        let mut reads = Vec::new();
        let mut history: Vec<_> = t.metadata().snapshots().cloned().collect();
        history.sort_by_key(|s| s.sequence_number());
        for snap in &history {
            let (full, changes) = (plan(&t, snap, 2).await.unwrap(), plan_changes(&t, snap, 2).await.unwrap());
            assert_eq!(needs(&changes), needs(&full), "snapshot {}", snap.snapshot_id());
            assert!(!needs(&full).is_empty(), "every snapshot of this history changes rows");
            reads.push((changes.manifests_read, full.manifests_read));
        }
        let (last_changes, last_full) = *reads.last().unwrap();
        assert_eq!(last_changes, 1, "an append reads its own manifest: {reads:?}");
        // once a delete's plan read every manifest (the older ones were many), the live files are known snapshot by
        // snapshot: the upserts after it read their own manifests only
        let seeded = reads.iter().position(|(c, f)| c == f && *f > LIVE_FILES_AFTER).expect("a plan that read every manifest once");
        assert!(reads[seeded + 1..].iter().all(|(c, _)| *c <= 2), "{reads:?}");
        assert!(last_full > 20, "the full plan reads the whole history: {reads:?}");
        assert!(reads.iter().all(|(c, f)| c <= f), "{reads:?}");
    }

    /// A bootstrap copy's full plan leaves the live files behind ([`remember_live`]): the first delete after it
    /// reads its own manifest, not the 20 older ones, and plans what the full plan gives.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_live_files_a_bootstrap_read_serve_the_first_delete_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, mut t) = demo(dir.path()).await;
        for i in 0..20i64 {
            t = append(&catalog, &t, 100 + i).await;
        }
        let copied = t.metadata().current_snapshot().unwrap().clone();
        let full = plan(&t, &copied, 2).await.unwrap();
        assert!(full.manifests_read > LIVE_FILES_AFTER, "{}", full.manifests_read);
        remember_live(&t, &copied, &full);
        t = crate::quickstart::commit_changes(&catalog, &t, &[], &[103, 105]).await.unwrap();
        let delete = t.metadata().current_snapshot().unwrap().clone();
        let changes = plan_changes(&t, &delete, 2).await.unwrap();
        assert_eq!(changes.manifests_read, 1, "the delete's own manifest only");
        assert_eq!(needs(&changes), needs(&plan(&t, &delete, 2).await.unwrap()));
        assert_eq!(changes.touched().len(), 3, "the files whose ids meet the delete's key range [103, 105]");
    }

    #[test]
    fn a_manifest_is_read_for_a_delete_only_when_its_partition_bounds_can_hold_the_delete_partition() {
        use iceberg::spec::{NestedField, Type};
        let ty = StructType::new(vec![NestedField::optional(1000, "day", Type::Primitive(PrimitiveType::Int)).into()]);
        let summary = |lo: i32, hi: i32, nulls| FieldSummary {
            contains_null: nulls,
            contains_nan: None,
            lower_bound: Some(Datum::int(lo).to_bytes().unwrap()),
            upper_bound: Some(Datum::int(hi).to_bytes().unwrap()),
        };
        let at = |v: Option<i32>| Struct::from_iter([v.map(Literal::int)]);
        assert!(partition_may_hold(&ty, &[summary(10, 20, false)], &at(Some(15))));
        assert!(
            partition_may_hold(&ty, &[summary(10, 20, false)], &at(Some(10))) && partition_may_hold(&ty, &[summary(10, 20, false)], &at(Some(20)))
        );
        assert!(!partition_may_hold(&ty, &[summary(10, 20, false)], &at(Some(9))));
        assert!(!partition_may_hold(&ty, &[summary(10, 20, false)], &at(Some(21))));
        assert!(!partition_may_hold(&ty, &[summary(10, 20, false)], &at(None)), "no null partition in the manifest");
        assert!(partition_may_hold(&ty, &[summary(10, 20, true)], &at(None)));
        let undecodable = FieldSummary { contains_null: false, contains_nan: None, lower_bound: Some(vec![1u8].into()), upper_bound: None };
        assert!(partition_may_hold(&ty, &[undecodable], &at(Some(99))), "bounds that do not decode never rule a manifest out");
    }
}

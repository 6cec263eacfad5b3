//! Per-snapshot file planning from one snapshot's manifests.
//!
//! A snapshot's manifests list its live files plus, with status DELETED, the files it removed. So the file sets
//! before (at the parent) and after the snapshot both follow from the snapshot alone — an expired parent does not
//! matter:  before = live-and-not-added ∪ removed,  after = live.
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use iceberg::spec::{DataContentType, DataFile, ManifestStatus, PrimitiveType, SnapshotRef, Struct};
use iceberg::table::Table;

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
}

pub async fn plan(table: &Table, snapshot: &SnapshotRef, concurrency: usize) -> Result<SnapshotFiles> {
    let meta = table.metadata();
    let list = table.manifest_list_reader(snapshot).load().await.map_err(|e| {
        Error::data(snapshot.manifest_list(), format!("cannot read manifest list of snapshot {}: {e}", snapshot.snapshot_id())).with_cause(e)
    })?;
    let file_io = table.file_io().clone();
    // collected first: the iterator iceberg-rust returns is not `Send`, and this future must be (a sink compacts)
    let entries: Vec<iceberg::spec::ManifestFile> = list.consume_entries().into_iter().collect();
    let manifests: Vec<_> = futures::stream::iter(entries.into_iter().map(|mf| {
        let file_io = file_io.clone();
        async move {
            let m = mf.load_manifest(&file_io).await.map_err(|e| Error::data(mf.manifest_path.clone(), e))?;
            Ok::<_, Error>((mf, m))
        }
    }))
    .buffer_unordered(concurrency.max(1))
    .try_collect()
    .await?;

    let sid = snapshot.snapshot_id();
    let mut out = SnapshotFiles::default();
    for (mf, manifest) in manifests {
        let spec_id = mf.partition_spec_id;
        let unpartitioned = meta.partition_spec_by_id(spec_id).map(|s| s.is_unpartitioned()).unwrap_or(true);
        let row_ids = crate::spec::row_lineage::first_row_ids(meta.format_version(), &mf, &manifest);
        for (entry, first_row_id) in manifest.entries().iter().zip(row_ids) {
            let seq = entry
                .sequence_number()
                .ok_or_else(|| Error::data(entry.file_path(), "manifest entry has no sequence number (v1 tables are not supported)"))?;
            check_format(entry.data_file())?;
            let fe = Arc::new(FileEntry { file: entry.data_file().clone(), seq, spec_id, unpartitioned, first_row_id });
            let is_data = entry.content_type() == DataContentType::Data;
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
                    out.changed_deletes.push(fe);
                }
            }
        }
    }
    Ok(out)
}

/// Refuses a file `cdc` cannot read with what it is (ORC, Avro), before anything reads it and calls it corrupt:
/// Parquet data and delete files, and deletion vectors in Puffin files, are read.
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
    match delete.file.content_type() {
        DataContentType::PositionDeletes => {
            if delete.seq < data.seq {
                return false;
            }
            match delete.file.referenced_data_file() {
                Some(r) => r == data.path(),
                // A v2 position-delete file may hold several data files: same partition, within the bounds of its
                // `file_path` column, checked by path later.
                None => delete.spec_id == data.spec_id && delete.partition() == data.partition() && path_within_bounds(&delete.file, data.path()),
            }
        }
        DataContentType::EqualityDeletes => {
            delete.seq > data.seq
                && (delete.unpartitioned || (delete.spec_id == data.spec_id && delete.partition() == data.partition()))
                && equality_ranges_overlap(&delete.file, &data.file)
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
    let bounds = |f: &DataFile| Some((f.lower_bounds().get(&id)?.clone(), f.upper_bounds().get(&id)?.clone()));
    let (Some((del_lo, del_hi)), Some((lo, hi))) = (bounds(delete), bounds(data)) else {
        return false;
    };
    if matches!(del_lo.data_type(), PrimitiveType::Float | PrimitiveType::Double) {
        return false;
    }
    del_hi.partial_cmp(&lo) == Some(Ordering::Less) || del_lo.partial_cmp(&hi) == Some(Ordering::Greater)
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
}

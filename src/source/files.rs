//! Per-snapshot file planning from one snapshot's manifests.
//!
//! A snapshot's manifests list its live files plus, with status DELETED, the files it removed. So the file sets
//! before (at the parent) and after the snapshot both follow from the snapshot alone — an expired parent does not
//! matter:  before = live-and-not-added ∪ removed,  after = live.
use std::collections::HashMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use iceberg::spec::{DataContentType, DataFile, ManifestStatus, SnapshotRef, Struct};
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
    let list = table
        .manifest_list_reader(snapshot)
        .load()
        .await
        .map_err(|e| Error::data(snapshot.manifest_list(), format!("cannot read manifest list of snapshot {}: {e}", snapshot.snapshot_id())))?;
    let file_io = table.file_io().clone();
    let manifests: Vec<_> = futures::stream::iter(list.consume_entries().into_iter().map(|mf| {
        let file_io = file_io.clone();
        async move {
            let m = mf.load_manifest(&file_io).await.map_err(|e| Error::data(mf.manifest_path.clone(), e))?;
            Ok::<_, Error>((mf.partition_spec_id, m))
        }
    }))
    .buffer_unordered(concurrency.max(1))
    .try_collect()
    .await?;

    let sid = snapshot.snapshot_id();
    let mut out = SnapshotFiles::default();
    for (spec_id, manifest) in manifests {
        let unpartitioned = meta.partition_spec_by_id(spec_id).map(|s| s.is_unpartitioned()).unwrap_or(true);
        for entry in manifest.entries() {
            let seq = entry
                .sequence_number()
                .ok_or_else(|| Error::data(entry.file_path(), "manifest entry has no sequence number (v1 tables are not supported)"))?;
            let fe = Arc::new(FileEntry { file: entry.data_file().clone(), seq, spec_id, unpartitioned });
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

/// Whether a delete file applies to a data file, by the spec's sequence-number and partition rules.
pub fn delete_applies(delete: &FileEntry, data: &FileEntry) -> bool {
    match delete.file.content_type() {
        DataContentType::PositionDeletes => {
            if delete.seq < data.seq {
                return false;
            }
            match delete.file.referenced_data_file() {
                Some(r) => r == data.path(),
                // A v2 position-delete file may hold several data files: same partition, checked by path later.
                None => delete.spec_id == data.spec_id && delete.partition() == data.partition(),
            }
        }
        DataContentType::EqualityDeletes => {
            delete.seq > data.seq && (delete.unpartitioned || (delete.spec_id == data.spec_id && delete.partition() == data.partition()))
        }
        DataContentType::Data => false,
    }
}

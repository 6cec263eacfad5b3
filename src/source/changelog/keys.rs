//! The columns equality deletes compare, of data files already read: kept between polls, so that a file a new
//! equality delete reaches is asked which of its rows the delete removes without being opened again.
//!
//! An upsert stream (Flink's upsert mode, the quickstart's writer) commits an equality delete of every key it
//! rewrites. Its key range spans the table's older files, so at every commit each older file of the partition is
//! asked again which of its rows the new delete removes — a read of every file of an uncompacted table per commit,
//! growing with the table's history. The answer needs only the compared columns, and a data file never changes once
//! written. So the compared columns of a file, once read — by the key-first read ([`super::diff::changed_by_equality`])
//! or projected from a whole-file read that had equality deletes to apply — are kept here, and the next time its
//! equality deletes change, the rows whose liveness changes are found from them; only those rows are then read.
//!
//! Process-wide (pipelines following the same source share it), least recently used out first, within a sixteenth
//! of `engine.memory_budget` ([`size`]); a file whose columns would take more than a quarter of that is not kept.
//!
//! Invariant: an entry holds every row of the file, in file order, decoded with exactly the schema it is keyed by
//! (field ids, types, metadata such as a name mapping); it is keyed by the file's path, size and row count as well,
//! so a file written again under the same name is not mistaken for the old one. A read that stopped early stores
//! nothing.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::error::Result;
use crate::source::files::FileEntry;

/// A file's compared columns: its path, size and row count, and the schema they were decoded with.
type Key = (String, u64, u64, SchemaRef);

/// Bytes the process keeps ([`size`]); 16 MiB until sized.
static BYTES: AtomicU64 = AtomicU64::new(16 << 20);
static CACHE: OnceLock<moka::future::Cache<Key, Arc<Vec<RecordBatch>>>> = OnceLock::new();

/// Sizes the cache to a sixteenth of `memory_budget`; effective only before the first file is kept (the service and
/// `cdc sync` call it once the configuration is loaded).
pub(crate) fn size(memory_budget: u64) {
    BYTES.store((memory_budget / 16).max(1 << 20), Ordering::Relaxed);
}

fn cache() -> &'static moka::future::Cache<Key, Arc<Vec<RecordBatch>>> {
    CACHE.get_or_init(|| {
        moka::future::Cache::builder()
            .weigher(|k: &Key, v: &Arc<Vec<RecordBatch>>| u32::try_from(k.0.len() as u64 + batches_bytes(v)).unwrap_or(u32::MAX))
            .max_capacity(BYTES.load(Ordering::Relaxed))
            .build()
    })
}

fn key(f: &FileEntry, schema: &SchemaRef) -> Key {
    (f.path().to_string(), f.file.file_size_in_bytes(), f.file.record_count(), schema.clone())
}

fn batches_bytes(batches: &[RecordBatch]) -> u64 {
    batches.iter().map(|b| b.get_array_memory_size() as u64).sum()
}

/// The most one file may keep: a quarter of the cache.
fn entry_limit() -> u64 {
    BYTES.load(Ordering::Relaxed) / 4
}

/// The columns of `f` decoded with `schema`, when kept.
pub(super) async fn get(f: &FileEntry, schema: &SchemaRef) -> Option<Arc<Vec<RecordBatch>>> {
    cache().get(&key(f, schema)).await
}

/// Keeps `batches`, every row of `f` decoded with `schema` in file order, unless they exceed a file's share.
pub(super) async fn put(f: &FileEntry, schema: &SchemaRef, batches: Vec<RecordBatch>) {
    let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    if rows == f.file.record_count() && batches_bytes(&batches) <= entry_limit() {
        cache().insert(key(f, schema), Arc::new(batches)).await;
    }
}

/// Collects the compared columns of a whole-file read, batch by batch, until they exceed a file's share.
pub(super) struct Collect {
    /// The compared columns' positions in the read schema, and their schema.
    cols: Vec<usize>,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    bytes: u64,
    /// Past a file's share: nothing more is collected, nothing stored.
    full: bool,
}

impl Collect {
    pub(super) fn new(cols: Vec<usize>, schema: SchemaRef) -> Self {
        Collect { cols, schema, batches: Vec::new(), bytes: 0, full: false }
    }

    /// Adds the compared columns of `batch` (a batch of the read schema, the next rows of the file).
    pub(super) fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        if self.full {
            return Ok(());
        }
        let cols = self.cols.iter().map(|&i| batch.column(i).clone()).collect();
        let keys = RecordBatch::try_new(self.schema.clone(), cols)?;
        self.bytes += keys.get_array_memory_size() as u64;
        self.full = self.bytes > entry_limit();
        if self.full {
            self.batches = Vec::new();
        } else {
            self.batches.push(keys);
        }
        Ok(())
    }

    /// Keeps what was collected of `f`, when it is all of the file.
    pub(super) async fn store(self, f: &FileEntry) {
        if !self.full {
            put(f, &self.schema, self.batches).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    fn entry(path: &str, rows: u64, size: u64) -> FileEntry {
        let file = iceberg::spec::DataFileBuilder::default()
            .content(iceberg::spec::DataContentType::Data)
            .file_path(path.to_string())
            .file_format(iceberg::spec::DataFileFormat::Parquet)
            .record_count(rows)
            .file_size_in_bytes(size)
            .build()
            .unwrap();
        FileEntry { file, seq: 1, spec_id: 0, unpartitioned: true, first_row_id: None }
    }

    fn schema(ty: DataType) -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("id", ty, false)]))
    }

    #[tokio::test]
    async fn kept_only_whole_and_by_the_schema_read() {
        let longs = schema(DataType::Int64);
        let batch = |from: i64| RecordBatch::try_new(longs.clone(), vec![Arc::new(Int64Array::from_iter_values(from..from + 3))]).unwrap();
        let f = entry("mem://keys/a.parquet", 6, 1000);
        // part of the file is not kept
        put(&f, &longs, vec![batch(0)]).await;
        assert!(get(&f, &longs).await.is_none());
        put(&f, &longs, vec![batch(0), batch(3)]).await;
        let kept = get(&f, &longs).await.expect("kept");
        assert_eq!(kept.iter().map(RecordBatch::num_rows).sum::<usize>(), 6);
        // another schema (a promoted or renamed column, another name mapping), another size or row count: not this entry
        assert!(get(&f, &schema(DataType::Int32)).await.is_none());
        assert!(get(&entry("mem://keys/a.parquet", 6, 999), &longs).await.is_none());
        assert!(get(&entry("mem://keys/a.parquet", 7, 1000), &longs).await.is_none());
    }

    #[tokio::test]
    async fn collect_projects_and_stops_past_a_files_share() {
        let full = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("name", DataType::Utf8, false)]));
        let keys = schema(DataType::Int64);
        let batch = RecordBatch::try_new(
            full.clone(),
            vec![Arc::new(Int64Array::from_iter_values(0..4)), Arc::new(StringArray::from_iter_values(["a", "b", "c", "d"]))],
        )
        .unwrap();
        let f = entry("mem://keys/b.parquet", 8, 1000);
        let mut c = Collect::new(vec![0], keys.clone());
        c.push(&batch).unwrap();
        c.push(&batch).unwrap();
        c.store(&f).await;
        let kept = get(&f, &keys).await.expect("kept");
        assert_eq!(kept[1].schema(), keys);
        assert_eq!(kept[1].column(0).as_ref(), batch.column(0).as_ref());
        // a file whose columns pass a quarter of the cache is not kept
        let g = entry("mem://keys/c.parquet", 4, 1000);
        let mut c = Collect::new(vec![0], keys.clone());
        c.bytes = entry_limit();
        c.push(&batch).unwrap();
        c.store(&g).await;
        assert!(get(&g, &keys).await.is_none());
    }
}

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
//! The columns of the files being read are collected within the same bound ([`Collect`]): what all reads at once
//! hold before they are kept is at most that sixteenth as well; a read that would pass it stops collecting.
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
/// Bytes collected by reads in progress ([`Collect`]), at most [`BYTES`].
static COLLECTING: AtomicU64 = AtomicU64::new(0);
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
async fn put(f: &FileEntry, schema: &SchemaRef, batches: Vec<RecordBatch>) {
    let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    if rows == f.file.record_count() && batches_bytes(&batches) <= entry_limit() {
        cache().insert(key(f, schema), Arc::new(batches)).await;
    }
}

/// Collects the compared columns of a file as it is read, batch by batch, until they exceed a file's share or the
/// reads in progress would hold more than the cache's bytes ([`COLLECTING`]); then it lets go of what it holds.
pub(super) struct Collect {
    /// The compared columns' positions in the read schema, and their schema.
    cols: Vec<usize>,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    /// Bytes of `batches`, counted in `pool` until dropped.
    bytes: u64,
    /// What the reads in progress hold: [`COLLECTING`] (a test's own counter in tests).
    pool: &'static AtomicU64,
    /// Stopped: nothing more is collected, nothing stored.
    stopped: bool,
}

impl Collect {
    /// Collects columns `cols` of the batches it is given, as `schema`.
    pub(super) fn new(cols: Vec<usize>, schema: SchemaRef) -> Self {
        Collect { cols, schema, batches: Vec::new(), bytes: 0, pool: &COLLECTING, stopped: false }
    }

    /// Collects every column of batches of `schema` (a read of the compared columns alone).
    pub(super) fn all(schema: SchemaRef) -> Self {
        Collect::new((0..schema.fields().len()).collect(), schema)
    }

    /// Adds the compared columns of `batch` (the next rows of the file).
    pub(super) fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        let cols = self.cols.iter().map(|&i| batch.column(i).clone()).collect();
        let keys = RecordBatch::try_new(self.schema.clone(), cols)?;
        let more = keys.get_array_memory_size() as u64;
        let limit = BYTES.load(Ordering::Relaxed);
        let reserved = self.pool.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| (held + more <= limit).then_some(held + more)).is_ok();
        if !reserved || self.bytes + more > entry_limit() {
            if reserved {
                self.pool.fetch_sub(more, Ordering::AcqRel);
            }
            self.stop();
            return Ok(());
        }
        self.bytes += more;
        self.batches.push(keys);
        Ok(())
    }

    /// Lets go of what was collected.
    fn stop(&mut self) {
        self.stopped = true;
        self.batches = Vec::new();
        self.pool.fetch_sub(std::mem::take(&mut self.bytes), Ordering::AcqRel);
    }

    /// Keeps what was collected of `f`, when it is all of the file.
    pub(super) async fn store(mut self, f: &FileEntry) {
        if !self.stopped {
            let batches = std::mem::take(&mut self.batches);
            put(f, &self.schema, batches).await;
        }
    }
}

impl Drop for Collect {
    fn drop(&mut self) {
        self.pool.fetch_sub(std::mem::take(&mut self.bytes), Ordering::AcqRel);
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
        static POOL: AtomicU64 = AtomicU64::new(0);
        let mut c = Collect::new(vec![0], keys.clone());
        c.pool = &POOL;
        c.bytes = entry_limit();
        POOL.fetch_add(entry_limit(), Ordering::AcqRel);
        c.push(&batch).unwrap();
        assert!(c.stopped && c.batches.is_empty() && c.bytes == 0 && POOL.load(Ordering::Acquire) == 0);
        c.store(&g).await;
        assert!(get(&g, &keys).await.is_none());
        // a read of the compared columns alone collects them whole
        let h = entry("mem://keys/d.parquet", 4, 1000);
        let only = RecordBatch::try_new(keys.clone(), vec![batch.column(0).clone()]).unwrap();
        let mut c = Collect::all(keys.clone());
        c.push(&only).unwrap();
        c.store(&h).await;
        assert_eq!(get(&h, &keys).await.expect("kept")[0], only);
    }

    #[test]
    fn reads_in_progress_collect_within_the_caches_bytes() {
        let keys = schema(DataType::Int64);
        let batch = RecordBatch::try_new(keys.clone(), vec![Arc::new(Int64Array::from_iter_values(0..1_000))]).unwrap();
        static POOL: AtomicU64 = AtomicU64::new(0);
        let one = batch.get_array_memory_size() as u64;
        let mut a = Collect::all(keys.clone());
        a.pool = &POOL;
        a.push(&batch).unwrap();
        assert_eq!(POOL.load(Ordering::Acquire), one);
        // other reads hold all but less than a batch: `b`'s batch would pass the bound, so `b` stops and lets go
        let rest = BYTES.load(Ordering::Relaxed) - one - one / 2;
        POOL.fetch_add(rest, Ordering::AcqRel);
        let mut b = Collect::all(keys.clone());
        b.pool = &POOL;
        b.push(&batch).unwrap();
        assert!(b.stopped && b.batches.is_empty() && b.bytes == 0);
        assert_eq!(POOL.load(Ordering::Acquire), one + rest);
        POOL.fetch_sub(rest, Ordering::AcqRel);
        drop(b);
        drop(a);
        assert_eq!(POOL.load(Ordering::Acquire), 0, "dropped reads give their bytes back");
    }
}

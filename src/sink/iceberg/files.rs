//! Partition-aware Parquet writers for a target table's data files and equality-delete files, built on
//! iceberg-rust's `ParquetWriter` (which computes the column metrics). Unlike iceberg-rust's rolling writers these
//! report where every row landed (file, position), which the applier needs to delete a row it wrote earlier in the
//! same commit by position.
use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use iceberg::spec::{DataContentType, DataFile, PartitionKey, PartitionSpecRef, SchemaRef, Struct};
use iceberg::table::Table;
use iceberg::writer::file_writer::{FileWriter, FileWriterBuilder, ParquetWriter, ParquetWriterBuilder};
use iceberg::writer::CurrentFileStatus;
use parquet::file::properties::WriterProperties;

use super::location::Locations;
use super::split::Splitter;
use crate::error::{Error, Result};

/// Size a data file is closed at, unless configured.
pub const DEFAULT_TARGET_FILE_SIZE: usize = crate::config::DEFAULT_TARGET_FILE_SIZE as usize;

/// Bytes an open file holds beside its row group in progress, per column: parquet-rs keeps a compressor context,
/// page buffers and a dictionary per column chunk (heap profiles: 0.4–0.7 MiB a column).
const OPEN_FILE_BYTES_PER_COLUMN: u64 = 1 << 20;

/// How much the files a writer has open may buffer, and so how many it keeps open at once.
#[derive(Debug, Clone, Copy)]
pub struct WriteLimits {
    /// Bytes one open file may buffer (its row group in progress) before the row group is written out.
    pub row_group_bytes: usize,
    /// Files open at once; beyond it the least recently written one is closed (its partition gets a new file when
    /// it has rows again).
    pub max_open: usize,
    /// Dictionary size of a column chunk before it falls back to plain encoding. The writer's dictionary (and the
    /// hash table interning its values, several times larger) is not part of the row group's estimated size: with
    /// parquet-rs's 1 MiB default, 16 open files held ~150 MB of dictionaries in heap profiles at 100 M rows.
    pub dictionary_page_bytes: usize,
}

impl WriteLimits {
    /// Files written outside a sync's memory budget (tests, benchmark fixtures).
    pub const FIXTURE: WriteLimits = WriteLimits { row_group_bytes: 64 << 20, max_open: usize::MAX, dictionary_page_bytes: 1 << 20 };

    /// Limits that keep the open files of one writer within `budget`: row groups of a sixteenth of it (a commit
    /// touching up to 16 partitions writes full row groups; never smaller than 1 MiB, readers pay per row group, nor
    /// larger than 128 MiB), and as many open files as the budget holds, but at least [`MIN_OPEN_CLUSTERED`] when
    /// the rows come clustered by partition (a bootstrap copies file by file: closing the least recent file loses
    /// nothing) and [`MIN_OPEN_SCATTERED`] when they come in key order (every batch touches every partition: closing
    /// files early fragments them, so only a commit touching more partitions than that trades file size for memory).
    pub fn within(budget: u64, columns: usize, clustered: bool) -> Self {
        let row_group_bytes = (budget / 16).clamp(1 << 20, 128 << 20);
        let per_file = row_group_bytes + columns as u64 * OPEN_FILE_BYTES_PER_COLUMN;
        let floor = if clustered { MIN_OPEN_CLUSTERED } else { MIN_OPEN_SCATTERED };
        // a column's dictionary gets a share of the row group: low-cardinality columns keep theirs, others fall back
        let dictionary_page_bytes = (row_group_bytes / (4 * columns.max(1) as u64)).clamp(64 << 10, 1 << 20) as usize;
        WriteLimits { row_group_bytes: row_group_bytes as usize, max_open: ((budget / per_file) as usize).max(floor), dictionary_page_bytes }
    }
}

/// Open files a writer of rows clustered by partition keeps at least.
pub const MIN_OPEN_CLUSTERED: usize = 16;
/// Open files a writer of rows in key order (scattered over partitions) keeps at least.
pub const MIN_OPEN_SCATTERED: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
/// What a file written by a [`PartitionedWriter`] holds.
pub enum Content {
    /// Rows.
    Data,
    /// Equality deletes on these field ids.
    EqualityDeletes(Vec<i32>),
}

struct Open {
    writer: ParquetWriter,
    path: Arc<str>,
    key: Option<PartitionKey>,
    /// When it was last written to (the writer's write counter).
    last_write: u64,
}

/// Where a written row ended up.
#[derive(Debug, Clone)]
pub struct Placement {
    /// The file the rows went to.
    pub path: Arc<str>,
    /// The position of the first row in it.
    pub first_pos: u64,
    /// How many rows.
    pub rows: usize,
    /// The rows, as written.
    pub batch: RecordBatch,
    /// Partition of the file (None when the table is unpartitioned).
    pub partition: Option<Struct>,
}

/// Writes rows into files per partition, closing each at the target size.
pub struct PartitionedWriter {
    content: Content,
    spec: PartitionSpecRef,
    splitter: Option<Splitter>,
    file_io: iceberg::io::FileIO,
    locations: Locations,
    builder: ParquetWriterBuilder,
    target_size: usize,
    prefix: String,
    counter: u64,
    open: HashMap<Option<Struct>, Open>,
    max_open: usize,
    writes: u64,
    /// Files closed early because `max_open` were open.
    evicted: u64,
    done: Vec<DataFile>,
    /// For delete files: the positions of the equality columns in the table schema, and the files' arrow schema.
    projection: Option<(Vec<usize>, arrow_schema::SchemaRef)>,
    /// Every file this writer created, finished or not: what to remove when the commit is abandoned.
    opened: Vec<String>,
}

impl PartitionedWriter {
    /// Files of `table` written in `table_schema` (the table's current schema, or the one the commit adds) and
    /// partitioned by `spec` (one of the table's specs). Each open file buffers at most about
    /// `limits.row_group_bytes` (encoded) before its row group is written out, and at most `limits.max_open` files
    /// (one per partition) are open: together they bound the memory, however many partitions the rows touch.
    /// `unique_ids`: top-level columns whose values are unique (the key), written without a dictionary.
    pub fn new(
        table: &Table,
        table_schema: &SchemaRef,
        spec: &PartitionSpecRef,
        content: Content,
        target_size: usize,
        limits: WriteLimits,
        unique_ids: &[i32],
    ) -> Result<Self> {
        let meta = table.metadata();
        let table_schema = table_schema.clone();
        let spec = spec.clone();
        let (file_schema, projection) = match &content {
            Content::Data => (table_schema.clone(), None),
            Content::EqualityDeletes(ids) => {
                let fields: Vec<_> = ids
                    .iter()
                    .map(|id| {
                        table_schema.field_by_id(*id).cloned().ok_or_else(|| Error::Schema(format!("equality field id {id} not in target schema")))
                    })
                    .collect::<Result<_>>()?;
                let arrow = iceberg::arrow::schema_to_arrow_schema(&table_schema)?;
                let idx = ids
                    .iter()
                    .map(|id| arrow.fields().iter().position(|f| crate::spec::projection::field_id(f) == Some(*id)).unwrap_or(usize::MAX))
                    .collect::<Vec<_>>();
                let s = Arc::new(iceberg::spec::Schema::builder().with_fields(fields).build()?);
                let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&s)?);
                (s, Some((idx, arrow)))
            }
        };
        let splitter = if spec.is_unpartitioned() { None } else { Some(Splitter::new(&table_schema, &spec)?) };
        let mut props = WriterProperties::builder()
            .set_compression(parquet::basic::Compression::ZSTD(parquet::basic::ZstdLevel::try_new(1).expect("valid level")))
            .set_max_row_group_bytes(Some(limits.row_group_bytes.max(1)))
            .set_dictionary_page_size_limit(limits.dictionary_page_bytes.max(1));
        // Key values are unique: a dictionary never pays off for them, yet parquet-rs interns every value of a row
        // group before it falls back to plain encoding (a fifth of a bootstrap in profiles).
        for id in unique_ids {
            if let Some(f) = table_schema.field_by_id(*id) {
                props = props.set_column_dictionary_enabled(parquet::schema::types::ColumnPath::from(f.name.as_str()), false);
            }
        }
        let props = props.build();
        Ok(PartitionedWriter {
            builder: ParquetWriterBuilder::new(props, file_schema),
            content,
            spec,
            splitter,
            file_io: table.file_io().clone(),
            locations: Locations::new(meta),
            target_size,
            prefix: format!("cdc-{}", uuid::Uuid::new_v4()),
            counter: 0,
            open: HashMap::new(),
            max_open: limits.max_open.max(1),
            writes: 0,
            evicted: 0,
            done: Vec::new(),
            projection,
            opened: Vec::new(),
        })
    }

    /// Writes rows of the table schema; returns where each partition's slice went.
    pub async fn write(&mut self, batch: &RecordBatch) -> Result<Vec<Placement>> {
        if batch.num_rows() == 0 {
            return Ok(Vec::new());
        }
        let parts: Vec<(Option<PartitionKey>, RecordBatch)> = match &self.splitter {
            None => vec![(None, batch.clone())],
            Some(s) => s.split(batch)?.into_iter().map(|p| (Some(p.key), p.batch)).collect(),
        };
        let mut out = Vec::with_capacity(parts.len());
        for (key, part) in parts {
            let slot = key.as_ref().map(|k| k.data().clone());
            if !self.open.contains_key(&slot) {
                if self.open.len() >= self.max_open {
                    self.evict().await?;
                }
                let o = self.open_file(key.clone()).await?;
                self.open.insert(slot.clone(), o);
            }
            self.writes += 1;
            let o = self.open.get_mut(&slot).expect("just inserted");
            o.last_write = self.writes;
            let file_batch = match &self.projection {
                None => part.clone(),
                Some((idx, arrow)) => RecordBatch::try_new(arrow.clone(), idx.iter().map(|&i| part.column(i).clone()).collect())?,
            };
            let first_pos = o.writer.current_row_num() as u64;
            o.writer.write(&file_batch).await.map_err(|e| io_error(&o.path, e))?;
            out.push(Placement { path: o.path.clone(), first_pos, rows: part.num_rows(), batch: part, partition: slot.clone() });
            if o.writer.current_written_size() >= self.target_size {
                let o = self.open.remove(&slot).expect("present");
                self.close_file(o).await?;
            }
        }
        Ok(out)
    }

    /// Closes the file written to least recently: input clustered by partition (a bootstrap reads file by file) loses
    /// nothing, scattered input gets more, smaller files instead of unbounded memory.
    async fn evict(&mut self) -> Result<()> {
        let Some(slot) = self.open.iter().min_by_key(|(_, o)| o.last_write).map(|(k, _)| k.clone()) else { return Ok(()) };
        let o = self.open.remove(&slot).expect("present");
        self.evicted += 1;
        self.close_file(o).await
    }

    /// Files closed early because too many partitions were open at once.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    async fn open_file(&mut self, key: Option<PartitionKey>) -> Result<Open> {
        self.counter += 1;
        let kind = match self.content {
            Content::Data => "data",
            Content::EqualityDeletes(_) => "eq-deletes",
        };
        let name = format!("{}-{kind}-{:05}.parquet", self.prefix, self.counter);
        let path = self.locations.file(key.as_ref(), &name);
        self.opened.push(path.clone());
        let writer = self.builder.build(self.file_io.new_output(&path)?).await.map_err(|e| io_error(&path, e))?;
        Ok(Open { writer, path: path.into(), key, last_write: 0 })
    }

    async fn close_file(&mut self, o: Open) -> Result<()> {
        for mut b in o.writer.close().await.map_err(|e| io_error(&o.path, e))? {
            match &self.content {
                Content::Data => {
                    b.content(DataContentType::Data);
                }
                Content::EqualityDeletes(ids) => {
                    b.content(DataContentType::EqualityDeletes);
                    b.equality_ids(Some(ids.clone()));
                }
            }
            b.partition_spec_id(self.spec.spec_id());
            if let Some(k) = &o.key {
                b.partition(k.data().clone());
            }
            self.done.push(b.build().map_err(|e| Error::failed("data file", e))?);
        }
        Ok(())
    }

    /// The partition spec the files are written in.
    pub fn spec_id(&self) -> i32 {
        self.spec.spec_id()
    }

    /// Every file this writer created, finished or not.
    pub fn opened(&self) -> &[String] {
        &self.opened
    }

    /// Closes every open file; returns all files written.
    pub async fn finish(mut self) -> Result<Vec<DataFile>> {
        let open: Vec<Open> = self.open.drain().map(|(_, o)| o).collect();
        for o in open {
            self.close_file(o).await?;
        }
        Ok(self.done)
    }
}

/// Writes `batches` (in the table's current schema) as data files.
pub async fn write_data(table: &Table, batches: &[RecordBatch]) -> Result<Vec<DataFile>> {
    let mut w = PartitionedWriter::new(
        table,
        table.metadata().current_schema(),
        table.metadata().default_partition_spec(),
        Content::Data,
        DEFAULT_TARGET_FILE_SIZE,
        WriteLimits::FIXTURE,
        &[],
    )?;
    for b in batches {
        w.write(b).await?;
    }
    w.finish().await
}

/// Writes equality deletes on `equality_ids` from `batches` (full rows in the current schema).
pub async fn write_equality_deletes(table: &Table, equality_ids: Vec<i32>, batches: &[RecordBatch]) -> Result<Vec<DataFile>> {
    let mut w = PartitionedWriter::new(
        table,
        table.metadata().current_schema(),
        table.metadata().default_partition_spec(),
        Content::EqualityDeletes(equality_ids.clone()),
        DEFAULT_TARGET_FILE_SIZE,
        WriteLimits::FIXTURE,
        &equality_ids,
    )?;
    for b in batches {
        w.write(b).await?;
    }
    w.finish().await
}

/// Removes files a commit wrote but will never reference (best effort: an orphan is harmless, only wasted space).
pub(crate) async fn remove_unreferenced(io: &iceberg::io::FileIO, paths: Vec<String>) {
    for p in paths {
        if let Err(e) = io.delete(&p).await {
            tracing::debug!(path = %p, error = %e, "could not remove an unreferenced file");
        }
    }
}

/// A failed write names its file; I/O failures (disk full, permissions) keep the I/O exit code. An `io::Error` in
/// the source chain decides; iceberg-rust 0.10.1's local FileIO flattens it into text ("… (os error 28)"), so for
/// that one the OS error marker in the message is all there is to read.
pub(crate) fn io_error(path: &str, e: iceberg::Error) -> Error {
    let message = error_chain(&e);
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    let mut io = false;
    while let Some(c) = cause {
        io |= c.is::<std::io::Error>();
        cause = c.source();
    }
    if io || message.contains("(os error ") {
        Error::Io { path: path.to_string(), message, retryable: false, cause: None }
    } else {
        Error::Iceberg(e)
    }
}

/// The innermost cause of an error chain, once (iceberg errors repeat their sources in `Display`).
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e;
    while let Some(s) = last.source() {
        last = s;
    }
    last.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_limits_bound_open_files_by_the_budget() {
        // the default budget's data writers (3/4 of a quarter of 256 MiB, 6 columns): 16 full row groups of 3 MiB
        let l = WriteLimits::within(48 << 20, 6, true);
        assert_eq!((l.row_group_bytes, l.max_open, l.dictionary_page_bytes), (3 << 20, 16, 128 << 10));
        // rows in key order touch every partition in every batch: more files stay open before any closes early
        assert_eq!(WriteLimits::within(48 << 20, 6, false).max_open, MIN_OPEN_SCATTERED);
        // a tiny budget still writes 1 MiB row groups and keeps the floor open: the "fixed overhead"
        let l = WriteLimits::within(1 << 20, 3, true);
        assert_eq!((l.row_group_bytes, l.max_open), (1 << 20, 16));
        // a large budget keeps more files open, each within its share
        let l = WriteLimits::within(8 << 30, 10, true);
        assert_eq!(l.row_group_bytes, 128 << 20);
        assert_eq!(l.max_open, ((8u64 << 30) / ((128 << 20) + (10 << 20))) as usize);
        assert!(l.max_open as u64 * (l.row_group_bytes as u64 + 10 * OPEN_FILE_BYTES_PER_COLUMN) <= 8 << 30);
    }
}

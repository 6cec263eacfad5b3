//! Reading Iceberg data and delete files into Arrow, by field id.
//!
//! Data files are projected onto the schema of the snapshot being read: columns are matched by Parquet field id (by
//! name only for files written without ids), promoted types are cast, and columns the file does not have come back
//! null. That is how rows of older files appear in a newer schema.
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use arrow_row::{RowConverter, SortField};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use iceberg::arrow::ArrowFileReader;
use iceberg::io::FileIO;
use iceberg::spec::DataFileFormat;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, RowSelection, RowSelector};
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData};
use roaring::RoaringTreemap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};
use crate::source::files::FileEntry;
use crate::spec::dv;
use crate::spec::projection;

pub(crate) use crate::source::format::opening_error;
pub use crate::source::format::BATCH_SIZE;
pub use crate::spec::{POS_DELETE_FILE_PATH_ID, POS_DELETE_POS_ID};

pub use crate::spec::projection::field_id;

/// How a data file is opened: its row-group fetches pass `gate` when one is given, and `page_index` loads the
/// offset index (when the file has one) so that a row selection fetches only the pages it needs.
#[derive(Clone, Copy, Default)]
struct OpenOptions<'g> {
    gate: Option<&'g ReadGate>,
    views: bool,
    page_index: bool,
}

async fn open(
    file_io: &FileIO,
    path: &str,
    opts: OpenOptions<'_>,
    fetched: Arc<AtomicU64>,
) -> Result<ParquetRecordBatchStreamBuilder<Box<dyn AsyncFileReader>>> {
    let err = |e: &dyn std::fmt::Display| Error::data(path, e);
    let input = file_io.new_input(path).map_err(|e| err(&e))?;
    let meta = input.metadata().await.map_err(|e| opening_error(path, e))?;
    let reader = ArrowFileReader::new(meta, input.reader().await.map_err(|e| err(&e))?);
    let mut reader: Box<dyn AsyncFileReader> = Box::new(GatedReader { inner: reader, gate: opts.gate.cloned(), held: None, fetched });
    let options = if opts.page_index {
        // the column index (page statistics) is not used: positions, not values, select the rows
        ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional).with_column_index_policy(PageIndexPolicy::Skip)
    } else {
        ArrowReaderOptions::new()
    };
    let meta = ArrowReaderMetadata::load_async(&mut reader, options).await.map_err(|e| err(&format!("not a readable Parquet file: {e}")))?;
    let meta = if opts.views { with_string_views(meta) } else { meta };
    Ok(ParquetRecordBatchStreamBuilder::new_with_metadata(reader, meta))
}

/// The file's top-level strings and binaries decoded as views ([`view_types`]); the plain types when the reader
/// refuses the hint.
fn with_string_views(meta: ArrowReaderMetadata) -> ArrowReaderMetadata {
    let schema = view_types(meta.schema());
    if Arc::ptr_eq(&schema, meta.schema()) {
        return meta;
    }
    ArrowReaderMetadata::try_new(meta.metadata().clone(), ArrowReaderOptions::new().with_schema(schema)).unwrap_or(meta)
}

/// `schema` with its top-level `Utf8` and `Binary` columns as `Utf8View` and `BinaryView` (the same Arc when it has
/// none). Decoding views copies no string out of a dictionary page — a third of the decoding time of a string-heavy
/// table — so the copy-on-write carry-over, which drops most rows it reads, reads them so and converts only the
/// survivors back ([`super::carry`]).
pub(crate) fn view_types(schema: &SchemaRef) -> SchemaRef {
    let view = |dt: &DataType| match dt {
        DataType::Utf8 => Some(DataType::Utf8View),
        DataType::Binary => Some(DataType::BinaryView),
        _ => None,
    };
    if !schema.fields().iter().any(|f| view(f.data_type()).is_some()) {
        return schema.clone();
    }
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match view(f.data_type()) {
            Some(dt) => f.as_ref().clone().with_data_type(dt),
            None => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Bounds the bytes that concurrent Parquet readers hold. A reader fetches the column chunks of a whole row group
/// before decoding it (compressed; Spark writes row groups of up to 128 MB), so N readers hold N row groups: that
/// grows with the files, not with the rows in flight. Every row-group fetch first takes its compressed size from
/// the gate (in KiB) and gives it back when the reader asks for its next row group or ends; a row group larger than
/// the whole gate takes all of it and is read alone, so one reader always makes progress.
#[derive(Clone, Debug)]
pub struct ReadGate {
    permits: Arc<Semaphore>,
    kib: u32,
}

impl ReadGate {
    /// A gate that lets readers hold at most `bytes` (or one row group, when a row group is larger).
    pub fn new(bytes: u64) -> Self {
        let kib = (bytes / 1024).clamp(1, u32::MAX as u64 >> 3) as u32;
        ReadGate { permits: Arc::new(Semaphore::new(kib as usize)), kib }
    }

    /// KiB free right now (for tests).
    #[cfg(test)]
    pub fn available_kib(&self) -> usize {
        self.permits.available_permits()
    }

    async fn admit(&self, bytes: u64) -> Result<OwnedSemaphorePermit> {
        let kib = bytes.div_ceil(1024).clamp(1, self.kib as u64) as u32;
        self.permits.clone().acquire_many_owned(kib).await.map_err(|e| Error::failed("read gate closed", e))
    }
}

/// An [`AsyncFileReader`] whose row-group fetches pass a [`ReadGate`] (when it has one) and that counts the bytes
/// it fetches (data pages and page indexes; the footer is read by the inner reader). The async Parquet stream asks
/// for the ranges of the next row group only once the previous one is decoded (one request per row group without
/// row filters, which we never set), so the permit of one fetch is released by the next.
struct GatedReader<R> {
    inner: R,
    gate: Option<ReadGate>,
    held: Option<OwnedSemaphorePermit>,
    fetched: Arc<AtomicU64>,
}

impl<R: AsyncFileReader> AsyncFileReader for GatedReader<R> {
    fn get_bytes(&mut self, range: std::ops::Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        self.fetched.fetch_add(range.end - range.start, Ordering::Relaxed);
        self.inner.get_bytes(range)
    }

    fn get_byte_ranges(&mut self, ranges: Vec<std::ops::Range<u64>>) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            self.held = None;
            let bytes = ranges.iter().map(|r| r.end - r.start).sum();
            self.fetched.fetch_add(bytes, Ordering::Relaxed);
            if let Some(gate) = &self.gate {
                self.held = Some(gate.admit(bytes).await.map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))?);
            }
            self.inner.get_byte_ranges(ranges).await
        }
        .boxed()
    }

    fn get_metadata<'a>(&'a mut self, options: Option<&'a ArrowReaderOptions>) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        self.inner.get_metadata(options)
    }
}

/// A stream of batches from one file.
pub type Batches = futures::stream::BoxStream<'static, Result<RecordBatch>>;

/// Streams the rows of a data file (Parquet; ORC and Avro through [`crate::source::format`]), projected by field id
/// onto `target`, in file order (so the n-th row overall is at position n); its Parquet row-group fetches pass `gate`
/// when one is given. With `views`, top-level Parquet strings and binaries come back as views ([`view_types`]).
pub async fn read_data_file(
    file_io: &FileIO,
    path: &str,
    format: DataFileFormat,
    target: SchemaRef,
    gate: Option<&ReadGate>,
    views: bool,
) -> Result<Batches> {
    if format != DataFileFormat::Parquet {
        let opened = crate::source::format::open(file_io, path, format).await?;
        let path = path.to_string();
        return Ok(opened.stream.map(move |b| project(&b?, &target).map_err(|e| Error::data(&path, e))).boxed());
    }
    let opts = OpenOptions { gate, views, page_index: false };
    let builder = open(file_io, path, opts, Arc::default()).await?;
    Ok(projected_stream(builder, path, target, views)?.boxed())
}

/// A read of only some rows of a data file ([`read_rows_at`]).
pub struct RowsAt<S> {
    /// The rows asked for that the file has, in position order.
    pub stream: S,
    /// The file's row count, from its footer.
    pub rows_in_file: u64,
    /// Bytes fetched so far: grows as the stream is read.
    pub fetched: Arc<AtomicU64>,
}

/// Streams the rows at `positions` of a Parquet data file (0-based, as deletes count them; `None`: every row),
/// projected onto `target` like [`read_data_file`], counting the bytes it fetches. Row groups without such a row are
/// not fetched, and when the file has an offset index (Iceberg's writers add one) neither are the pages; in the
/// pages fetched, the other rows are skipped, not decoded. Positions at or past the file's end are ignored. This is
/// how a snapshot that only adds deletes to a file costs what it deletes, not the size of the file.
pub async fn read_rows_at(
    file_io: &FileIO,
    path: &str,
    format: DataFileFormat,
    target: SchemaRef,
    gate: Option<&ReadGate>,
    positions: Option<&RoaringTreemap>,
) -> Result<RowsAt<Batches>> {
    if format != DataFileFormat::Parquet {
        // no page index to skip by: every row is decoded, the others dropped
        let opened = crate::source::format::open(file_io, path, format).await?;
        let (path, wanted, mut at) = (path.to_string(), positions.cloned(), 0u64);
        let stream = opened
            .stream
            .map(move |b| {
                let b = project(&b?, &target).map_err(|e| Error::data(&path, e))?;
                let first = at;
                at += b.num_rows() as u64;
                match &wanted {
                    None => Ok(b),
                    Some(w) => {
                        let keep: arrow_array::BooleanArray = (first..at).map(|p| Some(w.contains(p))).collect();
                        Ok(arrow_select::filter::filter_record_batch(&b, &keep)?)
                    }
                }
            })
            .boxed();
        return Ok(RowsAt { stream, rows_in_file: opened.rows, fetched: opened.fetched });
    }
    let fetched = Arc::new(AtomicU64::new(0));
    let opts = OpenOptions { gate, views: false, page_index: positions.is_some() };
    let builder = open(file_io, path, opts, fetched.clone()).await?;
    let rows_in_file = builder.metadata().file_metadata().num_rows().max(0) as u64;
    let builder = match positions {
        Some(p) => builder.with_row_selection(selection_of(p, rows_in_file)),
        None => builder,
    };
    Ok(RowsAt { stream: projected_stream(builder, path, target, false)?.boxed(), rows_in_file, fetched })
}

/// The [`RowSelection`] of `positions` below `rows` (runs of consecutive positions become one selector), covering all
/// `rows`.
fn selection_of(positions: &RoaringTreemap, rows: u64) -> RowSelection {
    let mut selectors = Vec::new();
    let (mut next, mut run) = (0u64, 0usize); // next = first position not yet covered by a selector
    for p in positions.iter().take_while(|p| *p < rows) {
        if run > 0 && p == next + run as u64 {
            run += 1;
            continue;
        }
        if run > 0 {
            selectors.push(RowSelector::select(run));
            next += run as u64;
        }
        if p > next {
            selectors.push(RowSelector::skip((p - next) as usize));
        }
        (next, run) = (p, 1);
    }
    if run > 0 {
        selectors.push(RowSelector::select(run));
        next += run as u64;
    }
    if rows > next {
        selectors.push(RowSelector::skip((rows - next) as usize));
    }
    RowSelection::from(selectors)
}

/// The builder's rows projected onto `target` (see [`read_data_file`]).
fn projected_stream(
    builder: ParquetRecordBatchStreamBuilder<Box<dyn AsyncFileReader>>,
    path: &str,
    target: SchemaRef,
    views: bool,
) -> Result<impl Stream<Item = Result<RecordBatch>> + Send + 'static> {
    // with views, top-level strings stay views through the projection (it would cast them back otherwise)
    let target = if views && builder.schema().fields().iter().any(|f| matches!(f.data_type(), DataType::Utf8View | DataType::BinaryView)) {
        view_types(&target)
    } else {
        target
    };
    let file_schema = crate::spec::name_mapping::map_schema(builder.schema(), &target).unwrap_or_else(|| builder.schema().clone());
    let wanted: HashSet<i32> = target.fields().iter().filter_map(|f| field_id(f)).collect();
    let names: HashSet<&str> = target.fields().iter().map(|f| f.name().as_str()).collect();
    let roots: Vec<usize> = file_schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| match field_id(f) {
            Some(id) => wanted.contains(&id),
            None => names.contains(f.name().as_str()),
        })
        .map(|(i, _)| i)
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let stream = builder.with_projection(mask).with_batch_size(BATCH_SIZE).build().map_err(|e| Error::data_from(path, e))?;
    let path = path.to_string();
    Ok(stream.map(move |b| {
        let b = b.map_err(|e| Error::data_from(&path, e))?;
        project(&b, &target).map_err(|e| Error::data(&path, e))
    }))
}

/// Reads every row of the Parquet file at `path` in its own schema through the read path (page checksums, record
/// batches): the number of rows, or why not (for the damaged-file corpus tests).
#[cfg(test)]
pub(crate) async fn read_all_columns(file_io: &FileIO, path: &str) -> Result<usize> {
    let builder = open(file_io, path, OpenOptions::default(), Arc::default()).await?;
    let target = builder.schema().clone();
    let mut stream = projected_stream(builder, path, target, false)?;
    let mut rows = 0;
    while let Some(b) = stream.try_next().await? {
        rows += b.num_rows();
    }
    Ok(rows)
}

/// Projects `batch` onto `target` by field id at every nesting level (ids from the name mapping the target carries for
/// files without ids — see [`crate::spec::name_mapping`] — else by name), casting
/// promoted types, nulls for the rest. Top-level columns come back nullable.
pub fn project(batch: &RecordBatch, target: &SchemaRef) -> Result<RecordBatch> {
    // a file written without ids, in a table with a name mapping: ids from the mapping first
    let mapped;
    let batch = match crate::spec::name_mapping::map_schema(&batch.schema(), target) {
        Some(schema) => {
            mapped = crate::source::format::relabel_batch(batch, &schema)?;
            &mapped
        }
        None => batch,
    };
    // a column the table requires must be in the file (the reader's schemas are relaxed: the requirement travels
    // as schema metadata, see `integrity::require`)
    crate::spec::integrity::check_present(&batch.schema(), target).map_err(Error::Schema)?;
    projection::project_batch(batch, &relax(target), &Some)
}

pub use crate::spec::projection::relax;

/// A v2 position-delete file (any format): deleted positions per data file path. Its `file_path` and `pos` columns
/// are found by field id (by name in files without ids), like any projection.
pub async fn read_position_deletes(file_io: &FileIO, path: &str, format: DataFileFormat) -> Result<HashMap<String, RoaringTreemap>> {
    let columns: SchemaRef = Arc::new(Schema::new(vec![
        projection_field(POS_DELETE_FILE_PATH_ID, "file_path", DataType::Utf8),
        projection_field(POS_DELETE_POS_ID, "pos", DataType::Int64),
    ]));
    let mut stream = read_data_file(file_io, path, format, columns, None, false).await?;
    let mut out: HashMap<String, RoaringTreemap> = HashMap::new();
    while let Some(b) = stream.try_next().await? {
        // projected onto `columns`: the types are those
        let (Some(paths), Some(pos)) = (b.column(0).as_any().downcast_ref::<StringArray>(), b.column(1).as_any().downcast_ref::<Int64Array>()) else {
            return Err(Error::Internal("a projected position-delete batch has other types".into()));
        };
        for i in 0..b.num_rows() {
            if paths.is_null(i) || pos.is_null(i) {
                return Err(Error::data(path, "position-delete row with a null file_path or pos"));
            }
            out.entry(paths.value(i).to_string()).or_default().insert(pos.value(i) as u64);
        }
    }
    Ok(out)
}

/// A field of a projection target, with its field id.
fn projection_field(id: i32, name: &str, dt: DataType) -> Field {
    Field::new(name, dt, true).with_metadata(HashMap::from([(parquet::arrow::PARQUET_FIELD_ID_META_KEY.to_string(), id.to_string())]))
}

/// A v3 deletion vector: the blob of a Puffin file at the entry's offset.
pub async fn read_dv(file_io: &FileIO, entry: &FileEntry) -> Result<RoaringTreemap> {
    let path = entry.path();
    let (off, len) = match (entry.file.content_offset(), entry.file.content_size_in_bytes()) {
        (Some(o), Some(l)) if o >= 0 && l > 0 => (o as u64, l as u64),
        _ => return Err(Error::data(path, "deletion vector without content_offset/content_size_in_bytes")),
    };
    let input = file_io.new_input(path).map_err(|e| Error::data_from(path, e))?;
    let reader = input.reader().await.map_err(|e| Error::data_from(path, e))?;
    let blob = reader.read(off..off + len).await.map_err(|e| Error::data_from(path, e))?;
    let bm = dv::decode(&blob).map_err(|e| Error::data(path, e))?;
    if bm.len() != entry.file.record_count() {
        return Err(Error::data(
            path,
            format!("deletion vector holds {} positions but its manifest entry says {}", bm.len(), entry.file.record_count()),
        ));
    }
    Ok(bm)
}

/// The keys of an equality-delete file, encoded with the row format of the data schema's types.
pub struct EqDeletes {
    pub field_ids: Vec<i32>,
    pub keys: KeySet,
    /// The file's identity across reads and polls: a 128-bit hash of its path, size and row count (a delete file
    /// never changes once written). Sets of deletes are named by the sum of theirs ([`EqDeletes::identity`]).
    pub id: u128,
}

pub use crate::spec::rowenc::KeySet;

impl EqDeletes {
    /// The identity of the delete file at `path` of `size` bytes holding `rows` keys (see [`EqDeletes::id`]).
    pub fn identity(path: &str, size: u64, rows: u64) -> u128 {
        hash128(&(path, size, rows))
    }

    /// The positions in `data_schema` of the columns these deletes compare.
    pub fn columns(&self, data_schema: &Schema) -> Result<Vec<usize>> {
        self.field_ids
            .iter()
            .map(|id| {
                data_schema
                    .fields()
                    .iter()
                    .position(|f| field_id(f) == Some(*id))
                    .ok_or_else(|| Error::Schema(format!("equality-delete field id {id} is not in the table schema")))
            })
            .collect()
    }

    /// The row converter that encodes these deletes' keys from rows of `data_schema`, and the columns it reads.
    pub fn converter(&self, data_schema: &Schema) -> Result<(RowConverter, Vec<usize>)> {
        let idx = self.columns(data_schema)?;
        Ok((key_converter(data_schema, &idx)?, idx))
    }
}

/// A 128-bit hash of `v`, the same for the life of the process (two SipHashes with fixed keys): names what stays
/// the same across polls; a collision is as unlikely as two random 128-bit values being equal.
pub(crate) fn hash128(v: &impl std::hash::Hash) -> u128 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher, Hash, Hasher};
    let halves = [0u8, 1].map(|tag| {
        let mut h = BuildHasherDefault::<DefaultHasher>::default().build_hasher();
        tag.hash(&mut h);
        v.hash(&mut h);
        h.finish()
    });
    (u128::from(halves[0]) << 64) | u128::from(halves[1])
}

/// The row converter of the columns `idx` of `schema`: how equality-delete keys are encoded and compared.
pub(crate) fn key_converter(schema: &Schema, idx: &[usize]) -> Result<RowConverter> {
    Ok(RowConverter::new(idx.iter().map(|&i| SortField::new(schema.field(i).data_type().clone())).collect())?)
}

pub async fn read_equality_deletes(file_io: &FileIO, entry: &FileEntry, data_schema: &SchemaRef) -> Result<EqDeletes> {
    let path = entry.path();
    let field_ids = entry.file.equality_ids().unwrap_or_default();
    if field_ids.is_empty() {
        return Err(Error::data(path, "equality-delete file without equality_ids"));
    }
    let capacity = entry.file.record_count().min(64 << 20) as usize;
    let id = EqDeletes::identity(path, entry.file.file_size_in_bytes(), entry.file.record_count());
    let mut eq = EqDeletes { field_ids, keys: KeySet::with_capacity_and_hasher(capacity, ahash::RandomState::new()), id };
    let (conv, idx) = eq.converter(data_schema)?;
    let key_schema: SchemaRef = Arc::new(Schema::new(idx.iter().map(|&i| data_schema.field(i).clone()).collect::<Vec<_>>()));
    // an equality-delete file without one of its equality columns would delete nothing: refused
    let key_schema = crate::spec::integrity::require(key_schema, eq.field_ids.iter().copied());
    // equality deletes are held whole anyway (their keys), and read once per cached file: not gated
    let mut stream = read_data_file(file_io, path, entry.file.file_format(), key_schema, None, false).await?;
    while let Some(b) = stream.try_next().await? {
        let rows = conv.convert_columns(b.columns())?;
        for r in rows.iter() {
            eq.keys.insert(r.as_ref().into());
        }
    }
    Ok(eq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Int64Array;
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;
    use std::time::Duration;

    /// A Parquet file of `groups` row groups of 20 000 distinct longs each (~160 KB a column chunk, uncompressed).
    fn file(groups: usize) -> Vec<u8> {
        let schema = Arc::new(Schema::new(vec![arrow_schema::Field::new("v", arrow_schema::DataType::Int64, false)]));
        let props = WriterProperties::builder().set_max_row_group_row_count(Some(20_000)).set_dictionary_enabled(false).build();
        let mut out = Vec::new();
        let mut w = ArrowWriter::try_new(&mut out, schema.clone(), Some(props)).unwrap();
        let values: Int64Array = (0..(groups * 20_000) as i64).map(|v| v * 7919).collect();
        w.write(&RecordBatch::try_new(schema, vec![Arc::new(values)]).unwrap()).unwrap();
        w.close().unwrap();
        out
    }

    async fn stream(
        bytes: Vec<u8>,
        gate: &ReadGate,
    ) -> parquet::arrow::async_reader::ParquetRecordBatchStream<GatedReader<std::io::Cursor<Vec<u8>>>> {
        let reader = GatedReader { inner: std::io::Cursor::new(bytes), gate: Some(gate.clone()), held: None, fetched: Arc::default() };
        ParquetRecordBatchStreamBuilder::new(reader).await.unwrap().with_batch_size(4096).build().unwrap()
    }

    #[test]
    fn a_selection_covers_every_row_and_selects_exactly_the_positions() {
        let positions: RoaringTreemap = [0u64, 1, 2, 7, 9, 10, 25, 99, 150].into_iter().collect();
        let sel = selection_of(&positions, 100);
        let selectors: Vec<RowSelector> = sel.clone().into();
        assert_eq!(selectors.iter().map(|s| s.row_count).sum::<usize>(), 100, "covers the file, ignores 150");
        let picked: Vec<u64> = {
            let mut at = 0u64;
            let mut out = Vec::new();
            for s in &selectors {
                if !s.skip {
                    out.extend(at..at + s.row_count as u64);
                }
                at += s.row_count as u64;
            }
            out
        };
        assert_eq!(picked, vec![0, 1, 2, 7, 9, 10, 25, 99]);
        assert_eq!(selectors.iter().filter(|s| !s.skip).count(), 5, "runs are one selector each");
        let none: Vec<RowSelector> = selection_of(&RoaringTreemap::new(), 10).into();
        assert!(!RowSelection::from(none).selects_any());
    }

    /// A file on local disk: `groups` row groups of 20 000 rows (`v` = position × 7919), pages of 1 000 rows, with an
    /// offset index.
    fn local_file(dir: &std::path::Path, groups: usize) -> (FileIO, String) {
        let schema = Arc::new(Schema::new(vec![arrow_schema::Field::new("v", arrow_schema::DataType::Int64, false)]));
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(20_000))
            .set_data_page_row_count_limit(1_000)
            .set_write_batch_size(1_000)
            .set_dictionary_enabled(false)
            .build();
        let path = dir.join("f.parquet");
        let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema.clone(), Some(props)).unwrap();
        let values: Int64Array = (0..(groups * 20_000) as i64).map(|v| v * 7919).collect();
        w.write(&RecordBatch::try_new(schema, vec![Arc::new(values)]).unwrap()).unwrap();
        w.close().unwrap();
        let io = crate::storage::file_io(crate::storage::CdcStorageFactory::default(), &HashMap::new());
        (io, path.to_string_lossy().into_owned())
    }

    #[tokio::test]
    async fn reading_rows_at_positions_fetches_only_their_pages() {
        let dir = tempfile::tempdir().unwrap();
        let (io, path) = local_file(dir.path(), 4);
        let size = std::fs::metadata(&path).unwrap().len();
        let target = Arc::new(Schema::new(vec![arrow_schema::Field::new("v", arrow_schema::DataType::Int64, true)]));
        // rows in row groups 1 and 3 only, one page each, plus one past the end (ignored)
        let positions: RoaringTreemap = [20_005u64, 20_006, 20_999, 79_999, 80_000, 1 << 40].into_iter().collect();
        let read = read_rows_at(&io, &path, DataFileFormat::Parquet, target, None, Some(&positions)).await.unwrap();
        assert_eq!(read.rows_in_file, 80_000);
        let batches: Vec<RecordBatch> = read.stream.try_collect().await.unwrap();
        let got: Vec<i64> = batches.iter().flat_map(|b| b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec()).collect();
        assert_eq!(got, vec![20_005 * 7919, 20_006 * 7919, 20_999 * 7919, 79_999 * 7919]);
        let fetched = read.fetched.load(Ordering::Relaxed);
        // two pages of ~8 KB and the offset index, of a 640 KB file
        assert!(fetched > 0 && fetched * 20 < size, "fetched {fetched} of {size} bytes");
    }

    #[tokio::test]
    async fn the_gate_holds_one_row_group_per_reader_and_lets_the_next_wait() {
        let gate = ReadGate::new(1 << 20);
        let mut a = stream(file(3), &gate).await;
        assert_eq!(gate.available_kib(), 1024, "the footer is not charged");
        a.next().await.unwrap().unwrap();
        let held = 1024 - gate.available_kib();
        assert!((100..400).contains(&held), "one row group's column chunk is held: {held} KiB");
        let mut rows = 4096;
        while let Some(b) = a.next().await {
            rows += b.unwrap().num_rows();
            assert!(1024 - gate.available_kib() <= held + 8, "never two row groups at once");
        }
        assert_eq!(rows, 60_000);
        drop(a);
        assert_eq!(gate.available_kib(), 1024, "a finished reader gives everything back");

        // a gate smaller than one row group: the first reader takes all of it, the second waits until it is done
        let tiny = ReadGate::new(64 << 10);
        let mut first = stream(file(1), &tiny).await;
        let mut second = stream(file(1), &tiny).await;
        first.next().await.unwrap().unwrap();
        assert_eq!(tiny.available_kib(), 0);
        assert!(tokio::time::timeout(Duration::from_millis(50), second.next()).await.is_err(), "the second reader must wait");
        while first.next().await.is_some() {}
        drop(first);
        let b = tokio::time::timeout(Duration::from_secs(5), second.next()).await.expect("admitted once the first is done");
        assert_eq!(b.unwrap().unwrap().num_rows(), 4096);
    }
}

//! Reading Iceberg data and delete files into Arrow, by field id.
//!
//! Data files are projected onto the schema of the snapshot being read: columns are matched by Parquet field id (by
//! name only for files written without ids), promoted types are cast, and columns the file does not have come back
//! null. That is how rows of older files appear in a newer schema.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use arrow_row::{RowConverter, SortField};
use arrow_schema::{Schema, SchemaRef};
use futures::{Stream, StreamExt, TryStreamExt};
use iceberg::arrow::ArrowFileReader;
use iceberg::io::FileIO;
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
use parquet::arrow::ProjectionMask;
use roaring::RoaringTreemap;

use crate::error::{Error, Result};
use crate::source::files::FileEntry;
use crate::spec::dv;
use crate::spec::projection;

pub const BATCH_SIZE: usize = 8192;
pub use crate::spec::{POS_DELETE_FILE_PATH_ID, POS_DELETE_POS_ID};

pub use crate::spec::projection::field_id;

async fn open(file_io: &FileIO, path: &str) -> Result<ParquetRecordBatchStreamBuilder<ArrowFileReader>> {
    let err = |e: &dyn std::fmt::Display| Error::data(path, e);
    let input = file_io.new_input(path).map_err(|e| err(&e))?;
    let meta = input.metadata().await.map_err(|e| {
        if e.to_string().contains("No such file") || e.to_string().contains("NotFound") {
            Error::MissingFile { path: path.to_string() }
        } else {
            err(&e)
        }
    })?;
    let reader = input.reader().await.map_err(|e| err(&e))?;
    ParquetRecordBatchStreamBuilder::new(ArrowFileReader::new(meta, reader)).await.map_err(|e| err(&format!("not a readable Parquet file: {e}")))
}

/// Streams the rows of a Parquet data file, projected by field id onto `target`, in file order (so the n-th row
/// overall is at position n).
pub async fn read_data_file(file_io: &FileIO, path: &str, target: SchemaRef) -> Result<impl Stream<Item = Result<RecordBatch>> + Send + 'static> {
    let builder = open(file_io, path).await?;
    let file_schema = builder.schema().clone();
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
    let stream = builder.with_projection(mask).with_batch_size(BATCH_SIZE).build().map_err(|e| Error::data(path, e))?;
    let path = path.to_string();
    Ok(stream.map(move |b| {
        let b = b.map_err(|e| Error::data(&path, e))?;
        project(&b, &target).map_err(|e| Error::data(&path, e))
    }))
}

/// Projects `batch` onto `target` by field id at every nesting level (names only for files without ids), casting
/// promoted types, nulls for the rest. Top-level columns come back nullable.
pub fn project(batch: &RecordBatch, target: &SchemaRef) -> Result<RecordBatch> {
    // The target may declare a column required that older files lack; we are reading, not validating.
    projection::project_batch(batch, &relax(target), &Some)
}

pub use crate::spec::projection::relax;

/// A v2 position-delete file: deleted positions per data file path.
pub async fn read_position_deletes(file_io: &FileIO, path: &str) -> Result<HashMap<String, RoaringTreemap>> {
    let builder = open(file_io, path).await?;
    let schema = builder.schema().clone();
    let find = |id: i32, name: &str| {
        schema
            .fields()
            .iter()
            .position(|f| field_id(f) == Some(id) || f.name() == name)
            .ok_or_else(|| Error::data(path, format!("position-delete file has no `{name}` column")))
    };
    let (pi, qi) = (find(POS_DELETE_FILE_PATH_ID, "file_path")?, find(POS_DELETE_POS_ID, "pos")?);
    let mask = ProjectionMask::roots(builder.parquet_schema(), [pi, qi]);
    let mut stream = builder.with_projection(mask).build().map_err(|e| Error::data(path, e))?;
    let mut out: HashMap<String, RoaringTreemap> = HashMap::new();
    while let Some(b) = stream.try_next().await.map_err(|e| Error::data(path, e))? {
        let paths = arrow_cast::cast(b.column(0), &arrow_schema::DataType::Utf8)?;
        let paths = paths.as_any().downcast_ref::<StringArray>().unwrap();
        let pos = arrow_cast::cast(b.column(1), &arrow_schema::DataType::Int64)?;
        let pos = pos.as_any().downcast_ref::<Int64Array>().unwrap();
        for i in 0..b.num_rows() {
            if paths.is_null(i) || pos.is_null(i) {
                return Err(Error::data(path, "position-delete row with a null file_path or pos"));
            }
            out.entry(paths.value(i).to_string()).or_default().insert(pos.value(i) as u64);
        }
    }
    Ok(out)
}

/// A v3 deletion vector: the blob of a Puffin file at the entry's offset.
pub async fn read_dv(file_io: &FileIO, entry: &FileEntry) -> Result<RoaringTreemap> {
    let path = entry.path();
    let (off, len) = match (entry.file.content_offset(), entry.file.content_size_in_bytes()) {
        (Some(o), Some(l)) if o >= 0 && l > 0 => (o as u64, l as u64),
        _ => return Err(Error::data(path, "deletion vector without content_offset/content_size_in_bytes")),
    };
    let input = file_io.new_input(path).map_err(|e| Error::data(path, e))?;
    let reader = input.reader().await.map_err(|e| Error::data(path, e))?;
    let blob = reader.read(off..off + len).await.map_err(|e| Error::data(path, e))?;
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
}

pub use crate::spec::rowenc::KeySet;

impl EqDeletes {
    pub fn converter(&self, data_schema: &Schema) -> Result<(RowConverter, Vec<usize>)> {
        let mut idx = Vec::new();
        for id in &self.field_ids {
            let i = data_schema
                .fields()
                .iter()
                .position(|f| field_id(f) == Some(*id))
                .ok_or_else(|| Error::Schema(format!("equality-delete field id {id} is not in the table schema")))?;
            idx.push(i);
        }
        let conv = RowConverter::new(idx.iter().map(|&i| SortField::new(data_schema.field(i).data_type().clone())).collect())?;
        Ok((conv, idx))
    }
}

pub async fn read_equality_deletes(file_io: &FileIO, entry: &FileEntry, data_schema: &SchemaRef) -> Result<EqDeletes> {
    let path = entry.path();
    let field_ids = entry.file.equality_ids().unwrap_or_default();
    if field_ids.is_empty() {
        return Err(Error::data(path, "equality-delete file without equality_ids"));
    }
    let capacity = entry.file.record_count().min(64 << 20) as usize;
    let mut eq = EqDeletes { field_ids, keys: KeySet::with_capacity_and_hasher(capacity, ahash::RandomState::new()) };
    let (conv, idx) = eq.converter(data_schema)?;
    let key_schema: SchemaRef = Arc::new(Schema::new(idx.iter().map(|&i| data_schema.field(i).clone()).collect::<Vec<_>>()));
    let mut stream = Box::pin(read_data_file(file_io, path, key_schema).await?);
    while let Some(b) = stream.try_next().await? {
        let rows = conv.convert_columns(b.columns())?;
        for r in rows.iter() {
            eq.keys.insert(r.as_ref().into());
        }
    }
    Ok(eq)
}

//! Reading Iceberg's other data-file formats — ORC and Avro — into Arrow batches whose fields carry Iceberg field
//! ids the way Parquet's do (`PARQUET:field_id` metadata). The Parquet path's projection by id (renames, widened
//! types, added columns), deletes, netting and fingerprints then apply to them unchanged.
//!
//! Where the ids come from: ORC files written by Iceberg carry an `iceberg.id` attribute on every type of the footer;
//! Avro files a `field-id` on every record field (`element-id` on arrays, `key-id`/`value-id` on maps) in the
//! writer schema of the file's header. The decoders (orc-rust, arrow-avro) drop these attributes, so each module
//! reads them itself and lays them onto the decoded Arrow schema by walking both trees together; a file without ids
//! is matched by name, as Parquet files without ids are.
//!
//! Both read the whole file in order (no row-group or page skipping: a read of selected rows filters), ORC a
//! stripe at a time through ranged reads, Avro from the file's bytes in memory (Iceberg writes Avro data files for
//! small tables; a large one costs its size in memory).
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, ListArray, MapArray, RecordBatch, StructArray};
use arrow_schema::{DataType, FieldRef, Schema, SchemaRef};
use futures::stream::BoxStream;
use iceberg::io::FileIO;
use iceberg::spec::DataFileFormat;

use crate::error::{Error, Result};

pub(crate) mod avro;
pub(crate) mod orc;

pub const BATCH_SIZE: usize = 8192;

/// A storage error opening `path`: [`Error::MissingFile`] when the file is not there (an expiry problem, explained
/// by the scan), a data error otherwise.
pub(crate) fn opening_error(path: &str, e: iceberg::Error) -> Error {
    if e.to_string().contains("No such file") || e.to_string().contains("NotFound") {
        Error::MissingFile { path: path.to_string() }
    } else {
        Error::data_from(path, e)
    }
}

/// A non-Parquet file opened for reading: every row in file order, fields with ids.
pub(crate) struct Opened {
    /// The batches.
    pub stream: BoxStream<'static, Result<RecordBatch>>,
    /// The file's rows (from its footer or its decoded blocks).
    pub rows: u64,
    /// Bytes fetched so far.
    pub fetched: Arc<AtomicU64>,
}

/// Opens an ORC or Avro file (Parquet has its own path in `reader`).
pub(crate) async fn open(file_io: &FileIO, path: &str, format: DataFileFormat) -> Result<Opened> {
    match format {
        DataFileFormat::Orc => orc::open(file_io, path).await,
        DataFileFormat::Avro => avro::open(file_io, path).await,
        other => Err(Error::UnsupportedFormat { path: path.to_string(), format: format!("{other:?}").to_uppercase(), content: "data".into() }),
    }
}

pub(crate) use crate::spec::projection::with_id;

/// `batch` under `schema`: the same columns, their nested fields relabelled to `schema`'s (same shapes; the names
/// and metadata — the ids — from `schema`).
pub(crate) fn relabel_batch(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let cols = batch.columns().iter().zip(schema.fields()).map(|(c, f)| relabel(c, f.data_type())).collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}

/// `array` with the nested field definitions of `to`, which has the same shape.
fn relabel(array: &ArrayRef, to: &DataType) -> Result<ArrayRef> {
    if array.data_type() == to {
        return Ok(array.clone());
    }
    let shape = || Error::Internal(format!("relabelling {} as {to}: different shapes", array.data_type()));
    Ok(match to {
        DataType::Struct(fields) => {
            let s = array.as_any().downcast_ref::<StructArray>().ok_or_else(shape)?;
            let children = s.columns().iter().zip(fields.iter()).map(|(c, f)| relabel(c, f.data_type())).collect::<Result<Vec<_>>>()?;
            Arc::new(StructArray::try_new(fields.clone(), children, s.nulls().cloned())?)
        }
        DataType::List(f) => {
            let l = array.as_any().downcast_ref::<ListArray>().ok_or_else(shape)?;
            Arc::new(ListArray::try_new(f.clone(), l.offsets().clone(), relabel(l.values(), f.data_type())?, l.nulls().cloned())?)
        }
        // a map the file stores as a list of key/value records (Avro maps with non-string keys)
        DataType::Map(f, sorted) if array.as_any().is::<ListArray>() => {
            let l = array.as_any().downcast_ref::<ListArray>().ok_or_else(shape)?;
            let entries = relabel(l.values(), f.data_type())?;
            let entries = entries.as_any().downcast_ref::<StructArray>().ok_or_else(shape)?;
            let entries = StructArray::try_new(entries.fields().clone(), entries.columns().to_vec(), None)?;
            Arc::new(MapArray::try_new(f.clone(), l.offsets().clone(), entries, l.nulls().cloned(), *sorted)?)
        }
        DataType::Map(f, sorted) => {
            let m = array.as_any().downcast_ref::<MapArray>().ok_or_else(shape)?;
            let entries: ArrayRef = Arc::new(m.entries().clone());
            let entries = relabel(&entries, f.data_type())?;
            let entries = entries.as_any().downcast_ref::<StructArray>().ok_or_else(shape)?.clone();
            Arc::new(MapArray::try_new(f.clone(), m.offsets().clone(), entries, m.nulls().cloned(), *sorted)?)
        }
        // primitive types that differ only by what the decoder chose are left to the projection's casts
        _ => array.clone(),
    })
}

/// A schema from fields.
pub(crate) fn schema_of(fields: Vec<FieldRef>, metadata: HashMap<String, String>) -> SchemaRef {
    Arc::new(Schema::new_with_metadata(fields, metadata))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int32Array, StringArray};
    use arrow_schema::{Field, Fields};

    #[test]
    fn nested_fields_take_the_ids_of_the_schema() {
        let plain = Fields::from(vec![Field::new("a", DataType::Int32, true), Field::new("b", DataType::Utf8, true)]);
        let s = StructArray::try_new(plain.clone(), vec![Arc::new(Int32Array::from(vec![1])), Arc::new(StringArray::from(vec!["x"]))], None).unwrap();
        let batch = RecordBatch::try_new(Arc::new(Schema::new(vec![Field::new("s", DataType::Struct(plain), true)])), vec![Arc::new(s)]).unwrap();
        let ided =
            Fields::from(vec![with_id(Field::new("a", DataType::Int32, true), Some(2)), with_id(Field::new("b", DataType::Utf8, true), Some(3))]);
        let schema = Arc::new(Schema::new(vec![with_id(Field::new("s", DataType::Struct(ided), true), Some(1))]));
        let got = relabel_batch(&batch, &schema).unwrap();
        let DataType::Struct(fields) = got.column(0).data_type() else { panic!() };
        assert_eq!(crate::spec::projection::field_id(&fields[1]), Some(3));
        assert_eq!(crate::spec::projection::field_id(got.schema().field(0)), Some(1));
    }
}

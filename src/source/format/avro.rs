//! Avro data files (arrow-avro), decoded from the file's bytes in memory.
//!
//! Field ids: arrow-avro keeps no field attributes, so the writer schema in the file's header (`avro.schema`) is
//! walked beside the decoded Arrow schema: a record field's `field-id`, an array's `element-id`, a map's `key-id`
//! and `value-id` (Iceberg's Avro mapping), through `["null", T]` unions.
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{DataType, Field, FieldRef};
use futures::StreamExt;
use iceberg::io::FileIO;
use serde_json::Value;

use super::{relabel_batch, schema_of, with_id, Opened};
use crate::error::{Error, Result};
use crate::source::reader::BATCH_SIZE;

pub(crate) async fn open(file_io: &FileIO, path: &str) -> Result<Opened> {
    let err = |e: &dyn std::fmt::Display| Error::data(path, e);
    let input = file_io.new_input(path).map_err(|e| err(&e))?;
    let bytes = input.read().await.map_err(|e| {
        if e.to_string().contains("No such file") || e.to_string().contains("NotFound") {
            Error::MissingFile { path: path.to_string() }
        } else {
            err(&e)
        }
    })?;
    let fetched = Arc::new(AtomicU64::new(bytes.len() as u64));
    let reader = arrow_avro::reader::ReaderBuilder::new()
        .with_batch_size(BATCH_SIZE)
        .build(std::io::Cursor::new(bytes))
        .map_err(|e| err(&format!("not a readable Avro file: {e}")))?;
    let writer: Value = reader
        .avro_header()
        .get("avro.schema")
        .and_then(|s| serde_json::from_slice(s).ok())
        .ok_or_else(|| err(&"Avro file without a readable writer schema"))?;
    let decoded = reader.schema();
    let record = non_null(&writer);
    let fields: Vec<FieldRef> = decoded.fields().iter().map(|f| Arc::new(field_of_record(f, record))).collect();
    let schema = schema_of(fields, decoded.metadata().clone());
    let mut batches = Vec::new();
    let mut rows = 0u64;
    for b in reader {
        let b = relabel_batch(&b.map_err(|e| err(&e))?, &schema)?;
        rows += b.num_rows() as u64;
        batches.push(Ok::<RecordBatch, Error>(b));
    }
    Ok(Opened { stream: futures::stream::iter(batches).boxed(), rows, fetched })
}

/// The member of a `["null", T]` union that is not null (the type itself otherwise).
fn non_null(t: &Value) -> &Value {
    match t {
        Value::Array(members) => members.iter().find(|m| m.as_str() != Some("null")).unwrap_or(t),
        _ => t,
    }
}

fn id_of(v: &Value, key: &str) -> Option<i32> {
    v.get(key).and_then(Value::as_i64).and_then(|i| i32::try_from(i).ok())
}

/// Arrow field `f`, a field of Avro record `record`, with its id and its nested ids.
fn field_of_record(f: &Field, record: &Value) -> Field {
    let Some(avro) =
        record.get("fields").and_then(Value::as_array).and_then(|fs| fs.iter().find(|a| a.get("name").and_then(Value::as_str) == Some(f.name())))
    else {
        return f.clone();
    };
    with_id(nested(f, non_null(avro.get("type").unwrap_or(&Value::Null))), id_of(avro, "field-id"))
}

/// `f` with the ids of the nested fields of Avro type `t`.
fn nested(f: &Field, t: &Value) -> Field {
    let dt = match (f.data_type(), t.get("type").and_then(Value::as_str)) {
        (DataType::Struct(fs), Some("record")) => DataType::Struct(fs.iter().map(|c| Arc::new(field_of_record(c, t))).collect()),
        (DataType::List(e), Some("array")) => {
            let items = non_null(t.get("items").unwrap_or(&Value::Null));
            DataType::List(Arc::new(with_id(nested(e, items), id_of(t, "element-id"))))
        }
        (DataType::Map(entries, sorted), Some("map")) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => {
                let values = non_null(t.get("values").unwrap_or(&Value::Null));
                let kv: Vec<FieldRef> = vec![
                    Arc::new(with_id(kv[0].as_ref().clone(), id_of(t, "key-id"))),
                    Arc::new(with_id(nested(&kv[1], values), id_of(t, "value-id"))),
                ];
                DataType::Map(Arc::new(entries.as_ref().clone().with_data_type(DataType::Struct(kv.into()))), *sorted)
            }
            _ => f.data_type().clone(),
        },
        (other, _) => other.clone(),
    };
    f.clone().with_data_type(dt)
}

//! Avro data files (arrow-avro), decoded batch by batch from the file's bytes in memory (the file, not its decoded
//! rows, is held). The row count comes first from the container's block headers (a count and a size each), without
//! decoding.
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

use super::{opening_error, BATCH_SIZE};
use super::{relabel_batch, schema_of, with_id, Opened};
use crate::error::{Error, Result};

pub(crate) async fn open(file_io: &FileIO, path: &str) -> Result<Opened> {
    let err = |e: &dyn std::fmt::Display| Error::data(path, e);
    let input = file_io.new_input(path).map_err(|e| err(&e))?;
    let bytes = input.read().await.map_err(|e| opening_error(path, e))?;
    let fetched = Arc::new(AtomicU64::new(bytes.len() as u64));
    let rows = count_rows(&bytes).map_err(|e| err(&format!("not a readable Avro file: {e}")))?;
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
    let path = path.to_string();
    // decoded lazily, a batch per poll (a few milliseconds of work)
    let stream =
        futures::stream::iter(reader).map(move |b| -> Result<RecordBatch> { relabel_batch(&b.map_err(|e| Error::data_from(&path, e))?, &schema) });
    Ok(Opened { stream: stream.boxed(), rows, fetched })
}

/// The rows of an Avro object container file: the sum of its blocks' counts. Each block is a zig-zag varint count,
/// a zig-zag varint byte size, the data and a 16-byte sync marker.
fn count_rows(bytes: &[u8]) -> std::result::Result<u64, String> {
    let header = arrow_avro::reader::read_header_info(std::io::Cursor::new(bytes)).map_err(|e| e.to_string())?;
    let mut at = header.header_len() as usize;
    let mut rows = 0u64;
    while at < bytes.len() {
        let count = varint(bytes, &mut at)?;
        let size = varint(bytes, &mut at)?;
        if count < 0 || size < 0 {
            return Err(format!("a block header at byte {at} is negative"));
        }
        rows += count as u64;
        at = at.checked_add(size as usize + 16).filter(|&a| a <= bytes.len()).ok_or("a block runs past the end of the file")?;
    }
    Ok(rows)
}

/// A zig-zag varint (Avro's `long`) at `*at`, advancing past it.
fn varint(bytes: &[u8], at: &mut usize) -> std::result::Result<i64, String> {
    let (mut v, mut shift) = (0u64, 0u32);
    loop {
        let b = *bytes.get(*at).ok_or("a block header runs past the end of the file")?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(((v >> 1) as i64) ^ -((v & 1) as i64));
        }
        shift += 7;
        if shift > 63 {
            return Err("a varint longer than 10 bytes".into());
        }
    }
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
        // Iceberg writes a map whose keys are not strings as an array of key/value records marked `logicalType: map`
        (DataType::List(e), Some("array")) if t.get("logicalType").and_then(Value::as_str) == Some("map") => match e.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => {
                let record = non_null(t.get("items").unwrap_or(&Value::Null));
                let key = field_of_record(&kv[0], record).with_nullable(false);
                let entries = Field::new("key_value", DataType::Struct(vec![Arc::new(key), Arc::new(field_of_record(&kv[1], record))].into()), false);
                DataType::Map(Arc::new(entries), false)
            }
            _ => f.data_type().clone(),
        },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zig_zag_varints_decode_as_avro_longs() {
        for (bytes, want) in [(&[0x00][..], 0i64), (&[0x01], -1), (&[0x02], 1), (&[0xac, 0x02], 150), (&[0xff, 0xff, 0x03], -32768)] {
            let mut at = 0;
            assert_eq!(varint(bytes, &mut at), Ok(want), "{bytes:?}");
            assert_eq!(at, bytes.len());
        }
        assert!(varint(&[0x80], &mut 0).is_err(), "cut short");
    }
}

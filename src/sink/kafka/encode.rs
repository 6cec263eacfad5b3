//! Kafka messages from change rows: the key (the row's key columns as a JSON object), the value (`json`: the change
//! row as `cdc changes` prints it; `debezium`: Debezium's envelope, optionally in Kafka Connect's `schema`+`payload`
//! framing) and the headers.
//!
//! Debezium pairs an `UPDATE_BEFORE` with the `UPDATE_AFTER` of the same key into one `u` message; the engine emits
//! the two rows next to each other (ordered by ordinal, key, then before-after), so [`Encoder`] holds at most one
//! pending before-image, also across batches.
use std::fmt::Write as _;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, Int8Type, TimestampMicrosecondType};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};

use crate::change::{self, ChangeType};
use crate::config::KafkaFormat;
use crate::error::{Error, Result};
use crate::output::{json_value, push_json_str as push_str};

/// Header names on every message.
pub mod headers {
    pub const CHANGE_TYPE: &str = "cdc.change_type";
    pub const SNAPSHOT_ID: &str = "cdc.snapshot_id";
    pub const SEQUENCE_NUMBER: &str = "cdc.sequence_number";
    pub const ORDINAL: &str = "cdc.ordinal";
    /// On the messages of a commit that follows a rewrite of the source's history: its kind (`rollback`, …).
    pub const RESYNC: &str = "cdc.resync";
}

/// One Kafka message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub key: Option<String>,
    /// `None`: a tombstone.
    pub value: Option<String>,
    pub change_type: &'static str,
    pub snapshot_id: i64,
    pub sequence_number: i64,
    pub ordinal: i32,
}

/// Which table the messages come from (Debezium's `source` block).
#[derive(Debug, Clone)]
pub struct SourceMeta {
    pub namespace: String,
    pub table: String,
}

/// Turns change batches into messages, in order.
pub struct Encoder {
    format: KafkaFormat,
    tombstones: bool,
    schemas_enable: bool,
    source: SourceMeta,
    /// Field ids of the key columns (empty: no key, messages without a key).
    key_ids: Vec<i32>,
    /// A before-image waiting for its after-image (debezium).
    pending: Option<Pending>,
    /// The bootstrap copy: rows are the table's contents (`r` messages).
    snapshot: bool,
    /// The envelope's `ts_ms` (processing time), read once per batch: a clock read per message was ~1 % of the CPU.
    now_ms: i64,
    /// With `schemas_enable`: the Connect envelope up to its payload (`{"schema":{...},"payload":`), built once per
    /// batch from the batch's schema rather than once per message.
    schema_prefix: String,
}

struct Pending {
    key: Option<String>,
    before: String,
    meta: RowMeta,
}

#[derive(Clone, Copy)]
struct RowMeta {
    change: ChangeType,
    snapshot_id: i64,
    sequence_number: i64,
    commit_ms: i64,
    ordinal: i32,
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a dyn Array> {
    batch.column_by_name(name).map(|c| c.as_ref()).ok_or_else(|| Error::Internal(format!("change batch without {name}")))
}

impl Encoder {
    /// An encoder for rows of a table whose key columns have `key_ids`.
    pub fn new(format: KafkaFormat, tombstones: bool, schemas_enable: bool, source: SourceMeta, key_ids: Vec<i32>) -> Self {
        Encoder { format, tombstones, schemas_enable, source, key_ids, pending: None, snapshot: false, now_ms: 0, schema_prefix: String::new() }
    }

    /// Whether the rows that follow are a bootstrap copy (`r` in Debezium).
    pub fn set_snapshot(&mut self, snapshot: bool) {
        self.snapshot = snapshot;
    }

    /// Whether a before-image waits for its after-image (a transaction must not end here).
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// The messages of `batch` (change rows in the engine's change schema) — `skip` rows are consumed without
    /// producing messages (already published). Returns the messages and the rows consumed per message (a Debezium
    /// update consumes two rows), so callers can count rows precisely.
    pub fn encode(&mut self, batch: &RecordBatch, out: &mut Vec<(Message, u64)>) -> Result<()> {
        self.now_ms = chrono::Utc::now().timestamp_millis();
        let types = column(batch, change::CHANGE_TYPE)?.as_primitive::<Int8Type>().clone();
        let snaps = column(batch, change::COMMIT_SNAPSHOT_ID)?.as_primitive::<Int64Type>().clone();
        let seqs = column(batch, change::COMMIT_SEQUENCE_NUMBER)?.as_primitive::<Int64Type>().clone();
        let ts = column(batch, change::COMMIT_TIMESTAMP)?.as_primitive::<TimestampMicrosecondType>().clone();
        let ords = column(batch, change::CHANGE_ORDINAL)?.as_primitive::<Int32Type>().clone();
        let schema = batch.schema();
        let data_cols: Vec<usize> = (0..schema.fields().len())
            .filter(|i| !schema.field(*i).name().starts_with("_change") && !schema.field(*i).name().starts_with("_commit"))
            .collect();
        let key_cols: Vec<usize> = self
            .key_ids
            .iter()
            .map(|id| {
                data_cols
                    .iter()
                    .copied()
                    .find(|i| crate::spec::projection::field_id(schema.field(*i)) == Some(*id))
                    .ok_or_else(|| Error::Internal(format!("key field {id} not in the change rows")))
            })
            .collect::<Result<_>>()?;
        let output = match self.format {
            KafkaFormat::Json => Some(change::for_output(batch, &change::output_schema(&schema))?),
            KafkaFormat::Debezium => None,
        };
        if self.schemas_enable && self.format == KafkaFormat::Debezium {
            self.schema_prefix = self.connect_prefix(&schema, &data_cols);
        }
        let all_cols: Vec<usize> = output.as_ref().map(|o| (0..o.num_columns()).collect()).unwrap_or_default();
        let all_keys = output.as_ref().map(|o| keys(o, &all_cols)).unwrap_or_default();
        let key_keys = keys(batch, &key_cols);
        let data_keys = keys(batch, &data_cols);
        for row in 0..batch.num_rows() {
            let meta = RowMeta {
                change: ChangeType::from_code(types.value(row)).ok_or_else(|| Error::Internal("unknown change type code".into()))?,
                snapshot_id: snaps.value(row),
                sequence_number: seqs.value(row),
                commit_ms: ts.value(row) / 1000,
                ordinal: ords.value(row),
            };
            let key = if key_cols.is_empty() { None } else { Some(object(batch, &key_cols, &key_keys, row)?) };
            match (&output, self.format) {
                (Some(o), _) => {
                    let value = object(o, &all_cols, &all_keys, row)?;
                    out.push((message(key, Some(value), meta), 1));
                }
                (None, _) => self.debezium(batch, &data_cols, &data_keys, row, key, meta, out)?,
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn debezium(
        &mut self,
        batch: &RecordBatch,
        data_cols: &[usize],
        data_keys: &[String],
        row: usize,
        key: Option<String>,
        meta: RowMeta,
        out: &mut Vec<(Message, u64)>,
    ) -> Result<()> {
        let image = object(batch, data_cols, data_keys, row)?;
        match meta.change {
            ChangeType::UpdateBefore => {
                if let Some(p) = self.pending.take() {
                    // a before-image without its after-image: publish it as a delete rather than lose it
                    let v = self.envelope(Some(&p.before), None, "d", p.meta);
                    out.push((message(p.key, Some(v), p.meta), 1));
                }
                self.pending = Some(Pending { key, before: image, meta });
            }
            ChangeType::UpdateAfter => match self.pending.take() {
                Some(p) if p.key == key => {
                    let v = self.envelope(Some(&p.before), Some(&image), "u", meta);
                    out.push((message(key, Some(v), meta), 2));
                }
                other => {
                    if let Some(p) = other {
                        let v = self.envelope(Some(&p.before), None, "d", p.meta);
                        out.push((message(p.key, Some(v), p.meta), 1));
                    }
                    let v = self.envelope(None, Some(&image), "c", meta);
                    out.push((message(key, Some(v), meta), 1));
                }
            },
            ChangeType::Insert => {
                let op = if self.snapshot { "r" } else { "c" };
                let v = self.envelope(None, Some(&image), op, meta);
                out.push((message(key, Some(v), meta), 1));
            }
            ChangeType::Delete => {
                let v = self.envelope(Some(&image), None, "d", meta);
                out.push((message(key.clone(), Some(v), meta), 1));
                if self.tombstones && key.is_some() {
                    out.push((message(key, None, meta), 0));
                }
            }
        }
        Ok(())
    }

    fn envelope(&self, before: Option<&str>, after: Option<&str>, op: &str, meta: RowMeta) -> String {
        let now = self.now_ms;
        let images = before.map_or(4, str::len) + after.map_or(4, str::len);
        // sized for the whole message: growing it would copy the images again
        let mut s = String::with_capacity(self.schema_prefix.len() + images + self.source.namespace.len() + self.source.table.len() + 320);
        s.push_str(&self.schema_prefix); // empty without schemas_enable
        s.push_str("{\"before\":");
        s.push_str(before.unwrap_or("null"));
        s.push_str(",\"after\":");
        s.push_str(after.unwrap_or("null"));
        s.push_str(",\"source\":{\"version\":");
        push_str(&mut s, env!("CARGO_PKG_VERSION"));
        s.push_str(",\"connector\":\"iceberg\",\"name\":\"iceberg-cdc\",\"db\":");
        push_str(&mut s, &self.source.namespace);
        s.push_str(",\"table\":");
        push_str(&mut s, &self.source.table);
        let _ = write!(
            s,
            ",\"snapshot_id\":{},\"sequence_number\":{},\"ordinal\":{},\"ts_ms\":{},\"snapshot\":\"{}\"}},\"op\":\"{op}\",\"ts_ms\":{now}}}",
            meta.snapshot_id, meta.sequence_number, meta.ordinal, meta.commit_ms, self.snapshot
        );
        if self.schemas_enable {
            s.push('}');
        }
        s
    }

    /// The Connect JSON envelope of rows with the columns `data_cols` of `schema`, up to (and including) `"payload":`.
    fn connect_prefix(&self, schema: &Schema, data_cols: &[usize]) -> String {
        let row = connect_struct(data_cols.iter().map(|i| schema.field(*i)), true, None);
        let source = r#"{"type":"struct","optional":false,"name":"io.iceberg.cdc.Source","field":"source","fields":[{"type":"string","optional":false,"field":"version"},{"type":"string","optional":false,"field":"connector"},{"type":"string","optional":false,"field":"name"},{"type":"string","optional":false,"field":"db"},{"type":"string","optional":false,"field":"table"},{"type":"int64","optional":false,"field":"snapshot_id"},{"type":"int64","optional":false,"field":"sequence_number"},{"type":"int32","optional":false,"field":"ordinal"},{"type":"int64","optional":false,"field":"ts_ms"},{"type":"string","optional":false,"field":"snapshot"}]}"#;
        let name = format!("cdc.{}.{}", self.source.namespace, self.source.table);
        let mut s = String::with_capacity(2 * row.len() + source.len() + 512);
        s.push_str("{\"schema\":{\"type\":\"struct\",\"optional\":false,\"name\":");
        push_str(&mut s, &format!("{name}.Envelope"));
        s.push_str(",\"fields\":[");
        s.push_str(&with_field(&row, "before", &format!("{name}.Value")));
        s.push(',');
        s.push_str(&with_field(&row, "after", &format!("{name}.Value")));
        s.push(',');
        s.push_str(source);
        s.push_str(r#",{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":false,"field":"ts_ms"}]},"payload":"#);
        s
    }
}

fn message(key: Option<String>, value: Option<String>, m: RowMeta) -> Message {
    Message { key, value, change_type: m.change.as_str(), snapshot_id: m.snapshot_id, sequence_number: m.sequence_number, ordinal: m.ordinal }
}

/// The JSON object keys (`"name":`) of `cols`, encoded once per batch.
fn keys(batch: &RecordBatch, cols: &[usize]) -> Vec<String> {
    let schema = batch.schema();
    cols.iter()
        .map(|i| {
            let mut k = serde_json::to_string(schema.field(*i).name()).expect("strings serialize");
            k.push(':');
            k
        })
        .collect()
}

/// `{"name": value, ...}` of the columns `cols` of `row` (Iceberg single-value JSON for the values); `keys` from
/// [`keys`].
fn object(batch: &RecordBatch, cols: &[usize], keys: &[String], row: usize) -> Result<String> {
    let schema = batch.schema_ref();
    let mut s = String::with_capacity(32 * cols.len() + 2);
    s.push('{');
    for (n, (i, k)) in cols.iter().zip(keys).enumerate() {
        if n > 0 {
            s.push(',');
        }
        s.push_str(k);
        json_value(&mut s, batch.column(*i).as_ref(), schema.field(*i), row)?;
    }
    s.push('}');
    Ok(s)
}

/// `schema` with `"field": name` (and a struct name) added, for a field of the envelope.
fn with_field(schema: &str, field: &str, name: &str) -> String {
    let inner = schema.strip_prefix('{').expect("a JSON object");
    format!("{{\"field\":\"{field}\",\"name\":{},{inner}", serde_json::to_string(name).expect("serializes"))
}

/// Kafka Connect's JSON schema of a struct of `fields`. Types Connect has no JSON form for that matches the
/// Iceberg single-value JSON (decimals, dates, times, timestamps, uuids, binary as text; maps) are declared `string`
/// (their JSON text) so that `JsonConverter` reads every payload.
fn connect_struct<'a>(fields: impl Iterator<Item = &'a Field>, optional: bool, field: Option<&str>) -> String {
    let mut s = String::from("{\"type\":\"struct\",");
    if let Some(f) = field {
        let _ = write!(s, "\"field\":{},", serde_json::to_string(f).expect("serializes"));
    }
    let _ = write!(s, "\"optional\":{optional},\"fields\":[");
    for (n, f) in fields.enumerate() {
        if n > 0 {
            s.push(',');
        }
        s.push_str(&connect_field(f, Some(f.name())));
    }
    s.push_str("]}");
    s
}

fn connect_field(f: &Field, name: Option<&str>) -> String {
    let named = |t: &str| match name {
        Some(n) => format!("{{\"type\":\"{t}\",\"optional\":{},\"field\":{}}}", f.is_nullable(), serde_json::to_string(n).expect("serializes")),
        None => format!("{{\"type\":\"{t}\",\"optional\":{}}}", f.is_nullable()),
    };
    match f.data_type() {
        DataType::Boolean => named("boolean"),
        DataType::Int32 => named("int32"),
        DataType::Int64 => named("int64"),
        DataType::Float32 => named("float"),
        DataType::Float64 => named("double"),
        DataType::Struct(children) => connect_struct(children.iter().map(|c| c.as_ref()), f.is_nullable(), name),
        DataType::List(item) | DataType::LargeList(item) => {
            let items = connect_field(item, None);
            match name {
                Some(n) => format!(
                    "{{\"type\":\"array\",\"optional\":{},\"field\":{},\"items\":{items}}}",
                    f.is_nullable(),
                    serde_json::to_string(n).expect("serializes")
                ),
                None => format!("{{\"type\":\"array\",\"optional\":{},\"items\":{items}}}", f.is_nullable()),
            }
        }
        // maps are {"keys": [...], "values": [...]} in Iceberg's JSON: a struct of two arrays
        DataType::Map(entries, _) => {
            let DataType::Struct(kv) = entries.data_type() else { return named("string") };
            let keys = connect_field(&kv[0], None);
            let values = connect_field(&kv[1], None);
            let head = match name {
                Some(n) => {
                    format!("{{\"type\":\"struct\",\"optional\":{},\"field\":{},", f.is_nullable(), serde_json::to_string(n).expect("serializes"))
                }
                None => format!("{{\"type\":\"struct\",\"optional\":{},", f.is_nullable()),
            };
            format!("{head}\"fields\":[{{\"type\":\"array\",\"optional\":false,\"field\":\"keys\",\"items\":{keys}}},{{\"type\":\"array\",\"optional\":false,\"field\":\"values\",\"items\":{values}}}]}}")
        }
        _ => named("string"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int32Array, Int64Array, Int8Array, StringArray, TimestampMicrosecondArray};
    use arrow_schema::{Field, Schema};

    use super::*;

    fn batch(rows: &[(ChangeType, i64, &str)]) -> RecordBatch {
        let id =
            Field::new("id", DataType::Int64, false).with_metadata([(parquet::arrow::PARQUET_FIELD_ID_META_KEY.to_string(), "1".to_string())].into());
        let name =
            Field::new("name", DataType::Utf8, true).with_metadata([(parquet::arrow::PARQUET_FIELD_ID_META_KEY.to_string(), "2".to_string())].into());
        let data = Arc::new(Schema::new(vec![id, name]));
        let schema = change::change_schema(&data);
        let n = rows.len();
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
            Arc::new(Int8Array::from_iter_values(rows.iter().map(|r| r.0.code()))),
            Arc::new(Int64Array::from(vec![7; n])),
            Arc::new(Int64Array::from(vec![3; n])),
            Arc::new(TimestampMicrosecondArray::from(vec![1_700_000_000_000_000; n]).with_timezone("+00:00")),
            Arc::new(Int32Array::from(vec![0; n])),
        ];
        RecordBatch::try_new(schema, cols).unwrap()
    }

    fn enc(format: KafkaFormat) -> Encoder {
        Encoder::new(format, true, false, SourceMeta { namespace: "db".into(), table: "t".into() }, vec![1])
    }

    #[test]
    fn json_messages_are_the_change_rows() {
        let mut out = Vec::new();
        enc(KafkaFormat::Json).encode(&batch(&[(ChangeType::Insert, 1, "a")]), &mut out).unwrap();
        let (m, rows) = &out[0];
        assert_eq!((m.key.as_deref(), *rows, m.change_type, m.snapshot_id, m.sequence_number), (Some(r#"{"id":1}"#), 1, "INSERT", 7, 3));
        let v: serde_json::Value = serde_json::from_str(m.value.as_ref().unwrap()).unwrap();
        assert_eq!(v["name"], "a");
        assert_eq!(v["_change_type"], "INSERT");
        assert_eq!(v["_commit_snapshot_id"], 7);
    }

    #[test]
    fn debezium_pairs_updates_across_batches_and_adds_tombstones() {
        let mut e = enc(KafkaFormat::Debezium);
        let mut out = Vec::new();
        e.encode(&batch(&[(ChangeType::Delete, 2, "x"), (ChangeType::UpdateBefore, 1, "old")]), &mut out).unwrap();
        assert!(e.has_pending());
        e.encode(&batch(&[(ChangeType::UpdateAfter, 1, "new")]), &mut out).unwrap();
        assert!(!e.has_pending());
        assert_eq!(out.len(), 3, "delete, its tombstone, one update");
        let d: serde_json::Value = serde_json::from_str(out[0].0.value.as_ref().unwrap()).unwrap();
        assert_eq!((d["op"].as_str(), d["after"].is_null(), d["before"]["name"].as_str()), (Some("d"), true, Some("x")));
        assert_eq!((out[1].0.key.as_deref(), out[1].0.value.as_ref(), out[1].1), (Some(r#"{"id":2}"#), None, 0));
        let u: serde_json::Value = serde_json::from_str(out[2].0.value.as_ref().unwrap()).unwrap();
        assert_eq!((u["op"].as_str(), u["before"]["name"].as_str(), u["after"]["name"].as_str(), out[2].1), (Some("u"), Some("old"), Some("new"), 2));
        assert_eq!(
            (u["source"]["db"].as_str(), u["source"]["table"].as_str(), u["source"]["snapshot_id"].as_i64()),
            (Some("db"), Some("t"), Some(7))
        );
        assert_eq!(u["source"]["ts_ms"].as_i64(), Some(1_700_000_000_000));
    }

    #[test]
    fn snapshot_rows_are_reads_and_connect_framing_carries_a_schema() {
        let mut e = Encoder::new(KafkaFormat::Debezium, true, true, SourceMeta { namespace: "db".into(), table: "t".into() }, vec![1]);
        e.set_snapshot(true);
        let mut out = Vec::new();
        e.encode(&batch(&[(ChangeType::Insert, 1, "a")]), &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_str(out[0].0.value.as_ref().unwrap()).unwrap();
        assert_eq!(v["payload"]["op"], "r");
        assert_eq!(v["payload"]["source"]["snapshot"], "true");
        let fields = v["schema"]["fields"].as_array().unwrap();
        assert_eq!(fields[0]["field"], "before");
        assert_eq!(fields[0]["fields"][0], serde_json::json!({"type": "int64", "optional": false, "field": "id"}));
        assert_eq!(fields[0]["fields"][1]["type"], "string");
    }
}

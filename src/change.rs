//! Change rows: the change types and the metadata columns every change row carries.
use std::sync::Arc;

use arrow_array::{ArrayRef, Int32Array, Int64Array, Int8Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

use crate::error::Result;

pub const CHANGE_TYPE: &str = "_change_type";
pub const COMMIT_SNAPSHOT_ID: &str = "_commit_snapshot_id";
pub const COMMIT_SEQUENCE_NUMBER: &str = "_commit_snapshot_sequence_number";
pub const COMMIT_TIMESTAMP: &str = "_commit_timestamp";
pub const CHANGE_ORDINAL: &str = "_change_ordinal";

/// Field ids of the metadata columns in Parquet output: the top of the id space Iceberg reserves for metadata
/// columns, below the ids the spec already assigns (`_file`, `_pos`, ...).
pub const CHANGE_TYPE_ID: i32 = 2147482000;
pub const COMMIT_SNAPSHOT_ID_ID: i32 = 2147482001;
pub const COMMIT_SEQUENCE_NUMBER_ID: i32 = 2147482002;
pub const COMMIT_TIMESTAMP_ID: i32 = 2147482003;
pub const CHANGE_ORDINAL_ID: i32 = 2147482004;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChangeType {
    Delete,
    Insert,
    UpdateBefore,
    UpdateAfter,
}

impl ChangeType {
    pub const ALL: [ChangeType; 4] = [ChangeType::Insert, ChangeType::Delete, ChangeType::UpdateBefore, ChangeType::UpdateAfter];
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeType::Delete => "DELETE",
            ChangeType::Insert => "INSERT",
            ChangeType::UpdateBefore => "UPDATE_BEFORE",
            ChangeType::UpdateAfter => "UPDATE_AFTER",
        }
    }
    pub fn parse(s: &str) -> Option<ChangeType> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
    /// The code change batches carry in their `_change_type` column (strings only when output is encoded).
    pub fn code(self) -> i8 {
        self as i8
    }
    pub fn from_code(code: i8) -> Option<ChangeType> {
        Self::ALL.into_iter().find(|t| t.code() == code)
    }
}

/// Arrow type of `_change_type` inside the engine: a [`ChangeType::code`].
pub const CHANGE_TYPE_CODE: DataType = DataType::Int8;

/// The commit a batch of change rows belongs to.
#[derive(Debug, Clone, Copy)]
pub struct CommitInfo {
    pub snapshot_id: i64,
    pub sequence_number: i64,
    pub timestamp_ms: i64,
    pub ordinal: i32,
}

/// Arrow schema of change rows: the (relaxed) table columns followed by the metadata columns.
pub fn change_schema(data: &SchemaRef) -> SchemaRef {
    let mut fields: Vec<Field> = data.fields().iter().map(|f| f.as_ref().clone()).collect();
    let meta = |name: &str, id: i32, dt: DataType| {
        Field::new(name, dt, false).with_metadata([(parquet::arrow::PARQUET_FIELD_ID_META_KEY.to_string(), id.to_string())].into())
    };
    fields.push(meta(CHANGE_TYPE, CHANGE_TYPE_ID, CHANGE_TYPE_CODE));
    fields.push(meta(COMMIT_SNAPSHOT_ID, COMMIT_SNAPSHOT_ID_ID, DataType::Int64));
    fields.push(meta(COMMIT_SEQUENCE_NUMBER, COMMIT_SEQUENCE_NUMBER_ID, DataType::Int64));
    fields.push(meta(COMMIT_TIMESTAMP, COMMIT_TIMESTAMP_ID, DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))));
    fields.push(meta(CHANGE_ORDINAL, CHANGE_ORDINAL_ID, DataType::Int32));
    Arc::new(Schema::new_with_metadata(fields, data.metadata().clone()))
}

/// Builds change rows from table columns (already in the output schema) and their change types.
pub fn with_metadata(schema: &SchemaRef, data_cols: Vec<ArrayRef>, change_types: ArrayRef, commit: CommitInfo) -> Result<RecordBatch> {
    let n = change_types.len();
    let mut cols = data_cols;
    cols.push(change_types);
    cols.push(Arc::new(Int64Array::from(vec![commit.snapshot_id; n])));
    cols.push(Arc::new(Int64Array::from(vec![commit.sequence_number; n])));
    cols.push(Arc::new(TimestampMicrosecondArray::from(vec![commit.timestamp_ms * 1000; n]).with_timezone("+00:00")));
    cols.push(Arc::new(Int32Array::from(vec![commit.ordinal; n])));
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}

/// Reads the `_change_type` column of a change batch (codes).
pub fn change_types(batch: &RecordBatch) -> Option<&Int8Array> {
    batch.column_by_name(CHANGE_TYPE)?.as_any().downcast_ref::<Int8Array>()
}

/// A `_change_type` column of `n` rows of one type.
pub fn change_type_column(t: ChangeType, n: usize) -> ArrayRef {
    Arc::new(Int8Array::from(vec![t.code(); n]))
}

/// The schema change rows are encoded in for output: `_change_type` as its name (`INSERT`, ...).
pub fn output_schema(schema: &SchemaRef) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| if f.name() == CHANGE_TYPE { f.as_ref().clone().with_data_type(DataType::Utf8) } else { f.as_ref().clone() })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// A change batch encoded for output (see [`output_schema`]).
pub fn for_output(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let cols = batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(f, c)| -> Result<ArrayRef> {
            if f.name() != CHANGE_TYPE {
                return Ok(c.clone());
            }
            let codes =
                c.as_any().downcast_ref::<Int8Array>().ok_or_else(|| crate::error::Error::Internal("_change_type is not a code column".into()))?;
            let names = codes.iter().map(|v| v.and_then(ChangeType::from_code).map(ChangeType::as_str));
            Ok(Arc::new(StringArray::from_iter(names)))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}

/// Where change rows go, batch by batch, in order.
pub trait ChangeConsumer: Send {
    fn write(&mut self, batch: RecordBatch) -> impl std::future::Future<Output = Result<()>> + Send;
}

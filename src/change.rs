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

/// The change rows that undo `batch` (one snapshot's rows, in their order): INSERT ↔ DELETE, UPDATE_BEFORE ↔
/// UPDATE_AFTER. The two rows of an update pair swap places, so a pair still reads before-then-after (the old row of
/// the inverse is the new row of the change). A pair split across batches is the caller's to join (see [`Inverse`]).
pub fn invert(batch: &RecordBatch) -> Result<RecordBatch> {
    let types = change_types(batch).ok_or_else(|| crate::error::Error::Internal("change batch without _change_type".into()))?;
    let code = |i: usize| ChangeType::from_code(types.value(i));
    let n = batch.num_rows();
    let mut order = Vec::with_capacity(n);
    let mut i = 0;
    while i < n {
        if code(i) == Some(ChangeType::UpdateBefore) && i + 1 < n && code(i + 1) == Some(ChangeType::UpdateAfter) {
            order.extend([i as u32 + 1, i as u32]);
            i += 2;
        } else {
            order.push(i as u32);
            i += 1;
        }
    }
    let inverted = order.iter().map(|&i| {
        let t = match ChangeType::from_code(types.value(i as usize)) {
            Some(ChangeType::Insert) => ChangeType::Delete,
            Some(ChangeType::Delete) => ChangeType::Insert,
            Some(ChangeType::UpdateBefore) => ChangeType::UpdateAfter,
            Some(ChangeType::UpdateAfter) | None => ChangeType::UpdateBefore,
        };
        t.code()
    });
    let inverted: ArrayRef = Arc::new(Int8Array::from_iter_values(inverted));
    let taken = arrow_select::take::take_record_batch(batch, &arrow_array::UInt32Array::from(order))?;
    let idx = batch.schema().index_of(CHANGE_TYPE)?;
    let mut cols = taken.columns().to_vec();
    cols[idx] = inverted;
    Ok(RecordBatch::try_new(batch.schema(), cols)?)
}

/// A [`ChangeConsumer`] that passes on the inverse of what it is given ([`invert`]), holding back a trailing
/// `UPDATE_BEFORE` until the batch with its `UPDATE_AFTER` comes; [`Inverse::flush`] after each snapshot.
pub struct Inverse<'a, C> {
    inner: &'a mut C,
    held: Option<RecordBatch>,
}

impl<'a, C: ChangeConsumer> Inverse<'a, C> {
    /// Inverts into `inner`.
    pub fn new(inner: &'a mut C) -> Self {
        Inverse { inner, held: None }
    }

    /// Passes on a row held back (a snapshot ended inside an update pair, which a netted snapshot never does).
    pub async fn flush(&mut self) -> Result<()> {
        if let Some(h) = self.held.take() {
            self.inner.write(invert(&h)?).await?;
        }
        Ok(())
    }
}

impl<C: ChangeConsumer> ChangeConsumer for Inverse<'_, C> {
    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        let batch = match self.held.take() {
            Some(h) => arrow_select::concat::concat_batches(&batch.schema(), [&h, &batch])?,
            None => batch,
        };
        let n = batch.num_rows();
        let last_opens_a_pair = n > 0 && change_types(&batch).is_some_and(|t| t.value(n - 1) == ChangeType::UpdateBefore.code());
        let batch = if last_opens_a_pair {
            self.held = Some(batch.slice(n - 1, 1));
            batch.slice(0, n - 1)
        } else {
            batch
        };
        if batch.num_rows() > 0 {
            self.inner.write(invert(&batch)?).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(types: &[ChangeType], ids: &[i64]) -> RecordBatch {
        let data = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let schema = change_schema(&data);
        let codes: ArrayRef = Arc::new(Int8Array::from_iter_values(types.iter().map(|t| t.code())));
        with_metadata(
            &schema,
            vec![Arc::new(Int64Array::from(ids.to_vec()))],
            codes,
            CommitInfo { snapshot_id: 7, sequence_number: 1, timestamp_ms: 0, ordinal: 0 },
        )
        .unwrap()
    }

    fn rows(b: &RecordBatch) -> Vec<(ChangeType, i64)> {
        let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        let t = change_types(b).unwrap();
        (0..b.num_rows()).map(|i| (ChangeType::from_code(t.value(i)).unwrap(), ids.value(i))).collect()
    }

    struct Collect(Vec<(ChangeType, i64)>);
    impl ChangeConsumer for Collect {
        async fn write(&mut self, b: RecordBatch) -> Result<()> {
            self.0.extend(rows(&b));
            Ok(())
        }
    }

    #[test]
    fn the_inverse_undoes_each_row_and_keeps_update_pairs_before_then_after() {
        use ChangeType::*;
        // key 1 inserted, 2 deleted, 3 updated from 30 to 31 (ids stand for the rows)
        let b = batch(&[Insert, Delete, UpdateBefore, UpdateAfter], &[1, 2, 30, 31]);
        assert_eq!(rows(&invert(&b).unwrap()), [(Delete, 1), (Insert, 2), (UpdateBefore, 31), (UpdateAfter, 30)]);
        // inverting twice gives the changes back
        assert_eq!(rows(&invert(&invert(&b).unwrap()).unwrap()), rows(&b));
    }

    #[test]
    fn a_pair_split_across_batches_is_joined_before_it_is_inverted() {
        use ChangeType::*;
        let mut out = Collect(Vec::new());
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let mut inv = Inverse::new(&mut out);
            inv.write(batch(&[Insert, UpdateBefore], &[1, 30])).await.unwrap();
            inv.write(batch(&[UpdateAfter, Delete], &[31, 2])).await.unwrap();
            inv.flush().await.unwrap();
        });
        assert_eq!(out.0, [(Delete, 1), (UpdateBefore, 31), (UpdateAfter, 30), (Insert, 2)]);
    }
}

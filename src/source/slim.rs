//! Removed rows carried with only the columns the sink reads of them.
//!
//! A sink that deletes by key (the Iceberg applier writes an equality delete on the equality columns, in the partition
//! of the row it removes) reads nothing else of a `DELETE` or `UPDATE_BEFORE` row ([`crate::sink::Sink::removed_columns`]).
//! Carry-over of a copy-on-write rewrite must hold one side of a partition group until the other side has been seen,
//! spilling it when it does not fit; holding the removed side with only those columns makes it a fraction of the
//! row (at 10 M rows the group fits in memory, at 100 M half the spill is gone). Fingerprints are taken from the whole
//! row before the columns are dropped, so matching stays exact.
//!
//! Invariants: a slim batch has the full schema's columns in order, each kept column as read, each dropped one as a
//! [`NullArray`] (no buffers, nothing spilled). [`Slim::expand`] gives the full schema back, a dropped column as a
//! placeholder of zero values (0, empty strings and lists), never null: the scan's schema may call a column
//! nullable that the target requires, and the row must still pass the sink's checks. Placeholders are never data:
//! such rows are netted without cancelling identical rows (`Netter::without_cancelling`), since a placeholder could
//! equal a real row's values.
use std::sync::Arc;

use arrow_array::{make_array, ArrayRef, NullArray, RecordBatch};
use arrow_data::ArrayData;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::Result;
use crate::source::net::Side;
use crate::spec::projection::field_id;

/// Which top-level columns removed rows keep; see the module header.
pub(crate) struct Slim {
    full: SchemaRef,
    /// `full` with every dropped column as a nullable [`DataType::Null`] field (its name and metadata kept).
    slim: SchemaRef,
    kept: Vec<bool>,
}

impl Slim {
    /// Removed rows of `full` keeping `key_idx` and the columns with field ids `ids`. `None` when that is every
    /// column (nothing to gain), or when an id is not a top-level column (a nested partition source: keep it all).
    pub(crate) fn new(full: &SchemaRef, key_idx: &[usize], ids: &[i32]) -> Option<Slim> {
        let mut kept = vec![false; full.fields().len()];
        for &i in key_idx {
            *kept.get_mut(i)? = true;
        }
        for id in ids {
            let i = full.fields().iter().position(|f| field_id(f) == Some(*id))?;
            kept[i] = true;
        }
        if key_idx.is_empty() || kept.iter().all(|k| *k) {
            return None;
        }
        let fields: Vec<Field> = full
            .fields()
            .iter()
            .zip(&kept)
            .map(|(f, k)| if *k { f.as_ref().clone() } else { Field::new(f.name(), DataType::Null, true).with_metadata(f.metadata().clone()) })
            .collect();
        Some(Slim { full: full.clone(), slim: Arc::new(Schema::new(fields)), kept })
    }

    /// The schema of slim batches (after carry-over made their columns canonical).
    pub(crate) fn schema(&self) -> &SchemaRef {
        &self.slim
    }

    /// `batch` (the full schema's columns, strings possibly as views) with the dropped columns as null columns.
    pub(crate) fn slim(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let n = batch.num_rows();
        let (fields, cols): (Vec<Field>, Vec<ArrayRef>) = batch
            .schema()
            .fields()
            .iter()
            .zip(batch.columns())
            .zip(self.slim.fields())
            .zip(&self.kept)
            .map(|(((f, c), s), k)| if *k { (f.as_ref().clone(), c.clone()) } else { (s.as_ref().clone(), Arc::new(NullArray::new(n)) as ArrayRef) })
            .unzip();
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?)
    }

    /// What carry-over emitted, taken with the removed rows first ([`crate::source::carry`]'s sides are roles), as
    /// the scan's side and full rows: the sides swapped back, the removed rows expanded.
    pub(crate) fn restore(&self, side: Side, batch: RecordBatch) -> Result<(Side, RecordBatch)> {
        match side.other() {
            Side::Removed => Ok((Side::Removed, self.expand(&batch)?)),
            Side::Added => Ok((Side::Added, batch)),
        }
    }

    /// A slim batch in the full schema again, the dropped columns as placeholders.
    pub(crate) fn expand(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let n = batch.num_rows();
        let cols = batch
            .columns()
            .iter()
            .zip(self.full.fields())
            .zip(&self.kept)
            .map(|((c, f), k)| if *k { Ok(c.clone()) } else { placeholder(f, n) })
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(self.full.clone(), cols)?)
    }
}

/// `n` values of `field` that stand for "not carried": zero values, not null (see the module header).
fn placeholder(field: &Field, n: usize) -> Result<ArrayRef> {
    Ok(make_array(zeroed(ArrayData::new_null(field.data_type(), n))?))
}

/// A null array's data without its validity, recursively: zeros, empty strings, empty lists.
fn zeroed(data: ArrayData) -> Result<ArrayData> {
    let children = data.child_data().iter().cloned().map(zeroed).collect::<Result<Vec<_>>>()?;
    Ok(data.into_builder().nulls(None).child_data(children).build()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Array, Int32Array, Int64Array, StringArray, StringViewArray, StructArray};
    use arrow_schema::Fields;
    use parquet::arrow::PARQUET_FIELD_ID_META_KEY;
    use std::collections::HashMap;

    fn with_id(f: Field, id: i32) -> Field {
        f.with_metadata(HashMap::from([(PARQUET_FIELD_ID_META_KEY.to_string(), id.to_string())]))
    }

    fn schema() -> SchemaRef {
        let point = Fields::from(vec![Field::new("x", DataType::Int32, false), Field::new("y", DataType::Utf8, true)]);
        Arc::new(Schema::new(vec![
            with_id(Field::new("id", DataType::Int64, false), 1),
            with_id(Field::new("region", DataType::Utf8, true), 2),
            with_id(Field::new("note", DataType::Utf8, true), 3),
            with_id(Field::new("qty", DataType::Int64, false), 4),
            with_id(Field::new("at", DataType::Struct(point.clone()), false), 5),
        ]))
    }

    fn batch(views: bool) -> RecordBatch {
        let s = schema();
        let region: ArrayRef = if views { Arc::new(StringViewArray::from(vec!["eu", "us"])) } else { Arc::new(StringArray::from(vec!["eu", "us"])) };
        let DataType::Struct(point) = s.field(4).data_type().clone() else { unreachable!("a struct column") };
        let at = StructArray::new(point, vec![Arc::new(Int32Array::from(vec![3, 4])), Arc::new(StringArray::from(vec![Some("p"), None]))], None);
        let mut fields: Vec<Field> = s.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields[1] = fields[1].clone().with_data_type(region.data_type().clone());
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![1, 2])),
            region,
            Arc::new(StringArray::from(vec![Some("a"), None])),
            Arc::new(Int64Array::from(vec![7, 8])),
            Arc::new(at),
        ];
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap()
    }

    #[test]
    fn keeps_key_and_named_columns_and_expands_to_placeholders() {
        let slim = Slim::new(&schema(), &[0], &[2]).expect("three columns dropped");
        let b = slim.slim(&batch(true)).unwrap();
        assert_eq!(b.num_columns(), 5);
        assert_eq!(b.column(1).data_type(), &DataType::Utf8View, "kept columns stay as read");
        for i in [2, 3, 4] {
            assert_eq!(b.column(i).data_type(), &DataType::Null);
        }
        // carry-over makes kept columns canonical before it hands rows on
        let canonical = RecordBatch::try_new(
            slim.schema().clone(),
            b.columns().iter().zip(slim.schema().fields()).map(|(c, f)| arrow_cast::cast(c, f.data_type()).unwrap()).collect(),
        )
        .unwrap();
        let full = slim.expand(&canonical).unwrap();
        assert_eq!(full.schema(), schema());
        let ids = full.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(ids.values().to_vec(), vec![1, 2]);
        let region = full.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!((region.value(0), region.value(1)), ("eu", "us"));
        // dropped columns are zero, never null, nullable or not
        let note = full.column(2).as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!((note.null_count(), note.value(0), note.value(1)), (0, "", ""));
        assert_eq!(full.column(3).null_count(), 0);
        assert_eq!(full.column(3).as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec(), vec![0, 0]);
        assert_eq!(full.column(4).null_count(), 0);
        full.column(4).to_data().validate_full().unwrap();
    }

    #[test]
    fn nothing_to_gain_or_a_nested_id_keeps_every_column() {
        assert!(Slim::new(&schema(), &[0], &[2, 3, 4, 5]).is_none(), "every column kept");
        assert!(Slim::new(&schema(), &[], &[1]).is_none(), "no key: the whole row is the key");
        assert!(Slim::new(&schema(), &[0], &[99]).is_none(), "not a top-level column");
        // without views the kept columns pass through as they are
        let slim = Slim::new(&schema(), &[0], &[2]).unwrap();
        let b = slim.slim(&batch(false)).unwrap();
        assert_eq!(b.schema(), *slim.schema());
    }
}

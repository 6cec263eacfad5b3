//! Projection of Arrow columns by Iceberg field id, at every nesting level.
//!
//! A column (or struct child) of the output is found in the input by field id — through `map`, which turns an
//! output field id into the input's (the identity on the read side; target → source ids on the write side) — and
//! by name only when the input carries no ids (files written without them). List elements and map keys/values are
//! matched by position: the spec fixes their place. What the input lacks comes back null; primitive types that
//! differ are converted only where that is exact (the spec's promotions and representation changes, see
//! [`crate::spec::integrity`]) and refused otherwise. Names always come from the
//! output, so a renamed column or nested field appears under its new name with its old values.
use std::sync::Arc;

use arrow_array::{new_null_array, Array, ArrayRef, ListArray, MapArray, RecordBatch, RecordBatchOptions, StructArray};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;

use crate::error::{Error, Result};

/// The Iceberg field id an Arrow field carries (Parquet field-id metadata).
pub fn field_id(f: &Field) -> Option<i32> {
    f.metadata().get(PARQUET_FIELD_ID_META_KEY).and_then(|v| v.parse().ok())
}

/// `field` carrying Iceberg field id `id` (when there is one), the way Parquet's reader marks fields.
pub fn with_id(field: Field, id: Option<i32>) -> Field {
    match id {
        Some(id) => {
            let mut meta = field.metadata().clone();
            meta.insert(PARQUET_FIELD_ID_META_KEY.to_string(), id.to_string());
            field.with_metadata(meta)
        }
        None => field,
    }
}

/// Projects every column of `batch` onto `target` by field id. `map` turns a target field id into the id the same
/// field has in `batch`. Missing columns are null; the result has `target`'s schema.
pub fn project_batch(batch: &RecordBatch, target: &SchemaRef, map: &dyn Fn(i32) -> Option<i32>) -> Result<RecordBatch> {
    let src = batch.schema();
    let cols = target
        .fields()
        .iter()
        .map(|f| match find_child(src.fields(), f, map) {
            Some(i) => project_array(batch.column(i), src.field(i), f, map),
            None => Ok(new_null_array(f.data_type(), batch.num_rows())),
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    Ok(RecordBatch::try_new_with_options(target.clone(), cols, &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())))?)
}

/// The position of the input field that holds `want`: by mapped id, else (input without ids) by name.
fn find_child(fields: &Fields, want: &Field, map: &dyn Fn(i32) -> Option<i32>) -> Option<usize> {
    match field_id(want) {
        Some(id) => {
            let src_id = map(id)?;
            fields.iter().position(|f| field_id(f) == Some(src_id)).or_else(|| {
                // files without field ids: by name
                fields.iter().position(|f| field_id(f).is_none() && f.name() == want.name())
            })
        }
        None => fields.iter().position(|f| f.name() == want.name()),
    }
}

/// One column projected from `from` onto `to` (see the module docs).
pub fn project_array(col: &ArrayRef, _from: &Field, to: &Field, map: &dyn Fn(i32) -> Option<i32>) -> Result<ArrayRef> {
    if col.data_type() == to.data_type() && !has_nested_ids(to.data_type()) {
        return Ok(col.clone());
    }
    let mismatch = || Error::Schema(format!("column `{}`: cannot read {} as {}", to.name(), col.data_type(), to.data_type()));
    match (col.data_type(), to.data_type()) {
        (DataType::Struct(from_fields), DataType::Struct(to_fields)) => {
            let s = col.as_any().downcast_ref::<StructArray>().ok_or_else(mismatch)?;
            let children = to_fields
                .iter()
                .map(|tf| match find_child(from_fields, tf, map) {
                    Some(i) => project_array(s.column(i), &from_fields[i], tf, map),
                    None => Ok(new_null_array(tf.data_type(), s.len())),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Arc::new(StructArray::try_new(to_fields.clone(), children, s.nulls().cloned()).map_err(|e| struct_error(to, e))?))
        }
        (DataType::List(fe), DataType::List(te)) => {
            let l = col.as_any().downcast_ref::<ListArray>().ok_or_else(mismatch)?;
            let values = project_array(l.values(), fe, te, map)?;
            Ok(Arc::new(ListArray::try_new(te.clone(), l.offsets().clone(), values, l.nulls().cloned()).map_err(|e| struct_error(to, e))?))
        }
        (DataType::Map(fe, _), DataType::Map(te, sorted)) => {
            let m = col.as_any().downcast_ref::<MapArray>().ok_or_else(mismatch)?;
            let (DataType::Struct(fk), DataType::Struct(tk)) = (fe.data_type(), te.data_type()) else { return Err(mismatch()) };
            let entries = m.entries();
            // key and value by position
            let key = project_array(entries.column(0), &fk[0], &tk[0], map)?;
            let value = project_array(entries.column(1), &fk[1], &tk[1], map)?;
            let entries = StructArray::try_new(tk.clone(), vec![key, value], entries.nulls().cloned()).map_err(|e| struct_error(to, e))?;
            Ok(Arc::new(MapArray::try_new(te.clone(), m.offsets().clone(), entries, m.nulls().cloned(), *sorted).map_err(|e| struct_error(to, e))?))
        }
        (DataType::Struct(_) | DataType::List(_) | DataType::Map(..), _) | (_, DataType::Struct(_) | DataType::List(_) | DataType::Map(..)) => {
            Err(mismatch())
        }
        (from, want) => {
            if !crate::spec::integrity::exact_conversion(from, want) {
                return Err(Error::Schema(crate::spec::integrity::mismatch(to.name(), from, want)));
            }
            // exact by type; `safe = false`: a value that does not fit is an error, never a null
            let opts = arrow_cast::CastOptions { safe: false, ..Default::default() };
            arrow_cast::cast_with_options(col, want, &opts)
                .map_err(|e| Error::Schema(format!("column `{}`: cannot read {from} as {want}: {e}", to.name())))
        }
    }
}

fn struct_error(to: &Field, e: arrow_schema::ArrowError) -> Error {
    Error::Schema(format!("column `{}`: {e}", to.name()))
}

/// Whether a type has nested fields, whose ids may need matching even when the Arrow types look alike.
fn has_nested_ids(dt: &DataType) -> bool {
    matches!(dt, DataType::Struct(_) | DataType::List(_) | DataType::Map(..) | DataType::LargeList(_))
}

/// The same schema with every top-level field nullable.
pub fn relax(schema: &SchemaRef) -> SchemaRef {
    if schema.fields().iter().all(|f| f.is_nullable()) {
        return schema.clone();
    }
    Arc::new(Schema::new_with_metadata(
        schema.fields().iter().map(|f| f.as_ref().clone().with_nullable(true)).collect::<Vec<_>>(),
        schema.metadata().clone(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int32Array, Int64Array, StringArray};
    use arrow_schema::Schema;
    use std::collections::HashMap;

    fn f(name: &str, id: i32, dt: DataType) -> Field {
        Field::new(name, dt, true).with_metadata(HashMap::from([(PARQUET_FIELD_ID_META_KEY.to_string(), id.to_string())]))
    }

    #[test]
    fn nested_rename_widen_and_add_by_id() {
        // input: s struct<a int (id 2), b string (id 3)> (id 1)
        let in_fields = Fields::from(vec![f("a", 2, DataType::Int32), f("b", 3, DataType::Utf8)]);
        let s =
            StructArray::try_new(in_fields.clone(), vec![Arc::new(Int32Array::from(vec![1, 2])), Arc::new(StringArray::from(vec!["x", "y"]))], None)
                .unwrap();
        let in_schema = Arc::new(Schema::new(vec![f("s", 1, DataType::Struct(in_fields))]));
        let batch = RecordBatch::try_new(in_schema, vec![Arc::new(s)]).unwrap();
        // output: s2 struct<bb string (id 3, renamed, reordered), a long (id 2, widened), c int (id 4, new)> (id 1)
        let out_fields = Fields::from(vec![f("bb", 3, DataType::Utf8), f("a", 2, DataType::Int64), f("c", 4, DataType::Int32)]);
        let out = Arc::new(Schema::new(vec![f("s2", 1, DataType::Struct(out_fields))]));
        let got = project_batch(&batch, &out, &|id| Some(id)).unwrap();
        let s = got.column(0).as_any().downcast_ref::<StructArray>().unwrap();
        assert_eq!(s.column(0).as_any().downcast_ref::<StringArray>().unwrap().value(1), "y");
        assert_eq!(s.column(1).as_any().downcast_ref::<Int64Array>().unwrap().value(0), 1);
        assert_eq!(s.column(2).null_count(), 2);
        // a mapped projection: output id 10 reads input id 2
        let out = Arc::new(Schema::new(vec![f("s", 11, DataType::Struct(Fields::from(vec![f("a", 10, DataType::Int32)])))]));
        let got = project_batch(&batch, &out, &|id| match id {
            10 => Some(2),
            11 => Some(1),
            _ => None,
        })
        .unwrap();
        let s = got.column(0).as_any().downcast_ref::<StructArray>().unwrap();
        assert_eq!(s.column(0).as_any().downcast_ref::<Int32Array>().unwrap().value(1), 2);
    }
}

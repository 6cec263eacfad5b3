//! Row encoding of any Iceberg type for comparison and hashing.
//!
//! Arrow's row format (arrow-row) orders and compares whole rows fast, but it does not take `Map` columns. A map is
//! physically a list of key/value structs, so for encoding it is presented as exactly that — `List<Struct<key,
//! value>>`, at every nesting level — without copying any values. Two maps compare equal when they hold the same
//! entries in the same order (the order a writer produced; Spark keeps it when it rewrites a row unchanged).
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, ListArray, MapArray, StructArray};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{DataType, Field, FieldRef, Fields};

use crate::error::Result;

/// Encoded keys; ahash because SipHash dominated equality-delete matching in profiles.
pub type KeySet = std::collections::HashSet<Box<[u8]>, ahash::RandomState>;

/// The type a column of type `dt` is encoded as (maps become lists of entry structs).
pub fn encodable_type(dt: &DataType) -> DataType {
    match dt {
        DataType::Map(entries, _) => DataType::List(Arc::new(Field::new("entries", encodable_type(entries.data_type()), entries.is_nullable()))),
        DataType::Struct(fields) => DataType::Struct(encodable_fields(fields)),
        DataType::List(f) => DataType::List(encodable_field(f)),
        DataType::LargeList(f) => DataType::LargeList(encodable_field(f)),
        other => other.clone(),
    }
}

fn encodable_field(f: &FieldRef) -> FieldRef {
    if contains_map(f.data_type()) {
        Arc::new(Field::new(f.name(), encodable_type(f.data_type()), f.is_nullable()))
    } else {
        f.clone()
    }
}

fn encodable_fields(fields: &Fields) -> Fields {
    fields.iter().map(encodable_field).collect()
}

fn contains_map(dt: &DataType) -> bool {
    match dt {
        DataType::Map(..) => true,
        DataType::Struct(fields) => fields.iter().any(|f| contains_map(f.data_type())),
        DataType::List(f) | DataType::LargeList(f) => contains_map(f.data_type()),
        _ => false,
    }
}

/// `col` presented in its [`encodable_type`] (zero-copy: offsets, validity and values are shared).
pub fn encodable_array(col: &ArrayRef) -> ArrayRef {
    if !contains_map(col.data_type()) {
        return col.clone();
    }
    match col.data_type() {
        DataType::Map(..) => {
            let m = col.as_any().downcast_ref::<MapArray>().expect("map type");
            let entries: ArrayRef = Arc::new(m.entries().clone());
            let entries = encodable_array(&entries);
            let field = Arc::new(Field::new("entries", entries.data_type().clone(), true));
            Arc::new(ListArray::new(field, m.offsets().clone(), entries, m.nulls().cloned()))
        }
        DataType::Struct(fields) => {
            let s = col.as_any().downcast_ref::<StructArray>().expect("struct type");
            let children: Vec<ArrayRef> = s.columns().iter().map(encodable_array).collect();
            let fields: Fields = fields.iter().zip(&children).map(|(f, c)| Arc::new(Field::new(f.name(), c.data_type().clone(), true))).collect();
            Arc::new(StructArray::new(fields, children, s.nulls().cloned()))
        }
        DataType::List(f) => {
            let l = col.as_any().downcast_ref::<ListArray>().expect("list type");
            let values = encodable_array(l.values());
            let field = Arc::new(Field::new(f.name(), values.data_type().clone(), true));
            Arc::new(ListArray::new(field, l.offsets().clone(), values, l.nulls().cloned()))
        }
        _ => col.clone(),
    }
}

/// A row converter over columns of these types, any Iceberg type included.
pub fn converter(types: impl IntoIterator<Item = DataType>) -> Result<RowConverter> {
    Ok(RowConverter::new(types.into_iter().map(|t| SortField::new(normalized(&encodable_type(&t)))).collect())?)
}

/// Encodes columns with a converter made by [`converter`].
pub fn convert(conv: &RowConverter, cols: &[ArrayRef]) -> Result<Rows> {
    let cols: Vec<ArrayRef> = cols.iter().map(|c| normalize(&encodable_array(c))).collect();
    Ok(conv.convert_columns(&cols)?)
}

/// Field names, nullability and metadata do not change how rows compare; the converter is built for one shape and
/// must accept columns whose nested fields carry other names or metadata (relaxed schemas, renamed fields).
fn normalized(dt: &DataType) -> DataType {
    match dt {
        DataType::Struct(fields) => {
            DataType::Struct(fields.iter().enumerate().map(|(i, f)| Arc::new(Field::new(format!("f{i}"), normalized(f.data_type()), true))).collect())
        }
        DataType::List(f) => DataType::List(Arc::new(Field::new("item", normalized(f.data_type()), true))),
        DataType::LargeList(f) => DataType::LargeList(Arc::new(Field::new("item", normalized(f.data_type()), true))),
        other => other.clone(),
    }
}

fn normalize(col: &ArrayRef) -> ArrayRef {
    let want = normalized(col.data_type());
    if &want == col.data_type() {
        return col.clone();
    }
    match col.data_type() {
        DataType::Struct(_) => {
            let s = col.as_any().downcast_ref::<StructArray>().expect("struct type");
            let children: Vec<ArrayRef> = s.columns().iter().map(normalize).collect();
            let DataType::Struct(fields) = want else { unreachable!() };
            Arc::new(StructArray::new(fields, children, s.nulls().cloned()))
        }
        DataType::List(_) => {
            let l = col.as_any().downcast_ref::<ListArray>().expect("list type");
            let DataType::List(field) = want else { unreachable!() };
            Arc::new(ListArray::new(field, l.offsets().clone(), normalize(l.values()), l.nulls().cloned()))
        }
        _ => col.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::builder::{Int32Builder, MapBuilder, StringBuilder};

    fn map(rows: &[&[(&str, i32)]]) -> ArrayRef {
        let mut b = MapBuilder::new(None, StringBuilder::new(), Int32Builder::new());
        for r in rows {
            for (k, v) in *r {
                b.keys().append_value(k);
                b.values().append_value(*v);
            }
            b.append(true).unwrap();
        }
        Arc::new(b.finish())
    }

    #[test]
    fn maps_encode_and_compare() {
        let a = map(&[&[("a", 1), ("b", 2)], &[("a", 1)], &[]]);
        let b = map(&[&[("a", 1), ("b", 2)], &[("a", 2)], &[]]);
        let conv = converter([a.data_type().clone()]).unwrap();
        let ra = convert(&conv, &[a]).unwrap();
        let rb = convert(&conv, &[b]).unwrap();
        assert_eq!(ra.row(0), rb.row(0));
        assert_ne!(ra.row(1), rb.row(1));
        assert_eq!(ra.row(2), rb.row(2));
    }
}

//! What a file must match before a row of it is used: the rules that keep a file which does not fit its table's
//! metadata from turning into plausible rows.
//!
//! - **Types.** A column is read as the table's type only by a conversion that cannot change a value
//!   ([`exact_conversion`]): Iceberg's type promotions (int → long, float → double, decimal(P,S) → decimal(P',S) with
//!   P' ≥ P, v3 date → timestamp) and representation changes of one logical type (string/binary views and large
//!   offsets, dictionary encoding, a column of nulls only, time and timestamp units widened — a legacy INT96
//!   timestamp's nanoseconds truncated to microseconds, as Iceberg Java reads them — and the UTC flag of a timestamp,
//!   which does not change the stored instant). Anything else — a decimal stored as text, a long as an int — is
//!   refused naming the column, the type found and the type expected; the casts that remain run with
//!   `safe = false`, so an overflow is an error, never a null.
//! - **Presence.** A required column (no v3 `initial-default`) missing from a data file, and an equality column
//!   missing from an equality-delete file, are refused ([`require`], [`check_present`]): read as nulls they would
//!   be rows without a key, or deletes that delete nothing.
//! - **Checksums.** Parquet page CRCs are verified where a writer put them (the `crc` feature of `parquet`: a page
//!   whose bytes do not match is an error); record counts are checked against the manifest by the readers.
use std::sync::Arc;

use arrow_schema::{DataType, Schema, SchemaRef, TimeUnit};

use crate::spec::projection::field_id;

/// Schema metadata key: the top-level field ids a file must hold (comma-separated).
const REQUIRED_KEY: &str = "cdc.required-field-ids";

/// Whether reading a column stored as `from` as the table's `to` is exact (see the module docs). Nested types are
/// matched child by child by the projection, not here.
pub(crate) fn exact_conversion(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    if from == to {
        return true;
    }
    match (from, to) {
        (Null, _) => true,
        (Dictionary(_, values), t) => exact_conversion(values, t),
        (Int8 | Int16, Int32 | Int64) | (Int32, Int64) | (Float32, Float64) => true,
        (Decimal32(p, s) | Decimal64(p, s) | Decimal128(p, s), Decimal128(p2, s2)) => s == s2 && p2 >= p,
        (Date32, Timestamp(..)) => true,
        (Timestamp(..), Timestamp(..)) => true,
        (Time32(_) | Time64(_), Time64(TimeUnit::Microsecond)) => true,
        (Utf8 | LargeUtf8 | Utf8View, Utf8 | LargeUtf8 | Utf8View) => true,
        (Binary | LargeBinary | BinaryView, Binary | LargeBinary | BinaryView) => true,
        _ => false,
    }
}

/// Why a column stored as `from` cannot be read as `to`, for the message of a refused file.
pub(crate) fn mismatch(column: &str, from: &DataType, to: &DataType) -> String {
    format!(
        "column `{column}` is stored as {from} but the table's type is {to}; that is not one of Iceberg's type promotions, so the file does not match its table's metadata (written by a broken writer, or replaced outside Iceberg) — rewrite or restore the file, or remove it from the table"
    )
}

/// `schema` marked so that a file read into it must hold the top-level columns `ids` ([`check_present`]).
pub(crate) fn require(schema: SchemaRef, ids: impl IntoIterator<Item = i32>) -> SchemaRef {
    let ids: Vec<String> = ids.into_iter().map(|i| i.to_string()).collect();
    if ids.is_empty() {
        return schema;
    }
    let mut meta = schema.metadata().clone();
    meta.insert(REQUIRED_KEY.into(), ids.join(","));
    Arc::new(Schema::new_with_metadata(schema.fields().clone(), meta))
}

/// The top-level fields of `schema` a data file must hold: required, without a v3 `initial-default`.
pub(crate) fn required_ids(schema: &iceberg::spec::Schema) -> Vec<i32> {
    schema.as_struct().fields().iter().filter(|f| f.required && f.initial_default.is_none()).map(|f| f.id).collect()
}

/// Checks that a batch read from a file (`file`: its schema, ids attached) holds every column `target` requires;
/// the message names the first missing one. Files without field ids are matched by name, as the projection does.
pub(crate) fn check_present(file: &Schema, target: &Schema) -> Result<(), String> {
    let Some(ids) = target.metadata().get(REQUIRED_KEY) else { return Ok(()) };
    for id in ids.split(',').filter_map(|s| s.parse::<i32>().ok()) {
        let Some(want) = target.fields().iter().find(|f| field_id(f) == Some(id)) else { continue };
        let present = file.fields().iter().any(|f| field_id(f) == Some(id) || (field_id(f).is_none() && f.name() == want.name()));
        if !present {
            return Err(format!(
                "the file has no column `{}` (field id {id}), which the table requires; read as nulls it would give rows without that value (or deletes that match nothing) — the file does not match its table's metadata: rewrite or restore it, or remove it from the table",
                want.name()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::Field;

    #[test]
    fn only_promotions_and_representations_are_exact() {
        use DataType::*;
        let ok = [
            (Int32, Int64),
            (Int16, Int32),
            (Float32, Float64),
            (Decimal128(9, 2), Decimal128(12, 2)),
            (Date32, Timestamp(TimeUnit::Microsecond, None)),
            (Timestamp(TimeUnit::Nanosecond, None), Timestamp(TimeUnit::Microsecond, None)),
            (Timestamp(TimeUnit::Microsecond, None), Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))),
            (Utf8View, Utf8),
            (Dictionary(Box::new(Int32), Box::new(Utf8)), Utf8),
            (Null, Decimal128(10, 2)),
            (Time32(TimeUnit::Millisecond), Time64(TimeUnit::Microsecond)),
        ];
        for (from, to) in ok {
            assert!(exact_conversion(&from, &to), "{from} -> {to}");
        }
        let refused = [
            (Utf8, Decimal128(10, 2)),
            (Int64, Int32),
            (Float64, Float32),
            (Decimal128(12, 2), Decimal128(10, 2)),
            (Decimal128(10, 2), Decimal128(12, 3)),
            (Utf8, Int64),
            (Int64, Utf8),
            (Binary, Utf8),
            (Int32, Date32),
            (Float64, Int64),
            (Timestamp(TimeUnit::Microsecond, None), Date32),
            (FixedSizeBinary(16), Binary),
        ];
        for (from, to) in refused {
            assert!(!exact_conversion(&from, &to), "{from} -> {to}");
        }
    }

    #[test]
    fn a_required_column_missing_from_a_file_is_named() {
        let with_id = |name: &str, id: i32| crate::spec::projection::with_id(Field::new(name, DataType::Int64, true), Some(id));
        let target = require(Arc::new(Schema::new(vec![with_id("id", 1), with_id("v", 2)])), [1]);
        assert!(check_present(&Schema::new(vec![with_id("id", 1)]), &target).is_ok());
        let e = check_present(&Schema::new(vec![with_id("v", 2)]), &target).unwrap_err();
        assert!(e.contains("`id` (field id 1)"), "{e}");
        // a file without ids: by name
        assert!(check_present(&Schema::new(vec![Field::new("id", DataType::Int64, true)]), &target).is_ok());
        // nothing required: anything goes
        assert!(check_present(&Schema::new(vec![with_id("v", 2)]), &Schema::new(vec![with_id("id", 1)])).is_ok());
    }
}

//! Whole-row 128-bit fingerprints, computed column by column.
//!
//! Carry-over cancellation ([`super::carry`]) matches a removed row with an identical added row by fingerprint
//! alone, so a fingerprint must be a function of the row's values only — not of batch boundaries, slicing, or
//! whether a column happens to carry a validity buffer — and two different rows must practically never share one.
//!
//! Algorithm: every row has two streaming hashers (ahash, fixed and different seeds: 2 × 64 bits). Columns are
//! visited in order and each column's values are fed to its rows' hashers in one tight loop per column (no row
//! encoding, no per-row allocation): fixed-width values as their bits, strings and binaries as length + bytes, and any
//! other type (structs, lists, maps, dictionaries) through arrow's row encoding of that one column. A null writes
//! nothing; instead each row ends with a bitmap of its null columns, so the fed sequence decodes uniquely given the
//! schema (fixed widths, length-prefixed bytes, the null map) and different rows feed different sequences.
use std::hash::{BuildHasher, Hasher};

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, PrimitiveArray, RecordBatch};
use arrow_row::RowConverter;
use arrow_schema::{DataType, SchemaRef};

use crate::error::Result;
use crate::spec::rowenc;

/// Seeds fixed so that every read of a snapshot fingerprints a row the same way (SHA-512's initial words; not the
/// digits of pi, which ahash XORs its seeds with — those zero its keys).
const SEEDS: [u64; 8] = [
    0x6a09e667f3bcc908,
    0xbb67ae8584caa73b,
    0x3c6ef372fe94f82b,
    0xa54ff53a5f1d36f1,
    0x510e527fade682d1,
    0x9b05688c2b3e6c1f,
    0x1f83d9abfb41bd6b,
    0x5be0cd19137e2179,
];

/// How one column is fed to the hashers.
enum Feed {
    /// Fixed-width values and binary-like columns, read directly.
    Direct,
    /// Anything else: the column's row encoding.
    Encoded(Box<RowConverter>),
}

/// Fingerprints rows of one schema; build once per schema (e.g. per file read), use for every batch.
pub(crate) struct Fingerprinter {
    feeds: Vec<Feed>,
}

impl Fingerprinter {
    /// A fingerprinter for batches of `schema`.
    pub(crate) fn new(schema: &SchemaRef) -> Result<Self> {
        let feeds = schema
            .fields()
            .iter()
            .map(|f| {
                if direct(f.data_type()) {
                    Ok(Feed::Direct)
                } else {
                    rowenc::converter([f.data_type().clone()]).map(|c| Feed::Encoded(Box::new(c)))
                }
            })
            .collect::<Result<_>>()?;
        Ok(Fingerprinter { feeds })
    }

    /// One fingerprint per row of `batch` (which must have the schema this was built for).
    pub(crate) fn fingerprints(&self, batch: &RecordBatch) -> Result<Vec<u128>> {
        let n = batch.num_rows();
        let s1 = ahash::RandomState::with_seeds(SEEDS[0], SEEDS[1], SEEDS[2], SEEDS[3]);
        let s2 = ahash::RandomState::with_seeds(SEEDS[4], SEEDS[5], SEEDS[6], SEEDS[7]);
        let mut h: Vec<[ahash::AHasher; 2]> = (0..n).map(|_| [s1.build_hasher(), s2.build_hasher()]).collect();
        let words = batch.num_columns().div_ceil(64).max(1);
        let mut nulls = vec![0u64; n * words];
        for (c, (col, feed)) in batch.columns().iter().zip(&self.feeds).enumerate() {
            if let Some(v) = col.logical_nulls() {
                for i in v.iter().enumerate().filter(|(_, valid)| !valid).map(|(i, _)| i) {
                    nulls[i * words + c / 64] |= 1 << (c % 64);
                }
            }
            match feed {
                Feed::Direct => feed_direct(col, &mut h),
                Feed::Encoded(conv) => {
                    let rows = rowenc::convert(conv, std::slice::from_ref(col))?;
                    each_valid(col.as_ref(), &mut h, |i, h| write_bytes(h, rows.row(i).as_ref()));
                }
            }
        }
        Ok(h.into_iter()
            .enumerate()
            .map(|(i, [mut a, mut b])| {
                for w in &nulls[i * words..(i + 1) * words] {
                    a.write_u64(*w);
                    b.write_u64(*w);
                }
                ((a.finish() as u128) << 64) | b.finish() as u128
            })
            .collect())
    }
}

/// Types fed from their values directly.
fn direct(dt: &DataType) -> bool {
    dt.is_primitive()
        || matches!(
            dt,
            DataType::Boolean
                | DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Utf8View
                | DataType::Binary
                | DataType::LargeBinary
                | DataType::BinaryView
                | DataType::FixedSizeBinary(_)
        )
}

type Hashers = [ahash::AHasher; 2];

fn write_bytes(h: &mut Hashers, b: &[u8]) {
    for x in h.iter_mut() {
        x.write_usize(b.len());
        x.write(b);
    }
}

/// Calls `f` for every valid row (nulls feed nothing; the row's null map records them).
fn each_valid(col: &dyn Array, h: &mut [Hashers], mut f: impl FnMut(usize, &mut Hashers)) {
    match col.logical_nulls() {
        None => h.iter_mut().enumerate().for_each(|(i, h)| f(i, h)),
        Some(v) => h.iter_mut().enumerate().filter(|(i, _)| v.is_valid(*i)).for_each(|(i, h)| f(i, h)),
    }
}

fn feed_primitive<T: ArrowPrimitiveType>(col: &ArrayRef, h: &mut [Hashers], bits: impl Fn(T::Native) -> u128) {
    let a: &PrimitiveArray<T> = col.as_primitive();
    let values = a.values();
    each_valid(a, h, |i, h| {
        let v = bits(values[i]);
        for x in h.iter_mut() {
            x.write_u128(v);
        }
    });
}

/// Feeds a column of a [`direct`] type.
fn feed_direct(col: &ArrayRef, h: &mut [Hashers]) {
    macro_rules! int {
        ($t:ty) => {
            feed_primitive::<$t>(col, h, |v| v as u128)
        };
    }
    match col.data_type() {
        DataType::Boolean => {
            let a = col.as_boolean();
            each_valid(a, h, |i, h| h.iter_mut().for_each(|x| x.write_u8(a.value(i) as u8)))
        }
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::UInt8 => int!(UInt8Type),
        DataType::UInt16 => int!(UInt16Type),
        DataType::UInt32 => int!(UInt32Type),
        DataType::UInt64 => int!(UInt64Type),
        DataType::Float16 => feed_primitive::<Float16Type>(col, h, |v| v.to_bits() as u128),
        DataType::Float32 => feed_primitive::<Float32Type>(col, h, |v| v.to_bits() as u128),
        DataType::Float64 => feed_primitive::<Float64Type>(col, h, |v| v.to_bits() as u128),
        DataType::Date32 => int!(Date32Type),
        DataType::Date64 => int!(Date64Type),
        DataType::Time32(arrow_schema::TimeUnit::Second) => int!(Time32SecondType),
        DataType::Time32(_) => int!(Time32MillisecondType),
        DataType::Time64(arrow_schema::TimeUnit::Microsecond) => int!(Time64MicrosecondType),
        DataType::Time64(_) => int!(Time64NanosecondType),
        // the unit and zone are the schema's, the same for every row: the value is enough
        DataType::Timestamp(..) => feed_primitive::<Int64Type>(&reinterpret_i64(col), h, |v| v as u128),
        DataType::Duration(..) => feed_primitive::<Int64Type>(&reinterpret_i64(col), h, |v| v as u128),
        DataType::Decimal32(..) => int!(Decimal32Type),
        DataType::Decimal64(..) => int!(Decimal64Type),
        DataType::Decimal128(..) => int!(Decimal128Type),
        DataType::Utf8 => {
            let a = col.as_string::<i32>();
            each_valid(a, h, |i, h| write_bytes(h, a.value(i).as_bytes()))
        }
        DataType::LargeUtf8 => {
            let a = col.as_string::<i64>();
            each_valid(a, h, |i, h| write_bytes(h, a.value(i).as_bytes()))
        }
        DataType::Utf8View => {
            let a = col.as_string_view();
            each_valid(a, h, |i, h| write_bytes(h, a.value(i).as_bytes()))
        }
        DataType::Binary => {
            let a = col.as_binary::<i32>();
            each_valid(a, h, |i, h| write_bytes(h, a.value(i)))
        }
        DataType::LargeBinary => {
            let a = col.as_binary::<i64>();
            each_valid(a, h, |i, h| write_bytes(h, a.value(i)))
        }
        DataType::BinaryView => {
            let a = col.as_binary_view();
            each_valid(a, h, |i, h| write_bytes(h, a.value(i)))
        }
        DataType::FixedSizeBinary(_) => {
            let a = col.as_fixed_size_binary();
            each_valid(a, h, |i, h| write_bytes(h, a.value(i)))
        }
        // the remaining primitive types (Decimal256, intervals) by their little-endian bytes
        _ => {
            let data = col.to_data();
            let width = data.data_type().primitive_width().expect("a primitive type");
            let bytes = &data.buffers()[0].as_slice()[data.offset() * width..];
            each_valid(col.as_ref(), h, |i, h| write_bytes(h, &bytes[i * width..(i + 1) * width]))
        }
    }
}

/// A timestamp or duration column as plain `Int64` (same buffers, no copy).
fn reinterpret_i64(col: &ArrayRef) -> ArrayRef {
    let data = col.to_data().into_builder().data_type(DataType::Int64).build().expect("64-bit values");
    arrow_array::make_array(data)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::{ListBuilder, StringBuilder};
    use arrow_array::{Decimal128Array, Int32Array, Int64Array, StringArray, TimestampMicrosecondArray};
    use arrow_buffer::NullBuffer;
    use arrow_schema::{Field, Schema};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("amount", DataType::Decimal128(12, 2), true),
            Field::new("at", DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, Some("UTC".into())), true),
            Field::new("tags", DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))), true),
        ]))
    }

    /// id, name, amount, at, tags
    type Row<'a> = (Option<i64>, Option<&'a str>, Option<i128>, Option<i64>, Option<Vec<&'a str>>);

    fn batch(rows: &[Row<'_>]) -> RecordBatch {
        let mut tags = ListBuilder::new(StringBuilder::new());
        for r in rows {
            match &r.4 {
                Some(v) => {
                    v.iter().for_each(|s| tags.values().append_value(s));
                    tags.append(true);
                }
                None => tags.append(false),
            }
        }
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(rows.iter().map(|r| r.0).collect::<Int64Array>()),
                Arc::new(rows.iter().map(|r| r.1).collect::<StringArray>()),
                Arc::new(rows.iter().map(|r| r.2).collect::<Decimal128Array>().with_precision_and_scale(12, 2).unwrap()),
                Arc::new(rows.iter().map(|r| r.3).collect::<TimestampMicrosecondArray>().with_timezone("UTC")),
                Arc::new(tags.finish()),
            ],
        )
        .unwrap()
    }

    #[test]
    fn a_row_has_one_fingerprint_wherever_it_is() {
        let f = Fingerprinter::new(&schema()).unwrap();
        let rows = [
            (Some(1), Some("a"), Some(100), Some(5), Some(vec!["x", "y"])),
            (Some(2), None, Some(200), None, None),
            (Some(3), Some("c"), None, Some(7), Some(vec![])),
        ];
        let all = f.fingerprints(&batch(&rows)).unwrap();
        // alone, in another batch, as a slice
        for (i, r) in rows.iter().enumerate() {
            assert_eq!(f.fingerprints(&batch(std::slice::from_ref(r))).unwrap(), vec![all[i]]);
            assert_eq!(f.fingerprints(&batch(&rows).slice(i, 1)).unwrap(), vec![all[i]]);
        }
        // a column without a validity buffer hashes like one with an all-valid buffer
        let plain = Int32Array::from(vec![1, 2, 3]);
        let with_nulls = Int32Array::new(plain.values().clone(), Some(NullBuffer::new_valid(3)));
        let s = Arc::new(Schema::new(vec![Field::new("v", DataType::Int32, true)]));
        let f = Fingerprinter::new(&s).unwrap();
        let a = f.fingerprints(&RecordBatch::try_new(s.clone(), vec![Arc::new(plain)]).unwrap()).unwrap();
        let b = f.fingerprints(&RecordBatch::try_new(s, vec![Arc::new(with_nulls)]).unwrap()).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn different_rows_have_different_fingerprints() {
        let f = Fingerprinter::new(&schema()).unwrap();
        let rows = [
            (Some(1), Some("ab"), Some(1), Some(1), Some(vec!["x"])),
            // the same bytes moved between neighbouring columns or list items
            (Some(1), Some("a"), Some(1), Some(1), Some(vec!["bx"])),
            (Some(1), Some("ab"), Some(1), Some(1), Some(vec!["", "x"])),
            (Some(1), Some("ab"), Some(1), Some(1), Some(vec![])),
            (Some(1), Some("ab"), Some(1), Some(1), None),
            // a null against a zero or an empty value
            (Some(1), Some(""), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), None, Some(1), Some(1), Some(vec!["x"])),
            (Some(0), Some("ab"), Some(1), Some(1), Some(vec!["x"])),
            (None, Some("ab"), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), Some("ab"), None, Some(1), Some(vec!["x"])),
            (Some(1), Some("ab"), Some(1), None, Some(vec!["x"])),
            // values swapped between columns of the same width
            (Some(1), Some("ab"), Some(1), Some(2), Some(vec!["x"])),
            (Some(2), Some("ab"), Some(1), Some(1), Some(vec!["x"])),
        ];
        let fps = f.fingerprints(&batch(&rows)).unwrap();
        let distinct: std::collections::HashSet<_> = fps.iter().collect();
        assert_eq!(distinct.len(), rows.len());
    }

    #[test]
    fn both_halves_spread() {
        let s = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        let b = RecordBatch::try_new(s.clone(), vec![Arc::new(Int64Array::from_iter_values(0..200_000))]).unwrap();
        let fps = Fingerprinter::new(&s).unwrap().fingerprints(&b).unwrap();
        // the carry-over map indexes by the low half, parts split by the high half
        let low: std::collections::HashSet<u64> = fps.iter().map(|f| *f as u64).collect();
        let high: std::collections::HashSet<u64> = fps.iter().map(|f| (*f >> 64) as u64).collect();
        assert_eq!((low.len(), high.len()), (200_000, 200_000));
        // and the parts (high half mod a small count) are even
        let mut parts = [0u32; 7];
        fps.iter().for_each(|f| parts[((*f >> 64) as u64 % 7) as usize] += 1);
        assert!(parts.iter().all(|p| (*p as f64 - 200_000.0 / 7.0).abs() < 2_000.0), "{parts:?}");
    }
}

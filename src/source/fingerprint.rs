//! Whole-row 128-bit fingerprints, computed column by column.
//!
//! Carry-over cancellation ([`super::carry`]) matches a removed row with an identical added row by fingerprint
//! alone, so a fingerprint must be a function of the row's values only — not of batch boundaries, slicing, or
//! whether a column happens to carry a validity buffer — and two different rows must practically never share one.
//!
//! Algorithm: every row has two 64-bit lanes (16 bytes, so a batch's states stay in cache), started from fixed,
//! different seeds. Columns are visited in order and each column's values are fed to its rows' lanes in one tight loop
//! per column (no row encoding, no per-row allocation) as a sequence of 64-bit words: values up to 64 bits as one word,
//! 128-bit decimals as two, strings and binaries as their length then their bytes in little-endian words (see
//! `Lanes::bytes` for the tail), and any other type (structs, lists, maps, dictionaries) as the bytes of arrow's row encoding of
//! that one column. A null feeds nothing; instead each row ends with a bitmap of its null columns, so the fed sequence
//! decodes uniquely given the schema (fixed widths, length-prefixed bytes, the null map) and different rows feed
//! different sequences.
//!
//! A word `w` enters a lane as `s ← fold(s ^ w, k)`, `fold` being the 128-bit product of its operands folded to 64
//! bits (high half XOR low half) — the mixing step of ahash's and wyhash's portable paths. The lanes use different odd
//! multipliers and the second lane sees each word rotated, so a collision of one lane says nothing about the other;
//! a final fold per lane spreads the last word's bits.

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, PrimitiveArray, RecordBatch};
use arrow_row::RowConverter;
use arrow_schema::{DataType, SchemaRef};

use crate::error::Result;
use crate::spec::rowenc;

/// Seeds and multipliers fixed so that every read of a snapshot fingerprints a row the same way (SHA-512's initial
/// words; the multipliers forced odd).
const SEED_A: u64 = 0x6a09e667f3bcc908;
const SEED_B: u64 = 0xbb67ae8584caa73b;
const MUL_A: u64 = 0x3c6ef372fe94f82b;
const MUL_B: u64 = 0xa54ff53a5f1d36f1;
const FINAL_A: u64 = 0x510e527fade682d1;
const FINAL_B: u64 = 0x9b05688c2b3e6c1f;

/// The 128-bit product folded to 64 bits.
#[inline(always)]
fn fold(x: u64, k: u64) -> u64 {
    let p = x as u128 * k as u128;
    (p as u64) ^ ((p >> 64) as u64)
}

/// One row's hash state: two independent 64-bit lanes.
#[derive(Clone, Copy)]
struct Lanes {
    a: u64,
    b: u64,
}

impl Lanes {
    const START: Lanes = Lanes { a: SEED_A, b: SEED_B };

    #[inline(always)]
    fn word(&mut self, w: u64) {
        self.a = fold(self.a ^ w, MUL_A);
        self.b = fold(self.b ^ w.rotate_left(32), MUL_B);
    }

    /// Length, then the bytes as little-endian words. A tail shorter than a word is read as the word that ends
    /// at the last byte (overlapping the previous word), and a string shorter than a word as overlapping 4-byte or
    /// single-byte reads: given the length, every byte is still determined, and no byte is copied to the stack (a
    /// zero-padded copy cost a third of the fingerprint's time in a stalled store-to-load).
    #[inline(always)]
    fn bytes(&mut self, b: &[u8]) {
        let n = b.len();
        self.word(n as u64);
        if n >= 8 {
            let mut words = b.chunks_exact(8);
            for w in &mut words {
                self.word(u64::from_le_bytes(w.try_into().expect("8 bytes")));
            }
            if !words.remainder().is_empty() {
                self.word(u64::from_le_bytes(b[n - 8..].try_into().expect("8 bytes")));
            }
        } else if n >= 4 {
            let lo = u32::from_le_bytes(b[..4].try_into().expect("4 bytes")) as u64;
            let hi = u32::from_le_bytes(b[n - 4..].try_into().expect("4 bytes")) as u64;
            self.word(lo | hi << 32);
        } else if n > 0 {
            self.word(b[0] as u64 | (b[n / 2] as u64) << 8 | (b[n - 1] as u64) << 16);
        }
    }

    fn finish(self) -> u128 {
        ((fold(self.a, FINAL_A) as u128) << 64) | fold(self.b, FINAL_B) as u128
    }
}

/// How one column is fed to the lanes.
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
        let mut h = vec![Lanes::START; n];
        let words = batch.num_columns().div_ceil(64).max(1);
        let mut nulls: Option<Vec<u64>> = None;
        for (c, (col, feed)) in batch.columns().iter().zip(&self.feeds).enumerate() {
            if let Some(v) = col.logical_nulls().filter(|v| v.null_count() > 0) {
                let nulls = nulls.get_or_insert_with(|| vec![0u64; n * words]);
                for i in v.iter().enumerate().filter(|(_, valid)| !valid).map(|(i, _)| i) {
                    nulls[i * words + c / 64] |= 1 << (c % 64);
                }
            }
            match feed {
                Feed::Direct => feed_direct(col, &mut h),
                Feed::Encoded(conv) => {
                    let rows = rowenc::convert(conv, std::slice::from_ref(col))?;
                    each_valid(col.as_ref(), &mut h, |i, h| h.bytes(rows.row(i).as_ref()));
                }
            }
        }
        Ok(match nulls {
            // no nulls at all: every row's null map is zero words
            None => h
                .into_iter()
                .map(|mut l| {
                    (0..words).for_each(|_| l.word(0));
                    l.finish()
                })
                .collect(),
            Some(nulls) => h
                .into_iter()
                .zip(nulls.chunks_exact(words))
                .map(|(mut l, m)| {
                    m.iter().for_each(|w| l.word(*w));
                    l.finish()
                })
                .collect(),
        })
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

/// Calls `f` for every valid row (nulls feed nothing; the row's null map records them).
#[inline(always)]
fn each_valid(col: &dyn Array, h: &mut [Lanes], mut f: impl FnMut(usize, &mut Lanes)) {
    match col.logical_nulls().filter(|v| v.null_count() > 0) {
        None => h.iter_mut().enumerate().for_each(|(i, h)| f(i, h)),
        Some(v) => h.iter_mut().enumerate().filter(|(i, _)| v.is_valid(*i)).for_each(|(i, h)| f(i, h)),
    }
}

/// Values of up to 64 bits, one word each.
fn feed_primitive<T: ArrowPrimitiveType>(col: &ArrayRef, h: &mut [Lanes], bits: impl Fn(T::Native) -> u64) {
    let a: &PrimitiveArray<T> = col.as_primitive();
    let values = a.values();
    each_valid(a, h, |i, h| h.word(bits(values[i])));
}

/// Feeds a column of a [`direct`] type.
fn feed_direct(col: &ArrayRef, h: &mut [Lanes]) {
    macro_rules! int {
        ($t:ty) => {
            feed_primitive::<$t>(col, h, |v| v as u64)
        };
    }
    match col.data_type() {
        DataType::Boolean => {
            let a = col.as_boolean();
            each_valid(a, h, |i, h| h.word(a.value(i) as u64))
        }
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::UInt8 => int!(UInt8Type),
        DataType::UInt16 => int!(UInt16Type),
        DataType::UInt32 => int!(UInt32Type),
        DataType::UInt64 => int!(UInt64Type),
        DataType::Float16 => feed_primitive::<Float16Type>(col, h, |v| v.to_bits() as u64),
        DataType::Float32 => feed_primitive::<Float32Type>(col, h, |v| v.to_bits() as u64),
        DataType::Float64 => feed_primitive::<Float64Type>(col, h, |v| v.to_bits()),
        DataType::Date32 => int!(Date32Type),
        DataType::Date64 => int!(Date64Type),
        DataType::Time32(arrow_schema::TimeUnit::Second) => int!(Time32SecondType),
        DataType::Time32(_) => int!(Time32MillisecondType),
        DataType::Time64(arrow_schema::TimeUnit::Microsecond) => int!(Time64MicrosecondType),
        DataType::Time64(_) => int!(Time64NanosecondType),
        // the unit and zone are the schema's, the same for every row: the value is enough
        DataType::Timestamp(..) => feed_primitive::<Int64Type>(&reinterpret_i64(col), h, |v| v as u64),
        DataType::Duration(..) => feed_primitive::<Int64Type>(&reinterpret_i64(col), h, |v| v as u64),
        DataType::Decimal32(..) => int!(Decimal32Type),
        DataType::Decimal64(..) => int!(Decimal64Type),
        DataType::Decimal128(..) => {
            let a = col.as_primitive::<Decimal128Type>();
            let values = a.values();
            each_valid(a, h, |i, h| {
                h.word(values[i] as u64);
                h.word((values[i] >> 64) as u64);
            })
        }
        DataType::Utf8 => {
            let a = col.as_string::<i32>();
            each_valid(a, h, |i, h| h.bytes(a.value(i).as_bytes()))
        }
        DataType::LargeUtf8 => {
            let a = col.as_string::<i64>();
            each_valid(a, h, |i, h| h.bytes(a.value(i).as_bytes()))
        }
        DataType::Utf8View => {
            let a = col.as_string_view();
            each_valid(a, h, |i, h| h.bytes(a.value(i).as_bytes()))
        }
        DataType::Binary => {
            let a = col.as_binary::<i32>();
            each_valid(a, h, |i, h| h.bytes(a.value(i)))
        }
        DataType::LargeBinary => {
            let a = col.as_binary::<i64>();
            each_valid(a, h, |i, h| h.bytes(a.value(i)))
        }
        DataType::BinaryView => {
            let a = col.as_binary_view();
            each_valid(a, h, |i, h| h.bytes(a.value(i)))
        }
        DataType::FixedSizeBinary(_) => {
            let a = col.as_fixed_size_binary();
            each_valid(a, h, |i, h| h.bytes(a.value(i)))
        }
        // the remaining primitive types (Decimal256, intervals) by their little-endian bytes
        _ => {
            let data = col.to_data();
            let width = data.data_type().primitive_width().expect("a primitive type");
            let bytes = &data.buffers()[0].as_slice()[data.offset() * width..];
            each_valid(col.as_ref(), h, |i, h| h.bytes(&bytes[i * width..(i + 1) * width]))
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
    use arrow_array::{
        BinaryArray, BinaryViewArray, Decimal128Array, Int32Array, Int64Array, LargeStringArray, StringArray, StringViewArray,
        TimestampMicrosecondArray,
    };
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

    /// Carry-over reads some files as views and others not, so a value fingerprints the same in every string or
    /// binary layout: inline views (up to 12 bytes), buffered views, offsets, with nulls and sliced. (Reading short
    /// views from the view's register instead of `value(i)` was tried: no faster, the lanes' multiplies are the cost.)
    #[test]
    fn every_string_layout_fingerprints_alike() {
        let values: Vec<Option<String>> =
            (0..=40).flat_map(|n| [Some((0..n).map(|i| char::from(b'a' + (i * 7 + n) as u8 % 26)).collect()), None]).collect();
        let one = |dt: DataType, col: ArrayRef| {
            let s = Arc::new(Schema::new(vec![Field::new("v", dt, true)]));
            let b = RecordBatch::try_new(s.clone(), vec![col]).unwrap();
            let f = Fingerprinter::new(&s).unwrap();
            (f.fingerprints(&b).unwrap(), f.fingerprints(&b.slice(3, 50)).unwrap())
        };
        let strs = || values.iter().map(|v| v.as_deref());
        let bins = || values.iter().map(|v| v.as_deref().map(str::as_bytes));
        let utf8 = one(DataType::Utf8, Arc::new(strs().collect::<StringArray>()));
        assert_eq!(one(DataType::Utf8View, Arc::new(strs().collect::<StringViewArray>())), utf8);
        assert_eq!(one(DataType::LargeUtf8, Arc::new(strs().collect::<LargeStringArray>())), utf8);
        assert_eq!(one(DataType::Binary, Arc::new(bins().collect::<BinaryArray>())), utf8);
        assert_eq!(one(DataType::BinaryView, Arc::new(bins().collect::<BinaryViewArray>())), utf8);
        // every length and value apart
        let distinct: std::collections::HashSet<_> = utf8.0.iter().collect();
        assert_eq!(distinct.len(), 41 + 1);
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
            // strings around a word's width, tails read overlapping: every byte counts
            (Some(1), Some("abcdefg"), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), Some("abcdefg\0"), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), Some("abcdefgh"), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), Some("abcdefgh\0"), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), Some("abcdefgh\0\0\0\0\0\0\0\0"), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), Some("abcdefghi"), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), Some("abcdefghj"), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), Some("abcdefgi"), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), Some("abc"), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), Some("abd"), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), Some("aXc"), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), Some("abcde"), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), Some("abXde"), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), Some("abcdX"), Some(1), Some(1), Some(vec!["x"])),
            (Some(1), Some("a"), Some(1), Some(1), Some(vec!["x"])),
            // decimals differing only in their high word
            (Some(1), Some("ab"), Some(1 + (1 << 64)), Some(1), Some(vec!["x"])),
            (Some(1), Some("ab"), Some(-1), Some(1), Some(vec!["x"])),
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

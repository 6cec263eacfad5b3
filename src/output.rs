//! Writers for change rows: JSON lines (the Iceberg spec's single-value JSON serialization) and Parquet.
//! File outputs are written to a temporary name and renamed on success, so a failed run leaves no partial file.
use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Field, SchemaRef, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
/// Formats of `cdc changes` output.
pub enum Format {
    /// One JSON object per change row.
    Jsonl,
    /// A Parquet file of change rows.
    Parquet,
}

/// A synchronous writer of change rows (stdout or a file).
pub trait ChangeWriter: Send {
    /// Writes the rows of `batch`.
    fn write(&mut self, batch: &RecordBatch) -> Result<()>;
    /// Flushes and, for a file, moves it into place.
    fn finish(self: Box<Self>) -> Result<()>;
}

/// Where output goes: stdout, or a file made visible only when complete.
enum OutputFile {
    Stdout(std::io::BufWriter<std::io::Stdout>),
    File { tmp: tempfile::NamedTempFile, path: PathBuf },
}

impl OutputFile {
    fn open(path: Option<&Path>) -> Result<OutputFile> {
        match path {
            None => Ok(OutputFile::Stdout(std::io::BufWriter::with_capacity(1 << 20, std::io::stdout()))),
            Some(p) => {
                let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
                let tmp = tempfile::Builder::new().prefix(".cdc-out-").tempfile_in(dir).map_err(|e| {
                    Error::Io { path: dir.display().to_string(), message: e.to_string(), retryable: false, cause: None }.with_cause(e)
                })?;
                Ok(OutputFile::File { tmp, path: p.to_path_buf() })
            }
        }
    }
    /// Where the output goes, for messages: the final path (not the temporary file), or stdout.
    fn name(&self) -> String {
        match self {
            OutputFile::Stdout(_) => "<stdout>".to_string(),
            OutputFile::File { path, .. } => path.display().to_string(),
        }
    }
    fn writer(&mut self) -> &mut dyn Write {
        match self {
            OutputFile::Stdout(w) => w,
            OutputFile::File { tmp, .. } => tmp.as_file_mut(),
        }
    }
    fn commit(self) -> Result<()> {
        match self {
            OutputFile::Stdout(mut w) => {
                w.flush().map_err(|e| Error::Io { path: "<stdout>".into(), message: e.to_string(), retryable: false, cause: None }.with_cause(e))
            }
            OutputFile::File { tmp, path } => {
                tmp.persist(&path).map_err(|e| {
                    Error::Io { path: path.display().to_string(), message: e.to_string(), retryable: false, cause: None }.with_cause(e)
                })?;
                Ok(())
            }
        }
    }
}

/// A synchronous writer as a [`crate::change::ChangeConsumer`].
pub struct WriterConsumer<'a>(pub &'a mut dyn ChangeWriter);

impl crate::change::ChangeConsumer for WriterConsumer<'_> {
    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        self.0.write(&batch)
    }
}

/// Dictionary size of a Parquet output column chunk before it falls back to plain encoding. The commit columns and
/// low-cardinality data columns fit; a key or other high-cardinality column falls back after a few thousand values
/// instead of interning 1 MiB of them (parquet-rs's default) per row group. Measured on the 10 M case's 1 M change
/// rows: 9.6 → 6.1 MB written and about a third less CPU to write them (ZSTD compresses the plain values better).
const DICTIONARY_PAGE_BYTES: usize = 64 << 10;

/// The part of `engine.memory_budget` `cdc changes` leaves to its output writer (numerator, denominator); the scan
/// gets the rest. Unbounded, the Parquet writer's row group of 1 M change rows took 80-180 MB beside a scan that
/// used the whole budget (peak RSS up to budget + 230 MB at 100 M rows).
pub const OUTPUT_SHARE: (u64, u64) = (1, 8);

/// A writer of change rows (in the engine's change schema; `_change_type` is encoded as its name here).
/// `memory`: what the writer may buffer (the Parquet writer's row group in progress; see [`OUTPUT_SHARE`]).
pub fn open(format: Format, path: Option<&Path>, schema: SchemaRef, memory: u64) -> Result<Box<dyn ChangeWriter>> {
    let target = OutputFile::open(path)?;
    let schema = crate::change::output_schema(&schema);
    Ok(match format {
        Format::Jsonl => Box::new(JsonLines { target, line: String::new(), schema }),
        Format::Parquet => {
            let props = WriterProperties::builder()
                .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap()))
                .set_dictionary_page_size_limit(DICTIONARY_PAGE_BYTES)
                .build();
            let path = target.name();
            let writer = ArrowWriter::try_new(SharedOutputFile(std::sync::Arc::new(std::sync::Mutex::new(target))), schema.clone(), Some(props))
                .map_err(|e| output_error(&path, e))?;
            Box::new(ParquetOut { writer: Some(writer), path, schema, memory: memory.max(1) as usize })
        }
    })
}

struct JsonLines {
    target: OutputFile,
    line: String,
    schema: SchemaRef,
}

impl ChangeWriter for JsonLines {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let batch = &crate::change::for_output(batch, &self.schema)?;
        let schema = batch.schema();
        for row in 0..batch.num_rows() {
            self.line.clear();
            self.line.push('{');
            for (i, f) in schema.fields().iter().enumerate() {
                if i > 0 {
                    self.line.push(',');
                }
                push_json_str(&mut self.line, f.name());
                self.line.push(':');
                json_value(&mut self.line, batch.column(i).as_ref(), f, row)?;
            }
            self.line.push_str("}\n");
            if let Err(e) = self.target.writer().write_all(self.line.as_bytes()) {
                return Err(Error::Io { path: self.target.name(), message: e.to_string(), retryable: false, cause: None });
            }
        }
        Ok(())
    }
    fn finish(self: Box<Self>) -> Result<()> {
        self.target.commit()
    }
}

/// ArrowWriter owns its sink; share the target so it can be committed after the footer is written.
struct SharedOutputFile(std::sync::Arc<std::sync::Mutex<OutputFile>>);
impl Write for SharedOutputFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").writer().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.lock().expect("not poisoned").writer().flush()
    }
}

struct ParquetOut {
    writer: Option<ArrowWriter<SharedOutputFile>>,
    path: String,
    schema: SchemaRef,
    /// The row group in progress is written out once its buffers hold this much.
    memory: usize,
}

/// A failure writing our own output is an I/O error on that output (disk full, permissions), never a bad input.
fn output_error(path: &str, e: parquet::errors::ParquetError) -> Error {
    let message = match &e {
        parquet::errors::ParquetError::External(inner) => inner.to_string(),
        other => other.to_string(),
    };
    Error::Io { path: path.to_string(), message, retryable: false, cause: None }
}

impl ChangeWriter for ParquetOut {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let batch = crate::change::for_output(batch, &self.schema)?;
        let w = self.writer.as_mut().expect("not finished");
        w.write(&batch).map_err(|e| output_error(&self.path, e))?;
        // a row group is buffered whole (parquet-rs's default: 1 M rows, whatever their size): bound it in bytes
        if w.memory_size() >= self.memory {
            w.flush().map_err(|e| output_error(&self.path, e))?;
        }
        Ok(())
    }
    fn finish(mut self: Box<Self>) -> Result<()> {
        let w = self.writer.take().expect("not finished");
        let shared = w.into_inner().map_err(|e| output_error(&self.path, e))?;
        let target = std::sync::Arc::try_unwrap(shared.0)
            .map_err(|_| Error::Internal("parquet sink still shared".into()))?
            .into_inner()
            .map_err(|_| Error::Internal("parquet sink poisoned".into()))?;
        target.commit()
    }
}

/// Appends `s` as a JSON string. Most values need no escaping (no control character, quote or backslash — the only
/// characters JSON escapes): those are copied between quotes without serde_json's allocation.
pub(crate) fn push_json_str(out: &mut String, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.reserve(s.len() + 2);
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(s).expect("strings serialize"));
    }
}

/// Appends `v` as exactly `width` decimal digits (zero-padded; `v < 10^width`, `width <= 10`).
fn push_digits(out: &mut String, mut v: u32, width: usize) {
    let mut buf = [b'0'; 10];
    for d in buf[..width].iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
    out.push_str(std::str::from_utf8(&buf[..width]).expect("ASCII digits"));
}

/// Appends the ISO form of a date, a time (with `digits` fraction digits, 6 or 9) or both (`T` between), quoted,
/// then `suffix` inside the quotes — written digit by digit: chrono's `format` parses its pattern and allocates for
/// every value (~4 % of publishing Debezium messages). Years outside 0..=9999 take chrono's `%Y` form (a sign, more
/// digits).
fn push_iso(out: &mut String, date: Option<chrono::NaiveDate>, time: Option<(chrono::NaiveTime, usize)>, suffix: &str) {
    use chrono::{Datelike, Timelike};
    if let Some(d) = date.filter(|d| !(0..=9999).contains(&d.year())) {
        let mut s = match time {
            Some((t, 9)) => d.and_time(t).format("%Y-%m-%dT%H:%M:%S%.9f").to_string(),
            Some((t, _)) => d.and_time(t).format("%Y-%m-%dT%H:%M:%S%.6f").to_string(),
            None => d.format("%Y-%m-%d").to_string(),
        };
        s.push_str(suffix);
        return push_json_str(out, &s);
    }
    out.push('"');
    if let Some(d) = date {
        push_digits(out, d.year() as u32, 4);
        out.push('-');
        push_digits(out, d.month(), 2);
        out.push('-');
        push_digits(out, d.day(), 2);
        if time.is_some() {
            out.push('T');
        }
    }
    if let Some((t, digits)) = time {
        push_digits(out, t.hour(), 2);
        out.push(':');
        push_digits(out, t.minute(), 2);
        out.push(':');
        push_digits(out, t.second(), 2);
        out.push('.');
        // chrono's `%.6f`/`%.9f`: the nanoseconds truncated to `digits`
        push_digits(out, t.nanosecond() / 10u32.pow(9 - digits as u32), digits);
    }
    out.push_str(suffix);
    out.push('"');
}

fn field_key(f: &Field) -> String {
    crate::spec::projection::field_id(f).map(|id| id.to_string()).unwrap_or_else(|| f.name().clone())
}

/// Appends the Iceberg single-value JSON form of `array[row]`.
pub fn json_value(out: &mut String, array: &dyn Array, field: &Field, row: usize) -> Result<()> {
    if array.is_null(row) {
        out.push_str("null");
        return Ok(());
    }
    macro_rules! num {
        ($t:ty) => {{
            out.push_str(itoa::Buffer::new().format(array.as_primitive::<$t>().value(row)));
        }};
    }
    macro_rules! float {
        ($t:ty) => {{
            let v = array.as_primitive::<$t>().value(row) as f64;
            if v.is_finite() {
                let _ = write!(out, "{}", serde_json::Number::from_f64(v).expect("finite"));
            } else {
                push_json_str(
                    out,
                    if v.is_nan() {
                        "NaN"
                    } else if v > 0.0 {
                        "Infinity"
                    } else {
                        "-Infinity"
                    },
                );
            }
        }};
    }
    match array.data_type() {
        DataType::Boolean => out.push_str(if array.as_boolean().value(row) { "true" } else { "false" }),
        DataType::Int8 => num!(Int8Type),
        DataType::Int16 => num!(Int16Type),
        DataType::Int32 => num!(Int32Type),
        DataType::Int64 => num!(Int64Type),
        DataType::UInt32 => num!(UInt32Type),
        DataType::UInt64 => num!(UInt64Type),
        DataType::Float32 => float!(Float32Type),
        DataType::Float64 => float!(Float64Type),
        DataType::Decimal128(p, s) => {
            let v = array.as_primitive::<Decimal128Type>().value(row);
            push_json_str(out, &Decimal128Type::format_decimal(v, *p, *s));
        }
        DataType::Date32 => {
            let d = chrono::DateTime::from_timestamp(array.as_primitive::<Date32Type>().value(row) as i64 * 86_400, 0)
                .ok_or_else(|| Error::Internal("date out of range".into()))?;
            push_iso(out, Some(d.date_naive()), None, "");
        }
        DataType::Time64(TimeUnit::Microsecond) => {
            let us = array.as_primitive::<Time64MicrosecondType>().value(row);
            let t = chrono::NaiveTime::from_num_seconds_from_midnight_opt((us / 1_000_000) as u32, ((us % 1_000_000) * 1000) as u32)
                .ok_or_else(|| Error::Internal("time out of range".into()))?;
            push_iso(out, None, Some((t, 6)), "");
        }
        DataType::Timestamp(unit, tz) => {
            let (dt, digits) = match unit {
                TimeUnit::Microsecond => (chrono::DateTime::from_timestamp_micros(array.as_primitive::<TimestampMicrosecondType>().value(row)), 6),
                TimeUnit::Nanosecond => (Some(chrono::DateTime::from_timestamp_nanos(array.as_primitive::<TimestampNanosecondType>().value(row))), 9),
                TimeUnit::Millisecond => (chrono::DateTime::from_timestamp_millis(array.as_primitive::<TimestampMillisecondType>().value(row)), 6),
                TimeUnit::Second => (chrono::DateTime::from_timestamp(array.as_primitive::<TimestampSecondType>().value(row), 0), 6),
            };
            let dt = dt.ok_or_else(|| Error::Internal("timestamp out of range".into()))?.naive_utc();
            push_iso(out, Some(dt.date()), Some((dt.time(), digits)), if tz.is_some() { "+00:00" } else { "" });
        }
        DataType::Utf8 => push_json_str(out, array.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => push_json_str(out, array.as_string::<i64>().value(row)),
        DataType::Utf8View => push_json_str(out, array.as_string_view().value(row)),
        DataType::Binary => push_json_str(out, &hex::encode_upper(array.as_binary::<i32>().value(row))),
        DataType::LargeBinary => push_json_str(out, &hex::encode_upper(array.as_binary::<i64>().value(row))),
        DataType::FixedSizeBinary(16) if is_uuid(field) => {
            let b = array.as_fixed_size_binary().value(row);
            push_json_str(out, &uuid::Uuid::from_slice(b).map(|u| u.to_string()).unwrap_or_else(|_| hex::encode_upper(b)));
        }
        DataType::FixedSizeBinary(_) => push_json_str(out, &hex::encode_upper(array.as_fixed_size_binary().value(row))),
        DataType::Struct(fields) => {
            let s = array.as_struct();
            out.push('{');
            for (i, f) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_json_str(out, &field_key(f));
                out.push(':');
                json_value(out, s.column(i).as_ref(), f, row)?;
            }
            out.push('}');
        }
        DataType::List(f) => json_array(out, array.as_list::<i32>().value(row).as_ref(), f)?,
        DataType::LargeList(f) => json_array(out, array.as_list::<i64>().value(row).as_ref(), f)?,
        DataType::Map(entries, _) => {
            let e = array.as_map().value(row);
            let DataType::Struct(kv) = entries.data_type() else { return Err(Error::Internal("map without struct entries".into())) };
            out.push_str("{\"keys\":");
            json_array(out, e.column(0).as_ref(), &kv[0])?;
            out.push_str(",\"values\":");
            json_array(out, e.column(1).as_ref(), &kv[1])?;
            out.push('}');
        }
        other => return Err(Error::Schema(format!("column `{}`: type {other} has no JSON form here", field.name()))),
    }
    Ok(())
}

fn json_array(out: &mut String, values: &dyn Array, field: &Field) -> Result<()> {
    out.push('[');
    for i in 0..values.len() {
        if i > 0 {
            out.push(',');
        }
        json_value(out, values, field, i)?;
    }
    out.push(']');
    Ok(())
}

fn is_uuid(f: &Field) -> bool {
    f.metadata().get("ARROW:extension:name").is_some_and(|n| n.contains("uuid"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Date32Array, Decimal128Array, StringArray, TimestampMicrosecondArray};

    fn one(a: &dyn Array) -> String {
        let mut s = String::new();
        json_value(&mut s, a, &Field::new("x", a.data_type().clone(), true), 0).unwrap();
        s
    }

    #[test]
    fn iceberg_single_value_json() {
        assert_eq!(one(&Decimal128Array::from(vec![1430]).with_precision_and_scale(10, 2).unwrap()), "\"14.30\"");
        assert_eq!(one(&Date32Array::from(vec![17486])), "\"2017-11-16\"");
        assert_eq!(one(&TimestampMicrosecondArray::from(vec![1_510_871_468_123_456])), "\"2017-11-16T22:31:08.123456\"");
        assert_eq!(
            one(&TimestampMicrosecondArray::from(vec![1_510_871_468_123_456]).with_timezone("+00:00")),
            "\"2017-11-16T22:31:08.123456+00:00\""
        );
        assert_eq!(one(&arrow_array::BinaryArray::from(vec![&[0x12u8, 0xab][..]])), "\"12AB\"");
        assert_eq!(one(&StringArray::from(vec!["a\"b"])), "\"a\\\"b\"");
        assert_eq!(one(&arrow_array::Float64Array::from(vec![f64::NAN])), "\"NaN\"");
        let l = arrow_array::ListArray::from_iter_primitive::<Int32Type, _, _>(vec![Some(vec![Some(1), None])]);
        assert_eq!(one(&l), "[1,null]");
    }

    /// The digit-by-digit ISO forms are chrono's `format` output, across the whole range (years 0..=9999 written
    /// directly, others through chrono), before 1970 (negative remainders) included.
    #[test]
    fn dates_times_and_timestamps_match_chrono() {
        use arrow_array::{Time64MicrosecondArray, TimestampNanosecondArray};
        let quoted = |s: String| format!("\"{s}\"");
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let year_0 = -62_167_219_200_i64; // 0000-01-01T00:00:00, in seconds
        let year_10000 = 253_402_300_800_i64;
        let edges = [0, -1, 1, year_0 - 1, year_0, year_10000 - 1, year_10000, 951_782_400, -2_208_988_800];
        let randoms: Vec<i64> = (0..20_000).map(|_| (next() % 800_000_000_000_u64) as i64 - 400_000_000_000).collect();
        for secs in edges.iter().copied().chain(randoms) {
            let sub = (next() % 1_000_000_000) as i64;
            let micros = secs * 1_000_000 + sub / 1000;
            let dt = chrono::DateTime::from_timestamp_micros(micros).unwrap().naive_utc();
            assert_eq!(one(&TimestampMicrosecondArray::from(vec![micros])), quoted(dt.format("%Y-%m-%dT%H:%M:%S%.6f").to_string()), "{micros}");
            assert_eq!(
                one(&TimestampMicrosecondArray::from(vec![micros]).with_timezone("UTC")),
                quoted(format!("{}+00:00", dt.format("%Y-%m-%dT%H:%M:%S%.6f")))
            );
            let days = secs.div_euclid(86_400) as i32;
            let d = chrono::DateTime::from_timestamp(days as i64 * 86_400, 0).unwrap();
            assert_eq!(one(&Date32Array::from(vec![days])), quoted(d.format("%Y-%m-%d").to_string()), "{days}");
            let of_day = micros.rem_euclid(86_400_000_000);
            let t = chrono::NaiveTime::from_num_seconds_from_midnight_opt((of_day / 1_000_000) as u32, (of_day % 1_000_000 * 1000) as u32).unwrap();
            assert_eq!(one(&Time64MicrosecondArray::from(vec![of_day])), quoted(t.format("%H:%M:%S%.6f").to_string()));
            if let Some(nanos) = secs.checked_mul(1_000_000_000).and_then(|n| n.checked_add(sub)) {
                let dt = chrono::DateTime::from_timestamp_nanos(nanos).naive_utc();
                assert_eq!(one(&TimestampNanosecondArray::from(vec![nanos])), quoted(dt.format("%Y-%m-%dT%H:%M:%S%.9f").to_string()));
            }
        }
    }

    /// Strings without characters JSON escapes are copied as they are; the others are serde_json's escaping.
    #[test]
    fn json_strings_escape_exactly_what_json_requires() {
        for s in ["", "plain", "ünïcødé ✓", "tab\there", "quote\"", "back\\slash", "nul\u{0}", "del\u{7f}", "/slash", "\u{1f}"] {
            let mut out = String::new();
            push_json_str(&mut out, s);
            assert_eq!(out, serde_json::to_string(s).unwrap(), "{s:?}");
        }
    }
}

#[cfg(test)]
mod row_group_tests {
    use super::*;
    use crate::change::{self, ChangeType, CommitInfo};
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Schema};
    use std::sync::Arc;

    /// Row groups written with `memory` bytes for the writer's buffers, for 200k change rows.
    fn row_groups(memory: u64) -> usize {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("changes.parquet");
        let data = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Utf8, true)]));
        let schema = change::change_schema(&data);
        let mut w = open(Format::Parquet, Some(&path), schema.clone(), memory).unwrap();
        let commit = CommitInfo { snapshot_id: 1, sequence_number: 1, timestamp_ms: 0, ordinal: 0 };
        for b in 0..25i64 {
            let ids = Int64Array::from_iter_values(b * 8000..(b + 1) * 8000);
            let vs = StringArray::from_iter_values((0..8000).map(|i| format!("value-{}-{i}", b * 7919 + i)));
            let batch =
                change::with_metadata(&schema, vec![Arc::new(ids), Arc::new(vs)], change::change_type_column(ChangeType::Insert, 8000), commit)
                    .unwrap();
            w.write(&batch).unwrap();
        }
        w.finish().unwrap();
        let reader = parquet::file::reader::SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        let meta = parquet::file::reader::FileReader::metadata(&reader);
        assert_eq!(meta.file_metadata().num_rows(), 200_000);
        meta.num_row_groups()
    }

    /// The writer's row group in progress stays within the memory it is given: a small share splits the rows into
    /// several row groups, the default share keeps them in one.
    #[test]
    fn a_row_group_is_written_out_once_it_fills_the_writers_memory() {
        assert_eq!(row_groups(32 << 20), 1);
        assert!(row_groups(1 << 20) > 2, "{}", row_groups(1 << 20));
    }
}

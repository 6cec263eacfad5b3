//! Manifest lists decoded column by column.
//!
//! A table that is not maintained gets one more manifest per commit, and every new snapshot's manifest list names
//! all of them: following one small commit reads a list that grows with the history. iceberg-rust decodes it
//! through Avro's generic `Value` tree and serde (one map of boxed values per entry), which made the list the
//! largest cost of a commit at the end of a long history. Here the list goes through `arrow-avro` (already the
//! reader of Avro data files) into Arrow arrays, and each entry is built straight from its columns: the same
//! `ManifestFile`s for a fraction of the CPU.
//!
//! Columns are found by name, as the writer's schema in the file names them: `added_files_count` and its pre-1.5
//! name `added_data_files_count` (and the other counts alike) both count; a v1 list has no `content` or sequence
//! numbers (data, 0). Anything the column reader does not expect — a missing required column, another type, a
//! null where the spec requires a value — makes [`parse`] fall back to iceberg-rust's decoder, which then decides
//! (its error names what is wrong), so this module only ever changes how fast a list is read, never what it says.
//!
//! [`read`] keeps decoded lists in a small process-wide cache keyed by path: a list never changes once written, and
//! a target reads its parent's list at each commit.
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, ArrayRef, RecordBatch, StructArray};
use arrow_schema::DataType;
use iceberg::io::FileIO;
use iceberg::spec::{FieldSummary, FormatVersion, ManifestContentType, ManifestFile, ManifestList, SnapshotRef};

use crate::error::{Error, Result};

/// The manifests `snapshot`'s list names, decoded once per process (see the module docs).
pub(crate) async fn read(file_io: &FileIO, snapshot: &SnapshotRef, version: FormatVersion) -> Result<Arc<Vec<ManifestFile>>> {
    let path = snapshot.manifest_list().to_string();
    let load = async {
        let err = |e: &dyn std::fmt::Display| Error::data(&path, format!("cannot read manifest list of snapshot {}: {e}", snapshot.snapshot_id()));
        let bytes = file_io.new_input(&path).map_err(|e| err(&e))?.read().await.map_err(|e| err(&e))?;
        parse(&bytes, version).map(Arc::new).map_err(|e| err(&e))
    };
    cache().try_get_with(path.clone(), load).await.map_err(|e: Arc<Error>| Error::data(&path, e.to_string()))
}

/// Decodes a manifest list of a table of format `version`: by columns, or by iceberg-rust where the columns are not
/// what this reader expects.
pub(crate) fn parse(bytes: &[u8], version: FormatVersion) -> std::result::Result<Vec<ManifestFile>, iceberg::Error> {
    // arrow-avro is not meant to panic on damaged input; should it, iceberg-rust's decoder gives the error
    match std::panic::catch_unwind(|| by_columns(bytes)) {
        Ok(Some(entries)) => Ok(entries),
        _ => Ok(ManifestList::parse_with_version(bytes, version)?.consume_entries().into_iter().collect()),
    }
}

/// The entries of the list in `bytes`, or `None` when a column is missing or not of the expected type.
fn by_columns(bytes: &[u8]) -> Option<Vec<ManifestFile>> {
    let reader = arrow_avro::reader::ReaderBuilder::new().with_batch_size(4096).build(std::io::Cursor::new(bytes)).ok()?;
    let mut out = Vec::new();
    for batch in reader {
        entries_of(&batch.ok()?, &mut out)?;
    }
    Some(out)
}

/// Appends the entries of one decoded batch to `out`.
fn entries_of(batch: &RecordBatch, out: &mut Vec<ManifestFile>) -> Option<()> {
    let column = |names: &[&str]| names.iter().find_map(|n| batch.column_by_name(n)).cloned();
    let path = column(&["manifest_path"])?;
    let path = path.as_string_opt::<i32>()?;
    let length = Longs::of(column(&["manifest_length"]))?;
    let spec_id = Ints::of(column(&["partition_spec_id"]))?;
    let content = Ints::of(column(&["content"]))?;
    let seq = Longs::of(column(&["sequence_number"]))?;
    let min_seq = Longs::of(column(&["min_sequence_number"]))?;
    let added_snapshot = Longs::of(column(&["added_snapshot_id"]))?;
    let added_files = Ints::of(column(&["added_files_count", "added_data_files_count"]))?;
    let existing_files = Ints::of(column(&["existing_files_count", "existing_data_files_count"]))?;
    let deleted_files = Ints::of(column(&["deleted_files_count", "deleted_data_files_count"]))?;
    let added_rows = Longs::of(column(&["added_rows_count"]))?;
    let existing_rows = Longs::of(column(&["existing_rows_count"]))?;
    let deleted_rows = Longs::of(column(&["deleted_rows_count"]))?;
    let first_row_id = Longs::of(column(&["first_row_id"]))?;
    let key_metadata = match column(&["key_metadata"]) {
        None => None,
        Some(c) => Some(c.as_binary_opt::<i32>()?.clone()),
    };
    let partitions = match column(&["partitions"]) {
        None => None,
        Some(c) => Some(c.as_list_opt::<i32>()?.clone()),
    };
    let summaries = match &partitions {
        None => None,
        Some(list) => Some(Summaries::of(list.values().as_struct_opt()?)?),
    };
    for i in 0..batch.num_rows() {
        let content = match content.get(i).unwrap_or(Some(0))? {
            0 => ManifestContentType::Data,
            1 => ManifestContentType::Deletes,
            _ => return None,
        };
        // `None` for a negative count; `Some(None)` for a count left out
        let count = |c: &Ints| c.get(i).flatten().map_or(Some(None), |n| u32::try_from(n).ok().map(Some));
        let rows = |c: &Longs| c.get(i).flatten().map_or(Some(None), |n| u64::try_from(n).ok().map(Some));
        let partitions = match (&partitions, &summaries) {
            (Some(list), Some(s)) if list.is_valid(i) => {
                let range = list.value_offsets()[i] as usize..list.value_offsets()[i + 1] as usize;
                Some(range.map(|j| s.get(j)).collect::<Option<Vec<_>>>()?)
            }
            _ => None,
        };
        out.push(ManifestFile {
            manifest_path: path.is_valid(i).then(|| path.value(i).to_string())?,
            manifest_length: length.get(i)??,
            partition_spec_id: spec_id.get(i)??,
            content,
            sequence_number: seq.get(i).unwrap_or(Some(0))?,
            min_sequence_number: min_seq.get(i).unwrap_or(Some(0))?,
            added_snapshot_id: added_snapshot.get(i)??,
            added_files_count: count(&added_files)?,
            existing_files_count: count(&existing_files)?,
            deleted_files_count: count(&deleted_files)?,
            added_rows_count: rows(&added_rows)?,
            existing_rows_count: rows(&existing_rows)?,
            deleted_rows_count: rows(&deleted_rows)?,
            partitions,
            key_metadata: key_metadata.as_ref().filter(|k| k.is_valid(i)).map(|k| k.value(i).to_vec()),
            first_row_id: rows(&first_row_id)?,
        });
    }
    Some(())
}

/// An optional `int` column: `get` is `None` for a column the writer left out, `Some(None)` for a null.
struct Ints(Option<arrow_array::PrimitiveArray<Int32Type>>);

impl Ints {
    /// `None` when the column is there but not an `int`.
    fn of(c: Option<ArrayRef>) -> Option<Self> {
        match c {
            None => Some(Self(None)),
            Some(c) if c.data_type() == &DataType::Int32 => Some(Self(Some(c.as_primitive::<Int32Type>().clone()))),
            Some(_) => None,
        }
    }
    fn get(&self, i: usize) -> Option<Option<i32>> {
        self.0.as_ref().map(|a| a.is_valid(i).then(|| a.value(i)))
    }
}

/// An optional `long` column (see [`Ints`]).
struct Longs(Option<arrow_array::PrimitiveArray<Int64Type>>);

impl Longs {
    fn of(c: Option<ArrayRef>) -> Option<Self> {
        match c {
            None => Some(Self(None)),
            Some(c) if c.data_type() == &DataType::Int64 => Some(Self(Some(c.as_primitive::<Int64Type>().clone()))),
            Some(_) => None,
        }
    }
    fn get(&self, i: usize) -> Option<Option<i64>> {
        self.0.as_ref().map(|a| a.is_valid(i).then(|| a.value(i)))
    }
}

/// The `field_summary` records of all entries' `partitions`, flattened.
struct Summaries {
    contains_null: arrow_array::BooleanArray,
    contains_nan: Option<arrow_array::BooleanArray>,
    lower: Option<arrow_array::BinaryArray>,
    upper: Option<arrow_array::BinaryArray>,
}

impl Summaries {
    fn of(s: &StructArray) -> Option<Self> {
        let bools = |n: &str| s.column_by_name(n).map(|c| c.as_boolean_opt().cloned());
        let bytes = |n: &str| s.column_by_name(n).map(|c| c.as_binary_opt::<i32>().cloned());
        Some(Self {
            contains_null: bools("contains_null")??,
            contains_nan: optional(bools("contains_nan"))?,
            lower: optional(bytes("lower_bound"))?,
            upper: optional(bytes("upper_bound"))?,
        })
    }
    fn get(&self, j: usize) -> Option<FieldSummary> {
        let bytes =
            |a: &Option<arrow_array::BinaryArray>| a.as_ref().filter(|a| a.is_valid(j)).map(|a| iceberg::spec::ByteBuf::from(a.value(j).to_vec()));
        Some(FieldSummary {
            contains_null: self.contains_null.is_valid(j).then(|| self.contains_null.value(j))?,
            contains_nan: self.contains_nan.as_ref().filter(|a| a.is_valid(j)).map(|a| a.value(j)),
            lower_bound: bytes(&self.lower),
            upper_bound: bytes(&self.upper),
        })
    }
}

/// An optional column as found (`None`: absent; `Some(None)`: of another type) → `None` when of another type.
fn optional<T>(found: Option<Option<T>>) -> Option<Option<T>> {
    found.map_or(Some(None), |c| c.map(Some))
}

/// Decoded lists the process keeps, by path, up to 16 MiB (weighed by their paths plus a fixed part per entry): a
/// target reads its parent's list at each commit, and a source's newest list may be planned more than once.
fn cache() -> &'static moka::future::Cache<String, Arc<Vec<ManifestFile>>> {
    static CACHE: std::sync::OnceLock<moka::future::Cache<String, Arc<Vec<ManifestFile>>>> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| {
        let weigh = |path: &String, v: &Arc<Vec<ManifestFile>>| {
            let bytes = path.len() + v.iter().map(|m| m.manifest_path.len() + 160).sum::<usize>();
            u32::try_from(bytes).unwrap_or(u32::MAX)
        };
        moka::future::Cache::builder().weigher(weigh).max_capacity(16 << 20).build()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::ManifestListWriter;

    fn entry(n: i64, content: ManifestContentType, partitions: Option<Vec<FieldSummary>>) -> ManifestFile {
        ManifestFile {
            manifest_path: format!("/t/metadata/m{n}.avro"),
            manifest_length: 1000 + n,
            partition_spec_id: (n % 2) as i32,
            content,
            sequence_number: n,
            min_sequence_number: n - 1,
            added_snapshot_id: 100 + n,
            added_files_count: Some(n as u32),
            existing_files_count: Some(2),
            deleted_files_count: Some(0),
            added_rows_count: Some(10 * n as u64),
            existing_rows_count: Some(20),
            deleted_rows_count: Some(0),
            partitions,
            key_metadata: None,
            first_row_id: None,
        }
    }

    fn summaries() -> Vec<FieldSummary> {
        vec![
            FieldSummary {
                contains_null: false,
                contains_nan: Some(false),
                lower_bound: Some(vec![1, 0, 0, 0].into()),
                upper_bound: Some(vec![9, 0, 0, 0].into()),
            },
            FieldSummary { contains_null: true, contains_nan: None, lower_bound: None, upper_bound: None },
        ]
    }

    async fn written(version: FormatVersion, entries: Vec<ManifestFile>) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let io = iceberg::io::FileIO::new_with_fs();
        let path = format!("{}/list.avro", dir.path().display());
        let out = io.new_output(&path).unwrap().writer().await.unwrap();
        let mut w = match version {
            FormatVersion::V1 => ManifestListWriter::v1(out, 7, Some(6)),
            FormatVersion::V2 => ManifestListWriter::v2(out, 7, Some(6), 50),
            FormatVersion::V3 => ManifestListWriter::v3(out, 7, Some(6), 50, Some(1000)),
        };
        w.add_manifests(entries.into_iter()).unwrap();
        w.close().await.unwrap();
        std::fs::read(&path).unwrap()
    }

    #[tokio::test]
    async fn columns_give_what_iceberg_rust_gives_in_every_format_version() {
        for version in [FormatVersion::V1, FormatVersion::V2, FormatVersion::V3] {
            let mut entries: Vec<ManifestFile> = (1..=40)
                .map(|n| {
                    let content = if n % 3 == 0 && version != FormatVersion::V1 { ManifestContentType::Deletes } else { ManifestContentType::Data };
                    entry(n, content, (n % 4 != 0).then(summaries))
                })
                .collect();
            entries[5].key_metadata = Some(vec![1, 2, 3]);
            entries[6].partitions = Some(Vec::new());
            let bytes = written(version, entries).await;
            let ours = by_columns(&bytes).expect("decoded by columns");
            let theirs: Vec<ManifestFile> = ManifestList::parse_with_version(&bytes, version).unwrap().consume_entries().into_iter().collect();
            assert_eq!(ours.len(), 40, "{version:?}");
            assert_eq!(ours, theirs, "{version:?}");
            assert_eq!(parse(&bytes, version).unwrap(), theirs, "{version:?}");
        }
    }

    /// Lists Spark 3.5 + Iceberg 1.10 wrote (deflate; three commits: two appends, a delete) of a table partitioned by
    /// `(cat, days(ts))` with nulls, in each format version (copy-on-write in v1, merge-on-read after).
    #[test]
    fn columns_give_what_iceberg_rust_gives_for_lists_spark_wrote() {
        for (file, version) in [("spark-v1", FormatVersion::V1), ("spark-v2", FormatVersion::V2), ("spark-v3", FormatVersion::V3)] {
            let bytes = std::fs::read(format!("{}/fixtures/manifest-lists/{file}.avro", env!("CARGO_MANIFEST_DIR"))).unwrap();
            let ours = by_columns(&bytes).expect("decoded by columns");
            let theirs: Vec<ManifestFile> = ManifestList::parse_with_version(&bytes, version).unwrap().consume_entries().into_iter().collect();
            assert!(ours.len() >= 2, "{file}");
            assert!(ours.iter().all(|m| m.partitions.as_ref().is_some_and(|p| p.len() == 2)), "{file}");
            assert!(ours.iter().all(|m| m.added_files_count.is_some() && m.deleted_files_count.is_some()), "{file}");
            let mut ours = ours;
            if version == FormatVersion::V1 {
                // Iceberg Java ≥ 1.5 names v1's file counts `added_files_count` …; iceberg-rust's v1 reader schema
                // knows only the older names and reads them as absent (the rest agrees)
                assert!(theirs.iter().all(|m| m.added_files_count.is_none()), "{file}");
                for m in &mut ours {
                    (m.added_files_count, m.existing_files_count, m.deleted_files_count) = (None, None, None);
                }
            }
            assert_eq!(ours, theirs, "{file}");
        }
    }

    #[test]
    fn a_damaged_list_is_refused_not_misread() {
        assert!(by_columns(b"Obj\x01 not a list").is_none());
        assert!(parse(b"Obj\x01 not a list", FormatVersion::V2).is_err());
    }
}

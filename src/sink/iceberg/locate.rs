//! Where the live rows of given keys sit in a target snapshot: the lookup that lets `delete_mode = "position"`
//! delete rows by position (position-delete files, deletion vectors) instead of by equality.
//!
//! 1. The snapshot's live data files, and the delete files that apply to each by the spec's rules
//!    ([`files::plan`], [`files::delete_applies`]).
//! 2. Pruning: a data file is read only when one of the keys lies in its key range — from the tuple of the key
//!    columns' lower bounds to the tuple of their upper bounds (manifest statistics), encoded in the keys' own row
//!    format. That format orders bytes as the values order, so one binary search in the sorted keys decides. A key
//!    inside every column's range lies inside the tuple range (the converse need not hold), and truncated string
//!    bounds stay bounds, so pruning only ever keeps a file too many, never one too few. Bounds that cannot be
//!    compared (missing, floating point, a type this module does not convert, keys with nulls) keep the file.
//! 3. The key columns of the files kept are read — with the columns of equality deletes that apply to them —
//!    concurrently; rows already deleted (position deletes, deletion vectors, equality deletes) are skipped, and each
//!    live row whose key is wanted gives its position.
//!
//! Invariant: the positions are those of exactly the snapshot read. A commit built on them must require that
//! snapshot still to be the table's head: a compaction or another writer may have moved rows between files since.
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, BooleanArray, Int32Array, Int64Array, StringArray};
use arrow_row::{RowConverter, SortField};
use arrow_schema::{DataType, FieldRef, Schema, SchemaRef};
use futures::{StreamExt, TryStreamExt};
use iceberg::spec::{DataContentType, DataFile, Datum, PrimitiveLiteral, SnapshotRef};
use iceberg::table::Table;
use roaring::RoaringTreemap;

use crate::error::{Error, Result};
use crate::source::changelog::{DeleteCache, FileDeletes};
use crate::source::files::{self, FileEntry};
use crate::source::reader;
use crate::spec::projection::field_id;
use crate::spec::rowenc::KeySet;

/// Data files read at once.
const CONCURRENCY: usize = 8;

/// Rows of one data file that hold wanted keys.
pub(crate) struct Found {
    /// The data file.
    pub data: Arc<FileEntry>,
    /// Positions of its live rows whose key is wanted.
    pub positions: RoaringTreemap,
    /// Positions its position deletes and deletion vectors already delete (what a new deletion vector merges).
    pub deleted: RoaringTreemap,
}

/// What a lookup found, and what it cost.
#[derive(Default)]
pub(crate) struct Located {
    /// Files with at least one wanted key, in path order.
    pub files: Vec<Found>,
    /// Data files read.
    pub files_read: u64,
    /// Rows read from them.
    pub rows_read: u64,
}

/// A lookup of keys in one snapshot of a table.
pub(crate) struct Lookup<'a> {
    /// The table, loaded at the snapshot to search.
    pub table: &'a Table,
    /// The key columns with their field ids, in the types the keys were encoded with.
    pub key_fields: Vec<FieldRef>,
    /// Some key has a null column: bounds (which leave nulls out) cannot prune.
    pub nulls: bool,
}

impl Lookup<'_> {
    fn converter(&self) -> Result<RowConverter> {
        Ok(RowConverter::new(self.key_fields.iter().map(|f| SortField::new(f.data_type().clone())).collect())?)
    }

    /// Where the live rows with a key of `keys` (encoded with the row format of `key_fields`) sit in the table's
    /// current snapshot.
    pub(crate) async fn locate(&self, keys: &KeySet) -> Result<Located> {
        let meta = self.table.metadata();
        let Some(snapshot) = meta.current_snapshot() else { return Ok(Located::default()) };
        if keys.is_empty() {
            return Ok(Located::default());
        }
        let plan = files::plan(self.table, snapshot, CONCURRENCY).await?;
        let mut sorted: Vec<&[u8]> = keys.iter().map(|k| k.as_ref()).collect();
        sorted.sort_unstable();
        let conv = self.converter()?;
        let mut candidates: Vec<Arc<FileEntry>> =
            plan.data_after.values().filter(|f| self.nulls || may_hold(&f.file, &self.key_fields, &conv, &sorted)).cloned().collect();
        candidates.sort_by(|a, b| a.path().cmp(b.path()));
        let schema = self.read_schema(snapshot, &plan.deletes_after)?;
        let cache = DeleteCache::default();
        let (cache, schema, plan) = (&cache, &schema, &plan);
        let found: Vec<(Found, u64)> = futures::stream::iter(candidates)
            .map(|f| async move {
                let deletes: Vec<_> = plan.deletes_after.iter().filter(|d| files::delete_applies(d, &f)).cloned().collect();
                self.search(f, &deletes, schema, cache, keys).await
            })
            .buffered(CONCURRENCY)
            .try_collect()
            .await?;
        let mut out = Located { files_read: found.len() as u64, ..Default::default() };
        for (f, rows) in found {
            out.rows_read += rows;
            if !f.positions.is_empty() {
                out.files.push(f);
            }
        }
        Ok(out)
    }

    /// The key columns, then the other columns that equality deletes of the snapshot compare.
    fn read_schema(&self, snapshot: &SnapshotRef, deletes: &[Arc<FileEntry>]) -> Result<SchemaRef> {
        let meta = self.table.metadata();
        let schema = crate::spec::lineage::snapshot_schema(meta, Some(snapshot));
        let table_arrow = iceberg::arrow::schema_to_arrow_schema(&schema)?;
        let mut fields = self.key_fields.clone();
        for d in deletes.iter().filter(|d| d.file.content_type() == DataContentType::EqualityDeletes) {
            for id in d.file.equality_ids().unwrap_or_default() {
                if fields.iter().any(|f| field_id(f) == Some(id)) {
                    continue;
                }
                let f = table_arrow.fields().iter().find(|f| field_id(f) == Some(id)).ok_or_else(|| {
                    Error::Schema(format!("equality-delete file {} compares field id {id}, which the target's schema lacks", d.path()))
                })?;
                fields.push(f.clone());
            }
        }
        Ok(Arc::new(Schema::new(fields)))
    }

    /// The live rows of one data file whose key is wanted; also the rows it read.
    async fn search(
        &self,
        data: Arc<FileEntry>,
        deletes: &[Arc<FileEntry>],
        schema: &SchemaRef,
        cache: &DeleteCache,
        keys: &KeySet,
    ) -> Result<(Found, u64)> {
        let io = self.table.file_io();
        let state = FileDeletes::load(io, cache, &data, deletes, schema, -1).await?;
        let conv = self.converter()?;
        let mut stream = reader::read_data_file(io, data.path(), data.file.file_format(), schema.clone(), None, false).await?;
        let mut positions = RoaringTreemap::new();
        let mut at = 0u64;
        while let Some(batch) = stream.try_next().await? {
            let live = state.live(&batch, at)?;
            let rows = conv.convert_columns(&batch.columns()[..self.key_fields.len()])?;
            for (i, r) in rows.iter().enumerate() {
                if live[i] && keys.contains(r.as_ref()) {
                    positions.insert(at + i as u64);
                }
            }
            at += batch.num_rows() as u64;
        }
        let deleted = state.positions().clone();
        Ok((Found { data, positions, deleted }, at))
    }
}

/// Whether a data file may hold one of `sorted` (encoded keys, ascending), judged by its key columns' bounds.
fn may_hold(file: &DataFile, key_fields: &[FieldRef], conv: &RowConverter, sorted: &[&[u8]]) -> bool {
    let bound = |bounds: &std::collections::HashMap<i32, Datum>| -> Option<Vec<ArrayRef>> {
        key_fields.iter().map(|f| bounds.get(&field_id(f)?).and_then(|d| bound_array(d, f.data_type()))).collect()
    };
    let (Some(lo), Some(hi)) = (bound(file.lower_bounds()), bound(file.upper_bounds())) else { return true };
    let (Ok(lo), Ok(hi)) = (conv.convert_columns(&lo), conv.convert_columns(&hi)) else { return true };
    let (lo, hi) = (lo.row(0), hi.row(0));
    let first = sorted.partition_point(|k| *k < lo.as_ref());
    first < sorted.len() && sorted[first] <= hi.as_ref()
}

/// A bound as a one-value array of the key column's type; `None` when not comparable (floating point: NaN lies
/// outside bounds; decimals, UUIDs and the rest: not converted here).
fn bound_array(d: &Datum, to: &DataType) -> Option<ArrayRef> {
    let plain: ArrayRef = match d.literal() {
        PrimitiveLiteral::Boolean(v) => Arc::new(BooleanArray::from(vec![*v])),
        PrimitiveLiteral::Int(v) => Arc::new(Int32Array::from(vec![*v])),
        PrimitiveLiteral::Long(v) => Arc::new(Int64Array::from(vec![*v])),
        PrimitiveLiteral::String(v) => Arc::new(StringArray::from(vec![v.as_str()])),
        PrimitiveLiteral::Binary(v) => Arc::new(BinaryArray::from(vec![v.as_slice()])),
        _ => return None,
    };
    let lossless = matches!(
        (plain.data_type(), to),
        (DataType::Boolean, DataType::Boolean)
            | (DataType::Int32, DataType::Int32 | DataType::Int64 | DataType::Date32)
            | (DataType::Int64, DataType::Int64 | DataType::Timestamp(_, _) | DataType::Time64(_))
            | (DataType::Utf8, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
            | (DataType::Binary, DataType::Binary | DataType::LargeBinary | DataType::BinaryView)
    );
    if !lossless {
        return None;
    }
    arrow_cast::cast(&plain, to).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::Field;
    use iceberg::spec::{DataFileBuilder, DataFileFormat};
    use std::collections::HashMap;

    fn key_field(id: i32, dt: DataType) -> FieldRef {
        Arc::new(Field::new("k", dt, false).with_metadata(HashMap::from([("PARQUET:field_id".to_string(), id.to_string())])))
    }

    fn file(bounds: &[(i32, Datum, Datum)]) -> DataFile {
        DataFileBuilder::default()
            .content(DataContentType::Data)
            .file_path("f.parquet".into())
            .file_format(DataFileFormat::Parquet)
            .record_count(10)
            .file_size_in_bytes(100)
            .lower_bounds(bounds.iter().map(|(id, lo, _)| (*id, lo.clone())).collect())
            .upper_bounds(bounds.iter().map(|(id, _, hi)| (*id, hi.clone())).collect())
            .build()
            .unwrap()
    }

    fn encoded(conv: &RowConverter, cols: Vec<ArrayRef>) -> Vec<Box<[u8]>> {
        let rows = conv.convert_columns(&cols).unwrap();
        let mut v: Vec<Box<[u8]>> = rows.iter().map(|r| r.as_ref().into()).collect();
        v.sort();
        v
    }

    #[test]
    fn files_whose_key_range_holds_no_wanted_key_are_not_read() {
        let fields = vec![key_field(1, DataType::Int64)];
        let conv = RowConverter::new(vec![SortField::new(DataType::Int64)]).unwrap();
        let keys = encoded(&conv, vec![Arc::new(Int64Array::from(vec![5, 50, -3]))]);
        let sorted: Vec<&[u8]> = keys.iter().map(|k| k.as_ref()).collect();
        let holds = |lo: i64, hi: i64| may_hold(&file(&[(1, Datum::long(lo), Datum::long(hi))]), &fields, &conv, &sorted);
        assert!(holds(0, 10) && holds(50, 60) && holds(-3, -3) && holds(-10, 100));
        assert!(!holds(6, 49) && !holds(51, 1000) && !holds(-100, -4));
        // an int bound of a file written before the key column was promoted to long still prunes
        let old = file(&[(1, Datum::int(6), Datum::int(49))]);
        assert!(!may_hold(&old, &fields, &conv, &sorted));
        // no bounds, or bounds of another column: the file is read
        assert!(may_hold(&file(&[]), &fields, &conv, &sorted));
        assert!(may_hold(&file(&[(2, Datum::long(6), Datum::long(49))]), &fields, &conv, &sorted));
    }

    #[test]
    fn composite_keys_prune_by_the_tuple_of_bounds_and_strings_by_truncated_bounds() {
        let fields = vec![key_field(1, DataType::Utf8), key_field(2, DataType::Int32)];
        let conv = RowConverter::new(vec![SortField::new(DataType::Utf8), SortField::new(DataType::Int32)]).unwrap();
        let keys = encoded(&conv, vec![Arc::new(StringArray::from(vec!["apple", "pear"])), Arc::new(Int32Array::from(vec![7, 1]))]);
        let sorted: Vec<&[u8]> = keys.iter().map(|k| k.as_ref()).collect();
        let holds = |lo: &str, hi: &str, nlo: i32, nhi: i32| {
            may_hold(&file(&[(1, Datum::string(lo), Datum::string(hi)), (2, Datum::int(nlo), Datum::int(nhi))]), &fields, &conv, &sorted)
        };
        assert!(holds("a", "b", 0, 10), "apple/7 inside");
        assert!(holds("ap", "aq", 0, 10), "a truncated lower bound (a prefix) and a rounded-up upper bound still hold apple");
        assert!(!holds("b", "o", 0, 10), "between apple and pear");
        assert!(!holds("q", "z", 0, 10), "after pear");
        // tuple bounds keep too many (apple/7 is outside n ∈ [8, 9] but inside the tuple range), never too few
        assert!(holds("a", "b", 8, 9));
        // floating point bounds are never trusted
        let f = vec![key_field(3, DataType::Float64)];
        let fc = RowConverter::new(vec![SortField::new(DataType::Float64)]).unwrap();
        let fk = encoded(&fc, vec![Arc::new(arrow_array::Float64Array::from(vec![1.0]))]);
        let fs: Vec<&[u8]> = fk.iter().map(|k| k.as_ref()).collect();
        assert!(may_hold(&file(&[(3, Datum::double(5.0), Datum::double(6.0))]), &f, &fc, &fs));
    }
}

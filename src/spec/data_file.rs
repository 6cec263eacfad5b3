//! A manifest entry's data file, copied and weighed: what iceberg-rust 0.10.1 keeps private or does not say.
//!
//! - [`copy`] rebuilds a [`DataFile`] with another `first_row_id` (see [`super::row_lineage`]) and, where only
//!   planning and reading will see it, without the statistics they never look at ([`Stats::BoundsOf`]): column
//!   sizes, value and NaN counts and split offsets go, and the bounds and null counts of the columns not named stay
//!   out. A wide table's file entry is mostly those maps; a planner that keeps a table's live files keeps the
//!   copy.
//! - [`heap_bytes`] estimates what an entry takes in memory — its struct, strings and hash maps as hashbrown sizes
//!   them — so that the caches that hold entries count them as the allocator does (a unit test checks the estimate
//!   against a counting allocator).
//!
//! Invariant: a copy holds everything a reader of the file needs (path, format, content, counts, sizes, partition,
//! key metadata, equality ids, sort order, row lineage, deletion-vector offsets); only statistics are dropped.
use std::collections::{BTreeSet, HashMap};

use iceberg::spec::{DataFile, DataFileBuilder, Datum, PrimitiveLiteral};

use crate::error::{Error, Result};

/// Which column statistics a [`copy`] keeps.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stats<'a> {
    /// Every map as it is.
    All,
    /// The lower and upper bounds and null counts of these field ids; nothing else.
    BoundsOf(&'a BTreeSet<i32>),
}

/// `f` with `first_row_id`, partition spec `spec_id` (which iceberg-rust keeps beside the file) and the statistics
/// `stats` says.
pub(crate) fn copy(f: &DataFile, spec_id: i32, first_row_id: Option<i64>, stats: Stats<'_>) -> Result<DataFile> {
    let mut b = DataFileBuilder::default();
    b.content(f.content_type())
        .file_path(f.file_path().to_string())
        .file_format(f.file_format())
        .partition(f.partition().clone())
        .record_count(f.record_count())
        .file_size_in_bytes(f.file_size_in_bytes())
        .key_metadata(f.key_metadata().map(<[u8]>::to_vec))
        .equality_ids(f.equality_ids())
        .first_row_id(first_row_id)
        .partition_spec_id(spec_id)
        .referenced_data_file(f.referenced_data_file())
        .content_offset(f.content_offset())
        .content_size_in_bytes(f.content_size_in_bytes());
    match stats {
        Stats::All => {
            b.column_sizes(f.column_sizes().clone())
                .value_counts(f.value_counts().clone())
                .null_value_counts(f.null_value_counts().clone())
                .nan_value_counts(f.nan_value_counts().clone())
                .lower_bounds(f.lower_bounds().clone())
                .upper_bounds(f.upper_bounds().clone())
                .split_offsets(f.split_offsets().map(<[i64]>::to_vec));
        }
        Stats::BoundsOf(fields) => {
            fn of<V: Clone>(m: &HashMap<i32, V>, fields: &BTreeSet<i32>) -> HashMap<i32, V> {
                fields.iter().filter_map(|id| Some((*id, m.get(id)?.clone()))).collect()
            }
            b.null_value_counts(of(f.null_value_counts(), fields))
                .lower_bounds(of(f.lower_bounds(), fields))
                .upper_bounds(of(f.upper_bounds(), fields));
        }
    }
    if let Some(order) = f.sort_order_id() {
        b.sort_order_id(order);
    }
    b.build().map_err(|e| Error::failed(format!("copying the entry of {}", f.file_path()), e))
}

/// What `f` takes in memory: the struct itself, its strings and vectors, and each map's table as hashbrown sizes
/// it for its length (a decoded map is sized for what it holds).
pub(crate) fn heap_bytes(f: &DataFile) -> u64 {
    fn table<K, V>(m: &HashMap<K, V>) -> usize {
        let n = m.len();
        if n == 0 {
            return 0;
        }
        let buckets = if n < 4 {
            4
        } else if n < 8 {
            8
        } else {
            (n * 8 / 7).next_power_of_two()
        };
        (buckets * std::mem::size_of::<(K, V)>()).next_multiple_of(16) + buckets + 16
    }
    fn datum(d: &Datum) -> usize {
        match d.literal() {
            PrimitiveLiteral::String(s) => s.capacity(),
            PrimitiveLiteral::Binary(b) => b.capacity(),
            _ => 0,
        }
    }
    let strings = f.file_path().len()
        + f.referenced_data_file().map_or(0, |p| p.len())
        + f.key_metadata().map_or(0, <[u8]>::len)
        + f.split_offsets().map_or(0, |s| s.len() * 8)
        + f.equality_ids().map_or(0, |e| e.len() * 4)
        + std::mem::size_of_val(f.partition().fields());
    let maps = table(f.column_sizes())
        + table(f.value_counts())
        + table(f.null_value_counts())
        + table(f.nan_value_counts())
        + table(f.lower_bounds())
        + table(f.upper_bounds())
        + f.lower_bounds().values().chain(f.upper_bounds().values()).map(datum).sum::<usize>();
    (std::mem::size_of::<DataFile>() + strings + maps) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::{DataContentType, DataFileFormat, Literal, Struct};

    /// A data file of `columns` columns with every statistic, as a writer leaves it (string bounds on column 2).
    fn file(i: usize, columns: i32) -> DataFile {
        let ids = 1..=columns;
        let bound = |c: i32, v: i64| if c == 2 { Datum::string(format!("customer-{v:06}")) } else { Datum::long(v) };
        let mut b = DataFileBuilder::default();
        b.content(DataContentType::Data)
            .file_path(format!("s3://bucket/warehouse/db/orders/data/day=2026-12-07/00000-{i}-5f1c3a2e-8d7b-4c1a-9e2f-0a1b2c3d4e5f.parquet"))
            .file_format(DataFileFormat::Parquet)
            .partition(Struct::from_iter([Some(Literal::date(20_000))]))
            .record_count(50)
            .file_size_in_bytes(2000)
            .column_sizes(ids.clone().map(|c| (c, 10)).collect())
            .value_counts(ids.clone().map(|c| (c, 50)).collect())
            .null_value_counts(ids.clone().map(|c| (c, 0)).collect())
            .nan_value_counts(HashMap::from([(3, 0)]))
            .lower_bounds(ids.clone().map(|c| (c, bound(c, i as i64))).collect())
            .upper_bounds(ids.clone().map(|c| (c, bound(c, i as i64 + 100))).collect())
            .split_offsets(Some(vec![4]))
            .partition_spec_id(1);
        b.build().unwrap()
    }

    #[test]
    fn a_copy_keeps_what_readers_need_and_only_the_named_statistics() {
        let f = file(7, 20);
        assert_eq!(copy(&f, 1, f.first_row_id(), Stats::All).unwrap(), f);
        let fields = BTreeSet::from([1, 2, 99]);
        let slim = copy(&f, 1, Some(5), Stats::BoundsOf(&fields)).unwrap();
        assert_eq!((slim.file_path(), slim.record_count(), slim.file_size_in_bytes()), (f.file_path(), 50, 2000));
        assert_eq!((slim.partition(), slim.first_row_id(), slim.file_format()), (f.partition(), Some(5), DataFileFormat::Parquet));
        assert_eq!(slim.lower_bounds(), &HashMap::from([(1, f.lower_bounds()[&1].clone()), (2, f.lower_bounds()[&2].clone())]));
        assert_eq!(slim.upper_bounds().len(), 2);
        assert_eq!(slim.null_value_counts(), &HashMap::from([(1, 0), (2, 0)]));
        assert!(slim.column_sizes().is_empty() && slim.value_counts().is_empty() && slim.nan_value_counts().is_empty());
        assert_eq!(slim.split_offsets(), None);
        // a wide file's entry is mostly its statistics
        assert!(heap_bytes(&slim) * 4 < heap_bytes(&f), "{} against {}", heap_bytes(&slim), heap_bytes(&f));
    }

    #[test]
    fn the_estimate_is_what_the_allocator_sees() {
        for columns in [1, 4, 20, 100] {
            let fields = BTreeSet::from([1]);
            for slim in [false, true] {
                let n = 200;
                let before = crate::test_alloc::net_bytes();
                let files: Vec<DataFile> = (0..n)
                    .map(|i| {
                        let f = file(i, columns);
                        if slim {
                            copy(&f, 1, None, Stats::BoundsOf(&fields)).unwrap()
                        } else {
                            f
                        }
                    })
                    .collect();
                let seen = (crate::test_alloc::net_bytes() - before) as f64 - (n * std::mem::size_of::<DataFile>()) as f64;
                let estimated: u64 = files.iter().map(heap_bytes).sum();
                // the struct itself sits in the vector here, not behind its own allocation
                let ratio = estimated as f64 / (seen + (n * std::mem::size_of::<DataFile>()) as f64);
                assert!(
                    (0.9..=1.1).contains(&ratio),
                    "{columns} columns (slim: {slim}): estimated {estimated} B, the allocator saw {seen} B + structs"
                );
            }
        }
    }
}

//! The rows of a data file that its equality deletes remove, kept between polls with the identity of the delete set
//! they were found for: the state *after* one poll is the state *before* the next, so the next poll tries only the
//! deletes added since.
//!
//! In an upsert stream every commit's equality delete reaches every older file of its partition. Finding a file's
//! rows live before such a commit tried each row against every delete file that applied to it — one per later
//! commit — so a commit cost rows × deletes, growing with the square of the history (31 % of the upsert load's CPU
//! after 120 commits). With the rows the state before removes kept here, a commit tries the rows still live against
//! the deletes it added, and nothing else.
//!
//! Keyed by the data file (path, size, row count). An entry names the set it was found for ([`set_of`]): the sum of
//! the delete files' identities ([`EqDeletes::id`]) and a hash of the schema the file is read with (another name
//! mapping, another promotion, compares other values). One entry per file, the last set found: a state whose set
//! differs (a rewritten history, a second pipeline at another point of the same source) finds nothing and tries
//! every delete, as without the memo. Process-wide, least recently used out first, within a sixty-fourth of
//! `engine.memory_budget` ([`size`]).
//!
//! Invariant: an entry holds exactly the positions of the file whose rows one delete of its set removes, whether or
//! not a position delete removes them too (so it holds for any position deletes beside the set), and is stored only
//! from a pass over every row of the file.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arrow_schema::SchemaRef;
use roaring::RoaringTreemap;

use super::{At, StateDeletes};
use crate::source::files::FileEntry;
use crate::source::reader::hash128;

/// A data file: its path, size and row count.
type Key = (String, u64, u64);

/// Bytes the process keeps ([`size`]); 4 MiB until sized.
static BYTES: AtomicU64 = AtomicU64::new(4 << 20);
static CACHE: OnceLock<moka::future::Cache<Key, Arc<Entry>>> = OnceLock::new();

/// The positions one delete set removes.
struct Entry {
    set: u128,
    removed: Arc<RoaringTreemap>,
}

/// Sizes the memo to a sixty-fourth of `memory_budget`; effective only before the first entry is stored.
pub(super) fn size(memory_budget: u64) {
    BYTES.store((memory_budget / 64).max(1 << 20), Ordering::Relaxed);
}

fn cache() -> &'static moka::future::Cache<Key, Arc<Entry>> {
    CACHE.get_or_init(|| {
        moka::future::Cache::builder()
            .weigher(|k: &Key, v: &Arc<Entry>| u32::try_from(k.0.len() + 64 + v.removed.serialized_size()).unwrap_or(u32::MAX))
            .max_capacity(BYTES.load(Ordering::Relaxed))
            .build()
    })
}

fn key(f: &FileEntry) -> Key {
    (f.path().to_string(), f.file.file_size_in_bytes(), f.file.record_count())
}

/// The identity of the schema files are read with, for [`set_of`]: computed once per scan, not per file.
pub(super) fn read_as(schema: &SchemaRef) -> u128 {
    hash128(schema.as_ref())
}

/// The identity of the equality deletes of `st` applied to a file read with the schema `read_as` names: the same
/// set (in any order) gives the same value.
pub(super) fn set_of(read_as: u128, st: &StateDeletes) -> u128 {
    st.eq.iter().flat_map(|g| &g.sets).fold(read_as, |sum, e| sum.wrapping_add(e.id))
}

/// The positions of `f` that the delete set `set` removes, when kept.
pub(super) async fn get(f: &FileEntry, set: u128) -> Option<Arc<RoaringTreemap>> {
    cache().get(&key(f)).await.filter(|e| e.set == set).map(|e| e.removed.clone())
}

/// Gathers, batch by batch over a whole file, the positions a delete set removes; stores them when told the pass
/// covered every row.
pub(super) struct Found {
    set: u128,
    removed: RoaringTreemap,
}

impl Found {
    /// Gathers for the delete set `set` ([`set_of`]).
    pub(super) fn new(set: u128) -> Self {
        Found { set, removed: RoaringTreemap::new() }
    }

    /// Adds the rows of a batch (at `at` in the file) the set removes.
    pub(super) fn push(&mut self, removed: &[bool], at: At<'_>) {
        self.removed.extend(removed.iter().enumerate().filter(|(_, r)| **r).map(|(i, _)| at.position(i)));
    }

    /// Keeps what was gathered for `f`: call only once every row of `f` was pushed.
    pub(super) async fn store(self, f: &FileEntry) {
        cache().insert(key(f), Arc::new(Entry { set: self.set, removed: Arc::new(self.removed) })).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::reader::EqDeletes;
    use arrow_schema::{DataType, Field, Schema};

    fn entry(path: &str, rows: u64) -> FileEntry {
        let file = iceberg::spec::DataFileBuilder::default()
            .content(iceberg::spec::DataContentType::Data)
            .file_path(path.to_string())
            .file_format(iceberg::spec::DataFileFormat::Parquet)
            .record_count(rows)
            .file_size_in_bytes(100)
            .build()
            .unwrap();
        FileEntry { file, seq: 1, spec_id: 0, unpartitioned: true, first_row_id: None }
    }

    fn deletes(path: &str) -> Arc<EqDeletes> {
        Arc::new(EqDeletes { field_ids: vec![1], keys: Default::default(), id: EqDeletes::identity(path, 10, 1) })
    }

    /// A set is named by its members whatever their order, and by the schema read; an entry answers its own set only.
    #[tokio::test]
    async fn kept_for_the_set_it_was_found_for() {
        let id = |ty| {
            let md = [(parquet::arrow::PARQUET_FIELD_ID_META_KEY.to_string(), "1".to_string())];
            Arc::new(Schema::new(vec![Field::new("id", ty, false).with_metadata(md.into())]))
        };
        let schema: SchemaRef = id(DataType::Int64);
        let (a, b) = (deletes("mem://dead/d1"), deletes("mem://dead/d2"));
        let state = |sets: &[&Arc<EqDeletes>]| {
            let mut st = StateDeletes { exists: true, ..Default::default() };
            for e in sets {
                st.add_eq((*e).clone(), &schema).unwrap();
            }
            st
        };
        let longs = read_as(&schema);
        let (ab, ba, just_a) = (set_of(longs, &state(&[&a, &b])), set_of(longs, &state(&[&b, &a])), set_of(longs, &state(&[&a])));
        assert_eq!(ab, ba);
        assert_ne!(ab, just_a);
        let ints: SchemaRef = id(DataType::Int32);
        assert_ne!(set_of(read_as(&ints), &StateDeletes::default()), set_of(longs, &StateDeletes::default()));

        let f = entry("mem://dead/f.parquet", 6);
        let mut found = Found::new(ab);
        found.push(&[false, true, false], At::From(0));
        found.push(&[true], At::Positions(&[5]));
        found.store(&f).await;
        assert_eq!(get(&f, ab).await.expect("kept").iter().collect::<Vec<_>>(), [1, 5]);
        assert!(get(&f, just_a).await.is_none(), "another set");
        assert!(get(&entry("mem://dead/f.parquet", 7), ab).await.is_none(), "another file under the same name");
        // the last set found replaces the entry
        Found::new(just_a).store(&f).await;
        assert!(get(&f, ab).await.is_none());
        assert!(get(&f, just_a).await.expect("kept").is_empty());
    }
}

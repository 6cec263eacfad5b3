//! Manifest lists, decoded lean.
//!
//! A table that is not maintained gets one more manifest per commit, and every new snapshot's manifest list names
//! all of them: following one small commit reads a list that grows with the history. iceberg-rust decodes it
//! through Avro's generic `Value` tree and serde (a map of boxed values per entry), which made the list the
//! largest cost of a commit at the end of a long history. This module reads the Avro container itself
//! ([`super::avro`]) and decodes each record by the writer's schema straight into iceberg-rust's `ManifestFile`,
//! borrowing bytes until a value is kept: the same entries for a fraction of the CPU.
//!
//! Fields are found by name, as the writer's schema names them: `added_files_count` and its pre-1.5 name
//! `added_data_files_count` (and the other counts alike) both count; a v1 list has no `content` or sequence numbers
//! (data, 0). Every length and count read from the file is checked against the bytes left before anything is
//! allocated or looped over. Anything this reader does not expect — a schema shape it does not know, a required
//! field missing or null, a damaged block — makes [`parse`] fall back to iceberg-rust's decoder, which then decides
//! (its error names what is wrong): this module changes how fast a list is read, never what it says.
//!
//! [`read`] keeps decoded lists in a small process-wide cache keyed by path: a list never changes once written, and
//! a target reads its parent's list at each commit.
use std::sync::Arc;

use iceberg::io::FileIO;
use iceberg::spec::{FieldSummary, FormatVersion, ManifestContentType, ManifestFile, ManifestList, SnapshotRef};

use super::avro::{Container, Cursor, Shape, Val};
use crate::error::{Error, Result};

/// The manifests `snapshot`'s list names, decoded once per process (see the module docs).
pub(crate) async fn read(file_io: &FileIO, snapshot: &SnapshotRef, version: FormatVersion) -> Result<Arc<Vec<ManifestFile>>> {
    let path = snapshot.manifest_list().to_string();
    let load = async { load(file_io, snapshot, version, None).await.map(Arc::new) };
    // the error as it was made when this call loaded the list (shared only with calls that waited on the same load)
    cache().try_get_with(path.clone(), load).await.map_err(|e: Arc<Error>| Arc::try_unwrap(e).unwrap_or_else(|e| Error::data(&path, e.to_string())))
}

/// The manifests `snapshot` wrote (`added_snapshot_id`), from its list. The other entries are skipped by the
/// writer's schema, not decoded: a plan that knows the older files already (see `source::files::LiveFiles`) reads a
/// list that grows with the history for the cost of its own entries. Not cached.
pub(crate) async fn read_own(file_io: &FileIO, snapshot: &SnapshotRef, version: FormatVersion) -> Result<Vec<ManifestFile>> {
    load(file_io, snapshot, version, Some(snapshot.snapshot_id())).await
}

/// `snapshot`'s list, read and decoded ([`parse`]); errors name the list and the snapshot.
async fn load(file_io: &FileIO, snapshot: &SnapshotRef, version: FormatVersion, only: Option<i64>) -> Result<Vec<ManifestFile>> {
    let path = snapshot.manifest_list();
    let err = |e: iceberg::Error| Error::data(path, format!("the manifest list of snapshot {}: {e}", snapshot.snapshot_id())).with_cause(e);
    let bytes = file_io.new_input(path).map_err(err)?.read().await.map_err(err)?;
    parse(&bytes, version, only).map_err(err)
}

/// Decodes a manifest list of a table of format `version` (keeping only the entries snapshot `only` added, when
/// given): lean, or by iceberg-rust where the lean reader does not know what it reads.
pub(crate) fn parse(bytes: &[u8], version: FormatVersion, only: Option<i64>) -> std::result::Result<Vec<ManifestFile>, iceberg::Error> {
    // before any Avro read in the process (the bound is fixed by the first one)
    super::bound_avro_allocations();
    if let Some(entries) = lean(bytes, only) {
        return Ok(entries);
    }
    // apache-avro 0.21 panics on some damaged schemas (an `unwrap` on a record name that does not validate)
    match std::panic::catch_unwind(|| ManifestList::parse_with_version(bytes, version)) {
        Ok(list) => Ok(list?.consume_entries().into_iter().filter(|m| only.is_none_or(|id| m.added_snapshot_id == id)).collect()),
        Err(_) => Err(iceberg::Error::new(iceberg::ErrorKind::DataInvalid, "not a readable manifest list: its Avro schema is damaged")),
    }
}

/// The entries of the list in `bytes` (only those snapshot `only` added, when given), or `None` for anything
/// unexpected (see the module docs). With `only`, each record is first skipped through, reading its
/// `added_snapshot_id` alone, and decoded only when it matches.
fn lean(bytes: &[u8], only: Option<i64>) -> Option<Vec<ManifestFile>> {
    let container = Container::open(bytes)?;
    let shape = Shape::of(&container.schema()?)?;
    let Shape::Record(fields) = &shape else { return None };
    let slots: Vec<Slot> = fields.iter().map(|(name, _)| Slot::of(name)).collect();
    let summary_fields = fields.iter().find(|(n, _)| n == "partitions").map(|(_, s)| s.record_fields()).unwrap_or_default();
    let mut out = Vec::new();
    container.each(|c| {
        let Some(id) = only else {
            out.push(entry(c, fields, &slots, &summary_fields)?);
            return Some(());
        };
        let start = c.b;
        let mut added = None;
        for ((_, shape), slot) in fields.iter().zip(&slots) {
            if *slot == Slot::AddedSnapshot {
                let Val::Long(n) = c.value(shape)? else { return None };
                added = Some(n);
            } else {
                c.skip(shape)?;
            }
        }
        if added? == id {
            out.push(entry(&mut Cursor { b: start }, fields, &slots, &summary_fields)?);
        }
        Some(())
    })?;
    Some(out)
}

/// Which `ManifestFile` field a top-level field of the list's record fills.
#[derive(Clone, Copy, PartialEq)]
enum Slot {
    Path,
    Length,
    SpecId,
    Content,
    Seq,
    MinSeq,
    AddedSnapshot,
    AddedFiles,
    ExistingFiles,
    DeletedFiles,
    AddedRows,
    ExistingRows,
    DeletedRows,
    Partitions,
    KeyMetadata,
    FirstRowId,
    Other,
}

impl Slot {
    fn of(name: &str) -> Self {
        match name {
            "manifest_path" => Self::Path,
            "manifest_length" => Self::Length,
            "partition_spec_id" => Self::SpecId,
            "content" => Self::Content,
            "sequence_number" => Self::Seq,
            "min_sequence_number" => Self::MinSeq,
            "added_snapshot_id" => Self::AddedSnapshot,
            "added_files_count" | "added_data_files_count" => Self::AddedFiles,
            "existing_files_count" | "existing_data_files_count" => Self::ExistingFiles,
            "deleted_files_count" | "deleted_data_files_count" => Self::DeletedFiles,
            "added_rows_count" => Self::AddedRows,
            "existing_rows_count" => Self::ExistingRows,
            "deleted_rows_count" => Self::DeletedRows,
            "partitions" => Self::Partitions,
            "key_metadata" => Self::KeyMetadata,
            "first_row_id" => Self::FirstRowId,
            _ => Self::Other,
        }
    }
}

/// One list entry: the record's fields decoded by `fields` and placed by `slots`.
fn entry(c: &mut Cursor<'_>, fields: &[(String, Shape)], slots: &[Slot], summary_fields: &[&str]) -> Option<ManifestFile> {
    let mut m = blank(String::new());
    let mut required = 0u8;
    for ((_, shape), slot) in fields.iter().zip(slots) {
        let v = c.value(shape)?;
        // a count or row number: absent when null, refused when negative
        let count = |v: &Val| match v {
            Val::Null => Some(None),
            Val::Long(n) => u32::try_from(*n).ok().map(Some),
            _ => None,
        };
        let rows = |v: &Val| match v {
            Val::Null => Some(None),
            Val::Long(n) => u64::try_from(*n).ok().map(Some),
            _ => None,
        };
        let long = |v: &Val| match v {
            Val::Long(n) => Some(*n),
            _ => None,
        };
        match slot {
            Slot::Path => {
                let Val::Bytes(b) = v else { return None };
                m.manifest_path = std::str::from_utf8(b).ok()?.to_string();
                required |= 1;
            }
            Slot::Length => (m.manifest_length, required) = (long(&v)?, required | 2),
            Slot::SpecId => (m.partition_spec_id, required) = (i32::try_from(long(&v)?).ok()?, required | 4),
            Slot::AddedSnapshot => (m.added_snapshot_id, required) = (long(&v)?, required | 8),
            Slot::Content => {
                m.content = match long(&v)? {
                    0 => ManifestContentType::Data,
                    1 => ManifestContentType::Deletes,
                    _ => return None,
                }
            }
            Slot::Seq => m.sequence_number = long(&v)?,
            Slot::MinSeq => m.min_sequence_number = long(&v)?,
            Slot::AddedFiles => m.added_files_count = count(&v)?,
            Slot::ExistingFiles => m.existing_files_count = count(&v)?,
            Slot::DeletedFiles => m.deleted_files_count = count(&v)?,
            Slot::AddedRows => m.added_rows_count = rows(&v)?,
            Slot::ExistingRows => m.existing_rows_count = rows(&v)?,
            Slot::DeletedRows => m.deleted_rows_count = rows(&v)?,
            Slot::FirstRowId => m.first_row_id = rows(&v)?,
            Slot::KeyMetadata => {
                m.key_metadata = match v {
                    Val::Null => None,
                    Val::Bytes(b) => Some(b.to_vec()),
                    _ => return None,
                }
            }
            Slot::Partitions => {
                m.partitions = match v {
                    Val::Null => None,
                    Val::Array(items) => Some(items.iter().map(|i| summary(i, summary_fields)).collect::<Option<_>>()?),
                    _ => return None,
                }
            }
            Slot::Other => {}
        }
    }
    (required == 15).then_some(m)
}

/// A list entry naming manifest `path`, every other field unset (-1 for the required numbers, a data manifest at
/// sequence number 0).
pub(crate) fn blank(path: String) -> ManifestFile {
    ManifestFile {
        manifest_path: path,
        manifest_length: -1,
        partition_spec_id: -1,
        content: ManifestContentType::Data,
        sequence_number: 0,
        min_sequence_number: 0,
        added_snapshot_id: -1,
        added_files_count: None,
        existing_files_count: None,
        deleted_files_count: None,
        added_rows_count: None,
        existing_rows_count: None,
        deleted_rows_count: None,
        partitions: None,
        key_metadata: None,
        first_row_id: None,
    }
}

/// A `field_summary` record whose fields are named `names`: `contains_null` required, `contains_nan`,
/// `lower_bound` and `upper_bound` when written.
fn summary(v: &Val<'_>, names: &[&str]) -> Option<FieldSummary> {
    let Val::Record(values) = v else { return None };
    let field = |name: &str| names.iter().position(|n| *n == name).and_then(|i| values.get(i));
    let bound = |name: &str| match field(name) {
        None | Some(Val::Null) => Some(None),
        Some(Val::Bytes(b)) => Some(Some(iceberg::spec::ByteBuf::from(b.to_vec()))),
        _ => None,
    };
    Some(FieldSummary {
        contains_null: match field("contains_null")? {
            Val::Bool(b) => *b,
            _ => return None,
        },
        contains_nan: match field("contains_nan") {
            None | Some(Val::Null) => None,
            Some(Val::Bool(b)) => Some(*b),
            _ => return None,
        },
        lower_bound: bound("lower_bound")?,
        upper_bound: bound("upper_bound")?,
    })
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
    async fn the_lean_decoder_reads_what_iceberg_rust_reads_in_every_format_version() {
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
            let ours = lean(&bytes, None).expect("decoded by the lean reader");
            let theirs: Vec<ManifestFile> = ManifestList::parse_with_version(&bytes, version).unwrap().consume_entries().into_iter().collect();
            assert_eq!(ours.len(), 40, "{version:?}");
            assert_eq!(ours, theirs, "{version:?}");
            assert_eq!(parse(&bytes, version, None).unwrap(), theirs, "{version:?}");
            only_own_entries_read_as_all_are(&bytes);
            damaged_never_abort(&bytes, version);
        }
    }

    /// iceberg-rust writes lists uncompressed, so a damaged byte reaches the record decoder as it is: counts and
    /// lengths out of range end in an error or another reading, never in a panic, an allocation abort or a loop
    /// (arrow-avro 58 loops forever on a block holding more bytes than its count of records; hence this decoder).
    fn damaged_never_abort(bytes: &[u8], version: FormatVersion) {
        for b in crate::spec::avro::damaged(bytes, 3000) {
            let _ = parse(&b, version, None);
            let _ = lean(&b, Some(105));
        }
    }

    /// For every snapshot a list names (and one it does not), the entries `lean(_, Some(id))` reads are those of the whole
    /// list it added.
    fn only_own_entries_read_as_all_are(bytes: &[u8]) {
        let all = lean(bytes, None).unwrap();
        let mut ids: Vec<i64> = all.iter().map(|m| m.added_snapshot_id).collect();
        ids.push(-42);
        for id in ids {
            let own: Vec<ManifestFile> = all.iter().filter(|m| m.added_snapshot_id == id).cloned().collect();
            assert_eq!(lean(bytes, Some(id)).expect("skimmed by the lean reader"), own, "{id}");
        }
    }

    /// Lists Spark 3.5 + Iceberg 1.10 wrote (deflate; three commits: two appends, a delete) of a table partitioned by
    /// `(cat, days(ts))` with nulls, in each format version (copy-on-write in v1, merge-on-read after).
    #[test]
    fn the_lean_decoder_reads_what_iceberg_rust_reads_of_lists_spark_wrote() {
        for (file, version) in [("spark-v1", FormatVersion::V1), ("spark-v2", FormatVersion::V2), ("spark-v3", FormatVersion::V3)] {
            let bytes = std::fs::read(format!("{}/fixtures/manifest-lists/{file}.avro", env!("CARGO_MANIFEST_DIR"))).unwrap();
            let ours = lean(&bytes, None).expect("decoded by the lean reader");
            let theirs: Vec<ManifestFile> = ManifestList::parse_with_version(&bytes, version).unwrap().consume_entries().into_iter().collect();
            assert!(ours.len() >= 2, "{file}");
            only_own_entries_read_as_all_are(&bytes);
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
        assert!(lean(b"Obj\x01 not a list", None).is_none());
        assert!(parse(b"Obj\x01 not a list", FormatVersion::V2, None).is_err());
    }
}

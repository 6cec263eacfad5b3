//! Manifests, decoded lean.
//!
//! iceberg-rust reads a manifest through apache-avro: it parses the writer's Avro schema (validating every name with a
//! regex), the table schema and partition spec from the header's JSON, builds a reader schema from them, resolves the
//! two, decodes every entry into a generic `Value` tree and then through serde. For the one or two small manifests a
//! commit writes, that fixed part is nearly all the cost — it was a fifth of following a small commit.
//!
//! This module reads the container itself ([`super::avro`]) and decodes each entry by the writer's schema straight
//! into iceberg-rust's `ManifestEntry`. What the header says (schemas, spec, the plan of which field goes where) is
//! worked out once per distinct header and kept ([`header`]): the manifests of one table share its metadata (in
//! whatever order their writer's hash map put it).
//!
//! The decoding follows iceberg-rust's reader, field by field: fields are matched by name, fields the reader does not
//! know are skipped, negative counts are dropped, bounds of fields the schema no longer has are dropped, a v1 entry
//! has sequence numbers 0. Anything this reader does not expect — a schema shape it does not know, a partition type
//! it does not convert (decimal, uuid, fixed, binary, nanosecond timestamps), a value out of range, a damaged block — makes
//! [`parse`] fall back to iceberg-rust's decoder, which then decides (its error names what is wrong): this module
//! changes how fast a manifest is read, never what it says. Debug builds (every test) read each manifest both ways
//! and assert that they agree.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use iceberg::io::FileIO;
use iceberg::spec::{
    DataContentType, DataFile, DataFileBuilder, DataFileFormat, Datum, FormatVersion, Literal, Manifest, ManifestEntry, ManifestFile,
    ManifestMetadata, ManifestStatus, PrimitiveType, Schema, Struct, StructType, Type,
};

use super::avro::{Container, Cursor, Shape, Val};

/// The manifest `mf` names, read and decoded (see the module docs).
pub(crate) async fn load(file_io: &FileIO, mf: &ManifestFile) -> iceberg::Result<Manifest> {
    if mf.key_metadata.is_some() {
        // an encrypted manifest: iceberg-rust decrypts it
        return mf.load_manifest(file_io).await;
    }
    let bytes = file_io.new_input(&mf.manifest_path)?.read().await?;
    parse(&bytes, mf)
}

/// Decodes the manifest `mf` names from its `bytes`: lean, or by iceberg-rust where the lean reader does not know what
/// it reads. Its entries inherit from `mf` what they leave null (snapshot id, sequence numbers), as the spec says.
pub(crate) fn parse(bytes: &[u8], mf: &ManifestFile) -> iceberg::Result<Manifest> {
    // before any Avro read in the process (the bound is fixed by the first one)
    super::bound_avro_allocations();
    let (metadata, mut entries) = match lean(bytes) {
        Some(ours) => {
            #[cfg(debug_assertions)]
            agrees_with_iceberg(bytes, &ours);
            ours
        }
        None => by_iceberg(bytes)?,
    };
    for e in &mut entries {
        inherit(e, mf);
    }
    Ok(Manifest::new(metadata, entries))
}

/// A manifest's metadata and entries (before inheritance).
type Parts = (ManifestMetadata, Vec<ManifestEntry>);

/// The manifest in `bytes` as iceberg-rust decodes it.
fn by_iceberg(bytes: &[u8]) -> iceberg::Result<Parts> {
    // apache-avro 0.21 panics on some damaged schemas (an `unwrap` on a record name that does not validate)
    match std::panic::catch_unwind(|| Manifest::parse_avro(bytes)) {
        Ok(manifest) => {
            let (entries, metadata) = manifest?.into_parts();
            Ok((metadata, entries.into_iter().map(Arc::unwrap_or_clone).collect()))
        }
        Err(_) => Err(iceberg::Error::new(iceberg::ErrorKind::DataInvalid, "not a readable manifest: its Avro schema is damaged")),
    }
}

/// Debug builds: the lean reading equals iceberg-rust's, where iceberg-rust reads the manifest at all (the lean reader
/// does not look at record names, so a manifest whose schema has a damaged name is read by it alone).
#[cfg(debug_assertions)]
fn agrees_with_iceberg(bytes: &[u8], ours: &Parts) {
    if let Ok(theirs) = by_iceberg(bytes) {
        assert!(theirs == *ours, "the lean manifest decoder disagrees with iceberg-rust:\nours: {ours:?}\ntheirs: {theirs:?}");
    }
}

/// What an entry leaves null it takes from the manifest list's entry `mf`: the snapshot id always, the sequence
/// numbers when it was added (or the list predates sequence numbers).
fn inherit(e: &mut ManifestEntry, mf: &ManifestFile) {
    if e.snapshot_id.is_none() {
        e.snapshot_id = Some(mf.added_snapshot_id);
    }
    let inherits = e.status == ManifestStatus::Added || mf.sequence_number == 0;
    if e.sequence_number.is_none() && inherits {
        e.sequence_number = Some(mf.sequence_number);
    }
    if e.file_sequence_number.is_none() && inherits {
        e.file_sequence_number = Some(mf.sequence_number);
    }
}

/// The manifest in `bytes`, or `None` for anything unexpected (see the module docs).
fn lean(bytes: &[u8]) -> Option<Parts> {
    let container = Container::open(bytes)?;
    let header = header(&container)?;
    let entries = container.records(|c| header.entry(c))?;
    Some((header.metadata.clone(), entries))
}

/// The decoding plan of `container`'s header, worked out once per distinct header (up to 256 kept; then they start
/// over). Headers are told apart by their metadata in key order: writers keep it in a hash map, so equal headers
/// come in any order (iceberg-rust's differ from file to file), and the order means nothing.
fn header(container: &Container<'_>) -> Option<Arc<Header>> {
    type Headers = HashMap<Vec<u8>, Arc<Header>, ahash::RandomState>;
    static HEADERS: OnceLock<Mutex<Headers>> = OnceLock::new();
    let headers = HEADERS.get_or_init(Default::default);
    let key = canonical_metadata(&container.meta);
    if let Some(h) = headers.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Some(h.clone());
    }
    let h = Arc::new(Header::of(container)?);
    let mut headers = headers.lock().unwrap_or_else(|e| e.into_inner());
    if headers.len() >= 256 {
        headers.clear();
    }
    headers.insert(key, h.clone());
    Some(h)
}

/// A container's metadata as one byte string that does not depend on the order it was written in: the pairs sorted
/// by key, each part length-prefixed.
fn canonical_metadata(meta: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut pairs: Vec<&(&[u8], &[u8])> = meta.iter().collect();
    pairs.sort_unstable_by_key(|(k, _)| *k);
    let mut key = Vec::with_capacity(pairs.iter().map(|(k, v)| k.len() + v.len() + 16).sum());
    for (k, v) in pairs {
        for part in [k, v] {
            key.extend_from_slice(&(part.len() as u64).to_le_bytes());
            key.extend_from_slice(part);
        }
    }
    key
}

/// What a manifest's header says, ready to decode its entries with.
struct Header {
    metadata: ManifestMetadata,
    /// The entry record's fields, as written, and where each goes.
    fields: Vec<(String, Shape)>,
    slots: Vec<Top>,
    /// The `data_file` record's fields and where each goes.
    file_slots: Vec<FileSlot>,
    partition_type: StructType,
    /// For each field of `partition_type`, its position in the written partition record.
    partition_at: Vec<usize>,
}

/// Where a field of the entry record goes.
#[derive(Clone, Copy)]
enum Top {
    Status,
    SnapshotId,
    Seq,
    FileSeq,
    DataFile,
    Other,
}

/// Where a field of the `data_file` record goes; maps (arrays of key/value records) with the positions of their key
/// and value (`Bounds`: lower bounds when `true`).
#[derive(Clone, Copy)]
enum FileSlot {
    Content,
    Path,
    Format,
    Partition,
    RecordCount,
    FileSize,
    Counts(Count, usize, usize),
    Bounds(bool, usize, usize),
    KeyMetadata,
    SplitOffsets,
    EqualityIds,
    SortOrderId,
    FirstRowId,
    ReferencedDataFile,
    ContentOffset,
    ContentSize,
    Other,
}

/// Which count map of a data file a field fills.
#[derive(Clone, Copy)]
enum Count {
    ColumnSizes,
    Values,
    Nulls,
    Nans,
}

impl Header {
    fn of(container: &Container<'_>) -> Option<Self> {
        let meta: HashMap<String, Vec<u8>> = container
            .meta
            .iter()
            .filter(|(k, _)| !k.starts_with(b"avro."))
            .map(|(k, v)| Some((String::from_utf8(k.to_vec()).ok()?, v.to_vec())))
            .collect::<Option<_>>()?;
        let metadata = ManifestMetadata::parse(&meta).ok()?;
        let partition_type = metadata.partition_spec.partition_type(&metadata.schema).ok()?;
        let Shape::Record(fields) = Shape::of(&container.schema()?)? else { return None };
        let slots: Vec<Top> = fields
            .iter()
            .map(|(name, _)| match name.as_str() {
                "status" => Top::Status,
                "snapshot_id" => Top::SnapshotId,
                "sequence_number" => Top::Seq,
                "file_sequence_number" => Top::FileSeq,
                "data_file" => Top::DataFile,
                _ => Top::Other,
            })
            .collect();
        let Some((_, Shape::Record(file_fields))) = fields.iter().find(|(n, _)| n == "data_file") else { return None };
        let file_slots = file_fields.iter().map(|(name, shape)| FileSlot::of(name, shape)).collect::<Option<_>>()?;
        let Some((_, Shape::Record(written))) = file_fields.iter().find(|(n, _)| n == "partition") else { return None };
        let partition_at = partition_type.fields().iter().map(|f| written.iter().position(|(n, _)| *n == f.name)).collect::<Option<_>>()?;
        Some(Header { metadata, fields, slots, file_slots, partition_type, partition_at })
    }

    /// One entry, decoded from the record at `c`.
    fn entry(&self, c: &mut Cursor<'_>) -> Option<ManifestEntry> {
        let (mut status, mut snapshot_id, mut seq, mut file_seq, mut data_file) = (None, None, None, None, None);
        for ((_, shape), slot) in self.fields.iter().zip(&self.slots) {
            let v = c.value(shape)?;
            match slot {
                Top::Status => status = Some(ManifestStatus::try_from(i32::try_from(long(&v)?).ok()?).ok()?),
                Top::SnapshotId => snapshot_id = optional_long(&v)?,
                Top::Seq => seq = optional_long(&v)?,
                Top::FileSeq => file_seq = optional_long(&v)?,
                Top::DataFile => data_file = Some(self.data_file(&v)?),
                Top::Other => {}
            }
        }
        if self.metadata.format_version == FormatVersion::V1 {
            // v1 entries have no sequence numbers, and always a snapshot id
            snapshot_id?;
            (seq, file_seq) = (Some(0), Some(0));
        }
        Some(ManifestEntry { status: status?, snapshot_id, sequence_number: seq, file_sequence_number: file_seq, data_file: data_file? })
    }

    fn data_file(&self, v: &Val<'_>) -> Option<DataFile> {
        let Val::Record(values) = v else { return None };
        let mut b = DataFileBuilder::default();
        b.partition_spec_id(self.metadata.partition_spec.spec_id());
        let mut content = 0;
        for (v, slot) in values.iter().zip(&self.file_slots) {
            match *slot {
                FileSlot::Content => content = long(v)?,
                FileSlot::Path => _ = b.file_path(string(v)?.to_string()),
                FileSlot::Format => _ = b.file_format(string(v)?.parse::<DataFileFormat>().ok()?),
                FileSlot::Partition => _ = b.partition(self.partition(v)?),
                FileSlot::RecordCount => _ = b.record_count(u64::try_from(long(v)?).ok()?),
                FileSlot::FileSize => _ = b.file_size_in_bytes(u64::try_from(long(v)?).ok()?),
                FileSlot::Counts(which, k, val) => {
                    let counts = counts(v, k, val)?;
                    match which {
                        Count::ColumnSizes => b.column_sizes(counts),
                        Count::Values => b.value_counts(counts),
                        Count::Nulls => b.null_value_counts(counts),
                        Count::Nans => b.nan_value_counts(counts),
                    };
                }
                FileSlot::Bounds(lower, k, val) => {
                    let bounds = bounds(v, k, val, &self.metadata.schema)?;
                    if lower {
                        b.lower_bounds(bounds);
                    } else {
                        b.upper_bounds(bounds);
                    }
                }
                FileSlot::KeyMetadata => _ = b.key_metadata(optional(v, |v| bytes(v).map(<[u8]>::to_vec))?),
                FileSlot::SplitOffsets => _ = b.split_offsets(optional(v, |v| longs(v, Some))?),
                FileSlot::EqualityIds => _ = b.equality_ids(optional(v, |v| longs(v, |n| i32::try_from(n).ok()))?),
                FileSlot::SortOrderId => {
                    if let Some(id) = optional(v, |v| i32::try_from(long(v)?).ok())? {
                        b.sort_order_id(id);
                    }
                }
                FileSlot::FirstRowId => _ = b.first_row_id(optional_long(v)?),
                FileSlot::ReferencedDataFile => _ = b.referenced_data_file(optional(v, |v| string(v).map(str::to_string))?),
                FileSlot::ContentOffset => _ = b.content_offset(optional_long(v)?),
                FileSlot::ContentSize => _ = b.content_size_in_bytes(optional_long(v)?),
                FileSlot::Other => {}
            }
        }
        b.content(DataContentType::try_from(i32::try_from(content).ok()?).ok()?);
        b.build().ok()
    }

    /// The partition tuple, in the partition type's order, from the written record `v`.
    fn partition(&self, v: &Val<'_>) -> Option<Struct> {
        let Val::Record(values) = v else { return None };
        let fields = self.partition_type.fields();
        let literals = fields.iter().zip(&self.partition_at).map(|(f, &i)| literal(values.get(i)?, &f.field_type)).collect::<Option<Vec<_>>>()?;
        Some(Struct::from_iter(literals))
    }
}

impl FileSlot {
    fn of(name: &str, shape: &Shape) -> Option<Self> {
        // the positions of `key` and `value` in a map's entry record
        let kv = || {
            let names = shape.record_fields();
            Some((names.iter().position(|n| *n == "key")?, names.iter().position(|n| *n == "value")?))
        };
        Some(match name {
            "content" => Self::Content,
            "file_path" => Self::Path,
            "file_format" => Self::Format,
            "partition" => Self::Partition,
            "record_count" => Self::RecordCount,
            "file_size_in_bytes" => Self::FileSize,
            "column_sizes" | "value_counts" | "null_value_counts" | "nan_value_counts" => {
                let which = match name {
                    "column_sizes" => Count::ColumnSizes,
                    "value_counts" => Count::Values,
                    "null_value_counts" => Count::Nulls,
                    _ => Count::Nans,
                };
                let (k, v) = kv()?;
                Self::Counts(which, k, v)
            }
            "lower_bounds" | "upper_bounds" => {
                let (k, v) = kv()?;
                Self::Bounds(name == "lower_bounds", k, v)
            }
            "key_metadata" => Self::KeyMetadata,
            "split_offsets" => Self::SplitOffsets,
            "equality_ids" => Self::EqualityIds,
            "sort_order_id" => Self::SortOrderId,
            "first_row_id" => Self::FirstRowId,
            "referenced_data_file" => Self::ReferencedDataFile,
            "content_offset" => Self::ContentOffset,
            "content_size_in_bytes" => Self::ContentSize,
            _ => Self::Other,
        })
    }
}

fn long(v: &Val<'_>) -> Option<i64> {
    match v {
        Val::Long(n) => Some(*n),
        _ => None,
    }
}

fn bytes<'a>(v: &Val<'a>) -> Option<&'a [u8]> {
    match v {
        Val::Bytes(b) => Some(b),
        _ => None,
    }
}

fn string<'a>(v: &Val<'a>) -> Option<&'a str> {
    std::str::from_utf8(bytes(v)?).ok()
}

/// `None` for a null, else what `f` makes of the value (`None` from `f` is a failure).
fn optional<'a, T>(v: &Val<'a>, f: impl FnOnce(&Val<'a>) -> Option<T>) -> Option<Option<T>> {
    match v {
        Val::Null => Some(None),
        v => f(v).map(Some),
    }
}

fn optional_long(v: &Val<'_>) -> Option<Option<i64>> {
    optional(v, long)
}

/// An array of longs, each made a `T` by `f`.
fn longs<T>(v: &Val<'_>, f: impl Fn(i64) -> Option<T>) -> Option<Vec<T>> {
    let Val::Array(items) = v else { return None };
    items.iter().map(|i| f(long(i)?)).collect()
}

/// The entries of a map (an array of key/value records) as `(key, value)`; a null map is empty.
fn map_entries<'v, 'a>(v: &'v Val<'a>, k: usize, val: usize) -> Option<Vec<(i32, &'v Val<'a>)>> {
    let items = match v {
        Val::Null => return Some(Vec::new()),
        Val::Array(items) => items,
        _ => return None,
    };
    items
        .iter()
        .map(|item| {
            let Val::Record(fields) = item else { return None };
            Some((i32::try_from(long(fields.get(k)?)?).ok()?, fields.get(val)?))
        })
        .collect()
}

/// A map of counts; a negative count is dropped, as iceberg-rust drops it.
fn counts(v: &Val<'_>, k: usize, val: usize) -> Option<HashMap<i32, u64>> {
    let mut out = HashMap::new();
    for (key, value) in map_entries(v, k, val)? {
        if let Ok(n) = u64::try_from(long(value)?) {
            out.insert(key, n);
        }
    }
    Some(out)
}

/// A map of bounds, each decoded by its field's type in `schema` (or the reserved field's); bounds of fields the
/// schema does not have are dropped, as iceberg-rust drops them.
fn bounds(v: &Val<'_>, k: usize, val: usize, schema: &Schema) -> Option<HashMap<i32, Datum>> {
    let mut out = HashMap::new();
    for (key, value) in map_entries(v, k, val)? {
        let Some(field) = schema.field_by_id(key).or_else(|| iceberg::metadata_columns::get_metadata_field(key).ok()) else { continue };
        let ty = field.field_type.as_primitive_type()?.clone();
        out.insert(key, Datum::try_from_bytes(bytes(value)?, ty).ok()?);
    }
    Some(out)
}

/// A partition value of type `ty`: the types partitions commonly use (identity of int, long, date, time, timestamps,
/// float, double, string and boolean columns; bucket, truncate and the date transforms); `None` for others (see the
/// module docs).
fn literal(v: &Val<'_>, ty: &Type) -> Option<Option<Literal>> {
    let Type::Primitive(ty) = ty else { return None };
    Some(Some(match (v, ty) {
        (Val::Null, _) => return Some(None),
        (Val::Bool(b), PrimitiveType::Boolean) => Literal::bool(*b),
        (Val::Long(n), PrimitiveType::Int) => Literal::int(i32::try_from(*n).ok()?),
        (Val::Long(n), PrimitiveType::Date) => Literal::date(i32::try_from(*n).ok()?),
        (Val::Long(n), PrimitiveType::Long) => Literal::long(*n),
        (Val::Long(n), PrimitiveType::Time) => Literal::time(*n),
        (Val::Long(n), PrimitiveType::Timestamp) => Literal::timestamp(*n),
        (Val::Long(n), PrimitiveType::Timestamptz) => Literal::timestamptz(*n),
        (Val::Float(f), PrimitiveType::Float) => Literal::float(*f),
        (Val::Double(d), PrimitiveType::Double) => Literal::double(*d),
        (Val::Bytes(b), PrimitiveType::String) => Literal::string(std::str::from_utf8(b).ok()?),
        _ => return None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::{ManifestContentType, ManifestWriterBuilder, NestedField, PartitionSpec, Transform, UnboundPartitionField};

    #[test]
    fn headers_are_told_apart_by_their_metadata_in_any_order() {
        let a: Vec<(&[u8], &[u8])> = vec![(b"schema", b"{}"), (b"avro.codec", b"null"), (b"content", b"data")];
        let mut b = a.clone();
        b.reverse();
        assert_eq!(canonical_metadata(&a), canonical_metadata(&b));
        let c: Vec<(&[u8], &[u8])> = vec![(b"schema", b"{}"), (b"avro.codec", b"null"), (b"content", b"deletes")];
        assert_ne!(canonical_metadata(&a), canonical_metadata(&c));
        // a part's length is part of the key: moving bytes from a key to its value is another header
        let d: Vec<(&[u8], &[u8])> = vec![(b"ab", b"c")];
        let e: Vec<(&[u8], &[u8])> = vec![(b"a", b"bc")];
        assert_ne!(canonical_metadata(&d), canonical_metadata(&e));
    }

    fn schema() -> Schema {
        Schema::builder()
            .with_schema_id(3)
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::optional(2, "cat", Type::Primitive(PrimitiveType::String)).into(),
                NestedField::optional(3, "day", Type::Primitive(PrimitiveType::Date)).into(),
                NestedField::optional(4, "ts", Type::Primitive(PrimitiveType::Timestamptz)).into(),
                NestedField::optional(5, "price", Type::Primitive(PrimitiveType::Decimal { precision: 9, scale: 2 })).into(),
                NestedField::optional(6, "ok", Type::Primitive(PrimitiveType::Boolean)).into(),
            ])
            .build()
            .unwrap()
    }

    /// A spec over `schema()` with these (source id, transform) fields.
    fn spec(fields: &[(i32, Transform)]) -> PartitionSpec {
        let mut b = PartitionSpec::builder(schema()).with_spec_id(0);
        for (i, (source, transform)) in fields.iter().enumerate() {
            b = b
                .add_unbound_field(UnboundPartitionField {
                    source_id: *source,
                    field_id: Some(1000 + i as i32),
                    name: format!("p{i}"),
                    transform: *transform,
                })
                .unwrap();
        }
        b.build().unwrap()
    }

    /// A file of each content type, partitioned by `values`, with counts and bounds (one for a field the schema lacks).
    fn files(content: DataContentType, values: &[Option<Literal>], n: i64) -> DataFile {
        let mut b = DataFileBuilder::default();
        b.content(content)
            .file_path(format!("/t/data/f{n}.parquet"))
            .file_format(DataFileFormat::Parquet)
            .partition(Struct::from_iter(values.iter().cloned()))
            .record_count(10 + n as u64)
            .file_size_in_bytes(1000 + n as u64)
            .column_sizes(HashMap::from([(1, 100), (2, 200)]))
            .value_counts(HashMap::from([(1, 10), (2, 10)]))
            .null_value_counts(HashMap::from([(2, 1)]))
            .nan_value_counts(HashMap::new())
            .lower_bounds(HashMap::from([(1, Datum::long(n)), (2, Datum::string("a")), (99, Datum::int(1))]))
            .upper_bounds(HashMap::from([(1, Datum::long(n + 9)), (2, Datum::string("z"))]))
            .split_offsets(Some(vec![4]))
            .sort_order_id(0);
        match content {
            DataContentType::EqualityDeletes => _ = b.equality_ids(Some(vec![1])),
            DataContentType::PositionDeletes if n % 2 == 0 => {
                // a deletion vector
                b.referenced_data_file(Some("/t/data/f1.parquet".into()))
                    .content_offset(Some(4))
                    .content_size_in_bytes(Some(40))
                    .file_format(DataFileFormat::Puffin);
            }
            _ => {}
        }
        b.build().unwrap()
    }

    async fn written(version: FormatVersion, content: ManifestContentType, spec: PartitionSpec, entries: Vec<DataFile>) -> (Vec<u8>, ManifestFile) {
        let dir = tempfile::tempdir().unwrap();
        let io = iceberg::io::FileIO::new_with_fs();
        let path = format!("{}/m.avro", dir.path().display());
        let b = ManifestWriterBuilder::new(io.new_output(&path).unwrap(), Some(7), Arc::new(schema()), spec);
        let mut w = match (version, content) {
            (FormatVersion::V1, _) => b.build_v1(),
            (FormatVersion::V2, ManifestContentType::Data) => b.build_v2_data(),
            (FormatVersion::V2, ManifestContentType::Deletes) => b.build_v2_deletes(),
            (FormatVersion::V3, ManifestContentType::Data) => b.build_v3_data(),
            (FormatVersion::V3, ManifestContentType::Deletes) => b.build_v3_deletes(),
        };
        for (i, f) in entries.into_iter().enumerate() {
            match i % 3 {
                0 => w.add_file(f, 45).unwrap(),
                1 => w.add_existing_file(f, 3, 30, Some(30)).unwrap(),
                _ => w.add_delete_file(f, 20, Some(20)).unwrap(),
            }
        }
        let mut mf = w.write_manifest_file().await.unwrap();
        mf.sequence_number = 50;
        (std::fs::read(&path).unwrap(), mf)
    }

    #[tokio::test]
    async fn the_lean_decoder_reads_what_iceberg_rust_reads_in_every_version_and_content() {
        type Spec = (Vec<(i32, Transform)>, Vec<Option<Literal>>);
        let specs: Vec<Spec> = vec![
            (vec![], vec![]),
            (
                vec![(2, Transform::Identity), (3, Transform::Day), (1, Transform::Bucket(8)), (4, Transform::Hour), (6, Transform::Identity)],
                vec![Some(Literal::string("x")), Some(Literal::date(19000)), Some(Literal::int(3)), None, Some(Literal::bool(true))],
            ),
            (vec![(2, Transform::Truncate(2)), (1, Transform::Identity)], vec![None, Some(Literal::long(-4))]),
        ];
        let kinds = [
            (FormatVersion::V1, ManifestContentType::Data, DataContentType::Data),
            (FormatVersion::V2, ManifestContentType::Data, DataContentType::Data),
            (FormatVersion::V2, ManifestContentType::Deletes, DataContentType::EqualityDeletes),
            (FormatVersion::V2, ManifestContentType::Deletes, DataContentType::PositionDeletes),
            (FormatVersion::V3, ManifestContentType::Data, DataContentType::Data),
            (FormatVersion::V3, ManifestContentType::Deletes, DataContentType::PositionDeletes),
        ];
        for (fields, values) in &specs {
            for (version, content, file_content) in kinds {
                let entries = (1..=7).map(|n| files(file_content, values, n)).collect();
                let (bytes, mf) = written(version, content, spec(fields), entries).await;
                let ours = lean(&bytes).expect("decoded by the lean reader");
                assert_eq!(ours.1.len(), 7);
                damaged_never_abort(&bytes, &mf);
                assert!(ours == by_iceberg(&bytes).unwrap(), "{version:?} {content:?} {fields:?}");
                // inherited as iceberg-rust inherits
                let dir = tempfile::tempdir().unwrap();
                let path = format!("{}/m.avro", dir.path().display());
                std::fs::write(&path, &bytes).unwrap();
                let io = iceberg::io::FileIO::new_with_fs();
                let mf = ManifestFile { manifest_path: path, ..mf };
                assert_eq!(load(&io, &mf).await.unwrap(), mf.load_manifest(&io).await.unwrap(), "{version:?} {content:?}");
            }
        }
    }

    #[tokio::test]
    async fn a_partition_type_the_lean_decoder_does_not_convert_is_read_by_iceberg_rust() {
        let values = vec![Some(Literal::decimal(1234))];
        let entries = (1..=3).map(|n| files(DataContentType::Data, &values, n)).collect();
        let (bytes, mf) = written(FormatVersion::V2, ManifestContentType::Data, spec(&[(5, Transform::Identity)]), entries).await;
        assert!(lean(&bytes).is_none(), "decimal partitions are left to iceberg-rust");
        let m = parse(&bytes, &mf).unwrap();
        assert_eq!(m.entries().len(), 3);
        assert_eq!(m.entries()[0].data_file().partition(), &Struct::from_iter(values));
    }

    /// Damaged bytes end in an error or another reading, never in a panic, an allocation abort or a loop.
    fn damaged_never_abort(bytes: &[u8], mf: &ManifestFile) {
        for b in crate::spec::avro::damaged(bytes, 300) {
            // debug builds assert inside `parse` that a damaged manifest both readers read reads the same
            let _ = parse(&b, mf);
        }
    }

    /// Every manifest under `CDC_MANIFEST_DIR` (e.g. the warehouses peer tests leave, written by Spark, Flink,
    /// pyiceberg and Java's REST catalog) read both ways: `cargo test --lib spec::manifest -- --ignored --nocapture`.
    #[test]
    #[ignore = "reads a directory of manifests named by CDC_MANIFEST_DIR"]
    fn every_manifest_under_a_directory_reads_the_same_both_ways() {
        let dir = std::env::var("CDC_MANIFEST_DIR").expect("CDC_MANIFEST_DIR");
        let (mut same, mut fallback, mut refused) = (0, 0, 0);
        let mut stack = vec![std::path::PathBuf::from(dir)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                if p.is_dir() {
                    stack.push(p);
                } else if name.ends_with(".avro") && !name.starts_with("snap-") {
                    let bytes = std::fs::read(&p).unwrap();
                    match (lean(&bytes), by_iceberg(&bytes)) {
                        (Some(ours), Ok(theirs)) => {
                            assert!(ours == theirs, "{}", p.display());
                            same += 1;
                        }
                        (None, Ok(_)) => fallback += 1,
                        (None, Err(_)) => refused += 1,
                        (Some(_), Err(e)) => panic!("{}: only the lean decoder reads it ({e})", p.display()),
                    }
                }
            }
        }
        println!("{same} read the same both ways, {fallback} left to iceberg-rust, {refused} refused by both");
        assert!(same > 0);
    }
}

//! Row lineage (format v3): the `first_row_id` a data file inherits from its manifest, made explicit wherever a
//! writer copies an entry into a new manifest.
//!
//! Spec rule: an `ADDED` data file is written with a null `first_row_id`; a reader assigns it the manifest's
//! `first_row_id` (from the manifest list) plus the `record_count` of every earlier file of the manifest that also
//! had none. A row's `_row_id`, when not stored in the file, is that plus its position. A writer that copies an entry
//! (`EXISTING` in a merged or rewritten manifest, `DELETED` for a removed file) must write the inherited value into
//! the entry: the new manifest gets a fresh `first_row_id`, and an entry left null would be renumbered — every row of
//! the file would change its `_row_id`.
//!
//! iceberg-rust 0.10.1 does not apply the inheritance when it reads a manifest, and keeps a data file's fields
//! private; this module does both: [`inherit`] (pure) and [`with_first_row_id`].
//!
//! A rewrite of rows (compaction) keeps their lineage the way Iceberg Java's does: it reads each row's `_row_id` and
//! `_last_updated_sequence_number` ([`fill`]: the stored value, else the inherited one — first row id plus position,
//! the file's data sequence number) and writes both as columns under their reserved field ids
//! ([`with_lineage_columns`]). A reader takes a stored value over the new file's inherited one.
//!
//! Invariants: an explicit `first_row_id` is never changed; a manifest without one (written before the table was
//! upgraded to v3) gives its files none, as Iceberg Java does; `DELETED` entries take no ids (the manifest list
//! reserved ids only for the `ADDED` and `EXISTING` rows).
use std::sync::Arc;

use arrow_array::{Array, Int64Array, RecordBatch};
use iceberg::spec::{
    DataFile, FormatVersion, Manifest, ManifestContentType, ManifestEntryRef, ManifestFile, NestedField, PrimitiveType, Schema, Type,
};

use crate::error::{Error, Result};

/// Reserved field id of `_row_id` (Iceberg spec).
pub(crate) const ROW_ID: i32 = 2147483540;
/// Reserved field id of `_last_updated_sequence_number` (Iceberg spec).
pub(crate) const LAST_UPDATED_SEQUENCE_NUMBER: i32 = 2147483539;

/// `schema` with the two row-lineage columns appended, optional longs under their reserved ids: the schema a rewrite
/// of a v3 table's rows reads and writes.
pub(crate) fn with_lineage_columns(schema: &Schema) -> Result<Schema> {
    let mut fields: Vec<_> = schema.as_struct().fields().to_vec();
    fields.push(Arc::new(NestedField::optional(ROW_ID, "_row_id", Type::Primitive(PrimitiveType::Long))));
    fields.push(Arc::new(NestedField::optional(LAST_UPDATED_SEQUENCE_NUMBER, "_last_updated_sequence_number", Type::Primitive(PrimitiveType::Long))));
    Ok(Schema::builder().with_schema_id(schema.schema_id()).with_identifier_field_ids(schema.identifier_field_ids()).with_fields(fields).build()?)
}

/// Where `schema` (Arrow, with field ids) holds `_row_id` and `_last_updated_sequence_number`, when it holds both.
pub(crate) fn lineage_columns(schema: &arrow_schema::Schema) -> Option<(usize, usize)> {
    let at = |id| schema.fields().iter().position(|f| crate::spec::projection::field_id(f) == Some(id));
    Some((at(ROW_ID)?, at(LAST_UPDATED_SEQUENCE_NUMBER)?))
}

/// `batch` (rows of one data file, the `i`-th at `position(i)` in it) with its lineage columns `cols` filled where
/// the file stored none: `_row_id` = `first_row_id` + position (null when the file has no first row id: written
/// before the table was upgraded to v3), `_last_updated_sequence_number` = the file's data sequence number `seq`.
/// Pure.
pub(crate) fn fill(
    batch: &RecordBatch,
    cols: (usize, usize),
    position: impl Fn(usize) -> u64,
    first_row_id: Option<i64>,
    seq: i64,
) -> Result<RecordBatch> {
    let int64 = |i: usize| {
        batch.column(i).as_any().downcast_ref::<Int64Array>().cloned().ok_or_else(|| Error::Internal(format!("row lineage column {i} is not a long")))
    };
    let (ids, seqs) = (int64(cols.0)?, int64(cols.1)?);
    if ids.null_count() == 0 && seqs.null_count() == 0 {
        return Ok(batch.clone());
    }
    let ids: Int64Array =
        (0..ids.len()).map(|i| if ids.is_valid(i) { Some(ids.value(i)) } else { first_row_id.map(|f| f + position(i) as i64) }).collect();
    let seqs: Int64Array = (0..seqs.len()).map(|i| Some(if seqs.is_valid(i) { seqs.value(i) } else { seq })).collect();
    let mut columns = batch.columns().to_vec();
    columns[cols.0] = Arc::new(ids);
    columns[cols.1] = Arc::new(seqs);
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// The `first_row_id` of every file of a manifest after inheritance, in the manifest's order. `files` are each
/// entry's (alive, stored `first_row_id`, `record_count`); `manifest_first_row_id` is the manifest list's value. Pure.
pub(crate) fn inherit(manifest_first_row_id: Option<u64>, files: impl IntoIterator<Item = (bool, Option<i64>, u64)>) -> Vec<Option<i64>> {
    let mut next = manifest_first_row_id.map(|id| id as i64);
    files
        .into_iter()
        .map(|(alive, stored, records)| match (next.as_mut(), stored) {
            (None, _) => None,
            (Some(_), Some(id)) => Some(id),
            (Some(_), None) if !alive => None,
            (Some(n), None) => {
                let id = *n;
                *n += records as i64;
                Some(id)
            }
        })
        .collect()
}

/// `f` with `first_row_id` set (and its partition spec id, which iceberg-rust keeps beside the file).
pub(crate) fn with_first_row_id(f: &DataFile, spec_id: i32, first_row_id: Option<i64>) -> Result<DataFile> {
    super::data_file::copy(f, spec_id, first_row_id, super::data_file::Stats::All)
}

/// The `first_row_id` of every entry of `manifest` (listed by `file`) after inheritance, in its order: for a data
/// manifest of a v3 table by [`inherit`]; otherwise as stored (none).
pub(crate) fn first_row_ids(version: FormatVersion, file: &ManifestFile, manifest: &Manifest) -> Vec<Option<i64>> {
    let entries = manifest.entries();
    if version < FormatVersion::V3 || file.content != ManifestContentType::Data {
        return entries.iter().map(|e| e.data_file.first_row_id()).collect();
    }
    inherit(file.first_row_id, entries.iter().map(|e| (e.is_alive(), e.data_file.first_row_id(), e.data_file.record_count())))
}

/// The live entries of `manifest` (listed by `file`), each with the data file a copy of it must carry: its inherited
/// `first_row_id` made explicit ([`first_row_ids`]; the file as read where that changes nothing).
pub(crate) fn live_entries(version: FormatVersion, file: &ManifestFile, manifest: &Manifest) -> Result<Vec<(ManifestEntryRef, DataFile)>> {
    let entries = manifest.entries();
    entries
        .iter()
        .zip(first_row_ids(version, file, manifest))
        .filter(|(e, _)| e.is_alive())
        .map(|(e, id)| {
            let f = if id == e.data_file.first_row_id() { e.data_file.clone() } else { with_first_row_id(&e.data_file, file.partition_spec_id, id)? };
            Ok((e.clone(), f))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::DataFileBuilder;

    #[test]
    fn files_without_an_id_count_on_from_the_manifests_in_order() {
        // ADDED 10 rows, EXISTING with id 500, ADDED 3 rows, ADDED 7 rows
        let ids = inherit(Some(100), [(true, None, 10), (true, Some(500), 40), (true, None, 3), (true, None, 7)]);
        assert_eq!(ids, vec![Some(100), Some(500), Some(110), Some(113)]);
    }

    #[test]
    fn a_manifest_without_an_id_gives_none_and_deleted_entries_take_none() {
        assert_eq!(inherit(None, [(true, None, 10), (true, Some(5), 1)]), vec![None, None]);
        assert_eq!(inherit(Some(0), [(false, None, 10), (true, None, 4)]), vec![None, Some(0)]);
    }

    #[test]
    fn stored_lineage_wins_and_missing_lineage_is_inherited_by_position() {
        let schema = with_lineage_columns(
            &Schema::builder().with_fields(vec![Arc::new(NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)))]).build().unwrap(),
        )
        .unwrap();
        let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema).unwrap());
        let cols = lineage_columns(&arrow).unwrap();
        assert_eq!(cols, (1, 2));
        let batch = RecordBatch::try_new(
            arrow,
            vec![
                Arc::new(Int64Array::from(vec![10, 11, 12])),
                Arc::new(Int64Array::from(vec![None, Some(7), None])),
                Arc::new(Int64Array::from(vec![None, Some(2), Some(3)])),
            ],
        )
        .unwrap();
        // rows at positions 4, 5, 9 of a file whose first row id is 100, data sequence number 6
        let positions = [4u64, 5, 9];
        let filled = fill(&batch, cols, |i| positions[i], Some(100), 6).unwrap();
        let col = |i: usize| filled.column(i).as_any().downcast_ref::<Int64Array>().unwrap().iter().collect::<Vec<_>>();
        assert_eq!(col(1), vec![Some(104), Some(7), Some(109)]);
        assert_eq!(col(2), vec![Some(6), Some(2), Some(3)]);
        // a file without a first row id (written before the upgrade to v3) gives its rows none
        let filled = fill(&batch, cols, |i| positions[i], None, 6).unwrap();
        assert_eq!(filled.column(1).as_any().downcast_ref::<Int64Array>().unwrap().iter().collect::<Vec<_>>(), vec![None, Some(7), None]);
    }

    #[test]
    fn a_copied_file_keeps_every_field_but_the_id_it_is_given() {
        let mut b = DataFileBuilder::default();
        b.content(iceberg::spec::DataContentType::Data)
            .file_path("/t/data/a.parquet".into())
            .file_format(iceberg::spec::DataFileFormat::Parquet)
            .record_count(12)
            .file_size_in_bytes(345)
            .value_counts([(1, 12)].into())
            .split_offsets(Some(vec![4]))
            .partition_spec_id(3);
        b.sort_order_id(0);
        let f = b.build().unwrap();
        let copy = with_first_row_id(&f, 3, Some(77)).unwrap();
        assert_eq!(copy.first_row_id(), Some(77));
        assert_eq!(with_first_row_id(&copy, 3, None).unwrap(), f);
    }
}

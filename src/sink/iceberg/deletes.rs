//! Position-delete files (v2) and deletion vectors (v3): how a commit deletes rows by position — in particular rows
//! that the same commit wrote, which an equality delete cannot reach (it only applies to strictly older data).
use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use iceberg::io::FileIO;
use iceberg::spec::{DataContentType, DataFile, DataFileBuilder, DataFileFormat, NestedField, PrimitiveType, Schema, Struct, Type};
use iceberg::writer::file_writer::{FileWriter, FileWriterBuilder, ParquetWriterBuilder};
use parquet::file::properties::WriterProperties;
use roaring::RoaringTreemap;

use crate::error::{Error, Result};
use crate::spec::dv;
use crate::spec::{POS_DELETE_FILE_PATH_ID, POS_DELETE_POS_ID};

const PUFFIN_MAGIC: [u8; 4] = *b"PFA1";
/// Field id the spec assigns to a deletion vector's blob (`_pos`).
const DV_FIELD_ID: i32 = 2147483645;
pub const DV_BLOB_TYPE: &str = "deletion-vector-v1";

/// The partition a delete file belongs to: that of the data files it references.
#[derive(Debug, Clone, PartialEq)]
pub struct Partition {
    pub spec_id: i32,
    pub value: Struct,
}

fn position_delete_schema() -> Result<Schema> {
    Ok(Schema::builder()
        .with_fields(vec![
            NestedField::required(POS_DELETE_FILE_PATH_ID, "file_path", Type::Primitive(PrimitiveType::String)).into(),
            NestedField::required(POS_DELETE_POS_ID, "pos", Type::Primitive(PrimitiveType::Long)).into(),
        ])
        .build()?)
}

/// A v2 position-delete file holding `deletes` (data file path → positions), sorted by path then position as the
/// spec requires. All referenced files must be in `partition`.
pub async fn write_position_delete_file(
    file_io: &FileIO,
    path: &str,
    partition: &Partition,
    deletes: &BTreeMap<String, RoaringTreemap>,
) -> Result<DataFile> {
    let schema = Arc::new(position_delete_schema()?);
    let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema)?);
    let io = |e| super::files::io_error(path, e);
    let mut w = ParquetWriterBuilder::new(WriterProperties::builder().build(), schema).build(file_io.new_output(path)?).await.map_err(io)?;
    for (file, positions) in deletes {
        let pos: Vec<i64> = positions.iter().map(|p| p as i64).collect();
        for chunk in pos.chunks(64 * 1024) {
            let cols: Vec<ArrayRef> = vec![Arc::new(StringArray::from(vec![file.as_str(); chunk.len()])), Arc::new(Int64Array::from(chunk.to_vec()))];
            w.write(&RecordBatch::try_new(arrow.clone(), cols)?).await.map_err(io)?;
        }
    }
    let mut built = w.close().await.map_err(io)?;
    let mut b = built.pop().ok_or_else(|| Error::Internal("position-delete writer produced no file".into()))?;
    b.content(DataContentType::PositionDeletes).partition_spec_id(partition.spec_id).partition(partition.value.clone());
    if deletes.len() == 1 {
        b.referenced_data_file(deletes.keys().next().cloned());
    }
    b.build().map_err(|e| Error::failed("position-delete file", e))
}

/// One Puffin file holding a deletion vector per data file; returns one delete-file entry per vector.
pub async fn write_dv_file(file_io: &FileIO, path: &str, vectors: &[(String, Partition, RoaringTreemap)]) -> Result<Vec<DataFile>> {
    let mut bytes = PUFFIN_MAGIC.to_vec();
    let mut blobs = Vec::new();
    let mut placed = Vec::new();
    for (data_file, _, positions) in vectors {
        let blob = dv::encode(positions);
        let offset = bytes.len();
        bytes.extend_from_slice(&blob);
        blobs.push(serde_json::json!({
            "type": DV_BLOB_TYPE,
            "fields": [DV_FIELD_ID],
            "snapshot-id": -1,
            "sequence-number": -1,
            "offset": offset,
            "length": blob.len(),
            "properties": {"referenced-data-file": data_file, "cardinality": positions.len().to_string()},
        }));
        placed.push((offset, blob.len()));
    }
    let footer = serde_json::to_vec(&serde_json::json!({"blobs": blobs, "properties": {"created-by": "iceberg-cdc"}}))
        .map_err(|e| Error::failed("encoding a Puffin footer", e))?;
    bytes.extend_from_slice(&PUFFIN_MAGIC);
    bytes.extend_from_slice(&footer);
    bytes.extend_from_slice(&(footer.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&[0, 0, 0, 0]); // flags: footer not compressed
    bytes.extend_from_slice(&PUFFIN_MAGIC);
    let size = bytes.len() as u64;
    file_io.new_output(path)?.write(bytes.into()).await.map_err(|e| super::files::io_error(path, e))?;
    vectors
        .iter()
        .zip(placed)
        .map(|((data_file, partition, positions), (offset, len))| {
            DataFileBuilder::default()
                .content(DataContentType::PositionDeletes)
                .file_path(path.to_string())
                .file_format(DataFileFormat::Puffin)
                .partition(partition.value.clone())
                .partition_spec_id(partition.spec_id)
                .record_count(positions.len())
                .file_size_in_bytes(size)
                .referenced_data_file(Some(data_file.clone()))
                .content_offset(Some(offset as i64))
                .content_size_in_bytes(Some(len as i64))
                .build()
                .map_err(|e| Error::failed("deletion vector entry", e))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::files::FileEntry;
    use crate::source::reader;

    fn unpartitioned() -> Partition {
        Partition { spec_id: 0, value: Struct::empty() }
    }

    #[tokio::test]
    async fn position_delete_file_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let io = FileIO::new_with_fs();
        let path = format!("{}/pd.parquet", dir.path().display());
        let mut d = BTreeMap::new();
        d.insert("/t/data/a.parquet".to_string(), RoaringTreemap::from_iter([0u64, 7, 9]));
        d.insert("/t/data/b.parquet".to_string(), RoaringTreemap::from_iter([3u64]));
        let f = write_position_delete_file(&io, &path, &unpartitioned(), &d).await.unwrap();
        assert_eq!(f.record_count(), 4);
        assert_eq!(f.content_type(), DataContentType::PositionDeletes);
        assert_eq!(f.referenced_data_file(), None, "two data files: no single reference");
        let back = reader::read_position_deletes(&io, &path, DataFileFormat::Parquet).await.unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back["/t/data/a.parquet"], d["/t/data/a.parquet"]);
    }

    #[tokio::test]
    async fn deletion_vectors_read_back_through_the_reader() {
        let dir = tempfile::tempdir().unwrap();
        let io = FileIO::new_with_fs();
        let path = format!("{}/dv.puffin", dir.path().display());
        let v = vec![
            ("/t/data/a.parquet".to_string(), unpartitioned(), RoaringTreemap::from_iter([1u64, 2, 100_000])),
            ("/t/data/b.parquet".to_string(), unpartitioned(), RoaringTreemap::from_iter([0u64])),
        ];
        let files = write_dv_file(&io, &path, &v).await.unwrap();
        assert_eq!(files.len(), 2);
        for (f, (_, _, want)) in files.iter().zip(&v) {
            let entry = FileEntry { file: f.clone(), seq: 1, spec_id: 0, unpartitioned: true, first_row_id: None };
            assert!(entry.is_dv());
            assert_eq!(&reader::read_dv(&io, &entry).await.unwrap(), want);
        }
        // a Puffin reader finds the blobs through the footer
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..4], b"PFA1");
        assert_eq!(&bytes[bytes.len() - 4..], b"PFA1");
        let n = bytes.len();
        let len = u32::from_le_bytes(bytes[n - 12..n - 8].try_into().unwrap()) as usize;
        let footer: serde_json::Value = serde_json::from_slice(&bytes[n - 12 - len..n - 12]).unwrap();
        assert_eq!(footer["blobs"][0]["type"], DV_BLOB_TYPE);
        assert_eq!(footer["blobs"][1]["properties"]["referenced-data-file"], "/t/data/b.parquet");
    }
}

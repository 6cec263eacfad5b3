//! Data files and equality-delete files of an (unpartitioned) table, written with iceberg-rust's writers.
use std::sync::Arc;

use arrow_array::RecordBatch;
use iceberg::arrow::arrow_schema_to_schema;
use iceberg::spec::{DataFile, DataFileFormat};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::base_writer::equality_delete_writer::{EqualityDeleteFileWriterBuilder, EqualityDeleteWriterConfig};
use iceberg::writer::file_writer::location_generator::{DefaultFileNameGenerator, DefaultLocationGenerator};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::file::properties::WriterProperties;

use crate::error::{Error, Result};

fn unpartitioned(table: &Table) -> Result<()> {
    if table.metadata().default_partition_spec().is_unpartitioned() {
        Ok(())
    } else {
        Err(Error::Internal("partitioned targets are not supported by this writer yet".into()))
    }
}

fn names(prefix: &str) -> DefaultFileNameGenerator {
    DefaultFileNameGenerator::new(format!("{prefix}-{}", uuid::Uuid::new_v4()), None, DataFileFormat::Parquet)
}

/// Writes `batches` (in the table's current schema) as data files.
pub async fn write_data(table: &Table, batches: &[RecordBatch]) -> Result<Vec<DataFile>> {
    unpartitioned(table)?;
    let schema = table.metadata().current_schema().clone();
    let pw = ParquetWriterBuilder::new(WriterProperties::builder().build(), schema);
    let rolling = RollingFileWriterBuilder::new_with_default_file_size(
        pw,
        table.file_io().clone(),
        DefaultLocationGenerator::new(table.metadata())?,
        names("data"),
    );
    let mut w = DataFileWriterBuilder::new(rolling).build(None).await?;
    for b in batches {
        w.write(b.clone()).await?;
    }
    Ok(w.close().await?)
}

/// Writes equality deletes on `equality_ids` from `batches` (full rows in the current schema; other columns are
/// projected away).
pub async fn write_equality_deletes(table: &Table, equality_ids: Vec<i32>, batches: &[RecordBatch]) -> Result<Vec<DataFile>> {
    unpartitioned(table)?;
    let schema = table.metadata().current_schema().clone();
    let config = EqualityDeleteWriterConfig::new(equality_ids, schema)?;
    let delete_schema = arrow_schema_to_schema(config.projected_arrow_schema_ref())?;
    let pw = ParquetWriterBuilder::new(WriterProperties::builder().build(), Arc::new(delete_schema));
    let rolling = RollingFileWriterBuilder::new_with_default_file_size(
        pw,
        table.file_io().clone(),
        DefaultLocationGenerator::new(table.metadata())?,
        names("eq-deletes"),
    );
    let mut w = EqualityDeleteFileWriterBuilder::new(rolling, config).build(None).await?;
    for b in batches {
        w.write(b.clone()).await?;
    }
    Ok(w.close().await?)
}

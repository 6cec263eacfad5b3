//! Shared by the benchmarks: the benchmark table (a ≥1M-row orders table and one merge-on-read snapshot updating
//! 10 % and deleting 2 % of the rows by equality deletes, so every older data file must be re-read), and measuring a
//! child process (wall time, CPU time and peak RSS of that child alone, via wait4).
#![allow(dead_code)] // each bench uses part of it
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::{ArrayRef, Decimal128Array, Int32Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use iceberg::spec::{FormatVersion, NestedField, PrimitiveType, Schema, Type};
use iceberg::table::Table;
use iceberg::TableCreation;
use iceberg_cdc::catalog::Catalog;
use iceberg_cdc::config::Config;
use iceberg_cdc::sink::iceberg::{files, rowdelta::RowDelta};

pub const CHUNK: usize = 250_000;

pub fn schema() -> Schema {
    Schema::builder()
        .with_identifier_field_ids([1])
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(2, "customer", Type::Primitive(PrimitiveType::String)).into(),
            NestedField::optional(3, "amount", Type::Primitive(PrimitiveType::Decimal { precision: 12, scale: 2 })).into(),
            NestedField::optional(4, "updated_at", Type::Primitive(PrimitiveType::Timestamptz)).into(),
            NestedField::optional(5, "quantity", Type::Primitive(PrimitiveType::Int)).into(),
            NestedField::optional(6, "status", Type::Primitive(PrimitiveType::String)).into(),
        ])
        .build()
        .unwrap()
}

pub fn batch(table: &Table, ids: impl Iterator<Item = i64>, version: i64) -> RecordBatch {
    let ids: Vec<i64> = ids.collect();
    let s = Arc::new(iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema()).unwrap());
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids.clone())),
        Arc::new(StringArray::from_iter_values(ids.iter().map(|i| format!("customer-{:08}", i % 100_000)))),
        Arc::new(
            Decimal128Array::from_iter_values(ids.iter().map(|i| (*i as i128 * 37 + version as i128) % 10_000_000))
                .with_precision_and_scale(12, 2)
                .unwrap(),
        ),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(ids.iter().map(|i| 1_700_000_000_000_000 + i * 1_000 + version)).with_timezone("+00:00"),
        ),
        Arc::new(Int32Array::from_iter_values(ids.iter().map(|i| (i % 97) as i32 + version as i32))),
        Arc::new(StringArray::from_iter_values(ids.iter().map(|i| ["new", "paid", "shipped", "done"][(i % 4) as usize]))),
    ];
    RecordBatch::try_new(s, cols).unwrap()
}

/// The benchmark table: the config, the data files the measured snapshot must read, their bytes, and the base
/// snapshot id.
pub struct BenchTable {
    pub config: PathBuf,
    pub files: Vec<String>,
    pub bytes: u64,
    pub base: i64,
}

/// A local hadoop catalog section for [`build_table`].
pub fn hadoop_catalog(dir: &Path) -> String {
    format!("type = \"hadoop\"\nwarehouse = \"{}\"\n", dir.join("wh").display())
}

/// Builds the table in the catalog `catalog` (the body of a `[source.catalog]` section); `extra` is appended to the
/// config (e.g. a `[target]`).
pub async fn build_table(dir: &Path, rows: i64, catalog: &str, extra: &str) -> BenchTable {
    let text = format!("[source]\ntable = \"bench.orders\"\n[source.catalog]\n{catalog}\n[engine]\nread_concurrency = 2\n{extra}");
    let cfg_path = dir.join("bench.toml");
    std::fs::write(&cfg_path, &text).unwrap();
    let cfg = Config::parse(&text).unwrap();
    let catalog = Catalog::connect(&cfg.source.catalog, "source").await.unwrap();
    let creation = TableCreation::builder().name("orders".into()).schema(schema()).format_version(FormatVersion::V2).build();
    let mut table = catalog.create_table("bench.orders", creation).await.unwrap();
    // base data: one data file per chunk
    let mut data_files = Vec::new();
    let mut start = 0;
    while start < rows {
        let end = (start + CHUNK as i64).min(rows);
        data_files.extend(files::write_data(&table, &[batch(&table, start..end, 0)]).await.unwrap());
        start = end;
    }
    let mut paths: Vec<String> = data_files.iter().map(|f| f.file_path().to_string()).collect();
    let mut bytes: u64 = data_files.iter().map(|f| f.file_size_in_bytes()).sum();
    let c = RowDelta::new().add_data_files(data_files).prepare(&table).await.unwrap();
    let base = c.snapshot_id;
    table = catalog.commit(&table, c.requirements, c.updates).await.unwrap();
    // the measured snapshot: update every 10th row, delete every 50th (+1 offset so they do not overlap)
    let updated = (0..rows).step_by(10);
    let deleted: Vec<i64> = (1..rows).step_by(50).collect();
    let keys = batch(&table, updated.clone().chain(deleted.iter().copied()), 0);
    let dels = files::write_equality_deletes(&table, vec![1], &[keys]).await.unwrap();
    let new_rows = files::write_data(&table, &[batch(&table, updated, 1)]).await.unwrap();
    paths.extend(new_rows.iter().map(|f| f.file_path().to_string()));
    bytes += new_rows.iter().chain(&dels).map(|f| f.file_size_in_bytes()).sum::<u64>();
    let c = RowDelta::new().add_delete_files(dels).add_data_files(new_rows).prepare(&table).await.unwrap();
    catalog.commit(&table, c.requirements, c.updates).await.unwrap();
    BenchTable { config: cfg_path, files: paths, bytes, base }
}

pub struct Measure {
    pub wall: f64,
    pub cpu: f64,
    pub rss_mb: f64,
}

/// Runs a child process and measures it with wait4 (CPU time and peak RSS of that child alone).
pub fn measure(cmd: &mut Command) -> Measure {
    measure_with(cmd, std::process::Stdio::null())
}

/// [`measure`] with the child's stdout going to `stdout`.
#[allow(clippy::zombie_processes)] // reaped by wait4 below
pub fn measure_with(cmd: &mut Command, stdout: std::process::Stdio) -> Measure {
    let started = Instant::now();
    let child = cmd.stdout(stdout).stderr(std::process::Stdio::null()).spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(r, pid);
    let wall = started.elapsed().as_secs_f64();
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "benchmark child failed");
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Measure { wall, cpu: tv(ru.ru_utime) + tv(ru.ru_stime), rss_mb: ru.ru_maxrss as f64 / 1024.0 }
}

pub fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

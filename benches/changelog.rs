//! Changelog benchmark: a ≥1M-row table, one merge-on-read snapshot updating 10 % and deleting 2 % of the rows
//! (equality deletes: every older data file must be re-read), `cdc changes` to Parquet, side by side with the raw
//! baseline in the same run: reading the same data files with the arrow-rs Parquet reader and writing the same
//! number of rows with the arrow-rs Parquet writer.
//!
//! `cargo bench --bench changelog [-- --rows N --runs K]`. Prints a Markdown table (copied into README.md).
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

const CDC: &str = env!("CARGO_BIN_EXE_cdc");
const CHUNK: usize = 250_000;

fn schema() -> Schema {
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

fn batch(table: &Table, ids: impl Iterator<Item = i64>, version: i64) -> RecordBatch {
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

/// Returns the config, the data files the measured snapshot must read, their bytes, and the base snapshot id.
async fn build_table(dir: &Path, rows: i64) -> (PathBuf, Vec<String>, u64, i64) {
    let wh = dir.join("wh");
    let text = format!(
        "[source]\ntable = \"bench.orders\"\n[source.catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n[engine]\nread_concurrency = 2\n",
        wh.display()
    );
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
    (cfg_path, paths, bytes, base)
}

struct Measure {
    wall: f64,
    cpu: f64,
    rss_mb: f64,
}

/// Runs a child process and measures it with wait4 (CPU time and peak RSS of that child alone).
#[allow(clippy::zombie_processes)] // reaped by wait4 below
fn measure(cmd: &mut Command) -> Measure {
    let started = Instant::now();
    let child = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
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

/// The raw baseline, run as a child of this bench: read `files` with arrow-rs (2 threads), write `rows` rows.
fn baseline(files: &[String], rows: usize, out: &Path) {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let chunks: Vec<Vec<String>> = files.chunks(files.len().div_ceil(2)).map(|c| c.to_vec()).collect();
    let handles: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            std::thread::spawn(move || {
                let mut kept = Vec::new();
                let mut n = 0usize;
                for f in chunk {
                    let r =
                        ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&f).unwrap()).unwrap().with_batch_size(8192).build().unwrap();
                    for b in r {
                        let b = b.unwrap();
                        n += b.num_rows();
                        kept.push(b);
                    }
                }
                (n, kept)
            })
        })
        .collect();
    let mut batches = Vec::new();
    for h in handles {
        batches.extend(h.join().unwrap().1);
    }
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::ZSTD(parquet::basic::ZstdLevel::try_new(1).unwrap()))
        .build();
    let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(out).unwrap(), batches[0].schema(), Some(props)).unwrap();
    let mut left = rows;
    'outer: loop {
        for b in &batches {
            if left == 0 {
                break 'outer;
            }
            let take = left.min(b.num_rows());
            w.write(&b.slice(0, take)).unwrap();
            left -= take;
        }
    }
    w.close().unwrap();
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--baseline-child") {
        let rows: usize = args[2].parse().unwrap();
        let out = PathBuf::from(&args[3]);
        baseline(&args[4..], rows, &out);
        return;
    }
    let get =
        |flag: &str, default: i64| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default);
    let rows = get("--rows", 1_000_000);
    let runs = get("--runs", 5).max(1) as usize;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    // --keep: leave the table behind (for profiling `cdc` alone)
    let _guard = if args.iter().any(|a| a == "--keep") {
        eprintln!("bench: keeping {}", tmp.keep().display());
        None
    } else {
        Some(tmp)
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let t0 = Instant::now();
    let (cfg, files, bytes, base) = rt.block_on(build_table(&root, rows));
    eprintln!("bench: table with {rows} rows ({:.1} MB in {} files) built in {:.1}s", bytes as f64 / 1e6, files.len(), t0.elapsed().as_secs_f64());

    let out = root.join("changes.parquet");
    let mut cdc_runs = Vec::new();
    let mut change_rows = 0usize;
    for _ in 0..runs {
        let base = base.to_string();
        let m = measure(Command::new(CDC).args([
            "changes",
            "--config",
            cfg.to_str().unwrap(),
            "--from-snapshot",
            &base,
            "--format",
            "parquet",
            "--output",
            out.to_str().unwrap(),
        ]));
        cdc_runs.push(m);
    }
    {
        let r = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&out).unwrap()).unwrap();
        change_rows = change_rows.max(r.metadata().file_metadata().num_rows() as usize);
    }
    let me = std::env::current_exe().unwrap();
    let base_out = root.join("baseline.parquet");
    let mut base_runs = Vec::new();
    for _ in 0..runs {
        let mut cmd = Command::new(&me);
        cmd.arg("--baseline-child").arg(change_rows.to_string()).arg(&base_out).args(&files);
        base_runs.push(measure(&mut cmd));
    }
    // rows read = all base rows + the new rows (every data file is re-read because of the equality deletes)
    let rows_read = rows as f64 + (rows as f64 / 10.0).ceil();
    let report = |name: &str, ms: &[Measure]| {
        let mut walls: Vec<f64> = ms.iter().map(|m| m.wall).collect();
        let p50 = pct(&mut walls, 0.5);
        let p95 = pct(&mut walls, 0.95);
        let cpu = ms.iter().map(|m| m.cpu).sum::<f64>() / ms.len() as f64;
        let rss = ms.iter().map(|m| m.rss_mb).fold(0.0, f64::max);
        let cores = 2.0;
        let row = format!(
            "| {name} | {:.0} | {:.1} | {:.0} | {:.1} | {:.2} | {:.1} | {:.0} | {:.2} / {:.2} |",
            rows_read / p50,
            bytes as f64 / 1e6 / p50 / cores,
            rows_read / p50 / cores,
            bytes as f64 / 1e6 / p50,
            cpu,
            cpu / (bytes as f64 / 1e9),
            rss,
            p50,
            p95
        );
        (row, p50)
    };
    let (cdc_row, cdc_p50) = report("`cdc changes` → Parquet", &cdc_runs);
    let (base_row, base_p50) = report("raw arrow-rs read + write (baseline)", &base_runs);
    println!("\nWorkload: {rows} rows in {} files ({:.1} MB), one snapshot updating {} and deleting {} rows by equality deletes → {change_rows} change rows; {runs} runs each, 2 cores.\n", files.len(), bytes as f64 / 1e6, rows / 10, rows / 50);
    println!("| run | rows/s | MB/s per core | rows/s per core | MB/s | CPU s | CPU s per GB | peak RSS MB | p50 / p95 s |");
    println!("|---|---|---|---|---|---|---|---|---|");
    println!("{cdc_row}");
    println!("{base_row}");
    println!("\n`cdc` reaches {:.0} % of the raw baseline's throughput.", 100.0 * base_p50 / cdc_p50);
}

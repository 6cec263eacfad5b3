//! Changelog benchmark: a ≥1M-row table, one merge-on-read snapshot updating 10 % and deleting 2 % of the rows
//! (equality deletes: every older data file must be re-read), `cdc changes` to Parquet, side by side with the raw
//! baseline in the same run: reading the same data files with the arrow-rs Parquet reader and writing the same
//! number of rows with the arrow-rs Parquet writer.
//!
//! `cargo bench --bench changelog [-- --rows N --runs K --compare OTHER_CDC_BINARY]`. Prints a Markdown table (copied
//! into README.md); `--compare` runs another build of `cdc` alternately with this one, for a before/after in one sitting.
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::{build_table, hadoop_catalog, measure, pct, BenchTable, Measure};

const CDC: &str = env!("CARGO_BIN_EXE_cdc");
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
    let BenchTable { config: cfg, files, bytes, base } = rt.block_on(build_table(&root, rows, &hadoop_catalog(&root), ""));
    eprintln!("bench: table with {rows} rows ({:.1} MB in {} files) built in {:.1}s", bytes as f64 / 1e6, files.len(), t0.elapsed().as_secs_f64());

    // --compare BIN: another build of `cdc` (say, the one before a change), run alternately with this one
    let compare = args.iter().position(|a| a == "--compare").and_then(|i| args.get(i + 1)).cloned();
    let out = root.join("changes.parquet");
    let mut cdc_runs = Vec::new();
    let mut compare_runs = Vec::new();
    let mut change_rows = 0usize;
    for _ in 0..runs {
        let base = base.to_string();
        let changes = |bin: &str| {
            measure(Command::new(bin).args([
                "changes",
                "--config",
                cfg.to_str().unwrap(),
                "--from-snapshot",
                &base,
                "--format",
                "parquet",
                "--output",
                out.to_str().unwrap(),
            ]))
        };
        cdc_runs.push(changes(CDC));
        if let Some(bin) = &compare {
            compare_runs.push(changes(bin));
        }
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
    let compare_row = compare.as_ref().map(|bin| report(&format!("`cdc changes` → Parquet, build `{bin}`"), &compare_runs).0);
    println!("\nWorkload: {rows} rows in {} files ({:.1} MB), one snapshot updating {} and deleting {} rows by equality deletes → {change_rows} change rows; {runs} runs each, 2 cores.\n", files.len(), bytes as f64 / 1e6, rows / 10, rows / 50);
    println!("| run | rows/s | MB/s per core | rows/s per core | MB/s | CPU s | CPU s per GB | peak RSS MB | p50 / p95 s |");
    println!("|---|---|---|---|---|---|---|---|---|");
    println!("{cdc_row}");
    if let Some(row) = compare_row {
        println!("{row}");
    }
    println!("{base_row}");
    println!("\n`cdc` reaches {:.0} % of the raw baseline's throughput.", 100.0 * base_p50 / cdc_p50);
}

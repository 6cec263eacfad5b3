//! Object-store benchmark: `cdc sync` of the benchmark change set (a 1 M-row table, one snapshot updating 10 % and
//! deleting 2 % of the rows by equality deletes, so every data file is re-read) into a new target, with the warehouse
//! on local disk and on the GCS emulator (fake-gcs-server on 127.0.0.1), in the same run.
//!
//! Reports wall time, CPU seconds, CPU·s per GB of source files read, peak RSS, and the object-store traffic the run
//! reports (`cdc sync --json`): GET requests and bytes read per byte of the files the snapshot involves (object stores
//! reward few, large, ranged reads).
//!
//! Needs the emulator from `scripts/setup-peers.sh`. `cargo bench --bench object_store [-- --rows N --runs K]`.
mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{build_table, measure_with, pct, BenchTable, Measure};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const CDC: &str = env!("CARGO_BIN_EXE_cdc");
const BUCKET: &str = "bench";

fn sql_catalog(dir: &Path, warehouse: &str, extra: &str) -> String {
    format!("type = \"sql\"\nwarehouse = \"{warehouse}\"\nuri = \"sqlite:{}/catalog.db\"\n{extra}", dir.display())
}

struct Run {
    m: Measure,
    read_requests: u64,
    read_bytes: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let get =
        |flag: &str, default: i64| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default);
    let rows = get("--rows", 1_000_000);
    let runs = get("--runs", 3).max(1) as usize;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let gcs_state = root.join("gcs");
    let out = Command::new("bash").arg(format!("{ROOT}/scripts/fake-gcs.sh")).arg("start").arg(&gcs_state).arg(BUCKET).output().unwrap();
    assert!(out.status.success(), "the GCS emulator did not start (run scripts/setup-peers.sh): {}", String::from_utf8_lossy(&out.stderr));
    let gcs = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let stop = || {
        let _ = Command::new("bash").arg(format!("{ROOT}/scripts/fake-gcs.sh")).arg("stop").arg(&gcs_state).status();
    };

    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut lines = Vec::new();
    for (label, dir, warehouse, props) in [
        ("local disk", root.join("local"), root.join("local").join("wh").display().to_string(), String::new()),
        ("GCS emulator", root.join("gcs-wh"), format!("gs://{BUCKET}/wh"), format!("\"gcs.service.path\" = \"{gcs}\"\n\"gcs.no-auth\" = \"true\"\n")),
    ] {
        std::fs::create_dir_all(&dir).unwrap();
        let catalog = sql_catalog(&dir, &warehouse, &props);
        let BenchTable { config, bytes, base, files } = rt.block_on(build_table(&dir, rows, &catalog, ""));
        let text = std::fs::read_to_string(&config).unwrap();
        let mut results = Vec::new();
        for i in 0..runs {
            let cfg = dir.join(format!("run-{i}.toml"));
            std::fs::write(&cfg, format!("{text}\n[target]\ntable = \"replica.orders_{i}\"\n[target.catalog]\n{catalog}")).unwrap();
            let json = dir.join(format!("run-{i}.json"));
            let mut cmd = Command::new(CDC);
            cmd.args(["sync", "--json", "--from-snapshot", &base.to_string(), "--config", cfg.to_str().unwrap()]);
            let m = measure_to(&mut cmd, &json);
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
            let os = &v["object_store"];
            results.push(Run { m, read_requests: os["read_requests"].as_u64().unwrap_or(0), read_bytes: os["read_bytes"].as_u64().unwrap_or(0) });
        }
        let mut walls: Vec<f64> = results.iter().map(|r| r.m.wall).collect();
        let p50 = pct(&mut walls, 0.5);
        let cpu = results.iter().map(|r| r.m.cpu).sum::<f64>() / runs as f64;
        let rss = results.iter().map(|r| r.m.rss_mb).fold(0.0, f64::max);
        let last = results.last().unwrap();
        let traffic = if last.read_requests == 0 {
            "— (local files)".to_string()
        } else {
            format!("{} GETs, {:.2} B read per B", last.read_requests, last.read_bytes as f64 / bytes as f64)
        };
        lines.push(format!("| {label} | {p50:.2} | {cpu:.2} | {:.1} | {rss:.0} | {traffic} |", cpu / (bytes as f64 / 1e9)));
        eprintln!("bench: {label}: {} files, {:.1} MB involved", files.len(), bytes as f64 / 1e6);
    }
    stop();
    println!("\nWorkload: `cdc sync` of one snapshot over {rows} rows (updates 10 %, deletes 2 % by equality deletes) into a new target in the same catalog; {runs} runs each, 2 cores.\n");
    println!("| warehouse | wall p50 s | CPU s | CPU s per GB | peak RSS MB | object-store reads |");
    println!("|---|---|---|---|---|---|");
    for l in lines {
        println!("{l}");
    }
}

/// [`measure`] with the child's stdout going to `path`.
fn measure_to(cmd: &mut Command, path: &Path) -> Measure {
    measure_with(cmd, Stdio::from(std::fs::File::create(path).unwrap()))
}

//! Iceberg → Kafka benchmark: `cdc sync` with a `[kafka]` sink publishing the benchmark table's history (the 1 M-row
//! insert snapshot, then one snapshot updating 10 % and deleting 2 % by equality deletes) to a local broker (Kafka
//! 4.1 in KRaft mode, `scripts/kafka.sh`), exactly once (transactions), in both formats.
//!
//! Reports messages/s and MB/s (per core), CPU·s per GB of source files read, peak RSS, wall time.
//! Needs the broker from `scripts/setup-peers.sh`. `cargo bench --bench kafka [-- --rows N] [--baseline PATH]...`:
//! each `--baseline` binary (an older build of `cdc`) runs the same work in the same sitting, alternating with this
//! build per format (each to a topic of its own), so that a change is measured against what it replaced.
mod common;

use std::process::{Command, Stdio};

use common::{build_table, hadoop_catalog, measure_with, BenchTable};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const CDC: &str = env!("CARGO_BIN_EXE_cdc");

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let get =
        |flag: &str, default: i64| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default);
    let rows = get("--rows", 1_000_000);
    let mut binaries = vec![CDC.to_string()];
    binaries.extend(args.windows(2).filter(|w| w[0] == "--baseline").map(|w| w[1].clone()));
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let state = root.join("kafka");
    let out = Command::new("bash").arg(format!("{ROOT}/scripts/kafka.sh")).arg("start").arg(&state).output().unwrap();
    assert!(out.status.success(), "Kafka did not start (run scripts/setup-peers.sh): {}", String::from_utf8_lossy(&out.stderr));
    let bootstrap = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let BenchTable { config, files, bytes, .. } = rt.block_on(build_table(root, rows, &hadoop_catalog(root), ""));
    let text = std::fs::read_to_string(&config).unwrap();
    // every data file is read for the insert snapshot, and again for the equality-deleted one
    let source_bytes: u64 = files.iter().map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0)).sum::<u64>() + bytes;
    let mut lines = Vec::new();
    for format in ["json", "debezium"] {
        for (n, bin) in binaries.iter().enumerate() {
            let name = format!("{format}-{n}");
            let cfg = root.join(format!("{name}.toml"));
            std::fs::write(
                &cfg,
                format!("{text}\n[kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopic = \"bench-{name}\"\nformat = \"{format}\"\ninitial = \"earliest\"\ntransactional_id = \"bench-{name}\"\nprogress_topic = \"bench-{name}-progress\"\nproperties = {{ \"compression.type\" = \"lz4\", \"linger.ms\" = \"20\" }}\n"),
            )
            .unwrap();
            let json = root.join(format!("{name}.json"));
            let m = measure_with(
                Command::new(bin).args(["sync", "--json", "--config", cfg.to_str().unwrap()]),
                Stdio::from(std::fs::File::create(&json).unwrap()),
            );
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
            let changes = v["inserts"].as_u64().unwrap_or(0) + v["deletes"].as_u64().unwrap_or(0) + v["updates"].as_u64().unwrap_or(0);
            let cores = 2.0;
            let build = if n == 0 { "this build".to_string() } else { format!("baseline {bin}") };
            lines.push(format!(
                "| {format} | {build} | {changes} | {:.0} | {:.0} | {:.1} | {:.2} | {:.1} | {:.0} | {:.2} |",
                changes as f64 / m.wall,
                changes as f64 / m.wall / cores,
                source_bytes as f64 / 1e6 / m.wall / cores,
                m.cpu,
                m.cpu / (source_bytes as f64 / 1e9),
                m.rss_mb,
                m.wall
            ));
        }
    }
    let _ = Command::new("bash").arg(format!("{ROOT}/scripts/kafka.sh")).arg("stop").arg(&state).status();
    println!(
        "\nWorkload: {rows} rows inserted, then 10 % updated and 2 % deleted (equality deletes), published from the first snapshot ({:.1} MB of source files read); one broker on the same 2 cores.\n",
        source_bytes as f64 / 1e6
    );
    println!("| format | build | messages | messages/s | messages/s per core | source MB/s per core | CPU s | CPU s per GB | peak RSS MB | wall s |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for l in lines {
        println!("{l}");
    }
}

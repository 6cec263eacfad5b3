//! Long-run bench: what a target looks like after thousands of streaming commits, with and without maintenance.
//!
//! A source (the quickstart's sqlite table) commits an insert, an update and — every third commit — a delete; the
//! applier follows it commit by commit (`sink::open` + `pipeline::run_sync` with `snapshots_per_commit = 1`: what
//! the service does at a short `commit_interval`) into a filesystem target. Every 50 commits the source's owner
//! maintains the source (`cdc maintain` on it: files compacted, manifests merged, snapshots beyond the newest 10
//! expired), so that the source's own growth does not mask the target's. Three runs in the same sitting:
//! - **on**: the defaults (manifest merging, compaction and expiry after commits) with `snapshot_retention = "5s"`,
//!   `retain_snapshots = 10` — a retention window that fills within the run;
//! - **no compaction**: the same with `compact = false` — the baseline compaction's latency cost is measured against;
//! - **off**: `merge_manifests = false`, `expire_snapshots = false`, `compact = false` (metadata files stay bounded
//!   in all three: targets the applier creates delete old ones after each commit).
//!
//! Every `--every` commits it records: the metadata directory's bytes, the current metadata file's bytes, the
//! current snapshot's manifests, the live delete files, and the time `cdc`'s own reader takes to read the whole
//! target (iceberg-rust 0.10's scan stalls on tables with hundreds of delete files); per commit, the sync's wall
//! time (load, scan, write, commit, maintenance). After the last commit the source goes quiet and the sink rests as
//! the service lets it after `compact_idle_after` (`Sink::rest`, polled until done): the target's shape at rest. Prints Markdown, writes
//! `benches/results/maintenance.csv` and `benches/results/maintenance.svg` (both copied into README.md).
//!
//! `cargo bench --bench maintenance [-- --commits 2000 --every 100 --modes on,no-compaction,off,position --name maintenance
//! --window 100 --keep DIR]` (`--window`: how many commits the first and last columns compare; `position`: maintenance on, `delete_mode = "position"`; `--keep`: the targets stay in `DIR/target-<mode>`,
//! and as they were before resting in `DIR/target-<mode>-streaming`
//! for `benches/spark_reads.py DIR`, Spark's read times against a compacted copy).
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use iceberg_cdc::catalog::Catalog;
use iceberg_cdc::config::Config;
use iceberg_cdc::quickstart;

const CDC: &str = env!("CARGO_BIN_EXE_cdc");

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One sample of the target's shape.
#[derive(Clone, Debug)]
struct Sample {
    commit: usize,
    metadata_dir_bytes: u64,
    metadata_file_bytes: u64,
    manifests: usize,
    delete_files: u64,
    read_seconds: f64,
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map(|es| es.flatten().filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum()).unwrap_or(0)
}

async fn sample(cfg: &Config, target: &Catalog, table_dir: &Path, commit: usize) -> Sample {
    let t = target.load_table("replica.orders").await.unwrap();
    let meta = t.metadata();
    let head = meta.current_snapshot().unwrap();
    let manifests = t.manifest_list_reader(head).load().await.unwrap().entries().len();
    let delete_files = head.summary().additional_properties.get("total-delete-files").and_then(|v| v.parse().ok()).unwrap_or(0);
    let current = t.metadata_location().map(|l| std::fs::metadata(l.trim_start_matches("file:")).map(|m| m.len()).unwrap_or(0)).unwrap_or(0);
    let started = Instant::now();
    let rows = iceberg_cdc::pipeline::count_live_rows(cfg, &t).await.unwrap();
    assert!(rows > 0);
    Sample {
        commit,
        metadata_dir_bytes: dir_bytes(&table_dir.join("metadata")),
        metadata_file_bytes: current,
        manifests,
        delete_files,
        read_seconds: started.elapsed().as_secs_f64(),
    }
}

fn seconds(w: &[Sync]) -> Vec<f64> {
    w.iter().map(|s| s.seconds).collect()
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// One sync's wall time and the maintenance it did in it (snapshots expired, seconds compacting, manifests merged).
#[derive(Clone, Copy, Debug, Default)]
struct Sync {
    seconds: f64,
    expired: u64,
    compact_seconds: f64,
    manifests_merged: u64,
}

/// Runs `commits` source commits, each followed by a sync, then lets the sink rest; returns the samples, each sync and
/// the target at rest (`keep`: a copy of the target before resting stays beside it).
async fn run(dir: &Path, name: &str, extra: &str, commits: usize, every: usize, keep: bool) -> (Vec<Sample>, Vec<Sync>, Rested) {
    let qs = dir.join(format!("qs-{name}"));
    let out = Command::new(CDC).args(["quickstart", "--changes-only", "--dir", qs.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let wh = qs.join("warehouse");
    let tw = dir.join(format!("target-{name}"));
    let text = format!(
        "[source]\ntable = \"{}\"\n[source.catalog]\ntype = \"sql\"\nwarehouse = \"{}\"\n\n[target]\ntable = \"replica.orders\"\n\
         snapshots_per_commit = 1\n{extra}\n[target.catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n",
        quickstart::TABLE,
        wh.display(),
        tw.display()
    );
    let cfg = Config::parse(&text).unwrap();
    let source = Catalog::connect(&cfg.source.catalog, "source").await.unwrap();
    let target = Catalog::connect(&cfg.targets().next().unwrap().catalog, "target").await.unwrap();
    let mut table = source.load_table(quickstart::TABLE).await.unwrap();
    let mut sinks = iceberg_cdc::sink::open(&cfg, "bench", iceberg_cdc::sink::Lifetime::LongRunning).await.unwrap();
    iceberg_cdc::pipeline::run_sync(&cfg, &mut sinks, None, None, |_| {}).await.unwrap();
    let table_dir = tw.join("replica").join("orders");
    // the source is maintained by its owner too (`cdc maintain` on it: compacted, manifests merged, snapshots expired), so that
    // a growing source does not hide what the target's maintenance does to commit latency
    let owner: iceberg_cdc::config::TargetConfig = toml::from_str(&format!(
        "table = \"{}\"\nsnapshot_retention = \"0s\"\nretain_snapshots = 10\norphan_grace = \"1h\"\n\
         [catalog]\ntype = \"sql\"\nwarehouse = \"{}\"\n",
        quickstart::TABLE,
        wh.display()
    ))
    .unwrap();
    let (mut samples, mut seconds) = (Vec::new(), Vec::new());
    for n in 1..=commits {
        let i = n as i64;
        let deletes: Vec<i64> = if n % 3 == 0 { vec![100_000 + i - 2] } else { vec![] };
        table =
            quickstart::commit_changes(&source, &table, &[(100_000 + i, "bench", i as i128), (1 + i % 8, "upd", i as i128)], &deletes).await.unwrap();
        let started = Instant::now();
        let mut sync = Sync::default();
        iceberg_cdc::pipeline::run_sync(&cfg, &mut sinks, None, None, |r| {
            sync.expired += r.stats.maintenance.snapshots_expired;
            sync.compact_seconds += r.stats.maintenance.compact_seconds;
            sync.manifests_merged += r.stats.maintenance.manifests_merged;
        })
        .await
        .unwrap();
        sync.seconds = started.elapsed().as_secs_f64();
        seconds.push(sync);
        if n % 50 == 0 {
            iceberg_cdc::sink::iceberg::maintain::maintain(&source, &owner, 256 << 20).await.unwrap();
            table = source.load_table(quickstart::TABLE).await.unwrap();
        }
        if n % every == 0 || n == 1 {
            samples.push(sample(&cfg, &target, &table_dir, n).await);
        }
    }
    // the source goes quiet: what the service does once `compact_idle_after` has passed. The state before stays
    // readable in `target-<name>-streaming` (its metadata points at this target's files, which resting keeps).
    if keep {
        let copy = dir.join(format!("target-{name}-streaming"));
        let _ = std::fs::remove_dir_all(&copy);
        assert!(Command::new("cp").arg("-a").arg(&tw).arg(&copy).status().unwrap().success());
    }
    let started = Instant::now();
    let mut passes = 0;
    loop {
        // a full poll: the sink reloads the target and collects what finished
        iceberg_cdc::pipeline::run_sync(&cfg, &mut sinks, None, None, |_| {}).await.unwrap();
        let mut working = false;
        for s in sinks.iter_mut() {
            let u = s.upkeep().expect("an Iceberg target has upkeep");
            u.take_maintenance();
            working |= u.rest().await.unwrap() == iceberg_cdc::sink::Rest::Working;
        }
        if !working {
            break;
        }
        passes += 1;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let rest = Rested { seconds: started.elapsed().as_secs_f64(), passes, sample: sample(&cfg, &target, &table_dir, commits).await };
    (samples, seconds, rest)
}

/// The target after the source went quiet and the sink rested (see `Sink::rest`).
struct Rested {
    /// Wall time until the sink was done resting.
    seconds: f64,
    /// Polls the rest took while working.
    passes: usize,
    sample: Sample,
}

/// A chart's title and what it plots of a sample.
type Chart<'a> = (&'a str, &'a dyn Fn(&Sample) -> f64);

/// One line of a chart: name, colour, points.
type Series<'a> = (&'a str, &'a str, Vec<(f64, f64)>);

/// A line chart of `series` as SVG.
fn chart(title: &str, unit: &str, series: &[Series], x: (f64, f64), y: (f64, f64), at: (f64, f64)) -> String {
    let (w, h) = (420.0, 240.0);
    let (ox, oy) = at;
    let px = |v: f64| ox + 50.0 + (v - x.0) / (x.1 - x.0).max(1e-9) * (w - 70.0);
    let py = |v: f64| oy + h - 30.0 - (v - y.0) / (y.1 - y.0).max(1e-9) * (h - 60.0);
    let mut s = String::new();
    let _ = write!(s, r#"<text x="{}" y="{}" font-size="13" font-weight="bold">{title}</text>"#, ox + 50.0, oy + 16.0);
    let _ = write!(s, r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#, px(x.0), py(y.0), px(x.1), py(y.0));
    let _ = write!(s, r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#, px(x.0), py(y.0), px(x.0), py(y.1));
    let _ = write!(s, r#"<text x="{}" y="{}" font-size="10" text-anchor="end">{:.0}</text>"#, px(x.0) - 4.0, py(y.1) + 4.0, y.1);
    let _ = write!(s, r#"<text x="{}" y="{}" font-size="10" text-anchor="end">0</text>"#, px(x.0) - 4.0, py(y.0));
    let _ = write!(s, r#"<text x="{}" y="{}" font-size="10" text-anchor="end">{:.0} commits</text>"#, px(x.1), py(y.0) + 14.0, x.1);
    let _ = write!(s, r#"<text x="{}" y="{}" font-size="10">{unit}</text>"#, px(x.0) + 4.0, py(y.1) + 4.0);
    for (k, (name, colour, pts)) in series.iter().enumerate() {
        let path: Vec<String> = pts.iter().map(|(a, b)| format!("{:.1},{:.1}", px(*a), py(*b))).collect();
        let _ = write!(s, r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#, path.join(" "));
        let _ = write!(s, r#"<text x="{}" y="{}" font-size="11" fill="{colour}">{name}</text>"#, ox + 70.0 + 110.0 * k as f64, oy + 34.0);
    }
    s
}

#[tokio::main]
async fn main() {
    let commits = arg("--commits", 2000) as usize;
    let every = arg("--every", 100) as usize;
    let temp = tempfile::tempdir().unwrap();
    // `--keep DIR`: the run's sources and targets stay in DIR (for `benches/spark_reads.py DIR`)
    let kept = std::env::args().skip_while(|a| a != "--keep").nth(1).map(std::path::PathBuf::from);
    let keep = kept.is_some();
    let root = kept.unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(&root).unwrap();
    // (name, colour, target settings)
    let all = [
        ("on", "#1b7f3b", "snapshot_retention = \"5s\"\nretain_snapshots = 10"),
        ("no compaction", "#d08000", "snapshot_retention = \"5s\"\nretain_snapshots = 10\ncompact = false"),
        ("off", "#b22", "merge_manifests = false\nexpire_snapshots = false\ncompact = false"),
        ("position", "#2458b3", "snapshot_retention = \"5s\"\nretain_snapshots = 10\ndelete_mode = \"position\""),
    ];
    // `--modes on,position` (names with `-` for spaces); default: the first three. `--name` names the result files.
    let args: Vec<String> = std::env::args().collect();
    let flag = |f: &str| args.iter().position(|a| a == f).and_then(|i| args.get(i + 1)).cloned();
    let chosen = flag("--modes").unwrap_or_else(|| "on,no-compaction,off".into());
    let modes: Vec<_> = all.iter().filter(|(n, _, _)| chosen.split(',').any(|c| c == n.replace(' ', "-"))).collect();
    let out_name = flag("--name").unwrap_or_else(|| "maintenance".into());
    let mut runs = Vec::new();
    for &(name, colour, extra) in modes {
        let (samples, secs, rested) = run(&root, &name.replace(' ', "-"), extra, commits, every, keep).await;
        runs.push((name, colour, samples, secs, rested));
    }

    let mode_names: Vec<&str> = runs.iter().map(|r| r.0).collect();
    println!("### {commits} streaming commits into a filesystem target: {}\n", mode_names.join(", "));
    // `--window N`: the commits the first and last columns take (100; a P99 of 100 syncs is their worst two, so long
    // runs compare wider windows too)
    let w = flag("--window").and_then(|v| v.parse::<usize>().ok()).unwrap_or(100).max(1);
    let window = |v: &[Sync], last: bool| if last { v[v.len().saturating_sub(w)..].to_vec() } else { v[..v.len().min(w)].to_vec() };
    let header: Vec<String> = runs.iter().map(|r| format!("{}: first {w} | {}: last {w}", r.0, r.0)).collect();
    println!("| | {} |\n|---|{}", header.join(" | "), "---:|".repeat(2 * runs.len()));
    // the tail, taken apart: which syncs expired or compacted inline, and the P99 of those that did neither
    type Cell = dyn Fn(&[Sync]) -> String;
    let cells: [(&str, &Cell); 5] = [
        ("sync per commit P50 (s)", &|w| format!("{:.3}", pct(&seconds(w), 0.5))),
        ("sync per commit P99 (s)", &|w| format!("{:.3}", pct(&seconds(w), 0.99))),
        ("syncs that expired / compacted (or collected a background compaction)", &|w| {
            format!("{} / {}", w.iter().filter(|s| s.expired > 0).count(), w.iter().filter(|s| s.compact_seconds > 0.0).count())
        }),
        ("P99 of the other syncs (s)", &|w| {
            let rest: Vec<Sync> = w.iter().filter(|s| s.expired == 0 && s.compact_seconds == 0.0).copied().collect();
            if rest.is_empty() {
                "-".into()
            } else {
                format!("{:.3}", pct(&seconds(&rest), 0.99))
            }
        }),
        ("P99 of the syncs that expired (s)", &|w| {
            let e: Vec<f64> = w.iter().filter(|s| s.expired > 0).map(|s| s.seconds).collect();
            if e.is_empty() {
                "-".into()
            } else {
                format!("{:.3}", pct(&e, 0.99))
            }
        }),
    ];
    for (label, f) in cells {
        let row: Vec<String> = runs.iter().map(|r| format!("{} | {}", f(&window(&r.3, false)), f(&window(&r.3, true)))).collect();
        println!("| {label} | {} |", row.join(" | "));
    }
    let last: Vec<Sample> = runs.iter().map(|r| r.2.last().unwrap().clone()).collect();
    let names: Vec<&str> = runs.iter().map(|r| r.0).collect();
    println!("\n| after {commits} commits | {} |\n|---|{}", names.join(" | "), "---:|".repeat(runs.len()));
    let row = |label: &str, f: &dyn Fn(&Sample) -> String| println!("| {label} | {} |", last.iter().map(f).collect::<Vec<_>>().join(" | "));
    row("metadata directory", &|x| format!("{:.1} MB", x.metadata_dir_bytes as f64 / 1e6));
    row("current metadata file", &|x| format!("{:.1} KB", x.metadata_file_bytes as f64 / 1e3));
    row("manifests of the current snapshot", &|x| x.manifests.to_string());
    row("live delete files", &|x| x.delete_files.to_string());
    row("full read of the target (cdc's reader)", &|x| format!("{:.3} s", x.read_seconds));
    // the same once the source went quiet and the sink rested (`compact_idle_after`)
    let rested: Vec<&Rested> = runs.iter().map(|r| &r.4).collect();
    let row = |label: &str, f: &dyn Fn(&Rested) -> String| println!("| {label} | {} |", rested.iter().map(|r| f(r)).collect::<Vec<_>>().join(" | "));
    row("at rest: live delete files", &|r| r.sample.delete_files.to_string());
    row("at rest: manifests of the current snapshot", &|r| r.sample.manifests.to_string());
    row("at rest: full read of the target (cdc's reader)", &|r| format!("{:.3} s", r.sample.read_seconds));
    row("at rest: time to rest (polls)", &|r| format!("{:.2} s ({})", r.seconds, r.passes));

    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches").join("results");
    std::fs::create_dir_all(&results).unwrap();
    let mut csv = String::from("mode,commit,metadata_dir_bytes,metadata_file_bytes,manifests,delete_files,read_seconds\n");
    for (mode, _, samples, _, _) in &runs {
        for x in samples {
            let _ = writeln!(
                csv,
                "{mode},{},{},{},{},{},{:.4}",
                x.commit, x.metadata_dir_bytes, x.metadata_file_bytes, x.manifests, x.delete_files, x.read_seconds
            );
        }
    }
    std::fs::write(results.join(format!("{out_name}.csv")), csv).unwrap();
    let xr = (0.0, commits as f64);
    let charts: [Chart; 4] = [
        ("Manifests in the current snapshot", &|x| x.manifests as f64),
        ("Live delete files", &|x| x.delete_files as f64),
        ("Metadata directory (KB)", &|x| x.metadata_dir_bytes as f64 / 1e3),
        ("Full read of the target (ms)", &|x| x.read_seconds * 1e3),
    ];
    let mut svg = String::from(r#"<svg xmlns="http://www.w3.org/2000/svg" width="860" height="500" font-family="sans-serif">"#);
    for (k, (title, f)) in charts.iter().enumerate() {
        let series: Vec<Series> = runs.iter().map(|r| (r.0, r.1, r.2.iter().map(|x| (x.commit as f64, f(x))).collect())).collect();
        let ymax = runs.iter().flat_map(|r| r.2.iter()).map(f).fold(1.0, f64::max);
        svg += &chart(title, "", &series, xr, (0.0, ymax), (430.0 * (k % 2) as f64, 250.0 * (k / 2) as f64));
    }
    svg += "</svg>\n";
    std::fs::write(results.join(format!("{out_name}.svg")), svg).unwrap();
    eprintln!("wrote {}", results.display());
}

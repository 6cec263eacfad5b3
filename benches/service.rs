//! Service benchmark: end-to-end latency and idle cost of `cdc run`.
//!
//! - Latency: a writer commits to the source every `--interval` seconds for `--seconds` while the service follows
//!   it with a 1 s poll into a filesystem target. Latency of a source commit = commit time of the target snapshot
//!   that first contains it − the source snapshot's commit time (both from table metadata, same clock). P50/P95/P99.
//! - Idle: for each count in `--idle-pipelines` (comma-separated), that many caught-up pipelines at poll
//!   `--idle-poll` seconds for `--idle-seconds`: CPU share of one core (from /proc/<pid>/stat), resident memory
//!   (VmRSS, VmHWM), threads and RSS per pipeline. `--baseline PATH` measures another `cdc` binary on the same work
//!   in the same sitting (e.g. an older build).
//! - Mixed (`--mixed IDLE,BUSY`): IDLE caught-up pipelines at poll `--idle-poll` beside BUSY pipelines, each
//!   following its own source (poll 1 s) that a writer commits 200 changed rows to every 500 ms, for
//!   `--mixed-seconds`. Reported: the longest gap between two polls of any idle pipeline (from `cdc_polls` scraped
//!   every `--scrape-every` s, default 2, so ± that; scraping 5 000 pipelines' metrics costs CPU of its own), how
//!   many idle pipelines ever went longer than two poll intervals without a poll, the most loops
//!   `cdc_pipeline_overdue` counted at once, the busy pipelines' latency (P50/P99) and the service's CPU.
//!   `--busy-apart 1` puts the busy targets in a warehouse of their own (else beside the idle ones).
//!
//! - History (`--history N[,N…]`): the cost of following a source by the length of its history, per build (this and
//!   `--baseline`): `--commits` small commits at `--rate` per second replayed by moving the catalog's pointer over
//!   a source of N snapshots with one unmerged manifest each; CPU per target commit and latency. The source is
//!   written by iceberg-rust, which lists snapshots in a hash map's order; `--appending-writer 1` rewrites the
//!   replayed metadata files with snapshots in commit order, as Java and pyiceberg write them (each file's arrays
//!   the previous file's and more).
//!   `--repeat K` runs each build K times per history, alternating, and reports the median run and the range; the
//!   floor line is this process writing the same commits to a fresh table with the same writers and no changelog
//!   (its CPU), and iceberg-rust's parse of the source's newest metadata file. `--history-sources DIR` keeps the
//!   written sources in DIR and uses them again in a later run with the same histories, commits and writer order
//!   (10 000 snapshots take ~10 minutes to write).
//!
//! - Discovery (`--discover TABLES,NAMESPACES`): a sqlite catalog and a hadoop warehouse of TABLES empty tables in
//!   NAMESPACES namespaces; per catalog the time and catalog calls of one listing (median of 5), then `cdc run` with
//!   one pattern pipeline (`**`) over all of them (poll `--idle-poll`): seconds until every table's loop runs, then
//!   CPU and RSS over `--idle-seconds`, as the idle bench reports them for hand-listed pipelines.
//!
//! `cargo bench --bench service [-- --seconds 120 --interval 2 --idle-pipelines 10,1000 --idle-poll 1 --idle-seconds 30
//! --baseline OLD_CDC --history 10,2000 --rate 4 --commits 100 --repeat 1 --appending-writer 0 --history-sources DIR --mixed 5000,5 --mixed-seconds 60 --scrape-every 2 --busy-apart 0]`. Prints Markdown (copied into README.md).
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use iceberg_cdc::catalog::Catalog;
use iceberg_cdc::config::Config;
use iceberg_cdc::quickstart;

const CDC: &str = env!("CARGO_BIN_EXE_cdc");

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `pipelines` pipelines `p<i>` from the quickstart's table into hadoop targets `replica.orders<i>`, polled every
/// `poll_secs`. Targets do not rest (`compact_idle_after = "0s"`): this bench measures polls; a target's rest is one
/// pass per quiet spell, measured by the maintenance bench.
fn service_toml(source_wh: &Path, target_wh: &Path, pipelines: usize, poll_secs: u64) -> String {
    let mut s = format!(
        "[service]\npoll_interval = \"{poll_secs}s\"\nmetrics_address = \"off\"\n\n[catalogs.demo]\ntype = \"sql\"\nwarehouse = \"{}\"\n\n\
         [catalogs.replica]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n",
        source_wh.display(),
        target_wh.display()
    );
    for i in 0..pipelines {
        s += &format!(
            "\n[[pipelines]]\nname = \"p{i}\"\nsource = {{ catalog = \"demo\", table = \"{}\" }}\n\n[[pipelines.sinks]]\ntype = \"iceberg\"\n\
             catalog = \"replica\"\ntable = \"replica.orders{i}\"\ncompact_idle_after = \"0s\"\n",
            quickstart::TABLE
        );
    }
    s
}

/// `n` idle pipelines (as [`service_toml`]) and `busy` pipelines `b<k>`, each from its own quickstart warehouse
/// `busy_wh[k]` into `replica.busy<k>` (in the idle targets' warehouse, or `busy_apart`'s own), polled every second;
/// metrics at `metrics`.
fn mixed_toml(
    source_wh: &Path,
    target_wh: &Path,
    n: usize,
    poll_secs: u64,
    (busy_wh, busy_apart): (&[std::path::PathBuf], Option<&Path>),
    metrics: &str,
) -> String {
    let mut s = service_toml(source_wh, target_wh, n, poll_secs).replace("metrics_address = \"off\"", &format!("metrics_address = \"{metrics}\""));
    let busy_catalog = match busy_apart {
        Some(wh) => {
            s += &format!("\n[catalogs.busyrep]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n", wh.display());
            "busyrep"
        }
        None => "replica",
    };
    for (k, wh) in busy_wh.iter().enumerate() {
        s += &format!(
            "\n[catalogs.busy{k}]\ntype = \"sql\"\nwarehouse = \"{}\"\n\n[[pipelines]]\nname = \"b{k}\"\npoll_interval = \"1s\"\n\
             source = {{ catalog = \"busy{k}\", table = \"{}\" }}\n\n[[pipelines.sinks]]\ntype = \"iceberg\"\ncatalog = \"{busy_catalog}\"\n\
             table = \"replica.busy{k}\"\n",
            wh.display(),
            quickstart::TABLE
        );
    }
    s
}

/// `name{labels} value` lines of `family` in a Prometheus text page, by their `pipeline` label.
fn by_pipeline(page: &str, family: &str) -> std::collections::HashMap<String, f64> {
    page.lines()
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with('{'))
        .filter_map(|l| {
            let p = l.split("pipeline=\"").nth(1)?.split('"').next()?.to_string();
            Some((p, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

async fn scrape(addr: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut sock) = tokio::net::TcpStream::connect(addr).await else { return String::new() };
    let _ = sock.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").await;
    let mut body = String::new();
    let _ = sock.read_to_string(&mut body).await;
    body
}

fn spawn(cdc: &str, cfg: &Path) -> Child {
    Command::new(cdc).args(["run", "--config", cfg.to_str().unwrap()]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()
}

fn stop(mut child: Child) {
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let _ = child.wait();
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // fields 14 and 15 of stat (utime, stime) are 12 and 13 after the command name
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

fn status_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

async fn hadoop_table(wh: &Path, name: &str) -> Option<iceberg::table::Table> {
    let cfg =
        Config::parse(&format!("[source]\ntable = \"{name}\"\n[source.catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n", wh.display())).ok()?;
    Catalog::connect(&cfg.source.catalog, "t").await.ok()?.load_table(name).await.ok()
}

/// Seconds from each source snapshot in `commits` to the first snapshot of `target` whose recorded source sequence
/// number reaches it (commits not applied yet are left out).
fn latencies<'a>(commits: impl IntoIterator<Item = &'a iceberg::spec::SnapshotRef>, target: &iceberg::table::Table) -> Vec<f64> {
    latencies_from(commits.into_iter().map(|s| (s.sequence_number(), s.timestamp_ms())), target)
}

/// Seconds from each (source sequence number, time it became visible in ms) to the first snapshot of `target` whose
/// recorded source sequence number reaches it.
fn latencies_from(commits: impl IntoIterator<Item = (i64, i64)>, target: &iceberg::table::Table) -> Vec<f64> {
    let target_lineage = iceberg_cdc::spec::lineage::main_lineage(target.metadata());
    commits
        .into_iter()
        .filter_map(|(sequence_number, visible_ms)| {
            let hit = target_lineage.iter().find(|t| {
                t.summary()
                    .additional_properties
                    .get(iceberg_cdc::sink::iceberg::progress::SOURCE_SEQUENCE_NUMBER)
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|seq| seq >= sequence_number)
            })?;
            Some((hit.timestamp_ms() - visible_ms) as f64 / 1000.0)
        })
        .collect()
}

/// Waits (up to `limit`) until `name` under the hadoop warehouse `wh` records progress at source snapshot `head` of
/// the source with `uuid`.
async fn wait_caught_up(wh: &Path, name: &str, uuid: &str, head: Option<i64>, limit: Duration, what: &str) {
    let wait = Instant::now();
    while hadoop_table(wh, name).await.and_then(|t| iceberg_cdc::sink::iceberg::progress::read(t.metadata(), uuid)).map(|p| p.source_snapshot_id)
        != head
    {
        assert!(wait.elapsed() < limit, "{what} did not catch up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((p / 100.0) * (sorted.len() - 1) as f64).round() as usize]
}

#[tokio::main]
async fn main() {
    let seconds = arg("--seconds", 120);
    let interval = arg("--interval", 2);
    let args: Vec<String> = std::env::args().collect();
    let text_arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let idle_counts: Vec<usize> =
        text_arg("--idle-pipelines").unwrap_or_else(|| "10".into()).split(',').map(|n| n.trim().parse().expect("--idle-pipelines N[,N…]")).collect();
    let idle_poll = arg("--idle-poll", 1);
    let idle_seconds = arg("--idle-seconds", 30);
    let baseline = text_arg("--baseline");
    let tmp = tempfile::tempdir().unwrap();
    // --keep: leave the tables behind (to profile `cdc` on them alone)
    let (_guard, root) = if args.iter().any(|a| a == "--keep") {
        let kept = tmp.keep();
        eprintln!("bench: keeping {}", kept.display());
        (None, kept)
    } else {
        let root = tmp.path().to_path_buf();
        (Some(tmp), root)
    };
    let dir = root.as_path();
    let qs = dir.join("qs");
    let out = Command::new(CDC).args(["quickstart", "--changes-only", "--dir", qs.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let wh = qs.join("warehouse");
    let scfg = Config::load(&qs.join("cdc.toml")).unwrap();
    let catalog = Catalog::connect(&scfg.source.catalog, "source").await.unwrap();
    let mut table = catalog.load_table(quickstart::TABLE).await.unwrap();

    // --- latency
    let tw = dir.join("replica");
    let cfg = dir.join("latency.toml");
    std::fs::write(&cfg, service_toml(&wh, &tw, 1, 1)).unwrap();
    let child = spawn(CDC, &cfg);
    let uuid = table.metadata().uuid().to_string();
    let caught_up = |t: Option<iceberg::table::Table>, head: Option<i64>| {
        t.and_then(|t| iceberg_cdc::sink::iceberg::progress::read(t.metadata(), &uuid)).map(|p| p.source_snapshot_id) == head
    };
    let start = Instant::now();
    while !caught_up(hadoop_table(&tw, "replica.orders0").await, table.metadata().current_snapshot_id()) {
        assert!(start.elapsed() < Duration::from_secs(60), "bootstrap did not finish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first_measured = table.metadata().current_snapshot_id();
    let started = Instant::now();
    let mut n = 0i64;
    while started.elapsed() < Duration::from_secs(seconds) {
        let t0 = Instant::now();
        n += 1;
        table = quickstart::commit_changes(&catalog, &table, &[(10_000 + n, "bench", n as i128), (1 + n % 8, "upd", n as i128)], &[]).await.unwrap();
        tokio::time::sleep(Duration::from_secs(interval).saturating_sub(t0.elapsed())).await;
    }
    let head = table.metadata().current_snapshot_id();
    let wait = Instant::now();
    while !caught_up(hadoop_table(&tw, "replica.orders0").await, head) {
        assert!(wait.elapsed() < Duration::from_secs(60), "the service did not catch up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop(child);
    let target = hadoop_table(&tw, "replica.orders0").await.unwrap();
    let source_lineage = iceberg_cdc::spec::lineage::main_lineage(table.metadata());
    let measured: Vec<_> = source_lineage.iter().skip_while(|s| Some(s.snapshot_id()) != first_measured).skip(1).collect();
    let mut lat = latencies(measured.iter().copied(), &target);
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("### Service latency (poll 1 s, a source commit every {interval} s for {seconds} s)\n");
    println!("| commits | P50 s | P95 s | P99 s | max s |");
    println!("|---|---|---|---|---|");
    println!(
        "| {} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
        lat.len(),
        percentile(&lat, 50.0),
        percentile(&lat, 95.0),
        percentile(&lat, 99.0),
        lat.last().copied().unwrap_or(f64::NAN)
    );

    // --- idle cost
    let head = table.metadata().current_snapshot_id();
    println!("### Service idle cost (caught-up pipelines, poll {idle_poll} s, measured over {idle_seconds} s)\n");
    println!("| build | pipelines | CPU % of one core | RSS MB | RSS KB per pipeline | peak RSS MB | threads | catch-up s |");
    println!("|---|---|---|---|---|---|---|---|");
    let builds = builds_of(baseline.as_deref());
    for &n in idle_counts.iter().filter(|&&n| n > 0) {
        for (label, cdc) in &builds {
            let tw = dir.join(format!("idle-{label}-{n}"));
            let cfg = dir.join(format!("idle-{label}-{n}.toml"));
            std::fs::write(&cfg, service_toml(&wh, &tw, n, idle_poll)).unwrap();
            let child = spawn(cdc, &cfg);
            let wait = Instant::now();
            for i in 0..n {
                while !caught_up(hadoop_table(&tw, &format!("replica.orders{i}")).await, head) {
                    assert!(wait.elapsed() < Duration::from_secs(600), "idle pipelines did not catch up");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            let catch_up = wait.elapsed().as_secs_f64();
            tokio::time::sleep(Duration::from_secs(2 * idle_poll)).await;
            let pid = child.id();
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
            let (c0, t0) = (cpu_ticks(pid), Instant::now());
            tokio::time::sleep(Duration::from_secs(idle_seconds)).await;
            let (c1, t1) = (cpu_ticks(pid), Instant::now());
            let rss = status_kb(pid, "VmRSS:") as f64 / 1024.0;
            let hwm = status_kb(pid, "VmHWM:") as f64 / 1024.0;
            let threads = status_kb(pid, "Threads:");
            stop(child);
            let cpu = (c1 - c0) as f64 / hz / (t1 - t0).as_secs_f64() * 100.0;
            let per = rss * 1024.0 / n as f64;
            println!("| {label} | {n} | {cpu:.2} | {rss:.1} | {per:.0} | {hwm:.1} | {threads} | {catch_up:.1} |");
        }
    }

    if let Some(histories) = text_arg("--history") {
        let histories: Vec<usize> = histories.split(',').map(|n| n.trim().parse().expect("--history N[,N…]")).collect();
        let rate = arg("--rate", 4);
        let commits = arg("--commits", 100) as usize;
        let appending = arg("--appending-writer", 0) == 1;
        let repeat = arg("--repeat", 1).max(1) as usize;
        let sources = text_arg("--history-sources").map(std::path::PathBuf::from);
        let shape = HistoryShape { rate, commits, appending, repeat };
        history_bench(dir, sources.as_deref(), &histories, shape, &builds_of(baseline.as_deref())).await;
    }

    if let Some(d) = text_arg("--discover") {
        let (tables, namespaces) = d.split_once(',').map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap())).expect("--discover TABLES,NAMESPACES");
        discover_bench(dir, tables, namespaces, idle_poll, idle_seconds).await;
    }

    if let Some(mixed) = text_arg("--mixed") {
        let (idle_n, busy_n) = mixed.split_once(',').map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap())).expect("--mixed IDLE,BUSY");
        let seconds = arg("--mixed-seconds", 60);
        let scrape_every = Duration::from_secs(arg("--scrape-every", 2).max(1));
        let busy_apart = arg("--busy-apart", 0) == 1;
        mixed_bench(dir, &wh, &table, (idle_n, busy_n, busy_apart), idle_poll, seconds, scrape_every).await;
    }
}

/// Discovery of `tables` tables in `namespaces` namespaces (see the module docs).
async fn discover_bench(dir: &Path, tables: usize, namespaces: usize, idle_poll: u64, idle_seconds: u64) {
    println!("### Discovery: {tables} tables in {namespaces} namespaces, one pattern pipeline (`**`), poll {idle_poll} s\n");
    println!("| catalog | list ms (median of 5) | catalog calls | all loops running after s | CPU % of one core | RSS MB | threads |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for kind in ["sql", "hadoop"] {
        let wh = dir.join(format!("discover-{kind}"));
        std::fs::create_dir_all(&wh).unwrap();
        let section = format!("type = \"{kind}\"\nwarehouse = \"{}\"\n", wh.display());
        let cfg = Config::parse(&format!("[source]\ntable = \"a.b\"\n[source.catalog]\n{section}")).unwrap();
        let catalog = Catalog::connect(&cfg.source.catalog, "source").await.unwrap();
        let t0 = Instant::now();
        for i in 0..tables {
            let creation = iceberg::TableCreation::builder().name(format!("t{i}")).schema(quickstart::demo_schema().unwrap()).build();
            catalog.create_table(&format!("ns{}.t{i}", i % namespaces), creation).await.unwrap();
        }
        eprintln!("bench: {tables} {kind} tables created in {:.1}s", t0.elapsed().as_secs_f64());
        let mut times = Vec::new();
        let mut calls = 0;
        for _ in 0..5 {
            let t = Instant::now();
            let (names, c) = catalog.list_tables().await.unwrap();
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(names.len(), tables);
            calls = c;
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let svc = dir.join(format!("discover-{kind}.toml"));
        std::fs::write(
            &svc,
            format!(
                "[service]\npoll_interval = \"{idle_poll}s\"\nmetrics_address = \"127.0.0.1:{port}\"\n\n[catalogs.lake]\n{section}\n\
                 [catalogs.replica]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n\n[[pipelines]]\nname = \"lake\"\n\
                 source = {{ catalog = \"lake\", tables = [\"**\"] }}\n[[pipelines.sinks]]\ntype = \"iceberg\"\ncatalog = \"replica\"\n\
                 table = \"r_{{namespace}}.{{table}}\"\ncompact_idle_after = \"0s\"\n",
                dir.join(format!("discover-{kind}-replica")).display()
            ),
        )
        .unwrap();
        let started = Instant::now();
        let child = spawn(CDC, &svc);
        let running = || {
            let body = std::process::Command::new("curl")
                .args(["-s", &format!("http://127.0.0.1:{port}/metrics")])
                .output()
                .map(|o| o.stdout)
                .unwrap_or_default();
            String::from_utf8_lossy(&body)
                .lines()
                .find(|l| l.starts_with("cdc_pipelines_running "))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        while running() < tables as f64 {
            assert!(started.elapsed() < Duration::from_secs(600), "the discovered loops did not all start");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let up = started.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(2 * idle_poll)).await;
        let pid = child.id();
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let (c0, w0) = (cpu_ticks(pid), Instant::now());
        tokio::time::sleep(Duration::from_secs(idle_seconds)).await;
        let (c1, w1) = (cpu_ticks(pid), Instant::now());
        let (rss, threads) = (status_kb(pid, "VmRSS:") as f64 / 1024.0, status_kb(pid, "Threads:"));
        stop(child);
        let cpu = (c1 - c0) as f64 / hz / (w1 - w0).as_secs_f64() * 100.0;
        println!("| {kind} | {:.1} | {calls} | {up:.1} | {cpu:.2} | {rss:.1} | {threads} |", times[2]);
    }
    println!();
}

/// This build, then `--baseline`'s when given: (label, binary).
fn builds_of(baseline: Option<&str>) -> Vec<(&'static str, String)> {
    std::iter::once(("this", CDC.to_string())).chain(baseline.map(|b| ("baseline", b.to_string()))).collect()
}

/// The history bench's load: `commits` commits replayed at `rate` a second, `appending` (snapshots in commit
/// order), each build run `repeat` times.
#[derive(Clone, Copy)]
struct HistoryShape {
    rate: u64,
    commits: usize,
    appending: bool,
    repeat: usize,
}

/// One service run of the history bench: CPU ms per target commit, target commits, service CPU %, sorted latencies.
struct HistoryRun {
    cpu_ms_per_commit: f64,
    target_commits: usize,
    cpu_percent: f64,
    latencies: Vec<f64>,
}

/// Commits `commits` commits of the history bench's shape to `table` — 50 rows appended, every third commit also 5
/// rows deleted by equality deletes (only once `deletes_from` commits are written) — and returns the metadata
/// location after each.
async fn write_history(
    catalog: &Catalog,
    table: &mut iceberg::table::Table,
    (deletes_from, commits): (usize, usize),
    next_id: &mut i64,
) -> Vec<String> {
    let mut locations = Vec::new();
    for n in 0..commits {
        let rows: Vec<(i64, &str, i128)> = (0..50).map(|i| (*next_id + i, "bench", i as i128)).collect();
        *next_id += 50;
        let deletes: Vec<i64> = if n >= deletes_from && n % 3 == 2 { (0..5).map(|i| *next_id - 100 + i * 7).collect() } else { Vec::new() };
        let b = quickstart::orders_batch(table, &rows).unwrap();
        let mut delta = iceberg_cdc::sink::iceberg::rowdelta::RowDelta::new()
            .add_data_files(iceberg_cdc::sink::iceberg::files::write_data(table, &[b]).await.unwrap());
        if !deletes.is_empty() {
            let doomed: Vec<(i64, &str, i128)> = deletes.iter().map(|&id| (id, "", 0)).collect();
            let d = quickstart::orders_batch(table, &doomed).unwrap();
            delta = delta.add_delete_files(iceberg_cdc::sink::iceberg::files::write_equality_deletes(table, vec![1], &[d]).await.unwrap());
        }
        let c = delta.prepare(table).await.unwrap();
        *table = catalog.commit(table, c.requirements, c.updates).await.unwrap();
        locations.push(table.metadata_location().unwrap().to_string());
    }
    locations
}

/// CPU seconds (user + system) this process has used so far.
fn own_cpu_seconds() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// The sql catalog of the warehouse `wh` (made if missing).
async fn source_catalog(wh: &Path) -> Catalog {
    let cfg =
        Config::parse(&format!("[source]\ntable = \"{}\"\n[source.catalog]\ntype = \"sql\"\nwarehouse = \"{}\"\n", quickstart::TABLE, wh.display()))
            .unwrap();
    std::fs::create_dir_all(wh).unwrap();
    Catalog::connect(&cfg.source.catalog, "source").await.unwrap()
}

/// The source table a former run wrote under `wh` (`--history-sources`).
async fn source_at(wh: &Path) -> (Catalog, iceberg::table::Table) {
    let catalog = source_catalog(wh).await;
    let table = catalog.load_table(quickstart::TABLE).await.unwrap();
    (catalog, table)
}

/// A fresh sql-catalog table of the quickstart's schema under `wh`.
async fn fresh_source(wh: &Path) -> (Catalog, iceberg::table::Table) {
    let catalog = source_catalog(wh).await;
    let schema = quickstart::demo_schema().unwrap();
    let creation = iceberg::TableCreation::builder().name("orders".into()).schema(schema).build();
    let table = catalog.create_table(quickstart::TABLE, creation).await.unwrap();
    (catalog, table)
}

/// The cost of following a source by its history's length (see the module docs): a fresh source of `history`
/// appends (one manifest each, never merged), then `commits` more — 50 rows appended, every third commit also 5
/// rows deleted by equality deletes — all written up front; the catalog's pointer is then moved one commit forward
/// `rate` times a second while a service (poll 250 ms) follows into a new target, so the writer costs the
/// service's cores nothing. Each build runs `repeat` times per history, the builds alternating (and the first of
/// each round alternating) so that a slow spell of the machine falls on both; reported per build: the median run
/// (CPU per target commit, with the range over runs), and per build the ratio of the longest history's median to
/// the shortest's. The floor: the CPU this process spends writing the same `commits` commits to a fresh table with
/// the same writers (iceberg-rust's Parquet and manifest writers, the row-delta commit, the catalog) and no
/// changelog: data file, delete file, manifest, manifest list, metadata — what a target commit cannot go below.
async fn history_bench(dir: &Path, sources: Option<&Path>, histories: &[usize], shape: HistoryShape, builds: &[(&str, String)]) {
    let HistoryShape { rate, commits, appending, repeat } = shape;
    let order = if appending { "snapshots in commit order, as Java and pyiceberg write them" } else { "snapshots in iceberg-rust's hash-map order" };
    let floor = {
        let (catalog, mut table) = fresh_source(&dir.join("history-floor")).await;
        let mut next_id = 0;
        let c0 = own_cpu_seconds();
        write_history(&catalog, &mut table, (0, commits), &mut next_id).await;
        (own_cpu_seconds() - c0) * 1000.0 / commits as f64
    };
    println!(
        "### Following a source by its history's length (poll 250 ms, {commits} commits at {rate}/s: 50 rows appended, every third also 5 deleted; {order}; median of {repeat} runs per build, builds alternating)\n"
    );
    println!("| history (snapshots) | build | target commits | CPU ms per target commit (range) | service CPU % | latency P50 s | P99 s | max s |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    let mut medians: Vec<Vec<f64>> = vec![Vec::new(); builds.len()];
    let mut metadata_files = Vec::new();
    for &history in histories {
        let root = dir.join(format!("history-{history}"));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let wh = sources.map_or_else(|| root.join("warehouse"), |d| d.join(format!("history-{history}-{commits}-{}", u8::from(appending))));
        let kept = wh.join("locations.txt");
        let (catalog, table, locations, written) = match std::fs::read_to_string(&kept) {
            Ok(text) => {
                let (catalog, table) = source_at(&wh).await;
                eprintln!("bench: the source of {history} snapshots from {}", wh.display());
                (catalog, table, text.lines().map(str::to_string).collect::<Vec<_>>(), false)
            }
            Err(_) => {
                let _ = std::fs::remove_dir_all(&wh);
                let (catalog, mut table) = fresh_source(&wh).await;
                let t0 = Instant::now();
                let mut next_id = 0i64;
                let locations = write_history(&catalog, &mut table, (history, history + commits), &mut next_id).await;
                eprintln!("bench: {} source commits written in {:.1}s", history + commits, t0.elapsed().as_secs_f64());
                (catalog, table, locations, true)
            }
        };
        assert_eq!(locations.len(), history + commits, "{} holds another history", wh.display());
        // what reading the newest metadata file costs any reader: its size, and iceberg-rust parsing all of it
        let last = std::fs::read(locations[locations.len() - 1].trim_start_matches("file://")).unwrap();
        let c0 = own_cpu_seconds();
        for _ in 0..10 {
            std::hint::black_box(serde_json::from_slice::<iceberg::spec::TableMetadata>(&last).unwrap());
        }
        metadata_files.push((history, last.len(), (own_cpu_seconds() - c0) * 100.0));
        if appending && written {
            // as Java and pyiceberg write them: snapshots in commit order, each file's arrays the last file's and more
            for loc in &locations[history..] {
                let path = loc.strip_prefix("file://").unwrap_or(loc);
                let mut doc: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
                doc["snapshots"].as_array_mut().unwrap().sort_by_key(|s| s["sequence-number"].as_i64().unwrap());
                std::fs::write(path, serde_json::to_vec(&doc).unwrap()).unwrap();
            }
        }
        if written && sources.is_some() {
            std::fs::write(&kept, locations.join("\n")).unwrap();
        }
        let db = rusqlite::Connection::open(wh.join("catalog.db")).unwrap();
        let point = |loc: &str| {
            db.execute("UPDATE iceberg_tables SET metadata_location = ?1 WHERE table_name = 'orders'", [loc]).unwrap();
        };
        let uuid = table.metadata().uuid().to_string();
        let mut runs: Vec<Vec<HistoryRun>> = (0..builds.len()).map(|_| Vec::new()).collect();
        for round in 0..repeat {
            for k in 0..builds.len() {
                let b = if round % 2 == 0 { k } else { builds.len() - 1 - k };
                let (label, cdc) = &builds[b];
                point(&locations[history - 1]);
                let tw = root.join(format!("target-{label}-{round}"));
                let cfg_path = root.join(format!("service-{label}-{round}.toml"));
                let toml = service_toml(&wh, &tw, 1, 1).replace("poll_interval = \"1s\"", "poll_interval = \"250ms\"");
                std::fs::write(&cfg_path, toml).unwrap();
                let child = spawn(cdc, &cfg_path);
                let start_head = catalog.load_table(quickstart::TABLE).await.unwrap().metadata().current_snapshot_id();
                wait_caught_up(&tw, "replica.orders0", &uuid, start_head, Duration::from_secs(120), "the bootstrap").await;
                let target_before = hadoop_table(&tw, "replica.orders0").await.unwrap().metadata().snapshots().count();
                let pid = child.id();
                let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
                let (c0, w0) = (cpu_ticks(pid), Instant::now());
                let mut visible = Vec::new();
                for (i, loc) in locations[history..].iter().enumerate() {
                    point(loc);
                    visible.push(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64);
                    let due = Duration::from_secs_f64((i + 1) as f64 / rate as f64);
                    tokio::time::sleep(due.saturating_sub(w0.elapsed())).await;
                }
                let head = catalog.load_table(quickstart::TABLE).await.unwrap().metadata().current_snapshot_id();
                wait_caught_up(&tw, "replica.orders0", &uuid, head, Duration::from_secs(600), "the service").await;
                let (c1, w1) = (cpu_ticks(pid), Instant::now());
                stop(child);
                let target = hadoop_table(&tw, "replica.orders0").await.unwrap();
                let target_commits = target.metadata().snapshots().count().saturating_sub(target_before).max(1);
                let source = catalog.load_table(quickstart::TABLE).await.unwrap();
                let lineage = iceberg_cdc::spec::lineage::main_lineage(source.metadata());
                // from the moment the pointer moved (the snapshots were written up front)
                let mut latencies = latencies_from(lineage.iter().skip(history).map(|s| s.sequence_number()).zip(visible), &target);
                latencies.sort_by(|a, b| a.partial_cmp(b).unwrap());
                let cpu = (c1 - c0) as f64 / hz;
                eprintln!("bench: history {history}, {label}, run {round}: {:.1} ms per target commit", cpu * 1000.0 / target_commits as f64);
                runs[b].push(HistoryRun {
                    cpu_ms_per_commit: cpu * 1000.0 / target_commits as f64,
                    target_commits,
                    cpu_percent: cpu / (w1 - w0).as_secs_f64() * 100.0,
                    latencies,
                });
            }
        }
        for (b, (label, _)) in builds.iter().enumerate() {
            let r = &mut runs[b];
            r.sort_by(|x, y| x.cpu_ms_per_commit.partial_cmp(&y.cpu_ms_per_commit).unwrap());
            let (lo, hi) = (r[0].cpu_ms_per_commit, r[r.len() - 1].cpu_ms_per_commit);
            let m = &r[r.len() / 2];
            medians[b].push(m.cpu_ms_per_commit);
            println!(
                "| {history} | {label} | {} | {:.1} ({lo:.1}–{hi:.1}) | {:.1} | {:.2} | {:.2} | {:.2} |",
                m.target_commits,
                m.cpu_ms_per_commit,
                m.cpu_percent,
                percentile(&m.latencies, 50.0),
                percentile(&m.latencies, 99.0),
                m.latencies.last().copied().unwrap_or(f64::NAN)
            );
        }
    }
    println!();
    for (b, (label, _)) in builds.iter().enumerate() {
        if let (Some(first), Some(last)) = (medians[b].first(), medians[b].last()) {
            println!("- {label}: {:.2}× from {} to {} snapshots (medians)", last / first, histories[0], histories[histories.len() - 1]);
        }
    }
    println!("- floor, target side: writing the same {commits} commits to a fresh table with the same writers, no changelog, costs {floor:.1} ms of CPU each (this process)");
    for (history, bytes, ms) in metadata_files {
        println!(
            "- the source's newest metadata file at {history} snapshots: {:.2} MB; iceberg-rust parses all of it in {ms:.1} ms",
            bytes as f64 / 1e6
        );
    }
    println!();
}

/// The mixed run (see the module docs).
async fn mixed_bench(
    dir: &Path,
    wh: &Path,
    source: &iceberg::table::Table,
    (idle_n, busy_n, busy_apart): (usize, usize, bool),
    idle_poll: u64,
    seconds: u64,
    scrape_every: Duration,
) {
    let (idle_uuid, head) = (source.metadata().uuid().to_string(), source.metadata().current_snapshot_id());
    let mut busy_wh = Vec::new();
    let mut writers = Vec::new();
    for k in 0..busy_n {
        let qs = dir.join(format!("busy-qs-{k}"));
        let out = Command::new(CDC).args(["quickstart", "--changes-only", "--dir", qs.to_str().unwrap()]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let cfg = Config::load(&qs.join("cdc.toml")).unwrap();
        let catalog = Catalog::connect(&cfg.source.catalog, "source").await.unwrap();
        let table = catalog.load_table(quickstart::TABLE).await.unwrap();
        busy_wh.push(qs.join("warehouse"));
        writers.push((catalog, table));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let metrics = format!("127.0.0.1:{port}");
    let tw = dir.join("mixed");
    let cfg = dir.join("mixed.toml");
    let busy_tw = if busy_apart { dir.join("mixed-busy") } else { tw.clone() };
    std::fs::write(&cfg, mixed_toml(wh, &tw, idle_n, idle_poll, (&busy_wh, busy_apart.then_some(busy_tw.as_path())), &metrics)).unwrap();
    let child = spawn(CDC, &cfg);
    let wait = Instant::now();
    for i in 0..idle_n {
        wait_caught_up(
            &tw,
            &format!("replica.orders{i}"),
            &idle_uuid,
            head,
            Duration::from_secs(900).saturating_sub(wait.elapsed()),
            "idle pipelines",
        )
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2 * idle_poll)).await;
    // the writers: every 500 ms, 200 changed rows (150 inserts, 50 updates) into each busy source
    let halt = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut handles = Vec::new();
    for (k, (catalog, mut table)) in writers.into_iter().enumerate() {
        let halt = halt.clone();
        handles.push(tokio::spawn(async move {
            let mut n = 0i64;
            let mut commits = Vec::new();
            while !halt.load(std::sync::atomic::Ordering::Relaxed) {
                let t0 = Instant::now();
                n += 1;
                let rows: Vec<(i64, &str, i128)> = (0..150)
                    .map(|j| (1_000_000 * (k as i64 + 1) + n * 1000 + j, "busy", j as i128))
                    .chain((1..=50).map(|j| (j, "upd", n as i128)))
                    .collect();
                table = quickstart::commit_changes(&catalog, &table, &rows, &[]).await.unwrap();
                commits.push(table.metadata().current_snapshot().unwrap().clone());
                tokio::time::sleep(Duration::from_millis(500).saturating_sub(t0.elapsed())).await;
            }
            (table, commits)
        }));
    }
    let pid = child.id();
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (c0, t0) = (cpu_ticks(pid), Instant::now());
    // per idle pipeline: when its poll count last moved, and the longest gap seen
    let mut last: std::collections::HashMap<String, (f64, Instant)> = std::collections::HashMap::new();
    let mut longest: std::collections::HashMap<String, Duration> = std::collections::HashMap::new();
    let mut overdue_max = 0.0f64;
    while t0.elapsed() < Duration::from_secs(seconds) {
        let page = scrape(&metrics).await;
        let now = Instant::now();
        for (p, polls) in by_pipeline(&page, "cdc_polls_total").into_iter().filter(|(p, _)| !p.starts_with('b')) {
            match last.get(&p) {
                Some(&(seen, _)) if seen == polls => {}
                Some(&(_, at)) => {
                    let gap = now - at;
                    let l = longest.entry(p.clone()).or_default();
                    *l = (*l).max(gap);
                    last.insert(p, (polls, now));
                }
                None => {
                    last.insert(p, (polls, now));
                }
            }
        }
        overdue_max = overdue_max.max(by_pipeline(&page, "cdc_pipeline_overdue").values().sum());
        tokio::time::sleep(scrape_every).await;
    }
    // pipelines that never polled again since the first scrape count with the whole run as their gap
    for (p, (_, at)) in &last {
        let l = longest.entry(p.clone()).or_default();
        *l = (*l).max(at.elapsed());
    }
    let (c1, t1) = (cpu_ticks(pid), Instant::now());
    halt.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut lat = Vec::new();
    let mut busy_commits = 0;
    for (k, h) in handles.into_iter().enumerate() {
        let (table, commits) = h.await.unwrap();
        busy_commits += commits.len();
        let uuid = table.metadata().uuid().to_string();
        let name = format!("replica.busy{k}");
        wait_caught_up(&busy_tw, &name, &uuid, table.metadata().current_snapshot_id(), Duration::from_secs(120), &format!("busy pipeline b{k}"))
            .await;
        lat.extend(latencies(&commits, &hadoop_table(&busy_tw, &name).await.unwrap()));
    }
    stop(child);
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let gaps: Vec<f64> = longest.values().map(Duration::as_secs_f64).collect();
    let worst = gaps.iter().copied().fold(0.0, f64::max);
    // a gap is seen between the scrapes at which the count moved: up to one scrape interval longer than it was
    let late = gaps.iter().filter(|g| **g > 2.0 * idle_poll as f64 + scrape_every.as_secs_f64() - 2.0).count();
    let cpu = (c1 - c0) as f64 / hz / (t1 - t0).as_secs_f64() * 100.0;
    println!("\n### {idle_n} idle pipelines (poll {idle_poll} s) beside {busy_n} busy ones ({seconds} s)\n");
    println!("| idle pipelines seen | longest gap between two polls s | idle pipelines with a gap > 2 polls | most loops overdue at once | busy commits | busy latency P50 s | P99 s | CPU % |");
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {worst:.1} | {late} | {overdue_max:.0} | {busy_commits} | {:.2} | {:.2} | {cpu:.1} |",
        last.len(),
        percentile(&lat, 50.0),
        percentile(&lat, 99.0)
    );
}

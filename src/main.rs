use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use iceberg_cdc::config::Config;
use iceberg_cdc::error::{exit, Error};
use iceberg_cdc::output::{self, Format};
use iceberg_cdc::pipeline;
use iceberg_cdc::spec::lineage::{self, Bound};

#[derive(Parser)]
#[command(name = "cdc", version = VERSION, about = "Change data capture for Apache Iceberg tables")]
struct Cli {
    /// Log filter (also RUST_LOG), e.g. `info`, `iceberg_cdc=debug`.
    #[arg(long, global = true, default_value = "warn")]
    log: String,
    /// Log lines as human-readable text or as JSON objects (for journald and log shippers).
    #[arg(long, global = true, value_enum, default_value = "human")]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

/// `cdc --version`: the crate's version and the commit it was built from (`build.rs`).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("CDC_COMMIT"), ")");

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the service: every pipeline of the file, continuously (SIGHUP reloads, SIGTERM stops).
    Run {
        #[arg(long)]
        config: PathBuf,
        /// `i/N`: run only this instance's share of the pipelines (overrides `service.shard`), e.g. the ordinal of a
        /// Kubernetes StatefulSet pod: `--shard "${HOSTNAME##*-}/3"`.
        #[arg(long)]
        shard: Option<String>,
        /// `host:port` of `/metrics`, `/healthz`, `/readyz` (overrides `service.metrics_address`; `off` disables
        /// them): instances of one file on one host need their own.
        #[arg(long)]
        metrics_address: Option<String>,
    },
    /// Every pipeline of a service file with the instance that runs it, its state, lag and last error (asked of the
    /// running instances: the cluster's group members, or the file's metrics address); exit 9 when any is not ok.
    Status {
        #[arg(long)]
        config: PathBuf,
        /// The instance to ask without a `[cluster]` (overrides `service.metrics_address`).
        #[arg(long)]
        metrics_address: Option<String>,
        /// One JSON object per pipeline sink instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Validate a service file and reach every catalog and table; one line per pipeline.
    Check {
        #[arg(long)]
        config: PathBuf,
        /// Only validate the file and list what each pipeline of table patterns matches: no table is loaded (quick
        /// on a lake of thousands of tables).
        #[arg(long)]
        matches_only: bool,
    },
    /// Print the main-branch lineage of the source table.
    Snapshots {
        #[arg(long)]
        config: PathBuf,
        /// One JSON object per snapshot instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the change rows of a snapshot range (start exclusive, end inclusive).
    Changes {
        #[arg(long)]
        config: PathBuf,
        #[command(flatten)]
        range: RangeArgs,
        #[arg(long, value_enum, default_value = "jsonl")]
        format: Format,
        /// Output file (default: stdout). Written atomically.
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Replicate the source range into the target table, exactly once (progress is kept in the target).
    Sync {
        #[arg(long)]
        config: PathBuf,
        #[command(flatten)]
        range: RangeArgs,
        /// Print the summary as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Maintain the target table once: compact data and delete files, rewrite small manifests, expire snapshots
    /// beyond the retention, delete orphan files older than `orphan_grace` (for `cdc sync` run from cron; the
    /// service does all of it on its own, in smaller steps).
    Maintain {
        #[arg(long)]
        config: PathBuf,
        /// Print the summary as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// The embedded default end to end: a demo table (local warehouse + sqlite catalog), its changes, and the service
    /// replicating it while it changes.
    Quickstart {
        /// Where the demo warehouse, cdc.toml and service.toml go.
        #[arg(long, default_value = "cdc-quickstart")]
        dir: PathBuf,
        /// Only build the demo table and print its changes; do not run the service.
        #[arg(long)]
        changes_only: bool,
    },
    /// Print a shell completion script: `cdc completions bash > /usr/share/bash-completion/completions/cdc`.
    Completions { shell: clap_complete::Shell },
    /// Print the man page (roff): `cdc man > /usr/share/man/man1/cdc.1`.
    Man,
}

#[derive(Args)]
struct RangeArgs {
    /// Exclusive start snapshot id (default: from the first snapshot, inclusive).
    #[arg(long, conflicts_with = "from_timestamp")]
    from_snapshot: Option<i64>,
    /// Exclusive start: the last snapshot at or before this time (RFC 3339 or epoch ms).
    #[arg(long)]
    from_timestamp: Option<String>,
    /// Inclusive end snapshot id (default: the current snapshot).
    #[arg(long, conflicts_with = "to_timestamp")]
    to_snapshot: Option<i64>,
    /// Inclusive end: the last snapshot at or before this time (RFC 3339 or epoch ms).
    #[arg(long)]
    to_timestamp: Option<String>,
}

impl RangeArgs {
    fn bounds(&self) -> Result<(Option<Bound>, Option<Bound>), Error> {
        let ts = |s: &Option<String>, flag: &str| -> Result<Option<Bound>, Error> {
            s.as_deref()
                .map(|t| lineage::parse_timestamp(t).map(Bound::TimestampMs).map_err(|e| Error::Config(vec![format!("{flag}: {e}")])))
                .transpose()
        };
        let from = match self.from_snapshot {
            Some(id) => Some(Bound::Snapshot(id)),
            None => ts(&self.from_timestamp, "--from-timestamp")?,
        };
        let to = match self.to_snapshot {
            Some(id) => Some(Bound::Snapshot(id)),
            None => ts(&self.to_timestamp, "--to-timestamp")?,
        };
        Ok((from, to))
    }
}

/// glibc gives each thread that allocates its own arena (up to 8 per core) and keeps what is freed in it: with the
/// runtime's workers, the blocking threads and the writers' tasks that kept ~70 MB more resident than the live heap
/// at 10 M rows (measured: peak RSS 360 → 290 MB, same CPU). Two arenas keep `engine.memory_budget` honest. Set
/// before any thread starts; `MALLOC_ARENA_MAX` in the environment still wins.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only tunes the allocator; called once, before other threads exist.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

fn main() -> ExitCode {
    // Like other Unix filters: a closed pipe (`cdc changes | head`) ends the process quietly.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    limit_malloc_arenas();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::USAGE as u8 } else { 0 });
        }
    };
    // The service logs what it does at info; one-shot commands stay quiet unless asked.
    let default_log = if matches!(cli.cmd, Cmd::Run { .. }) && cli.log == "warn" { "info".to_string() } else { cli.log.clone() };
    let filter = std::env::var("RUST_LOG").unwrap_or(default_log);
    // Colour only for a terminal: journald and log files get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Human => builder.with_ansi(ansi).init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let result = rt.block_on(run(cli.cmd));
    // Loops the service abandoned at its shutdown deadline must not hold the process.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = e.downcast_ref::<Error>().map(Error::exit_code).unwrap_or(exit::INTERNAL);
            eprintln!("error: {}", render(&e));
            ExitCode::from(code as u8)
        }
    }
}

/// `cdc sync` of one table: per commit a line (a progress bar on a terminal), then the run's summary.
async fn sync_one(cfg: &Config, from: Option<Bound>, to: Option<Bound>, json: bool) -> anyhow::Result<()> {
    // On a terminal, long runs show a progress bar (snapshots applied / planned); elsewhere, one line a commit.
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let bar = tty.then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} snapshots {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let (mut rows, mut bytes) = (0u64, 0u64);
    // the destinations first: a config without one fails before anything is read
    let opened = iceberg_cdc::sink::open(cfg, &format!("sync-{}", cfg.source.table), iceberg_cdc::sink::Lifetime::OneShot).await?;
    let mut sinks = iceberg_cdc::sink::testing::PauseBeforeCommit::from_env(opened);
    let summary = pipeline::run_sync(cfg, &mut sinks, from, to, |c| {
        let s = &c.stats;
        if let Some(b) = &bar {
            rows += s.inserts + s.deletes + s.updates;
            bytes += s.bytes;
            b.set_length(c.planned_snapshots as u64);
            b.set_position(c.done_snapshots as u64);
            b.set_message(format!("{rows} rows, {:.1} MB", bytes as f64 / 1e6));
            return;
        }
        eprintln!(
            "cdc: source {}..{} ({} snapshot(s)) -> target snapshot {}: {} insert, {} delete, {} update; {} files, {:.1} MB",
            c.first_source_snapshot,
            c.last_source_snapshot,
            c.source_snapshots,
            c.target_snapshot_id.map(|i| i.to_string()).unwrap_or_else(|| "(already applied)".into()),
            s.inserts,
            s.deletes,
            s.updates,
            s.files,
            s.bytes as f64 / 1e6
        );
    })
    .await;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let summary = summary?;
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    }
    eprintln!(
        "cdc: sync {} -> {}{}: {} source snapshot(s) in {} commit(s), {} insert, {} delete, {} update, {} files / {:.1} MB written, target at source snapshot {}, {:.2}s",
        summary.source_table,
        summary.target_table,
        if summary.bootstrap { " (initial copy)" } else { "" },
        summary.source_snapshots_applied,
        summary.target_snapshot_ids.len(),
        summary.inserts, summary.deletes, summary.updates,
        summary.files_written, summary.bytes_written as f64 / 1e6,
        summary.source_snapshot_id.map(|i| i.to_string()).unwrap_or_else(|| "-".into()),
        summary.seconds
    );
    if let Some(h) = &summary.history_rewrite {
        eprintln!(
            "cdc: the source's history was rewritten ({}): the target went from source snapshot {} to {} in one commit ({} snapshot(s) undone)",
            h.kind.as_str(),
            h.from_snapshot.map(|i| i.to_string()).unwrap_or_else(|| "(the dropped table's)".into()),
            h.to_snapshot,
            h.undone_snapshots
        );
    }
    let os = &summary.object_store;
    if os.read_requests + os.objects_written > 0 {
        eprintln!(
            "cdc: object store: {} reads / {:.1} MB, {} objects / {:.1} MB written, {} other requests",
            os.read_requests,
            os.read_bytes as f64 / 1e6,
            os.objects_written,
            os.written_bytes as f64 / 1e6,
            os.other_requests
        );
    }
    Ok(())
}

/// The error and its causes, each cause once: messages that already quote their source are not repeated.
fn render(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.contains(&c) {
            out.push_str(": ");
            out.push_str(&c);
        }
    }
    out
}

async fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Snapshots { config, json } => {
            let cfg = Config::load_one(&config)?;
            let (_, table) = pipeline::load_source(&cfg).await?;
            let lineage = lineage::main_lineage(table.metadata());
            if !json {
                println!(
                    "{:<20} {:<20} {:>5} {:<24} {:<10} {:>8} {:>8} {:>8} {:>8}",
                    "snapshot_id", "parent_id", "seq", "committed_at", "operation", "+files", "-files", "+rows", "-rows"
                );
            }
            for s in lineage {
                let sum = &s.summary().additional_properties;
                let g = |k: &str| sum.get(k).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
                let removed_rows = g("deleted-records") + g("added-position-deletes") + g("added-equality-deletes");
                if json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "snapshot_id": s.snapshot_id(), "parent_id": s.parent_snapshot_id(), "sequence_number": s.sequence_number(),
                            "timestamp_ms": s.timestamp_ms(), "committed_at": lineage::fmt_ms(s.timestamp_ms()),
                            "operation": s.summary().operation.as_str(),
                            "added_data_files": g("added-data-files"), "deleted_data_files": g("deleted-data-files"),
                            "added_delete_files": g("added-delete-files"), "added_records": g("added-records"), "removed_records": removed_rows,
                            "summary": sum,
                        })
                    );
                } else {
                    println!(
                        "{:<20} {:<20} {:>5} {:<24} {:<10} {:>8} {:>8} {:>8} {:>8}",
                        s.snapshot_id(),
                        s.parent_snapshot_id().map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                        s.sequence_number(),
                        lineage::fmt_ms(s.timestamp_ms()),
                        s.summary().operation.as_str(),
                        g("added-data-files") + g("added-delete-files"),
                        g("deleted-data-files") + g("removed-delete-files"),
                        g("added-records"),
                        removed_rows
                    );
                }
            }
        }
        Cmd::Changes { config, range, format, output } => {
            let cfg = Config::load_one(&config)?;
            let (from, to) = range.bounds()?;
            let (_, table) = pipeline::load_source(&cfg).await?;
            let summary =
                pipeline::run_changes(&cfg, &table, from, to, |schema, memory| output::open(format, output.as_deref(), schema, memory), |_| {})
                    .await?;
            tracing::info!(summary = %serde_json::to_string(&summary).unwrap_or_default(), "changes done");
            eprintln!(
                "cdc: {} snapshot(s) ({} compaction), {} insert, {} delete, {} update; {} manifests, {} files / {:.1} MB read, {:.1} MB spilled, in {:.2}s",
                summary.snapshots,
                summary.skipped_replace,
                summary.inserts,
                summary.deletes,
                summary.update_pairs,
                summary.manifests_read,
                summary.files_read,
                summary.bytes_read as f64 / 1e6,
                summary.spilled_bytes as f64 / 1e6,
                summary.seconds
            );
        }
        Cmd::Maintain { config, json } => {
            let cfg = Config::load_one(&config)?;
            if cfg.targets().next().is_none() {
                return Err(Error::Config(vec!["[target]: `cdc maintain` maintains the Iceberg target; this file has none".into()]).into());
            }
            // every Iceberg target of the file; the first failure is the exit code, after all were tried
            let mut first_failure = None;
            for t in cfg.targets() {
                let catalog = iceberg_cdc::catalog::Catalog::connect(&t.catalog, "target").await?;
                let (m, failed) = iceberg_cdc::sink::iceberg::maintain::maintain(&catalog, t, cfg.engine.memory_budget).await?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&m)?);
                } else {
                    eprintln!(
                        "cdc: {}: compacted {} data file(s) into {} and removed {} delete file(s), manifests {} -> {}, {} snapshot(s) expired ({} files deleted), {} orphan file(s) deleted ({} younger than orphan_grace kept), in {:.2}s",
                        m.table,
                        m.compacted.data_files_rewritten,
                        m.compacted.data_files_written,
                        m.compacted.delete_files_removed,
                        m.manifests_before,
                        m.manifests_after,
                        m.snapshots_expired, m.expired_files_deleted, m.orphans_deleted, m.orphans_too_young, m.seconds
                    );
                }
                first_failure = first_failure.or(failed);
            }
            if let Some(e) = first_failure {
                return Err(e.into());
            }
        }
        Cmd::Sync { config, range, json } => {
            let (from, to) = range.bounds()?;
            let cfg = Config::load(&config)?;
            if !cfg.source.has_patterns() {
                sync_one(&cfg.for_table(&cfg.source.table), from, to, json).await?;
                return Ok(());
            }
            // table patterns: every matching table, one after the other; a failed one does not stop the others
            if from.is_some() || to.is_some() {
                return Err(Error::Config(vec![
                    "--from/--to name snapshots of one table; with source.tables each table syncs from its own progress to its head".into(),
                ])
                .into());
            }
            let tables = pipeline::matching_tables(&cfg).await?;
            eprintln!("cdc: {} table(s) match: {}", tables.len(), tables.join(", "));
            let mut failed = Vec::new();
            for (i, t) in tables.iter().enumerate() {
                eprintln!("cdc: [{}/{}] {t}", i + 1, tables.len());
                if let Err(e) = sync_one(&cfg.for_table(t), None, None, json).await {
                    eprintln!("cdc: {t}: failed: {}", render(&e));
                    failed.push(t.clone());
                }
            }
            eprintln!("cdc: {} table(s): {} synced, {} failed", tables.len(), tables.len() - failed.len(), failed.len());
            if !failed.is_empty() {
                return Err(Error::Partial { failed, total: tables.len() }.into());
            }
        }
        Cmd::Quickstart { dir, changes_only } => {
            iceberg_cdc::quickstart::run(&dir, changes_only).await?;
        }
        Cmd::Completions { shell } => {
            clap_complete::generate(shell, &mut <Cli as clap::CommandFactory>::command(), "cdc", &mut std::io::stdout());
        }
        Cmd::Man => {
            let page = clap_mangen::Man::new(<Cli as clap::CommandFactory>::command());
            page.render(&mut std::io::stdout()).map_err(|e| Error::Internal(format!("writing the man page: {e}")))?;
        }
        Cmd::Run { config, shard, metrics_address } => {
            let shard =
                shard.as_deref().map(iceberg_cdc::service::Shard::parse).transpose().map_err(|e| Error::Config(vec![format!("--shard: {e}")]))?;
            iceberg_cdc::service::run(&config, iceberg_cdc::service::Overrides { shard, metrics_address }, None).await?;
        }
        Cmd::Status { config, metrics_address, json } => {
            let lines = iceberg_cdc::service::status(&config, metrics_address).await?;
            if !json {
                println!("{:<24} {:<32} {:<32} {:<18} {:>9} {:>9}  last error", "pipeline", "sink", "owner", "state", "lag snaps", "lag s");
            }
            for l in &lines {
                if json {
                    println!("{}", serde_json::to_string(l)?);
                } else {
                    let n = |v: Option<String>| v.unwrap_or_else(|| "-".into());
                    println!(
                        "{:<24} {:<32} {:<32} {:<18} {:>9} {:>9}  {}",
                        l.pipeline,
                        l.sink,
                        n(l.owner.clone()),
                        l.state,
                        n(l.lag_snapshots.map(|v| v.to_string())),
                        n(l.lag_seconds.map(|v| format!("{v:.1}"))),
                        n(l.last_error.clone())
                    );
                }
            }
            let bad = lines.iter().filter(|l| l.state != "ok").count();
            if !lines.is_empty() && lines.iter().all(|l| l.state == "owner unreachable") {
                let owners: std::collections::BTreeSet<&str> = lines.iter().filter_map(|l| l.owner.as_deref()).collect();
                return Err(anyhow::Error::new(Error::Service(format!(
                    "no instance of this service is running: nothing answers at {} — start it (`cdc run --config {}`, or its systemd unit), or give --metrics-address where it listens",
                    owners.into_iter().collect::<Vec<_>>().join(", "),
                    config.display()
                ))));
            }
            if bad > 0 {
                return Err(anyhow::Error::new(Error::Service(format!(
                    "{bad} of {} pipeline sinks are not running cleanly (see above)",
                    lines.len()
                ))));
            }
        }
        Cmd::Check { config, matches_only } => {
            if !iceberg_cdc::service::check(&config, matches_only).await? {
                return Err(anyhow::Error::new(Error::Catalog {
                    catalog: "check".into(),
                    message: "some pipelines cannot reach their catalog or table (see above)".into(),
                    retryable: true,
                    cause: None,
                }));
            }
        }
    }
    Ok(())
}

//! The service's configuration: many pipelines in one file, catalogs defined once and referenced by name.
//!
//! Parse (serde, unknown keys rejected — all of them listed at once) → validate (pure: every problem in the file
//! reported together, each prefixed with where it is) → [`ServiceConfig::runs`] turns every (pipeline, sink) pair into
//! the same [`Config`] a one-shot `cdc sync` runs with, so the daemon and `cdc sync` share one engine.
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::config::{keys_of, unknown_in, unknown_sink_keys, CatalogConfig, Config, EngineConfig, SinkConfig, SourceConfig};
use crate::error::{Error, Result};
use crate::pattern::TablePatterns;

/// Default address of the telemetry endpoints (`/metrics`, `/healthz`, `/readyz`).
pub const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:9464";
/// Polls faster than this are refused: the catalog would be hammered for nothing.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    #[serde(default)]
    pub service: ServiceSettings,
    #[serde(default)]
    pub engine: EngineConfig,
    #[serde(default)]
    pub catalogs: BTreeMap<String, CatalogConfig>,
    #[serde(default)]
    pub pipelines: Vec<PipelineConfig>,
    /// Services started with this file share its pipelines through a Kafka consumer group (see [`ClusterConfig`]).
    pub cluster: Option<ClusterConfig>,
}

/// `[cluster]`: every service started with the same file joins one Kafka consumer group; each pipeline maps to a
/// partition of a control topic by the fixed hash of its name ([`partition_of`]), and the group's assignment decides
/// which instance runs it. Correctness never depends on it: two instances that briefly run one pipeline stay exact
/// through the catalog's commit requirements.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// The Kafka brokers, `host:port[,host:port]`.
    pub bootstrap_servers: String,
    /// The consumer group's id: one per set of instances sharing a file.
    pub group: String,
    /// The control topic (no message is ever written to it; its partitions are what the group assigns). Default:
    /// `<group>.pipelines`.
    pub topic: Option<String>,
    /// Partitions of the control topic when it is created (more than the instances you will run; an existing topic
    /// keeps its own count, which every instance then uses).
    #[serde(default = "default_cluster_partitions")]
    pub partitions: i32,
    /// An instance not heard from for this long loses its pipelines to the others (Kafka's `session.timeout.ms`;
    /// brokers accept 6 s to 30 min by default).
    #[serde(default = "default_session_timeout", with = "humantime_serde")]
    pub session_timeout: Duration,
    /// When this instance loses contact with the group's coordinator (a broker outage, a network cut), it keeps
    /// running the pipelines it owned until the group answers again — then the group's new assignment decides — or
    /// for this long at most. Replication never depends on the coordinator: another instance the group gave those
    /// pipelines to meanwhile runs them too, safely (the catalog keeps them exact), until this bound. Default 5 min.
    #[serde(default = "default_outage_grace", with = "humantime_serde")]
    pub outage_grace: Duration,
    /// `google`: SASL OAUTHBEARER with Google access tokens (Google Cloud Managed Service for Apache Kafka), as the
    /// Kafka sink's `auth`.
    pub auth: Option<String>,
    /// The service account e-mail OAUTHBEARER presents (default: `client_email` of GOOGLE_APPLICATION_CREDENTIALS).
    pub principal: Option<String>,
    /// librdkafka properties for the group's clients (TLS, SASL, `group.protocol`...).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

impl ClusterConfig {
    /// The control topic's name.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub fn topic(&self) -> String {
        self.topic.clone().unwrap_or_else(|| format!("{}.pipelines", self.group))
    }
}

fn default_cluster_partitions() -> i32 {
    64
}
fn default_outage_grace() -> Duration {
    Duration::from_secs(300)
}
fn default_session_timeout() -> Duration {
    Duration::from_secs(10)
}

/// The control-topic partition of `pipeline` among `partitions`: its name's FNV-1a hash (see [`Shard`]) modulo the
/// count.
pub fn partition_of(pipeline: &str, partitions: i32) -> i32 {
    (stable_hash(pipeline) % partitions.max(1) as u64) as i32
}

/// FNV-1a 64-bit: fixed on every machine and version (Rust's own hasher is randomized).
fn stable_hash(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceSettings {
    /// `host:port` of `/metrics`, `/healthz`, `/readyz`; `"off"` disables them.
    #[serde(default = "default_metrics_address")]
    pub metrics_address: String,
    /// Poll interval of pipelines that do not set their own.
    #[serde(default = "default_poll", with = "humantime_serde")]
    pub poll_interval: Duration,
    /// How long SIGTERM waits for in-flight commits before the process exits anyway.
    #[serde(default = "default_shutdown", with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// A poll that makes no progress (no commit) for this long is stuck: the loop is overdue, the systemd watchdog
    /// stops being fed and `/healthz` fails, so systemd restarts the service.
    #[serde(default = "default_stall", with = "humantime_serde")]
    pub stall_timeout: Duration,
    /// `"i/N"`: this instance runs only the pipelines whose name hashes to `i` modulo `N` (see [`Shard`]); `cdc run
    /// --shard` overrides it. Every instance of a set gets the same file and its own `i`.
    pub shard: Option<String>,
    /// Runs that apply changes at once (each may use `engine.memory_budget`); other pipelines' polls go on while
    /// they work. Default: the number of cores, at least 2.
    pub workers: Option<usize>,
    /// How often pipelines of table patterns list their catalogs for tables created, dropped or renamed (also on
    /// SIGHUP). Default 1 min.
    #[serde(default = "default_discover", with = "humantime_serde")]
    pub discover_interval: Duration,
}

impl ServiceSettings {
    /// [`ServiceSettings::workers`] or its default.
    pub fn workers(&self) -> usize {
        self.workers.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).max(2))
    }
}

/// A static share of a service file's pipelines: instance `index` of `count` runs the pipelines whose name's
/// FNV-1a 64-bit hash is `index` modulo `count`. The hash is fixed (not Rust's randomized one), so every instance,
/// on every machine and version, splits the same file the same way; adding a pipeline never moves the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This instance's share, from 0.
    pub index: u64,
    /// How many instances share the file.
    pub count: u64,
}

impl Shard {
    /// Parses `"i/N"` (0 ≤ i < N).
    pub fn parse(s: &str) -> std::result::Result<Shard, String> {
        let bad = || format!("`{s}` — give \"i/N\": this instance's number i (from 0) of N instances");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count): (u64, u64) = (i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }

    /// Whether this instance runs `pipeline`.
    pub fn owns(&self, pipeline: &str) -> bool {
        stable_hash(pipeline) % self.count == self.index
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Default for ServiceSettings {
    fn default() -> Self {
        ServiceSettings {
            metrics_address: default_metrics_address(),
            poll_interval: default_poll(),
            shutdown_timeout: default_shutdown(),
            stall_timeout: default_stall(),
            shard: None,
            workers: None,
            discover_interval: default_discover(),
        }
    }
}

fn default_metrics_address() -> String {
    DEFAULT_METRICS_ADDRESS.to_string()
}
fn default_poll() -> Duration {
    Duration::from_secs(60)
}
fn default_discover() -> Duration {
    Duration::from_secs(60)
}
fn default_shutdown() -> Duration {
    Duration::from_secs(30)
}
fn default_stall() -> Duration {
    Duration::from_secs(600)
}

/// One source table and where its changes go.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// Unique in the file; names metrics, logs and `cdc check` lines.
    pub name: String,
    pub source: PipelineSource,
    #[serde(default, with = "humantime_serde::option")]
    pub poll_interval: Option<Duration>,
    /// At most one target commit per interval (covering every new source snapshot); default: the poll interval.
    #[serde(default, with = "humantime_serde::option")]
    pub commit_interval: Option<Duration>,
    pub sinks: Vec<SinkConfig<String>>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PipelineSource {
    /// Name of a `[catalogs.<name>]` section.
    pub catalog: String,
    /// The source table (`namespace.table`); or leave it out and give `tables`.
    #[serde(default)]
    pub table: String,
    /// Patterns of `namespace.table` names ([`crate::pattern`]): the pipeline stands for every table of the catalog
    /// that matches one (and no `exclude` pattern), found by discovery ([`Discovered`]); its sinks name each table's
    /// destination with `{namespace}` and `{table}`.
    #[serde(default)]
    pub tables: Vec<String>,
    /// Patterns of tables `tables` leaves out.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// What happens when a table the patterns matched is gone (dropped, renamed, no longer matched); see [`OnDrop`].
    #[serde(default)]
    pub on_drop: OnDrop,
    /// How long the destinations of a gone table stay before `on_drop = "drop"` drops them (default 1 day).
    #[serde(default, with = "humantime_serde::option")]
    pub drop_grace: Option<Duration>,
    /// What happens to the destinations of a table renamed in the source catalog; see [`OnRename`].
    #[serde(default)]
    pub on_rename: OnRename,
    pub key_columns: Option<Vec<String>>,
    /// See [`crate::config::OnHistoryRewrite`].
    #[serde(default)]
    pub on_history_rewrite: crate::config::OnHistoryRewrite,
}

/// What a pipeline of table patterns does when one of its tables is gone from the catalog.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDrop {
    /// Its loop stops; each Iceberg destination stays, marked with the table property [`GONE_PROPERTY`] (removed
    /// again if the table comes back).
    #[default]
    Keep,
    /// Its loop stays and reports the table as missing (failing on `/readyz` and in `cdc status`) until a reload.
    Stop,
    /// As `keep`, then, once the table has been gone for `drop_grace`, each Iceberg destination is dropped from its
    /// catalog (its data files stay, as `DROP TABLE` without `PURGE`; a hadoop table's directory goes with it). Kafka
    /// topics and jsonl files stay.
    Drop,
}

/// What a pipeline of table patterns does when one of its tables is renamed in the source catalog (seen as one
/// table gone and one added with the same uuid, in one discovery).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnRename {
    /// Each Iceberg destination is renamed to what the sink's template names for the new name, and replication goes
    /// on from its recorded progress (no copy from scratch). Where the destination's catalog cannot rename (hadoop,
    /// Glue) and for Kafka topics and jsonl files, the new name is replicated as a new table and the old name is
    /// gone (`on_drop`).
    #[default]
    Rename,
    /// The new name is replicated as a new table; the old one is gone (`on_drop`).
    New,
}

/// How long a gone table's destinations stay when `on_drop = "drop"` and `drop_grace` is not set.
pub const DEFAULT_DROP_GRACE: Duration = Duration::from_secs(24 * 3600);

/// Table property set on the Iceberg destination of a table that is gone from its source catalog (`on_drop =
/// "keep"`): since when, and the source table's name.
pub const GONE_PROPERTY: &str = "cdc.source-gone";

/// What discovery found: per pipeline of table patterns, the names (`namespace.table`) of the tables it stands for.
pub type Discovered = BTreeMap<String, Vec<String>>;

impl PipelineSource {
    /// The source's table patterns (`None`: one named table).
    pub(crate) fn patterns(&self) -> Option<TablePatterns<'_>> {
        (!self.tables.is_empty() || !self.exclude.is_empty()).then_some(TablePatterns { tables: &self.tables, exclude: &self.exclude })
    }

    /// How long a gone table's destinations stay before `on_drop = "drop"` drops them.
    pub(crate) fn drop_grace(&self) -> Duration {
        self.drop_grace.unwrap_or(DEFAULT_DROP_GRACE)
    }

    /// The problems of the table (or patterns) and key settings (the catalog is checked under `catalogs`).
    fn validate(&self, at: &str, p: &mut Vec<String>) {
        let discovery_only = [
            (self.on_drop != OnDrop::default(), "on_drop"),
            (self.on_rename != OnRename::default(), "on_rename"),
            (self.drop_grace.is_some(), "drop_grace"),
        ];
        for (_, key) in discovery_only.iter().filter(|(set, _)| *set && self.patterns().is_none()) {
            p.push(format!("{at}.{key}: only for a source of `tables` patterns (a table of its own is never dropped or renamed by discovery)"));
        }
        if self.drop_grace.is_some() && self.on_drop != OnDrop::Drop {
            p.push(format!("{at}.drop_grace: only with on_drop = \"drop\""));
        }
        match self.patterns() {
            Some(patterns) => {
                patterns.validate(at, &self.table, p);
                crate::config::validate_table_and_keys(at, crate::pattern::SAMPLE_TABLE, self.key_columns.as_deref(), p);
            }
            None if self.table.is_empty() => p.push(format!("{at}.table: missing; name the table, or give `tables` patterns")),
            None => crate::config::validate_table_and_keys(at, &self.table, self.key_columns.as_deref(), p),
        }
    }
}

/// One loop of a pipeline: the sinks that share one read of the source ([`crate::pipeline::plan::shared_reads`]), ready
/// for the runner.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub pipeline: String,
    pub sink: String,
    pub poll_interval: Duration,
    pub commit_interval: Duration,
    pub config: Config,
}

impl ServiceConfig {
    pub fn load(path: &Path) -> Result<ServiceConfig> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ConfigFile { path: path.to_path_buf(), source })?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Result<ServiceConfig> {
        crate::config::parse_checked(text, unknown_keys, ServiceConfig::validate)
    }

    /// Pure checks; every problem in the file.
    pub fn validate(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.pipelines.is_empty() {
            p.push("pipelines: none defined; add a [[pipelines]] section".into());
        }
        if self.service.metrics_address != "off" && self.service.metrics_address.parse::<std::net::SocketAddr>().is_err() {
            p.push(format!("service.metrics_address: `{}` is not host:port (or \"off\")", self.service.metrics_address));
        }
        if self.service.poll_interval < MIN_POLL_INTERVAL {
            p.push("service.poll_interval: below the 100ms minimum".into());
        }
        if self.service.discover_interval < Duration::from_secs(1) {
            p.push("service.discover_interval: below the 1s minimum (each discovery lists the catalogs)".into());
        }
        if let Some(Err(e)) = self.service.shard.as_deref().map(Shard::parse) {
            p.push(format!("service.shard: {e}"));
        }
        if let Some(w) = self.service.workers.filter(|w| !(1..=256).contains(w)) {
            p.push(format!("service.workers: {w} — between 1 and 256 runs at once"));
        }
        if let Some(c) = &self.cluster {
            if !cfg!(feature = "kafka") {
                p.push(format!("cluster: {}", crate::config::LEFT_OUT_KAFKA));
            }
            if c.bootstrap_servers.trim().is_empty() {
                p.push("cluster.bootstrap_servers: give the Kafka brokers, host:port".into());
            }
            if c.group.trim().is_empty() {
                p.push("cluster.group: give the consumer group every instance of this file joins".into());
            }
            if !(1..=10_000).contains(&c.partitions) {
                p.push(format!("cluster.partitions: {} — between 1 and 10000 (more than the instances you will run)", c.partitions));
            }
            if c.session_timeout < Duration::from_secs(1) {
                p.push("cluster.session_timeout: at least 1s (brokers refuse less than 6s by default)".into());
            }
            if let Some(a) = c.auth.as_deref().filter(|a| *a != "google") {
                p.push(format!("cluster.auth: `{a}` — the only value is `google` (OAUTHBEARER with Google tokens)"));
            }
            if self.service.shard.is_some() {
                p.push("service.shard and [cluster] both split the pipelines: keep one".into());
            }
        }
        for (name, c) in &self.catalogs {
            c.validate(&format!("catalogs.{name}"), &mut p);
        }
        self.engine.validate(&mut p);
        let mut names = HashSet::new();
        for (i, pl) in self.pipelines.iter().enumerate() {
            let at = format!("pipelines[{i}] ({})", pl.name);
            if pl.name.trim().is_empty() {
                p.push(format!("pipelines[{i}].name: must not be empty"));
            } else if !names.insert(pl.name.as_str()) {
                p.push(format!("{at}: the name is used twice"));
            }
            if !self.catalogs.contains_key(&pl.source.catalog) {
                p.push(format!("{at}.source.catalog: no [catalogs.{}] section", pl.source.catalog));
            }
            if pl.poll_interval.is_some_and(|d| d < MIN_POLL_INTERVAL) {
                p.push(format!("{at}.poll_interval: below the 100ms minimum"));
            }
            if pl.sinks.is_empty() {
                p.push(format!("{at}.sinks: none; add a [[pipelines.sinks]] section"));
            }
            pl.source.validate(&format!("{at}.source"), &mut p);
            let mut labels = HashSet::new();
            let many = pl.source.patterns().is_some();
            // a pattern's sinks are checked as they are for a table it matches
            let sample = if many { crate::pattern::SAMPLE_TABLE } else { pl.source.table.as_str() };
            let source = self.source_of(pl, sample);
            for (j, s) in pl.sinks.iter().enumerate() {
                let sink_at = format!("{at}.sinks[{j}]");
                if many {
                    s.check_names_each_table(&sink_at, &mut p);
                }
                let s = &s.for_table(sample);
                match self.resolve(s) {
                    Some(resolved) => {
                        if let Some(source) = &source {
                            resolved.validate(&sink_at, source, &mut p);
                        }
                    }
                    None => {
                        if let SinkConfig::Iceberg(t) = s {
                            p.push(format!("{sink_at}.catalog: no [catalogs.{}] section", t.catalog));
                        }
                    }
                }
                if !labels.insert(s.label()) {
                    p.push(format!("{sink_at}: {} is listed twice", s.label()));
                }
            }
        }
        p
    }

    /// A pipeline's source, table `table`, with its catalog resolved (`None`: no such catalog section).
    fn source_of(&self, pl: &PipelineConfig, table: &str) -> Option<SourceConfig> {
        Some(SourceConfig {
            table: table.to_string(),
            tables: Vec::new(),
            exclude: Vec::new(),
            key_columns: pl.source.key_columns.clone(),
            catalog: self.catalogs.get(&pl.source.catalog)?.clone(),
            on_history_rewrite: pl.source.on_history_rewrite,
        })
    }

    /// A sink with its catalog resolved (`None`: no such catalog section).
    fn resolve(&self, sink: &SinkConfig<String>) -> Option<SinkConfig> {
        Some(match sink {
            SinkConfig::Iceberg(t) => SinkConfig::Iceberg(t.clone().with_catalog(self.catalogs.get(&t.catalog)?.clone())),
            SinkConfig::Kafka(k) => SinkConfig::Kafka(k.clone()),
            SinkConfig::Jsonl(j) => SinkConfig::Jsonl(j.clone()),
        })
    }

    /// The runs of the pipelines `shard` owns (all without one). Call after [`Self::validate`] passed.
    pub fn owned_runs(&self, shard: Option<Shard>, found: &Discovered) -> Vec<Run> {
        self.runs(found).into_iter().filter(|r| shard.is_none_or(|s| s.owns(&r.pipeline))).collect()
    }

    /// Whether a pipeline stands for table patterns (the service then discovers tables).
    pub fn has_patterns(&self) -> bool {
        self.pipelines.iter().any(|pl| pl.source.patterns().is_some())
    }

    /// Each pipeline's tables: its one table, or those of `found` for a pipeline of patterns, as (pipeline name,
    /// table). A matched table's pipeline is named `<pipeline>:<namespace.table>` (its metrics, logs, status line,
    /// shard and cluster assignment). Pure.
    pub fn pipeline_tables<'a>(&'a self, found: &'a Discovered) -> Vec<(&'a PipelineConfig, String, &'a str)> {
        let mut out = Vec::new();
        for pl in &self.pipelines {
            match pl.source.patterns() {
                None => out.push((pl, pl.name.clone(), pl.source.table.as_str())),
                Some(_) => {
                    for t in found.get(&pl.name).into_iter().flatten() {
                        out.push((pl, format!("{}:{t}", pl.name), t.as_str()));
                    }
                }
            }
        }
        out
    }

    /// The shard this file configures (`service.shard`). Call after [`Self::validate`] passed.
    pub fn shard(&self) -> Option<Shard> {
        self.service.shard.as_deref().and_then(|s| Shard::parse(s).ok())
    }

    /// Every loop of every pipeline (those of patterns: of each table in `found`), its catalogs resolved and its
    /// sinks' names filled. Call after [`Self::validate`] passed.
    pub fn runs(&self, found: &Discovered) -> Vec<Run> {
        let mut out = Vec::new();
        for (pl, name, table) in self.pipeline_tables(found) {
            let (Some(source), poll) = (self.source_of(pl, table), pl.poll_interval.unwrap_or(self.service.poll_interval)) else { continue };
            for read in crate::pipeline::plan::shared_reads(&pl.sinks) {
                let sinks: Option<Vec<SinkConfig>> = read.iter().map(|&i| self.resolve(&pl.sinks[i].for_table(table))).collect();
                let Some(sinks) = sinks else { continue };
                out.push(Run {
                    pipeline: name.clone(),
                    sink: sinks.iter().map(SinkConfig::label).collect::<Vec<_>>().join("+"),
                    poll_interval: poll,
                    commit_interval: pl.commit_interval.unwrap_or(poll),
                    config: Config { source: source.clone(), sinks, engine: self.engine.clone() },
                });
            }
        }
        out
    }
}

/// Every key no section takes (catalog sections pass unknown keys on as catalog properties).
fn unknown_keys(value: &toml::Value) -> Vec<String> {
    let mut out = Vec::new();
    unknown_in("", Some(value), keys_of::<ServiceConfig>(), &mut out);
    unknown_in("service", value.get("service"), keys_of::<ServiceSettings>(), &mut out);
    unknown_in("engine", value.get("engine"), keys_of::<EngineConfig>(), &mut out);
    unknown_in("cluster", value.get("cluster"), keys_of::<ClusterConfig>(), &mut out);
    for (i, pl) in value.get("pipelines").and_then(toml::Value::as_array).into_iter().flatten().enumerate() {
        unknown_in(&format!("pipelines[{i}]"), Some(pl), keys_of::<PipelineConfig>(), &mut out);
        unknown_in(&format!("pipelines[{i}].source"), pl.get("source"), keys_of::<PipelineSource>(), &mut out);
        unknown_sink_keys::<String>(&format!("pipelines[{i}].sinks"), pl.get("sinks"), &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fixture_is_a_valid_service_file() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        let mut n = 0;
        for f in std::fs::read_dir(&dir).unwrap() {
            let path = f.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path).unwrap().replace("${GOOGLE_CLOUD_PROJECT}", "my-project");
                if let Err(e) = ServiceConfig::parse(&text) {
                    panic!("{}: {e}", path.display());
                }
                n += 1;
            }
        }
        assert!(n >= 3, "{n} fixtures");
    }

    const GOOD: &str = r#"
[service]
poll_interval = "1s"

[catalogs.lake]
type = "hadoop"
warehouse = "/wh"

[catalogs.replica]
type = "sql"
warehouse = "/replica"

[[pipelines]]
name = "orders"
source = { catalog = "lake", table = "db.orders" }
poll_interval = "200ms"

[[pipelines.sinks]]
type = "iceberg"
catalog = "replica"
table = "r.orders"
format_version = 3

[[pipelines]]
name = "items"
source = { catalog = "lake", table = "db.items", key_columns = ["id"] }

[[pipelines.sinks]]
type = "iceberg"
catalog = "replica"
table = "r.items"
"#;

    #[test]
    fn shards_split_pipelines_stably_and_completely() {
        assert_eq!(Shard::parse("1/3"), Ok(Shard { index: 1, count: 3 }));
        for bad in ["3/3", "1", "a/2", "0/0", "-1/2"] {
            assert!(Shard::parse(bad).is_err(), "{bad}");
        }
        let names: Vec<String> = (0..300).map(|i| format!("orders_{i}")).collect();
        let shards: Vec<Shard> = (0..3).map(|i| Shard { index: i, count: 3 }).collect();
        let mut per = [0usize; 3];
        for n in &names {
            let owners: Vec<usize> = (0..3).filter(|&i| shards[i].owns(n)).collect();
            assert_eq!(owners.len(), 1, "{n} has exactly one owner");
            per[owners[0]] += 1;
        }
        assert!(per.iter().all(|&c| c > 70), "roughly even: {per:?}");
        // fixed hash: the same split on every machine and version
        assert!(Shard { index: 0, count: 1 }.owns("anything"));
        assert_eq!((0..3).find(|&i| shards[i].owns("orders")), Some(1), "FNV-1a(\"orders\") % 3");
    }

    #[test]
    fn runs_resolve_catalogs_and_defaults() {
        let cfg = ServiceConfig::parse(GOOD).unwrap();
        let runs = cfg.runs(&Discovered::new());
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].poll_interval, Duration::from_millis(200));
        assert_eq!(runs[0].commit_interval, Duration::from_millis(200));
        assert_eq!(runs[1].poll_interval, Duration::from_secs(1));
        let t = runs[0].config.targets().next().unwrap();
        assert_eq!(t.format_version, 3);
        assert_eq!(t.catalog.warehouse.as_deref(), Some("/replica"));
        assert_eq!(runs[1].config.source.key_columns.as_deref(), Some(&["id".to_string()][..]));
    }

    #[test]
    fn every_problem_at_once() {
        let bad =
            GOOD.replace("catalog = \"replica\"\ntable = \"r.items\"", "catalog = \"nope\"\ntable = \"r.items\"").replace("\"200ms\"", "\"10ms\"")
                + "\n[[pipelines]]\nname = \"orders\"\nsource = { catalog = \"missing\", table = \"db.x\" }\nsinks = []\n";
        let err = ServiceConfig::parse(&bad).unwrap_err().to_string();
        for needle in ["no [catalogs.nope]", "100ms minimum", "used twice", "no [catalogs.missing]", "sinks: none"] {
            assert!(err.contains(needle), "{needle}: {err}");
        }
        let err = ServiceConfig::parse(&GOOD.replace("format_version = 3", "format_version = 3\nformat = 1\nbogus = 2")).unwrap_err().to_string();
        assert!(err.contains("sinks[0].format`") && err.contains("sinks[0].bogus`"), "{err}");
    }

    #[test]
    fn a_cluster_section_is_checked_with_the_rest() {
        let ok = ServiceConfig::parse(&format!("{GOOD}\n[cluster]\nbootstrap_servers = \"k:9092\"\ngroup = \"lake\"\n")).unwrap();
        let c = ok.cluster.as_ref().unwrap();
        assert_eq!((c.topic(), c.partitions, c.session_timeout), ("lake.pipelines".to_string(), 64, Duration::from_secs(10)));
        let bad = format!(
            "{}\n[cluster]\nbootstrap_servers = \"\"\ngroup = \"\"\npartitions = 0\nsession_timeout = \"10ms\"\nauth = \"aws\"\n",
            GOOD.replace("[service]\n", "[service]\nshard = \"0/2\"\n")
        );
        let err = ServiceConfig::parse(&bad).unwrap_err().to_string();
        for needle in
            ["cluster.bootstrap_servers", "cluster.group", "cluster.partitions", "cluster.session_timeout", "cluster.auth: `aws`", "keep one"]
        {
            assert!(err.contains(needle), "{needle}: {err}");
        }
        let unknown = format!("{GOOD}\n[cluster]\nbootstrap_servers = \"k:9092\"\ngroup = \"lake\"\nretries = 3\n");
        assert!(ServiceConfig::parse(&unknown).unwrap_err().to_string().contains("unknown key `cluster.retries`"));
    }

    #[test]
    fn pipelines_map_to_partitions_by_a_fixed_hash() {
        // the same on every instance, machine and version: the group's assignment means the same pipelines everywhere
        assert_eq!(partition_of("orders", 3), 1, "FNV-1a(\"orders\") % 3, as the static shards");
        let mut per = vec![0usize; 32];
        for i in 0..3200 {
            per[partition_of(&format!("table_{i}"), 32) as usize] += 1;
        }
        assert!(per.iter().all(|&n| (50..=150).contains(&n)), "roughly even: {per:?}");
        assert_eq!(partition_of("anything", 1), 0);
    }
}

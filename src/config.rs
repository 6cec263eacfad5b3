//! Configuration: parse (serde, unknown keys rejected) → validate (pure, every problem reported at once) → build
//! (the catalog modules touch the network). Each catalog backend checks its own keys (`catalog::<backend>::validate`,
//! reached through `CatalogConfig::validate`): this module knows no backend.
//! Size: ~670 lines of code (every section's parse and validate rules) and ~170 of unit tests.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};

/// The default `engine.memory_budget`.
pub const DEFAULT_MEMORY_BUDGET: u64 = 256 * 1024 * 1024;

/// `(n, d)` of `budget`: n/d of it (how the engine's parts divide `engine.memory_budget`).
pub fn share_of(budget: u64, (n, d): (u64, u64)) -> u64 {
    (budget as u128 * n as u128 / d as u128) as u64
}
/// The default `target_file_size` of files the applier writes.
pub const DEFAULT_TARGET_FILE_SIZE: u64 = 512 * 1024 * 1024;

/// A one-shot configuration (`cdc changes`, `cdc sync`): a source and its destinations.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The table changes are read from.
    pub source: SourceConfig,
    /// Where `cdc sync` writes, in commit order (empty for `cdc changes`): `[target]` and `[kafka]` are shorthands
    /// for one entry each, ahead of the `[[sinks]]` entries.
    pub sinks: Vec<SinkConfig>,
    /// Memory, spill and read settings of the engine.
    pub engine: EngineConfig,
}

/// A one-shot file as written: the shorthands beside the list ([`Config`] is what the rest of the program reads).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConfigFile {
    source: SourceConfig,
    /// Shorthand for one `[[sinks]]` entry of type `iceberg`.
    target: Option<TargetConfig>,
    /// Shorthand for one `[[sinks]]` entry of type `kafka`.
    kafka: Option<KafkaConfig>,
    #[serde(default)]
    sinks: Vec<SinkConfig>,
    #[serde(default)]
    engine: EngineConfig,
}

impl From<ConfigFile> for Config {
    fn from(f: ConfigFile) -> Config {
        let shorthands = f.target.map(SinkConfig::Iceberg).into_iter().chain(f.kafka.map(SinkConfig::Kafka));
        Config { source: f.source, sinks: shorthands.chain(f.sinks).collect(), engine: f.engine }
    }
}

/// A destination of change rows. `C` is how an Iceberg target's catalog is given: inline (the default) or, in the
/// service's file, by the name of a `[catalogs.<name>]` section. Adding a destination: a variant here and one arm in
/// `sink::open`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum SinkConfig<C = CatalogConfig> {
    /// A target Iceberg table (the keys of `[target]`).
    Iceberg(TargetConfig<C>),
    /// A Kafka topic (the keys of `[kafka]`).
    Kafka(KafkaConfig),
    /// A directory of JSON-lines change files, one per commit (see `sink::jsonl`).
    Jsonl(JsonlConfig),
}

/// A directory of JSON-lines change files: each commit one file, `progress.json` the commit (see `sink::jsonl`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JsonlConfig {
    /// The directory (created when missing); one per source table.
    pub path: PathBuf,
}

impl<C: Clone> SinkConfig<C> {
    /// This sink for source table `name` (`namespace.table`): the placeholders of its table, topic or path filled
    /// ([`crate::pattern::fill`]).
    pub(crate) fn for_table(&self, name: &str) -> Self {
        let mut out = self.clone();
        match &mut out {
            SinkConfig::Iceberg(t) => t.table = crate::pattern::fill(&t.table, name),
            SinkConfig::Kafka(k) => k.topic = crate::pattern::fill(&k.topic, name),
            SinkConfig::Jsonl(j) => j.path = crate::pattern::fill(&j.path.to_string_lossy(), name).into(),
        }
        out
    }

    /// Adds a problem (named `at`) to `p` unless this sink's table, topic or path names its source table
    /// ([`crate::pattern::TABLE`]), as a sink of a pipeline of many tables must: else all of them land in one place.
    pub(crate) fn check_names_each_table(&self, at: &str, p: &mut Vec<String>) {
        let named = match self {
            SinkConfig::Iceberg(t) => t.table.contains(crate::pattern::TABLE),
            SinkConfig::Kafka(k) => k.topic.contains(crate::pattern::TABLE),
            SinkConfig::Jsonl(j) => j.path.to_string_lossy().contains(crate::pattern::TABLE),
        };
        if !named {
            p.push(format!(
                "{at}: {} would receive every table the patterns match; name each table's destination with {{table}} (e.g. \"replica_{{namespace}}.{{table}}\")",
                self.label()
            ));
        }
    }
}

impl<C> SinkConfig<C> {
    /// `iceberg:<table>` / `kafka:<topic>`: how the sink is named in logs and metrics.
    pub fn label(&self) -> String {
        match self {
            SinkConfig::Iceberg(t) => format!("iceberg:{}", t.table),
            SinkConfig::Kafka(k) => format!("kafka:{}", k.topic),
            SinkConfig::Jsonl(j) => format!("jsonl:{}", j.path.display()),
        }
    }

    /// The keys an entry of this `type` takes (`type` included), for the unknown-key check.
    pub(crate) fn keys_of_type(kind: Option<&str>) -> Vec<&'static str>
    where
        C: for<'de> Deserialize<'de>,
    {
        let keys = match kind {
            Some("kafka") => keys_of::<KafkaConfig>(),
            Some("jsonl") => keys_of::<JsonlConfig>(),
            _ => keys_of::<TargetConfig<C>>(),
        };
        keys.iter().copied().chain(["type"]).collect()
    }
}

impl SinkConfig {
    /// Every problem of this entry (`at`: where it is, for messages), given the source it serves.
    pub fn validate(&self, at: &str, source: &SourceConfig, p: &mut Vec<String>) {
        match self {
            SinkConfig::Iceberg(t) => t.validate(at, source, p),
            SinkConfig::Kafka(k) => k.validate(at, p),
            SinkConfig::Jsonl(j) => {
                if j.path.as_os_str().is_empty() {
                    p.push(format!("{at}.path: give the directory the change files go to"));
                }
            }
        }
    }
}

/// Value encoding of Kafka messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum KafkaFormat {
    /// The change row as `cdc changes` prints it.
    #[default]
    Json,
    /// Debezium's envelope (`before`, `after`, `op`, `source`, `ts_ms`).
    Debezium,
}

/// Where a Kafka sink without progress starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum KafkaInitial {
    /// The table at its current snapshot (`r` messages), then its changes.
    #[default]
    Snapshot,
    /// Only changes after the current snapshot.
    Latest,
    /// Every change from the first snapshot.
    Earliest,
}

/// A Kafka sink: the change stream of one source table on one topic, exactly once (transactions).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// `host:port[,host:port]`.
    pub bootstrap_servers: String,
    /// Topic name; `{namespace}`, `{table}` and `{pipeline}` are replaced.
    #[serde(default = "default_topic")]
    pub topic: String,
    #[serde(default)]
    /// How change rows are encoded as messages.
    pub format: KafkaFormat,
    /// Debezium: a tombstone (key, null value) after each delete, for compacted topics.
    #[serde(default = "default_true")]
    pub tombstones: bool,
    /// Debezium: Kafka Connect JSON framing (`schema` + `payload`) for `JsonConverter` with `schemas.enable=true`.
    #[serde(default)]
    pub schemas_enable: bool,
    #[serde(default)]
    /// Where a pipeline without recorded progress starts.
    pub initial: KafkaInitial,
    /// Compacted topic of the sinks' progress records (created when missing).
    #[serde(default = "default_progress_topic")]
    pub progress_topic: String,
    /// Stable per pipeline; a second instance with the same id fences the first. Default: `cdc-{pipeline}`.
    pub transactional_id: Option<String>,
    /// A transaction holds at most this many change rows (a larger snapshot spans several; progress is written
    /// with the last, and a restart resumes inside the snapshot).
    #[serde(default = "default_txn_rows")]
    pub max_transaction_rows: u64,
    /// ... and at most this many bytes of messages.
    #[serde(default = "default_txn_bytes", deserialize_with = "de_bytes")]
    pub max_transaction_bytes: u64,
    /// Source snapshots one transaction may cover at most (default 1000).
    pub snapshots_per_commit: Option<usize>,
    /// `google`: SASL OAUTHBEARER with Google access tokens (Google Cloud Managed Service for Apache Kafka).
    pub auth: Option<String>,
    /// The service account e-mail OAUTHBEARER presents (default: `client_email` of GOOGLE_APPLICATION_CREDENTIALS).
    pub principal: Option<String>,
    /// Passed to librdkafka as they are (compression.type, linger.ms, security.protocol, sasl.*, ssl.*, ...).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

fn default_topic() -> String {
    "cdc.{namespace}.{table}".into()
}
fn default_true() -> bool {
    true
}
fn default_progress_topic() -> String {
    "cdc-progress".into()
}
fn default_txn_rows() -> u64 {
    100_000
}
fn default_txn_bytes() -> u64 {
    64 * 1024 * 1024
}

/// Why a Kafka sink or `[cluster]` cannot be used by a build without the `kafka` cargo feature.
pub(crate) const LEFT_OUT_KAFKA: &str =
    "this cdc was built without Kafka (sinks of type \"kafka\", [cluster]); build it with `--features kafka` (on by default)";

impl KafkaConfig {
    /// Every problem of this section (`at`: where it is, for messages).
    pub fn validate(&self, at: &str, p: &mut Vec<String>) {
        if !cfg!(feature = "kafka") {
            p.push(format!("{at}: {LEFT_OUT_KAFKA}"));
        }
        if self.bootstrap_servers.trim().is_empty() {
            p.push(format!("{at}.bootstrap_servers: required (host:port of the brokers)"));
        }
        if self.topic.trim().is_empty() {
            p.push(format!("{at}.topic: must not be empty"));
        }
        if self.progress_topic.trim().is_empty() || self.progress_topic == self.topic {
            p.push(format!("{at}.progress_topic: must be a topic of its own"));
        }
        if self.max_transaction_rows == 0 {
            p.push(format!("{at}.max_transaction_rows: must be at least 1"));
        }
        if self.max_transaction_bytes < 1024 * 1024 {
            p.push(format!("{at}.max_transaction_bytes: below the 1MiB minimum"));
        }
        if self.snapshots_per_commit == Some(0) {
            p.push(format!("{at}.snapshots_per_commit: must be at least 1"));
        }
        if let Some(a) = &self.auth {
            if a != "google" {
                p.push(format!("{at}.auth: `{a}` — the only value is `google` (OAUTHBEARER with Google tokens)"));
            }
        }
        if self.format == KafkaFormat::Json && self.schemas_enable {
            p.push(format!("{at}.schemas_enable: only for format = \"debezium\""));
        }
        for k in ["transactional.id", "enable.idempotence", "isolation.level", "bootstrap.servers"] {
            if self.properties.contains_key(k) {
                p.push(format!("{at}.properties.{k}: set by cdc (exactly-once needs its own value); remove it"));
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
/// How the applier writes changes to the target.
pub enum WriteMode {
    #[default]
    /// Data files plus delete files (the only mode so far).
    MergeOnRead,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
/// How the applier deletes the target rows that a change removes or replaces.
pub enum DeleteMode {
    #[default]
    /// An equality delete on the key columns (the seed's layout): cheapest to write, but not every reader applies
    /// them (pyiceberg refuses them).
    Equality,
    /// By position: the rows are looked up by key in the target and deleted with position-delete files (v2) or
    /// deletion vectors (v3). No equality-delete file is ever written: every engine reads the target.
    Position,
}

/// A target table. `C` is how its catalog is given: inline (`[target.catalog]`, the default) or, in the service's
/// file, by the name of a `[catalogs.<name>]` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig<C = CatalogConfig> {
    /// The target table, `namespace.table`.
    pub table: String,
    #[serde(default)]
    /// How changes are written.
    pub mode: WriteMode,
    /// How rows are deleted: `"equality"` (default) or `"position"`.
    #[serde(default)]
    pub delete_mode: DeleteMode,
    /// Columns the equality deletes match on; default: the source's key columns.
    pub equality_columns: Option<Vec<String>>,
    /// Format version of a table the applier creates: 2 (position deletes) or 3 (deletion vectors).
    #[serde(default = "default_format_version")]
    pub format_version: u8,
    /// Source snapshots one target commit may cover (their changes are netted per key). Default: 1 for `cdc sync`;
    /// the daemon coalesces every new snapshot of a poll into one commit (up to 1000).
    pub snapshots_per_commit: Option<usize>,
    /// Attempts for a commit that conflicts or fails transiently.
    #[serde(default = "default_retries")]
    pub commit_retries: u32,
    /// First retry delay; doubles per attempt, with jitter.
    #[serde(default = "default_backoff", with = "humantime_serde")]
    pub retry_backoff: std::time::Duration,
    #[serde(default = "default_file_size", deserialize_with = "de_bytes")]
    /// Size a data file is closed at.
    pub target_file_size: u64,
    /// Keep columns the source dropped (optional, renamed out of the way when a new column takes the name) instead
    /// of dropping them from the target too.
    #[serde(default)]
    pub keep_dropped_columns: bool,
    /// Evolve the target's partition spec when the source's evolves (default: the target keeps its own).
    #[serde(default)]
    pub follow_partition_spec: bool,
    /// Expire the target's old snapshots after commits, and delete the files only they referenced.
    #[serde(default = "default_true")]
    pub expire_snapshots: bool,
    /// Snapshots younger than this are never expired.
    #[serde(default = "default_snapshot_retention", with = "humantime_serde")]
    pub snapshot_retention: std::time::Duration,
    /// The newest snapshots of the target's main branch that stay whatever their age (at least 1).
    #[serde(default = "default_retain_snapshots")]
    pub retain_snapshots: usize,
    /// Merge small manifests in commits (Iceberg Java's merge-append, by the table's `commit.manifest.*`
    /// properties), so that a snapshot's manifests follow the data, not the number of commits.
    #[serde(default = "default_true")]
    pub merge_manifests: bool,
    /// Compact the target after commits when due (see `compact_delete_files`, `compact_small_files`): small data
    /// files and those that deletes apply to are rewritten with the deletes applied, and the delete files no longer
    /// needed are removed, in a `replace` commit.
    #[serde(default = "default_true")]
    pub compact: bool,
    /// A partition (the table, when unpartitioned) is compacted once this many delete files apply to its data files.
    #[serde(default = "default_compact_files")]
    pub compact_delete_files: usize,
    /// ... or once it holds this many data files smaller than three quarters of `target_file_size`.
    #[serde(default = "default_compact_files")]
    pub compact_small_files: usize,
    /// Data bytes one compaction rewrites at most (in a `cdc sync` and on position-delete targets it delays the next
    /// commit by its duration; the service compacts equality-delete targets in the background); `cdc maintain` has
    /// no such bound.
    #[serde(default = "default_compact_max_bytes", deserialize_with = "de_bytes")]
    pub compact_max_bytes: u64,
    /// The service compacts a target completely once it has found nothing to apply for this long: every delete
    /// file that applies to data is folded in and every partition's small files are merged (`compact_max_bytes`
    /// per pass, passes until nothing is left). A table at rest then reads at its fastest — Spark answers
    /// `count(*)` from metadata only when no delete file is live. `"0s"` turns it off; `cdc sync` never does it.
    #[serde(default = "default_compact_idle_after", with = "humantime_serde")]
    pub compact_idle_after: std::time::Duration,
    /// The service (and a long `cdc sync`) sweeps the target for orphan files this often, after a commit: files no
    /// snapshot references, older than `orphan_grace`. `"0s"` turns the sweep off; `cdc maintain` always sweeps.
    #[serde(default = "default_orphan_sweep_interval", with = "humantime_serde")]
    pub orphan_sweep_interval: std::time::Duration,
    /// Orphan sweeps delete unreferenced files only when older than this: another writer's commit may be in
    /// flight with its files written and its metadata not yet.
    #[serde(default = "default_orphan_grace", with = "humantime_serde")]
    pub orphan_grace: std::time::Duration,
    /// The target's catalog (a `[catalogs.<name>]` name in a service file, resolved to its settings).
    pub catalog: C,
}

impl TargetConfig {
    /// Every problem of this section (`at`: where it is, for messages), given the source it serves.
    pub fn validate(&self, at: &str, source: &SourceConfig, p: &mut Vec<String>) {
        validate_table_name(&format!("{at}.table"), &self.table, p);
        self.catalog.validate(&format!("{at}.catalog"), p);
        if !(2..=3).contains(&self.format_version) {
            p.push(format!("{at}.format_version: {} — must be 2 or 3", self.format_version));
        }
        if self.snapshots_per_commit == Some(0) {
            p.push(format!("{at}.snapshots_per_commit: must be at least 1"));
        }
        if self.equality_columns.as_ref().is_some_and(|c| c.is_empty()) {
            p.push(format!("{at}.equality_columns: must not be empty (omit it to use the source's key columns)"));
        }
        if self.target_file_size < 1024 * 1024 {
            p.push(format!("{at}.target_file_size: below the 1MiB minimum"));
        }
        if self.retain_snapshots == 0 {
            p.push(format!("{at}.retain_snapshots: must be at least 1 (the head always stays)"));
        }
        if self.compact_delete_files == 0 || self.compact_small_files < 2 {
            p.push(format!("{at}.compact_delete_files must be at least 1 and {at}.compact_small_files at least 2"));
        }
        if self.compact_max_bytes == 0 {
            p.push(format!("{at}.compact_max_bytes: must be more than 0 (set `compact = false` to turn compaction off)"));
        }
        if self.catalog.kind == source.catalog.kind
            && self.catalog.warehouse == source.catalog.warehouse
            && self.catalog.props == source.catalog.props
            && self.table == source.table
        {
            p.push(format!("{at}.table: the target is the source table itself"));
        }
    }
}

impl<C> TargetConfig<C> {
    /// The same target with its catalog resolved.
    pub fn with_catalog<D>(self, catalog: D) -> TargetConfig<D> {
        TargetConfig {
            table: self.table,
            mode: self.mode,
            delete_mode: self.delete_mode,
            equality_columns: self.equality_columns,
            format_version: self.format_version,
            snapshots_per_commit: self.snapshots_per_commit,
            commit_retries: self.commit_retries,
            retry_backoff: self.retry_backoff,
            target_file_size: self.target_file_size,
            keep_dropped_columns: self.keep_dropped_columns,
            follow_partition_spec: self.follow_partition_spec,
            expire_snapshots: self.expire_snapshots,
            snapshot_retention: self.snapshot_retention,
            retain_snapshots: self.retain_snapshots,
            merge_manifests: self.merge_manifests,
            compact: self.compact,
            compact_delete_files: self.compact_delete_files,
            compact_small_files: self.compact_small_files,
            compact_max_bytes: self.compact_max_bytes,
            compact_idle_after: self.compact_idle_after,
            orphan_sweep_interval: self.orphan_sweep_interval,
            orphan_grace: self.orphan_grace,
            catalog,
        }
    }
}

fn default_snapshot_retention() -> std::time::Duration {
    std::time::Duration::from_secs(3600)
}
fn default_orphan_sweep_interval() -> std::time::Duration {
    std::time::Duration::from_secs(24 * 3600)
}
fn default_compact_idle_after() -> std::time::Duration {
    std::time::Duration::from_secs(5 * 60)
}
fn default_orphan_grace() -> std::time::Duration {
    std::time::Duration::from_secs(3 * 24 * 3600)
}
fn default_compact_files() -> usize {
    16
}
fn default_compact_max_bytes() -> u64 {
    256 << 20
}
fn default_retain_snapshots() -> usize {
    10
}
fn default_format_version() -> u8 {
    2
}
fn default_retries() -> u32 {
    5
}
fn default_backoff() -> std::time::Duration {
    std::time::Duration::from_millis(200)
}
fn default_file_size() -> u64 {
    DEFAULT_TARGET_FILE_SIZE
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
/// The source table.
pub struct SourceConfig {
    /// `namespace.table` (nested namespaces: `a.b.table`); or leave it out and give `tables` (`cdc sync` only).
    #[serde(default)]
    pub table: String,
    /// Patterns of `namespace.table` names ([`crate::pattern`]): `cdc sync` copies every matching table of the
    /// catalog, each to the destination its sinks' `{namespace}`/`{table}` templates name.
    #[serde(default)]
    pub tables: Vec<String>,
    /// Patterns of tables `tables` leaves out.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Row key; default: the table's identifier fields.
    pub key_columns: Option<Vec<String>>,
    /// Where the table is.
    pub catalog: CatalogConfig,
    /// What a destination does when the source's history no longer runs through its progress.
    #[serde(default)]
    pub on_history_rewrite: OnHistoryRewrite,
}

impl SourceConfig {
    /// The source's table patterns (`None`: one named table).
    pub(crate) fn patterns(&self) -> Option<crate::pattern::TablePatterns<'_>> {
        (!self.tables.is_empty() || !self.exclude.is_empty())
            .then_some(crate::pattern::TablePatterns { tables: &self.tables, exclude: &self.exclude })
    }

    /// Whether the source is given as table patterns (`tables`) rather than one table.
    pub fn has_patterns(&self) -> bool {
        self.patterns().is_some()
    }

    /// This source for table `name` of its catalog (no patterns).
    pub(crate) fn for_table(&self, name: &str) -> SourceConfig {
        SourceConfig { table: name.to_string(), tables: Vec::new(), exclude: Vec::new(), ..self.clone() }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
/// What a destination does when the source's history was rewritten under it: a rollback, a cherry-pick onto another
/// line, `set_current_snapshot`, `CREATE OR REPLACE`, or a new table under the same name.
pub enum OnHistoryRewrite {
    /// One commit brings the destination to the source's new state, and says so in its summary.
    #[default]
    Follow,
    /// Stop with exit code 14 and say what happened and how to follow it.
    Stop,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
/// The kinds of catalog `cdc` speaks.
pub enum CatalogType {
    /// Spark/Java's filesystem layout.
    Hadoop,
    /// iceberg-rust's SQL catalog on sqlite (the embedded default).
    Sql,
    /// An Iceberg REST catalog.
    Rest,
    /// Google BigLake's Iceberg REST catalog: `project`, `location`, `warehouse` (the REST client's settings derive
    /// from them).
    Biglake,
    /// A Hive Metastore: `uri = "thrift://HOST:PORT"`, optional `warehouse` (where new databases go).
    Hive,
    /// The AWS Glue Data Catalog: `region`, optional `endpoint`, `catalog-id`, credentials, `warehouse`.
    Glue,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
/// How to reach a catalog.
pub struct CatalogConfig {
    #[serde(rename = "type")]
    /// Its kind (`type` in the file).
    pub kind: CatalogType,
    /// The warehouse location (a path or a URI).
    pub warehouse: Option<String>,
    /// Everything else is a catalog property (uri, token, credential, header.X, ...).
    #[serde(flatten)]
    pub props: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
/// Engine settings shared by every run of a file.
pub struct EngineConfig {
    /// Memory a snapshot's change rows may take before they are sorted in runs and spilled to disk
    /// ("256MiB", "1GiB", or bytes).
    #[serde(default = "default_budget", deserialize_with = "de_bytes")]
    pub memory_budget: u64,
    /// Where spill files go; default: the system temp dir.
    pub spill_dir: Option<PathBuf>,
    /// Data files read concurrently.
    #[serde(default = "default_concurrency")]
    pub read_concurrency: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { memory_budget: DEFAULT_MEMORY_BUDGET, spill_dir: None, read_concurrency: default_concurrency() }
    }
}

fn default_budget() -> u64 {
    DEFAULT_MEMORY_BUDGET
}
fn default_concurrency() -> usize {
    4
}

fn de_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum V {
        N(u64),
        S(String),
    }
    match V::deserialize(d)? {
        V::N(n) => Ok(n),
        V::S(s) => parse_bytes(&s).map_err(serde::de::Error::custom),
    }
}

/// "512MiB", "2 GiB", "100MB", "1048576".
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("`{s}` is not a size (e.g. 256MiB)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        u => return Err(format!("unknown size unit `{u}` in `{s}` (use B, KiB, MiB, GiB)")),
    };
    Ok((n * mult as f64) as u64)
}

/// Expands `${NAME}` from the environment; `$${` stays a literal `${`. Unset variables are errors.
pub fn expand_env(text: &str, lookup: impl Fn(&str) -> Option<String>) -> std::result::Result<String, Vec<String>> {
    let mut out = String::with_capacity(text.len());
    let mut errors = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        if i > 0 && rest.as_bytes()[i - 1] == b'$' {
            out.push_str(&rest[..i - 1]);
            out.push_str("${");
            rest = &rest[i + 2..];
            continue;
        }
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        match after.find('}') {
            Some(end) => {
                let name = &after[..end];
                match lookup(name) {
                    Some(v) => out.push_str(&v),
                    None => errors.push(format!("environment variable `{name}` is not set (referenced as ${{{name}}})")),
                }
                rest = &after[end + 1..];
            }
            None => {
                errors.push("unterminated `${` in config".to_string());
                rest = "";
            }
        }
    }
    out.push_str(rest);
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// The keys a configuration section takes: the fields its struct declares to serde (after renames), read from the
/// type's own `Deserialize` impl, so a field added to a struct is a known key without a list to keep beside it.
///
/// Works by handing `T::deserialize` a deserializer that records the field list serde's derive passes to
/// `deserialize_struct`, then stops. A type that is not a plain struct (a map, an enum, `#[serde(flatten)]`) has
/// no such list: it yields no keys, which the unit tests would show.
pub(crate) fn keys_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    use serde::de::{Error as _, Visitor};
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Probe<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> std::result::Result<V::Value, Self::Error> {
            Err(Self::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> std::result::Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(Self::Error::custom("field names recorded"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

/// Every key no section takes, with the section and the keys it does take (catalog sections pass unknown keys on as
/// catalog properties).
fn unknown_keys(value: &toml::Value) -> Vec<String> {
    let mut out = Vec::new();
    unknown_in("", Some(value), keys_of::<ConfigFile>(), &mut out);
    unknown_in("source", value.get("source"), keys_of::<SourceConfig>(), &mut out);
    unknown_in("target", value.get("target"), keys_of::<TargetConfig>(), &mut out);
    unknown_in("kafka", value.get("kafka"), keys_of::<KafkaConfig>(), &mut out);
    unknown_in("engine", value.get("engine"), keys_of::<EngineConfig>(), &mut out);
    unknown_sink_keys::<CatalogConfig>("sinks", value.get("sinks"), &mut out);
    out
}

/// The unknown keys of every entry of a list of sinks (`at`: the list's place in the file).
pub(crate) fn unknown_sink_keys<C: for<'de> Deserialize<'de>>(at: &str, sinks: Option<&toml::Value>, out: &mut Vec<String>) {
    for (j, s) in sinks.and_then(toml::Value::as_array).into_iter().flatten().enumerate() {
        let keys = SinkConfig::<C>::keys_of_type(s.get("type").and_then(toml::Value::as_str));
        unknown_in(&format!("{at}[{j}]"), Some(s), &keys, out);
    }
}

/// Parse → validate for a TOML configuration: `${ENV}` expanded, every unknown key listed (serde stops at the first
/// one), then the typed parse, then every problem `validate` finds.
pub(crate) fn parse_checked<T: serde::de::DeserializeOwned>(
    text: &str,
    unknown_keys: fn(&toml::Value) -> Vec<String>,
    validate: fn(&T) -> Vec<String>,
) -> Result<T> {
    let text = expand_env(text, |k| std::env::var(k).ok()).map_err(Error::Config)?;
    let mut problems: Vec<String> = match toml::from_str::<toml::Value>(&text) {
        Ok(value) => unknown_keys(&value).into_iter().map(|m| with_line_of_key(&text, m)).collect(),
        // a syntax error: nothing else can be read
        Err(e) => return Err(Error::Config(vec![located(&text, &e)])),
    };
    match typed_parse::<T>(&text) {
        (Some(cfg), typed) => {
            problems.extend(typed);
            problems.extend(validate(&cfg));
            if problems.is_empty() {
                return Ok(cfg);
            }
        }
        (None, typed) => problems.extend(typed),
    }
    Err(Error::Config(problems))
}

/// The typed parse of `text`, going on past each value of a wrong type (or an unknown key, already reported): its
/// line is reported and left out, and the parse tried again — so that one mistake does not hide the others. The
/// configuration is returned when what is left parses; a key left out that the parse then misses is not reported
/// twice. Problems come as `line N: …`.
fn typed_parse<T: serde::de::DeserializeOwned>(text: &str) -> (Option<T>, Vec<String>) {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let (mut problems, mut left_out) = (Vec::new(), Vec::<String>::new());
    for _ in 0..64 {
        let working = lines.join("\n");
        let e = match toml::from_str::<T>(&working) {
            Ok(cfg) => return (Some(cfg), problems),
            Err(e) => e,
        };
        let message = e.message().to_string();
        let missing = message.strip_prefix("missing field `").and_then(|m| m.split('`').next()).map(str::to_string);
        if missing.as_ref().is_some_and(|m| left_out.contains(m)) {
            return (None, problems); // the consequence of a line left out, not a problem of its own
        }
        if !message.starts_with("unknown field") {
            problems.push(located(&working, &e));
        }
        // leave out the line of a `key = value` (not of a table header or an inline table holding other keys)
        let line = e.span().map(|s| working[..s.start.min(working.len())].matches('\n').count()).filter(|&l| l < lines.len());
        let key = line.and_then(|l| lines[l].split_once('=')).map(|(k, _)| k.trim().trim_matches('"').to_string());
        match (line, key) {
            (Some(l), Some(k)) if !k.starts_with('[') && !lines[l].contains('{') => {
                left_out.push(k);
                lines[l].clear();
            }
            _ => return (None, problems),
        }
    }
    (None, problems)
}

/// A TOML error as `line N (`key`): message`.
fn located(text: &str, e: &toml::de::Error) -> String {
    let Some(s) = e.span() else { return e.message().trim().to_string() };
    let n = text[..s.start.min(text.len())].matches('\n').count();
    let key = text
        .lines()
        .nth(n)
        .and_then(|l| l.split_once('='))
        .map(|(k, _)| k.trim())
        .filter(|k| !k.is_empty() && !k.starts_with('[') && !k.contains('{'))
        .map(|k| format!(" (`{}`)", k.trim_matches('"')))
        .unwrap_or_default();
    format!("line {}{key}: {}", n + 1, e.message().trim())
}

/// An unknown-key message (`unknown key `a.b` …`) with the line of that key, where a plain `key =` line under its
/// table header holds it.
fn with_line_of_key(text: &str, message: String) -> String {
    let Some(path) = message.strip_prefix("unknown key `").and_then(|m| m.split('`').next()) else { return message };
    let (section, key) = path.rsplit_once('.').unwrap_or(("", path));
    let mut header = String::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.starts_with('[') {
            header = t.trim_matches(|c| c == '[' || c == ']').trim().to_string();
        } else if header == section && t.split_once('=').is_some_and(|(k, _)| k.trim().trim_matches('"') == key) {
            return format!("line {}: {message}", i + 1);
        }
    }
    message
}

/// Appends to `out` every key of the table `v` (at `section`) that is not in `known`.
pub(crate) fn unknown_in(section: &str, v: Option<&toml::Value>, known: &[&str], out: &mut Vec<String>) {
    let Some(table) = v.and_then(toml::Value::as_table) else { return };
    for k in table.keys() {
        if !known.contains(&k.as_str()) {
            let at = if section.is_empty() { k.clone() } else { format!("{section}.{k}") };
            out.push(format!("unknown key `{at}` (expected one of: {})", known.join(", ")));
        }
    }
}

impl Config {
    /// Reads, parses and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ConfigFile { path: path.to_path_buf(), source })?;
        Self::parse(&text)
    }

    /// Parses and validates a configuration (every problem at once).
    pub fn parse(text: &str) -> Result<Config> {
        parse_checked(text, unknown_keys, ConfigFile::validate).map(Config::from)
    }

    /// [`Self::load`] for a command that reads one table: a file of table patterns is refused (they are for `cdc
    /// sync` and the service), and the sinks' `{namespace}`/`{table}` templates are filled with the source's table.
    pub fn load_one(path: &Path) -> Result<Config> {
        let cfg = Self::load(path)?;
        if cfg.source.patterns().is_some() {
            return Err(Error::Config(vec![
                "source.tables: this command reads one table; name it with source.table (patterns are for `cdc sync` and `cdc run`)".into(),
            ]));
        }
        Ok(cfg.for_table(&cfg.source.table))
    }

    /// This configuration for table `name` of the source's catalog: the source names it (no patterns), and each
    /// sink's templates are filled ([`SinkConfig::for_table`]).
    pub fn for_table(&self, name: &str) -> Config {
        Config { source: self.source.for_table(name), sinks: self.sinks.iter().map(|s| s.for_table(name)).collect(), engine: self.engine.clone() }
    }

    /// The Iceberg target tables among the sinks, in order.
    pub fn targets(&self) -> impl Iterator<Item = &TargetConfig> + Clone {
        self.sinks.iter().filter_map(|s| match s {
            SinkConfig::Iceberg(t) => Some(t),
            _ => None,
        })
    }
}

impl ConfigFile {
    /// Pure checks; returns every problem found, each sink named where the file has it (`target`, `kafka`,
    /// `sinks[i]`).
    fn validate(&self) -> Vec<String> {
        let mut p = Vec::new();
        // a file of patterns is checked as it is for a table they match
        let many = self.source.patterns().is_some();
        let source = match self.source.patterns() {
            Some(patterns) => {
                patterns.validate("source", &self.source.table, &mut p);
                self.source.for_table(crate::pattern::SAMPLE_TABLE)
            }
            None => self.source.clone(),
        };
        validate_table_and_keys("source", &source.table, source.key_columns.as_deref(), &mut p);
        self.source.catalog.validate("source.catalog", &mut p);
        let shorthands = self.target.clone().map(|t| ("target".to_string(), SinkConfig::Iceberg(t)));
        let named = shorthands.into_iter().chain(self.kafka.clone().map(|k| ("kafka".to_string(), SinkConfig::Kafka(k))));
        for (at, sink) in named.chain(self.sinks.iter().enumerate().map(|(i, s)| (format!("sinks[{i}]"), s.clone()))) {
            if many {
                sink.check_names_each_table(&at, &mut p);
            }
            sink.for_table(&source.table).validate(&at, &source, &mut p);
        }
        self.engine.validate(&mut p);
        p
    }
}

impl EngineConfig {
    /// Every problem of `[engine]`.
    pub fn validate(&self, p: &mut Vec<String>) {
        if self.memory_budget < 1024 * 1024 {
            p.push(format!("engine.memory_budget: {} bytes is below the 1MiB minimum", self.memory_budget));
        }
        if self.read_concurrency == 0 || self.read_concurrency > 256 {
            p.push("engine.read_concurrency: must be between 1 and 256".into());
        }
    }
}

/// The problems of a source's `table` and `key_columns` (`at`: where they are).
pub(crate) fn validate_table_and_keys(at: &str, table: &str, key_columns: Option<&[String]>, p: &mut Vec<String>) {
    validate_table_name(&format!("{at}.table"), table, p);
    if let Some(keys) = key_columns {
        if keys.is_empty() {
            p.push(format!("{at}.key_columns: must not be empty (omit it to use the identifier fields)"));
        }
        let mut seen = std::collections::HashSet::new();
        for k in keys {
            if !seen.insert(k) {
                p.push(format!("{at}.key_columns: `{k}` is listed twice"));
            }
        }
    }
}

fn validate_table_name(field: &str, name: &str, p: &mut Vec<String>) {
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() < 2 || parts.iter().any(|s| s.trim().is_empty()) {
        p.push(format!("{field}: `{name}` must be `namespace.table`"));
    }
}

/// Splits `a.b.table` into (namespace parts, table name).
pub fn split_table_name(name: &str) -> (Vec<String>, String) {
    let mut parts: Vec<String> = name.split('.').map(str::to_string).collect();
    let table = parts.pop().unwrap_or_default();
    (parts, table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_keys_are_the_fields_the_types_declare() {
        assert_eq!(keys_of::<ConfigFile>(), ["source", "target", "kafka", "sinks", "engine"]);
        assert_eq!(keys_of::<SourceConfig>(), ["table", "tables", "exclude", "key_columns", "catalog", "on_history_rewrite"]);
        let target = [
            "table",
            "mode",
            "delete_mode",
            "equality_columns",
            "format_version",
            "snapshots_per_commit",
            "commit_retries",
            "retry_backoff",
            "target_file_size",
            "keep_dropped_columns",
            "follow_partition_spec",
            "expire_snapshots",
            "snapshot_retention",
            "retain_snapshots",
            "merge_manifests",
            "compact",
            "compact_delete_files",
            "compact_small_files",
            "compact_max_bytes",
            "compact_idle_after",
            "orphan_sweep_interval",
            "orphan_grace",
            "catalog",
        ];
        assert_eq!(keys_of::<TargetConfig>(), target);
        assert_eq!(keys_of::<TargetConfig<String>>(), target);
        assert_eq!(keys_of::<EngineConfig>(), ["memory_budget", "spill_dir", "read_concurrency"]);
        assert!(keys_of::<KafkaConfig>().starts_with(&["bootstrap_servers", "topic", "format"]) && keys_of::<KafkaConfig>().contains(&"properties"));
        // not a struct: no keys
        assert!(keys_of::<std::collections::HashMap<String, String>>().is_empty());
    }

    #[test]
    fn reports_every_problem_at_once() {
        let err = Config::parse(
            r#"
            [source]
            table = "orders"
            key_columns = ["id", "id"]
            [source.catalog]
            type = "rest"
            [engine]
            memory_budget = "10KiB"
            "#,
        )
        .unwrap_err();
        let Error::Config(p) = err else { panic!("{err}") };
        assert_eq!(p.len(), 4, "{p:?}");
    }

    #[test]
    fn a_value_of_the_wrong_type_hides_no_other_problem() {
        // a type error, an unknown key, a bad catalog value and a bad size: all four, each with its line
        let err = Config::parse(
            "[source]\ntable = \"a.b\"\nkey_columns = \"id\"\nbogus = 1\n[source.catalog]\ntype = \"rest\"\nuri = \"ftp://x\"\n[engine]\nmemory_budget = \"10KiB\"\nread_concurrency = \"four\"\n",
        )
        .unwrap_err();
        let Error::Config(p) = err else { panic!("{err}") };
        let all = p.join("\n");
        for needle in ["line 3 (`key_columns`)", "line 4: unknown key `source.bogus`", "ftp://x", "line 10 (`read_concurrency`)", "memory_budget"] {
            assert!(all.contains(needle), "{needle} missing: {all}");
        }
        assert!(!all.contains("missing field"), "a line left out is not reported again: {all}");
    }

    #[test]
    fn reports_every_unknown_key() {
        let err = Config::parse(
            "bogus = 1\n[source]\ntable = \"a.b\"\ntabel = 1\n[source.catalog]\ntype = \"hadoop\"\nwarehouse = \"/w\"\n[engine]\nmemory = 1\n",
        )
        .unwrap_err()
        .to_string();
        for k in ["`bogus`", "`source.tabel`", "`engine.memory`"] {
            assert!(err.contains(k), "{k}: {err}");
        }
    }

    #[test]
    fn rejects_unknown_keys() {
        let err = Config::parse("[source]\ntable='a.b'\nbogus=1\n[source.catalog]\ntype='hadoop'\nwarehouse='/x'\n").unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn expands_env_and_passes_props() {
        let out = expand_env("a=${X} b=$${Y}", |k| (k == "X").then(|| "1".to_string())).unwrap();
        assert_eq!(out, "a=1 b=${Y}");
        assert!(expand_env("${NOPE}", |_| None).unwrap_err()[0].contains("NOPE"));
        let cfg = Config::parse("[source]\ntable='db.t'\n[source.catalog]\ntype='rest'\nuri='http://x'\n'header.X-Y'='z'\n").unwrap();
        assert_eq!(cfg.source.catalog.props.get("header.X-Y").unwrap(), "z");
        assert_eq!(cfg.engine.memory_budget, DEFAULT_MEMORY_BUDGET);
    }

    #[test]
    fn target_section() {
        let base = "[source]\ntable='db.t'\n[source.catalog]\ntype='hadoop'\nwarehouse='/w'\n";
        let cfg = Config::parse(&format!("{base}[target]\ntable='r.t'\nretry_backoff='1s'\n[target.catalog]\ntype='sql'\nwarehouse='/x'\n")).unwrap();
        let t = cfg.targets().next().unwrap();
        assert_eq!((t.format_version, t.snapshots_per_commit, t.retry_backoff), (2, None, std::time::Duration::from_secs(1)));
        let err = Config::parse(&format!("{base}[target]\ntable='db.t'\nformat_version=4\nsnapshots_per_commit=0\nmode='copy-on-write'\n[target.catalog]\ntype='hadoop'\nwarehouse='/w'\n")).unwrap_err();
        assert!(err.to_string().contains("mode"), "{err}");
        let Error::Config(p) = Config::parse(&format!(
            "{base}[target]\ntable='db.t'\nformat_version=4\nsnapshots_per_commit=0\n[target.catalog]\ntype='hadoop'\nwarehouse='/w'\n"
        ))
        .unwrap_err() else {
            panic!()
        };
        assert_eq!(p.len(), 3, "{p:?}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("2 GiB").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("123").unwrap(), 123);
        assert!(parse_bytes("5 parsecs").is_err());
    }

    #[test]
    fn catalog_key_problems_are_reported_together() {
        let Error::Config(p) = Config::parse(
            "[source]\ntable='db.t'\n[source.catalog]\ntype='biglake'\nwarehouse='s3://x'\nlocation='US Central'\nauth='gcloud'\ntokn='x'\n",
        )
        .unwrap_err() else {
            panic!()
        };
        let all = p.join("\n");
        for needle in ["project: required", "warehouse: `s3://x`", "location: `US Central`", "auth: `gcloud`", "tokn: unknown key"] {
            assert!(all.contains(needle), "{needle} missing in {all}");
        }
        let Error::Config(p) = Config::parse("[source]\ntable='db.t'\n[source.catalog]\ntype='hadoop'\nwarehouse='gs://b/wh'\n").unwrap_err() else {
            panic!()
        };
        assert!(p[0].contains("local directories only"), "{p:?}");
        assert!(Config::parse(
            "[source]\ntable='db.t'\n[source.catalog]\ntype='rest'\nuri='http://x'\n'gcs.service.path'='http://y'\n'header.A'='b'\n"
        )
        .is_ok());
    }

    #[test]
    fn hive_catalog_keys() {
        let parse = |cat: &str| Config::parse(&format!("[source]\ntable='db.t'\n[source.catalog]\ntype='hive'\n{cat}"));
        assert!(parse("uri='thrift://meta:9083'\nwarehouse='gs://b/wh'\nauth='google'\n's3.endpoint'='http://x'\n").is_ok());
        let Error::Config(p) = parse("uri='http://meta:9083'\ntoken='x'\n").unwrap_err() else { panic!() };
        let all = p.join("\n");
        assert!(all.contains("must be thrift://HOST:PORT") && all.contains("token: unknown key for a hive catalog"), "{all}");
        let Error::Config(p) = parse("").unwrap_err() else { panic!() };
        assert!(p[0].contains("uri: required for a hive catalog"), "{p:?}");
    }

    #[test]
    fn glue_catalog_keys() {
        let parse = |cat: &str| Config::parse(&format!("[source]\ntable='db.t'\n[source.catalog]\ntype='glue'\n{cat}"));
        assert!(parse(
            "region='eu-west-1'\nendpoint='http://127.0.0.1:5000'\n'access-key-id'='a'\n'secret-access-key'='b'\n's3.endpoint'='http://x'\n"
        )
        .is_ok());
        let Error::Config(p) = parse("endpoint='glue.local'\n'access-key-id'='a'\nuri='x'\n").unwrap_err() else { panic!() };
        let all = p.join("\n");
        for needle in ["endpoint: `glue.local`", "go together", "uri: unknown key for a glue catalog"] {
            assert!(all.contains(needle), "{needle} missing in {all}");
        }
    }

    #[test]
    fn kafka_section() {
        let base = "[source]\ntable='db.t'\n[source.catalog]\ntype='hadoop'\nwarehouse='/w'\n";
        let cfg = Config::parse(&format!("{base}[kafka]\nbootstrap_servers='b:9092'\nformat='debezium'\nmax_transaction_bytes='8MiB'\n")).unwrap();
        let [SinkConfig::Kafka(k)] = &cfg.sinks[..] else { panic!("{:?}", cfg.sinks) };
        assert_eq!(
            (k.format, k.initial, k.topic.as_str(), k.max_transaction_bytes),
            (KafkaFormat::Debezium, KafkaInitial::Snapshot, "cdc.{namespace}.{table}", 8 << 20)
        );
        let Error::Config(p) = Config::parse(&format!(
            "{base}[kafka]\nbootstrap_servers=''\nschemas_enable=true\nmax_transaction_rows=0\nauth='aws'\nproperties={{'transactional.id'='x'}}\n"
        ))
        .unwrap_err() else {
            panic!()
        };
        let all = p.join("\n");
        for needle in
            ["bootstrap_servers: required", "schemas_enable: only for", "max_transaction_rows", "auth: `aws`", "properties.transactional.id"]
        {
            assert!(all.contains(needle), "{needle} missing in {all}");
        }
        assert!(Config::parse(&format!("{base}[kafka]\nbootstrap_servers='b'\nlinger=1\n")).unwrap_err().to_string().contains("kafka.linger"));
    }
}

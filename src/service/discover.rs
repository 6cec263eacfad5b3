//! Discovery: the tables each pipeline of table patterns stands for, found by listing its catalog.
//!
//! Each catalog a pattern names is listed once per discovery, whatever the number of pipelines on it
//! ([`crate::catalog::Catalog::list_tables`]: one query for sqlite, a directory walk for hadoop, paginated list
//! calls for REST and Glue, three calls a database for a Hive Metastore); every pipeline of patterns on it then
//! selects its tables from that one listing (pure: [`select`]). A catalog that cannot be listed leaves its pipelines
//! with the tables found before — an outage of the catalog stops no pipeline that is running — and is reported.
//!
//! Discovery runs in its own task ([`Discoverer`]): every `discover_interval`, and at once when the configuration is
//! reloaded; the service applies what it finds like a reload (new tables start their loops, gone ones stop theirs),
//! so a slow listing delays no loop and no signal. Before it tells the service, the task settles what came and went:
//! - **renames** ([`follow_renames`], `on_rename = "rename"`): a table gone and one added in the same discovery with
//!   the same uuid (the gone table's uuid is the one its Iceberg destination records progress for) is one table
//!   renamed: its destinations are renamed to the new name's, so the new name's loop resumes from their progress;
//! - **drops** ([`Gone`], `on_drop = "drop"`): a gone table's Iceberg destinations are dropped once it has been gone
//!   for `drop_grace`. Since when is the [`GONE_PROPERTY`] mark's time, so a restart does not restart the grace: the
//!   first discovery after a start finds the destinations whose table went meanwhile ([`Gone::scan`]).
//!
//! Only the instance that owns a table's pipeline ([`Owns`]) renames or drops its destinations. A destination is only
//! ever dropped when it is marked gone and no table the pipeline follows now is named to it.
//!
//! A gone table's destination otherwise follows the pipeline's [`OnDrop`]: kept and marked ([`mark`]), or its loop
//! kept to report the missing table.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use iceberg::{TableRequirement, TableUpdate};
use tokio::sync::watch;

use super::config::{Discovered, OnDrop, OnRename, PipelineConfig, ServiceConfig, GONE_PROPERTY};
use super::telemetry::Telemetry;
use crate::catalog::Catalog;
use crate::config::{CatalogConfig, SinkConfig};
use crate::sink::iceberg::progress::PROPERTY_PREFIX;

/// Whether this instance runs a pipeline, by name (`<pipeline>:<namespace.table>`).
pub(crate) type Owns = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The discovery task: lists the catalogs on an interval and when told the configuration changed.
pub(crate) struct Discoverer {
    found: watch::Receiver<Discovered>,
    cfg: watch::Sender<(ServiceConfig, Owns)>,
    task: tokio::task::JoinHandle<()>,
}

impl Discoverer {
    /// Starts discovering for `cfg`, from `first` (what a discovery before the start found); `owns` tells which
    /// pipelines' destinations this instance may rename or drop.
    pub(crate) fn start(cfg: ServiceConfig, first: Discovered, owns: Owns, telemetry: Arc<Telemetry>) -> Discoverer {
        let (found_tx, found) = watch::channel(first.clone());
        let (cfg_tx, mut cfg_rx) = watch::channel((cfg, owns));
        let task = tokio::spawn(async move {
            let mut last = first;
            let mut gone = Gone::default();
            let mut scan = true;
            // the listed catalogs stay connected between discoveries: what a listing learnt (a Hive Metastore's
            // table kinds) serves the next one
            let first_cfg = cfg_rx.borrow().0.clone();
            let mut _held = hold(&first_cfg).await;
            loop {
                if scan {
                    // after a start or reload: the destinations of tables that went while nobody watched
                    let cfg = cfg_rx.borrow().0.clone();
                    gone.scan(&cfg, &last).await;
                }
                let interval = cfg_rx.borrow().0.service.discover_interval;
                let reconfigured = tokio::select! {
                    _ = tokio::time::sleep(interval) => false,
                    changed = cfg_rx.changed() => match changed {
                        Ok(()) => true,
                        Err(_) => return, // the service is gone
                    },
                };
                let (cfg, owns) = cfg_rx.borrow_and_update().clone();
                // a reload starts from the listing alone: tables a `stop` pipeline kept for their missing table leave
                let before = if reconfigured { Discovered::new() } else { last.clone() };
                let now = if cfg.has_patterns() { discover(&cfg, &before, &telemetry).await } else { Discovered::new() };
                _held = hold(&cfg).await;
                follow_renames(&cfg, &last, &now, &owns, &telemetry).await;
                gone.follow(&cfg, &last, &now, SystemTime::now());
                gone.drop_due(&cfg, &now, &owns, &telemetry).await;
                scan = reconfigured;
                if now != last {
                    last = now.clone();
                    if found_tx.send(now).is_err() {
                        return;
                    }
                }
            }
        });
        Discoverer { found, cfg: cfg_tx, task }
    }

    /// The configuration was reloaded: discover for `cfg` now.
    pub(crate) fn reconfigure(&self, cfg: ServiceConfig, owns: Owns) {
        let _ = self.cfg.send((cfg, owns));
    }

    /// What discovery found, once it differs from the last seen.
    pub(crate) async fn changed(&mut self) -> Discovered {
        if self.found.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        self.found.borrow_and_update().clone()
    }
}

impl Drop for Discoverer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What `cfg`'s pipelines of patterns stand for now: each catalog listed once; a catalog that fails keeps its
/// pipelines' entries of `before`. Events (tables added and gone, calls, failures) go to `telemetry`.
pub(crate) async fn discover(cfg: &ServiceConfig, before: &Discovered, telemetry: &Telemetry) -> Discovered {
    let mut listings = BTreeMap::new();
    for (name, listed, seconds) in list_catalogs(cfg).await {
        telemetry.catalog_listed(name, listed.as_ref().map(|(t, calls)| (t.len(), *calls)), seconds);
        listings.insert(name, listed.ok().map(|(t, _)| t));
    }
    let found = select(cfg, &listings, before);
    for (pipeline, tables) in &found {
        let old = before.get(pipeline).map(Vec::as_slice).unwrap_or_default();
        let added: Vec<String> = tables.iter().filter(|t| !old.contains(t)).cloned().collect();
        let gone: Vec<String> = old.iter().filter(|t| !tables.contains(t)).cloned().collect();
        telemetry.tables_discovered(pipeline, tables.len(), &added, &gone);
    }
    found
}

/// The catalogs `cfg`'s pipelines of patterns list, connected (shared with every other user of each).
async fn hold(cfg: &ServiceConfig) -> Vec<Arc<Catalog>> {
    let mut out = Vec::new();
    for (name, c) in pattern_catalogs(cfg) {
        if let Ok(c) = Catalog::shared(c, name).await {
            out.push(c);
        }
    }
    out
}

/// Each catalog a pipeline of `cfg` names by patterns, once, in the order first named.
fn pattern_catalogs(cfg: &ServiceConfig) -> Vec<(&str, &CatalogConfig)> {
    let mut out: Vec<(&str, &CatalogConfig)> = Vec::new();
    for pl in cfg.pipelines.iter().filter(|pl| pl.source.patterns().is_some()) {
        let name = pl.source.catalog.as_str();
        if let Some(c) = cfg.catalogs.get(name).filter(|_| out.iter().all(|(n, _)| *n != name)) {
            out.push((name, c));
        }
    }
    out
}

/// One listing of each catalog a pipeline of `cfg` names by patterns (in the order first named): its name, the
/// tables and catalog calls (or why it could not be listed), and the seconds it took.
pub(crate) async fn list_catalogs(cfg: &ServiceConfig) -> Vec<(&str, crate::error::Result<(Vec<String>, usize)>, f64)> {
    let mut out = Vec::new();
    for (name, c) in pattern_catalogs(cfg) {
        let t0 = Instant::now();
        let listed = match Catalog::shared(c, name).await {
            Ok(catalog) => catalog.list_tables().await,
            Err(e) => Err(e),
        };
        out.push((name, listed, t0.elapsed().as_secs_f64()));
    }
    out
}

/// Each pipeline of patterns with the tables of its catalog's listing that match (sorted); a catalog without a
/// listing (`None`: it failed) keeps the pipeline's entry of `before`, and so does a pipeline with `on_drop = "stop"`
/// for its tables that are gone (their loops stay, reporting the missing table). Pure.
pub(crate) fn select(cfg: &ServiceConfig, listings: &BTreeMap<&str, Option<Vec<String>>>, before: &Discovered) -> Discovered {
    let mut out = Discovered::new();
    for pl in &cfg.pipelines {
        let Some(patterns) = pl.source.patterns() else { continue };
        let old = before.get(&pl.name).cloned().unwrap_or_default();
        let tables = match listings.get(pl.source.catalog.as_str()) {
            Some(Some(names)) => {
                let mut now: Vec<String> = patterns.select(names).into_iter().cloned().collect();
                if pl.source.on_drop == OnDrop::Stop {
                    now.extend(old.into_iter().filter(|t| !names.contains(t)));
                    now.sort();
                }
                now
            }
            _ => old,
        };
        out.insert(pl.name.clone(), tables);
    }
    out
}

/// The tables each pipeline gained (`true`) and lost (`false`) from `before` to `after`.
pub(crate) fn changes(before: &Discovered, after: &Discovered) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    for pipeline in before.keys().chain(after.keys()).collect::<std::collections::BTreeSet<_>>() {
        let (b, a) = (before.get(pipeline).cloned().unwrap_or_default(), after.get(pipeline).cloned().unwrap_or_default());
        out.extend(a.iter().filter(|t| !b.contains(t)).map(|t| (pipeline.clone(), t.clone(), true)));
        out.extend(b.iter().filter(|t| !a.contains(t)).map(|t| (pipeline.clone(), t.clone(), false)));
    }
    out
}

/// After the loops followed a discovery: the Iceberg destinations of tables that are gone (`on_drop = "keep"` or
/// `"drop"`) get [`GONE_PROPERTY`]; those of tables that came (back) lose it where they had it. Best effort: a
/// destination that cannot be marked is logged, never retried (the next event marks it).
pub(crate) async fn mark(cfg: ServiceConfig, changes: Vec<(String, String, bool)>) {
    for (pipeline, table, added) in changes {
        let Some(pl) = cfg.pipelines.iter().find(|p| p.name == pipeline && p.source.on_drop != OnDrop::Stop) else { continue };
        for (c, label, dest) in iceberg_destinations(&cfg, pl, &table) {
            if let Err(e) = mark_one(c, label, &dest, &table, added).await {
                tracing::warn!(pipeline = %pipeline, table = %table, destination = %dest, error = %e, "could not mark the destination of a table that came or went");
            }
        }
    }
}

/// The Iceberg destinations of `table` in pipeline `pl`: each one's catalog, the catalog's name, and the table.
fn iceberg_destinations<'c>(cfg: &'c ServiceConfig, pl: &PipelineConfig, table: &str) -> Vec<(&'c CatalogConfig, &'c str, String)> {
    let mut out = Vec::new();
    for sink in &pl.sinks {
        let SinkConfig::Iceberg(t) = sink.for_table(table) else { continue };
        if let Some((label, c)) = cfg.catalogs.get_key_value(&t.catalog) {
            out.push((c, label.as_str(), t.table));
        }
    }
    out
}

/// Sets (the source `table` is gone) or removes (`came`) [`GONE_PROPERTY`] on destination `dest`.
async fn mark_one(c: &CatalogConfig, label: &str, dest: &str, table: &str, came: bool) -> crate::error::Result<()> {
    let catalog = Catalog::shared(c, label).await?;
    let t = match catalog.load_table(dest).await {
        Ok(t) => t,
        Err(crate::error::Error::TableNotFound { .. }) => return Ok(()), // never created: nothing to mark
        Err(e) => return Err(e),
    };
    let marked = t.metadata().properties().contains_key(GONE_PROPERTY);
    let update = match (came, marked) {
        (true, true) => TableUpdate::RemoveProperties { removals: vec![GONE_PROPERTY.to_string()] },
        (false, false) => {
            let since = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            let value =
                format!("{since} {table}: the source table is gone (dropped, renamed or no longer matched); this replica is no longer updated");
            TableUpdate::SetProperties { updates: HashMap::from([(GONE_PROPERTY.to_string(), value)]) }
        }
        _ => return Ok(()),
    };
    let uuid = t.metadata().uuid();
    catalog.commit(&t, vec![TableRequirement::UuidMatch { uuid }], vec![update]).await?;
    tracing::info!(destination = %dest, table = %table, gone = !came, "destination marked");
    Ok(())
}

/// The source table uuids destination `t` records progress for.
fn progress_uuids(t: &iceberg::table::Table) -> BTreeSet<String> {
    t.metadata().properties().keys().filter_map(|k| k.strip_prefix(PROPERTY_PREFIX)).map(String::from).collect()
}

/// When [`GONE_PROPERTY`]'s value `mark` says the table went.
fn marked_since(mark: &str) -> Option<SystemTime> {
    let at = chrono::DateTime::parse_from_rfc3339(mark.split(' ').next()?).ok()?;
    Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(at.timestamp().max(0) as u64))
}

/// Renamed tables (`on_rename = "rename"`): of the tables each pipeline lost from `before` to `now`, those whose
/// Iceberg destination records progress for the uuid of a table it gained have their destination renamed to that
/// table's — before its loop starts, which then resumes from that progress. Only the owner of the new name's
/// pipeline renames. A destination that cannot be renamed (its catalog cannot, or the new name is taken) is
/// reported; the new name is then replicated as a new table.
pub(crate) async fn follow_renames(cfg: &ServiceConfig, before: &Discovered, now: &Discovered, owns: &Owns, telemetry: &Telemetry) {
    for pl in cfg.pipelines.iter().filter(|pl| pl.source.patterns().is_some() && pl.source.on_rename == OnRename::Rename) {
        let (old, new) = (before.get(&pl.name).cloned().unwrap_or_default(), now.get(&pl.name).cloned().unwrap_or_default());
        let gone: Vec<&String> = old.iter().filter(|t| !new.contains(t)).collect();
        let added: Vec<&String> = new.iter().filter(|t| !old.contains(t) && owns(&format!("{}:{t}", pl.name))).collect();
        if gone.is_empty() || added.is_empty() || !pl.sinks.iter().any(|s| matches!(s, SinkConfig::Iceberg(_))) {
            continue;
        }
        let Some(source) = cfg.catalogs.get(&pl.source.catalog) else { continue };
        let Ok(source) = Catalog::shared(source, &pl.source.catalog).await else { continue };
        let mut by_uuid = HashMap::new();
        for a in added {
            if let Ok(t) = source.load_table(a).await {
                by_uuid.insert(t.metadata().uuid().to_string(), a.clone());
            }
        }
        for g in gone {
            for (c, label, dest) in iceberg_destinations(cfg, pl, g) {
                let Ok(catalog) = Catalog::shared(c, label).await else { continue };
                let Ok(t) = catalog.load_table(&dest).await else { continue };
                let Some(to) = progress_uuids(&t).iter().find_map(|u| by_uuid.get(u)) else { continue };
                let Some((_, _, renamed)) = iceberg_destinations(cfg, pl, to).into_iter().find(|(_, l, _)| *l == label) else { continue };
                if renamed == dest {
                    continue; // the template names both alike: the new name's loop finds the progress where it is
                }
                let outcome = catalog.rename_table(&dest, &renamed).await;
                telemetry.table_renamed(&pl.name, g, to, &dest, &renamed, outcome.as_ref().err());
            }
        }
    }
}

/// The tables of `on_drop = "drop"` pipelines that are gone, and since when: (pipeline, table) → the time it went.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Gone(BTreeMap<(String, String), SystemTime>);

impl Gone {
    /// Follows one discovery (`before` → `now`, at `at`): tables that went are gone since `at`; tables that came
    /// back, and those of pipelines that no longer drop, are forgotten. Pure.
    pub(crate) fn follow(&mut self, cfg: &ServiceConfig, before: &Discovered, now: &Discovered, at: SystemTime) {
        let drops = |p: &str| cfg.pipelines.iter().any(|pl| pl.name == p && pl.source.on_drop == OnDrop::Drop);
        self.0.retain(|(p, t), _| drops(p) && !now.get(p).is_some_and(|ts| ts.contains(t)));
        for (p, t, added) in changes(before, now) {
            if !added && drops(&p) {
                self.0.entry((p, t)).or_insert(at);
            }
        }
    }

    /// After a start or reload: the Iceberg destinations of `on_drop = "drop"` pipelines whose table is not among
    /// `now` — found by listing the destination catalogs and reading each name back through its template
    /// ([`crate::pattern::unfill`]) — are gone since their [`GONE_PROPERTY`] mark (marked now when they have none and
    /// record progress, i.e. are replicas). A template without `{namespace}` cannot be read back: such destinations
    /// wait for their table to go while the service runs.
    pub(crate) async fn scan(&mut self, cfg: &ServiceConfig, now: &Discovered) {
        let mut listings: HashMap<String, Vec<String>> = HashMap::new();
        for pl in cfg.pipelines.iter().filter(|pl| pl.source.on_drop == OnDrop::Drop) {
            let Some(patterns) = pl.source.patterns() else { continue };
            let found = now.get(&pl.name).cloned().unwrap_or_default();
            for sink in &pl.sinks {
                let SinkConfig::Iceberg(t) = sink else { continue };
                let Some(c) = cfg.catalogs.get(&t.catalog) else { continue };
                let Ok(catalog) = Catalog::shared(c, &t.catalog).await else { continue };
                if !listings.contains_key(&t.catalog) {
                    match catalog.list_tables().await {
                        Ok((names, _)) => listings.insert(t.catalog.clone(), names),
                        Err(e) => {
                            tracing::warn!(catalog = %t.catalog, error = %e, "cannot list the destination catalog for replicas of dropped tables; trying again at the next start or reload");
                            continue;
                        }
                    };
                }
                for dest in &listings[&t.catalog] {
                    let Some(table) = crate::pattern::unfill(&t.table, dest, |n| patterns.matches(n) && !found.iter().any(|f| f == n)) else {
                        continue;
                    };
                    let Ok(replica) = catalog.load_table(dest).await else { continue };
                    let since = match replica.metadata().properties().get(GONE_PROPERTY).and_then(|m| marked_since(m)) {
                        Some(since) => since,
                        None if !progress_uuids(&replica).is_empty() => {
                            if let Err(e) = mark_one(c, &t.catalog, dest, &table, false).await {
                                tracing::warn!(destination = %dest, error = %e, "could not mark the replica of a gone table");
                            }
                            SystemTime::now()
                        }
                        None => continue, // not a replica of ours
                    };
                    let at = self.0.entry((pl.name.clone(), table)).or_insert(since);
                    *at = (*at).min(since);
                }
            }
        }
    }

    /// Drops the Iceberg destinations of tables gone for their pipeline's `drop_grace`, where this instance owns the
    /// table's pipeline, the destination is marked gone, and no table of `now` is named to it. A table is forgotten
    /// once all its destinations are dropped (or were never there); a failed drop is tried again at the next
    /// discovery.
    pub(crate) async fn drop_due(&mut self, cfg: &ServiceConfig, now: &Discovered, owns: &Owns, telemetry: &Telemetry) {
        let due: Vec<(String, String)> = self
            .0
            .iter()
            .filter(|((p, t), since)| {
                let grace = cfg.pipelines.iter().find(|pl| pl.name == *p).map(|pl| pl.source.drop_grace()).unwrap_or_default();
                SystemTime::now().duration_since(**since).is_ok_and(|d| d >= grace) && owns(&format!("{p}:{t}"))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for (p, t) in due {
            let Some(pl) = cfg.pipelines.iter().find(|pl| pl.name == p) else { continue };
            let named: BTreeSet<String> =
                now.get(&p).into_iter().flatten().flat_map(|n| iceberg_destinations(cfg, pl, n)).map(|(_, l, d)| format!("{l}:{d}")).collect();
            let mut done = true;
            for (c, label, dest) in iceberg_destinations(cfg, pl, &t) {
                if named.contains(&format!("{label}:{dest}")) {
                    continue; // the destination of a table followed now
                }
                match drop_marked(c, label, &dest).await {
                    Ok(Some(true)) => telemetry.destination_dropped(&p, &t, &dest, None),
                    Ok(Some(false)) => {}     // renamed or dropped meanwhile
                    Ok(None) => done = false, // not marked yet: the mark comes after the loop stopped
                    Err(e) => {
                        telemetry.destination_dropped(&p, &t, &dest, Some(&e));
                        done = false;
                    }
                }
            }
            if done {
                self.0.remove(&(p, t));
            }
        }
    }
}

/// Drops destination `dest` when it is marked gone: `Some(true)` dropped, `Some(false)` it does not exist (renamed,
/// dropped by hand), `None` it is not marked.
async fn drop_marked(c: &CatalogConfig, label: &str, dest: &str) -> crate::error::Result<Option<bool>> {
    let catalog = Catalog::shared(c, label).await?;
    match catalog.load_table(dest).await {
        Ok(t) if t.metadata().properties().contains_key(GONE_PROPERTY) => {}
        Ok(_) => return Ok(None),
        Err(crate::error::Error::TableNotFound { .. }) => return Ok(Some(false)),
        Err(e) => return Err(e),
    }
    match catalog.drop_table(dest).await {
        Ok(()) => Ok(Some(true)),
        Err(crate::error::Error::TableNotFound { .. }) => Ok(Some(false)),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ServiceConfig {
        ServiceConfig::parse(
            r#"
[catalogs.lake]
type = "hadoop"
warehouse = "/tmp/lake"
[catalogs.other]
type = "hadoop"
warehouse = "/tmp/other"
[catalogs.dr]
type = "hadoop"
warehouse = "/tmp/dr"

[[pipelines]]
name = "sales"
source = { catalog = "lake", tables = ["sales.*"], exclude = ["sales.tmp_*"] }
[[pipelines.sinks]]
type = "iceberg"
catalog = "dr"
table = "replica_{namespace}.{table}"

[[pipelines]]
name = "ops"
source = { catalog = "other", tables = ["ops.**"] }
[[pipelines.sinks]]
type = "kafka"
bootstrap_servers = "127.0.0.1:9092"
topic = "cdc.{namespace}.{table}"

[[pipelines]]
name = "one"
source = { catalog = "lake", table = "hr.people" }
[[pipelines.sinks]]
type = "iceberg"
catalog = "dr"
table = "copy.{table}"
"#,
        )
        .unwrap()
    }

    #[test]
    fn each_pipeline_takes_its_matches_and_a_failed_listing_keeps_what_was_found() {
        let cfg = cfg();
        let lake: Vec<String> = ["sales.orders", "sales.tmp_1", "sales.eu.orders", "hr.people"].map(String::from).into();
        let listings = BTreeMap::from([("lake", Some(lake)), ("other", None)]);
        let before = Discovered::from([("ops".to_string(), vec!["ops.a.b".to_string()]), ("sales".into(), vec!["sales.gone".into()])]);
        let found = select(&cfg, &listings, &before);
        assert_eq!(found["sales"], vec!["sales.orders"], "excluded and nested tables left out; a gone table is gone");
        assert_eq!(found["ops"], vec!["ops.a.b"], "the catalog could not be listed: what was found before stays");
        assert!(!found.contains_key("one"), "a pipeline of one table is not discovered");
        // every matched table is a pipeline like any other: its name, its destinations' names filled
        let runs = cfg.runs(&found);
        let names: Vec<(&str, &str)> = runs.iter().map(|r| (r.pipeline.as_str(), r.sink.as_str())).collect();
        assert_eq!(
            names,
            vec![("sales:sales.orders", "iceberg:replica_sales.orders"), ("ops:ops.a.b", "kafka:cdc.ops.a.b"), ("one", "iceberg:copy.people")]
        );
        assert_eq!(runs[0].config.source.table, "sales.orders");
        assert!(cfg.has_patterns());
    }

    /// A file of one pipeline `name` on a hadoop catalog `lake`, its source (`{ … }`) and its Iceberg sink's table.
    fn one_pipeline(name: &str, source: &str, table: &str) -> String {
        format!(
            "[catalogs.lake]\ntype = \"hadoop\"\nwarehouse = \"/tmp/lake\"\n[[pipelines]]\nname = \"{name}\"\nsource = {source}\n\
                 [[pipelines.sinks]]\ntype = \"iceberg\"\ncatalog = \"lake\"\ntable = \"{table}\"\n"
        )
    }

    #[test]
    fn a_stop_pipeline_keeps_its_gone_tables_and_changes_name_what_came_and_went() {
        let text = one_pipeline("s", r#"{ catalog = "lake", tables = ["a.*"], on_drop = "stop" }"#, "r.{table}");
        let cfg = ServiceConfig::parse(&text).unwrap();
        let before = Discovered::from([("s".to_string(), vec!["a.gone".to_string(), "a.kept".into()])]);
        let listing = vec!["a.kept".to_string(), "a.new".into()];
        let found = select(&cfg, &BTreeMap::from([("lake", Some(listing))]), &before);
        assert_eq!(found["s"], vec!["a.gone", "a.kept", "a.new"], "the gone table's loop stays to report it missing");
        let keep = ServiceConfig::parse(&text.replace(", on_drop = \"stop\"", "")).unwrap();
        let found = select(&keep, &BTreeMap::from([("lake", Some(vec!["a.kept".to_string(), "a.new".into()]))]), &before);
        assert_eq!(found["s"], vec!["a.kept", "a.new"]);
        assert_eq!(changes(&before, &found), vec![("s".to_string(), "a.new".to_string(), true), ("s".to_string(), "a.gone".to_string(), false)]);
    }

    #[test]
    fn a_pattern_whose_sink_does_not_name_each_table_is_refused() {
        let text = one_pipeline("all", r#"{ catalog = "lake", tables = ["sales.*"], table = "sales.orders" }"#, "replica.all");
        let Err(crate::error::Error::Config(problems)) = ServiceConfig::parse(&text) else { panic!("refused") };
        assert!(problems.iter().any(|p| p.contains("not both")), "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("would receive every table") && p.contains("sinks[0]")), "{problems:?}");
    }

    #[test]
    fn gone_tables_of_drop_pipelines_wait_from_when_they_went_and_are_forgotten_when_back() {
        let text = one_pipeline("s", r#"{ catalog = "lake", tables = ["a.*"], on_drop = "drop", drop_grace = "1h" }"#, "r.{namespace}_{table}");
        let cfg = ServiceConfig::parse(&text).unwrap();
        assert_eq!(cfg.pipelines[0].source.drop_grace(), std::time::Duration::from_secs(3600));
        let d = |ts: &[&str]| Discovered::from([("s".to_string(), ts.iter().map(|t| t.to_string()).collect())]);
        let (t0, t1) = (SystemTime::UNIX_EPOCH, SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(60));
        let mut gone = Gone::default();
        gone.follow(&cfg, &d(&["a.x", "a.y"]), &d(&["a.y"]), t0);
        gone.follow(&cfg, &d(&["a.y"]), &d(&[]), t1);
        let key = |t: &str| ("s".to_string(), t.to_string());
        assert_eq!(gone.0, BTreeMap::from([(key("a.x"), t0), (key("a.y"), t1)]));
        // a.x comes back: forgotten; a.y goes again: still since it first went
        gone.follow(&cfg, &d(&[]), &d(&["a.x"]), t1);
        assert_eq!(gone.0, BTreeMap::from([(key("a.y"), t1)]));
        // the pipeline keeps its replicas now: nothing is waiting to be dropped
        let keep = ServiceConfig::parse(&text.replace(r#", on_drop = "drop", drop_grace = "1h""#, "")).unwrap();
        gone.follow(&keep, &d(&["a.x"]), &d(&[]), t1);
        assert!(gone.0.is_empty());
        // the mark's time is read back after a restart
        let since = marked_since("2026-12-06T10:00:00Z a.x: the source table is gone").unwrap();
        assert_eq!(since.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(), 1_796_551_200);
    }

    #[test]
    fn drop_and_rename_policies_belong_to_patterns() {
        let text = one_pipeline("s", r#"{ catalog = "lake", table = "a.b", on_drop = "drop", on_rename = "new", drop_grace = "1h" }"#, "r.b");
        let Err(crate::error::Error::Config(problems)) = ServiceConfig::parse(&text) else { panic!("refused") };
        for key in ["on_drop", "on_rename", "drop_grace"] {
            assert!(problems.iter().any(|p| p.contains(&format!("source.{key}: only for a source of `tables` patterns"))), "{key}: {problems:?}");
        }
        let text = text.replace(r#"table = "a.b", on_drop = "drop", on_rename = "new","#, r#"tables = ["a.*"],"#).replace("r.b", "r.{table}");
        let Err(crate::error::Error::Config(problems)) = ServiceConfig::parse(&text) else { panic!("refused") };
        assert!(problems.iter().any(|p| p.contains("drop_grace: only with on_drop = \"drop\"")), "{problems:?}");
    }
}

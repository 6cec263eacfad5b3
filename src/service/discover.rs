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
//! so a slow listing delays no loop and no signal. A gone table's destination follows the pipeline's
//! [`OnDrop`]: kept and marked ([`mark`]), or its loop kept to report the missing table.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use iceberg::{TableRequirement, TableUpdate};
use tokio::sync::watch;

use super::config::{Discovered, OnDrop, ServiceConfig, GONE_PROPERTY};
use super::telemetry::Telemetry;
use crate::catalog::Catalog;
use crate::config::SinkConfig;

/// The discovery task: lists the catalogs on an interval and when told the configuration changed.
pub(crate) struct Discoverer {
    found: watch::Receiver<Discovered>,
    cfg: watch::Sender<ServiceConfig>,
    task: tokio::task::JoinHandle<()>,
}

impl Discoverer {
    /// Starts discovering for `cfg`, from `first` (what a discovery before the start found).
    pub(crate) fn start(cfg: ServiceConfig, first: Discovered, telemetry: Arc<Telemetry>) -> Discoverer {
        let (found_tx, found) = watch::channel(first.clone());
        let (cfg_tx, mut cfg_rx) = watch::channel(cfg);
        let task = tokio::spawn(async move {
            let mut last = first;
            loop {
                let interval = cfg_rx.borrow().service.discover_interval;
                let reconfigured = tokio::select! {
                    _ = tokio::time::sleep(interval) => false,
                    changed = cfg_rx.changed() => match changed {
                        Ok(()) => true,
                        Err(_) => return, // the service is gone
                    },
                };
                let cfg = cfg_rx.borrow_and_update().clone();
                // a reload starts from the listing alone: tables a `stop` pipeline kept for their missing table leave
                let before = if reconfigured { Discovered::new() } else { last.clone() };
                let now = if cfg.has_patterns() { discover(&cfg, &before, &telemetry).await } else { Discovered::new() };
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
    pub(crate) fn reconfigure(&self, cfg: ServiceConfig) {
        let _ = self.cfg.send(cfg);
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

/// One listing of each catalog a pipeline of `cfg` names by patterns (in the order first named): its name, the
/// tables and catalog calls (or why it could not be listed), and the seconds it took.
pub(crate) async fn list_catalogs(cfg: &ServiceConfig) -> Vec<(&str, crate::error::Result<(Vec<String>, usize)>, f64)> {
    let mut out: Vec<(&str, _, f64)> = Vec::new();
    for pl in cfg.pipelines.iter().filter(|pl| pl.source.patterns().is_some()) {
        let name = pl.source.catalog.as_str();
        let Some(c) = cfg.catalogs.get(name).filter(|_| out.iter().all(|(n, _, _)| *n != name)) else { continue };
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

/// After the loops followed a discovery: the Iceberg destinations of tables that are gone (`on_drop = "keep"`) get
/// [`GONE_PROPERTY`]; those of tables that came (back) lose it where they had it. Best effort: a destination that
/// cannot be marked is logged, never retried (the next event marks it).
pub(crate) async fn mark(cfg: ServiceConfig, changes: Vec<(String, String, bool)>) {
    for (pipeline, table, added) in changes {
        let Some(pl) = cfg.pipelines.iter().find(|p| p.name == pipeline && p.source.on_drop == OnDrop::Keep) else { continue };
        for sink in &pl.sinks {
            let SinkConfig::Iceberg(t) = sink.for_table(&table) else { continue };
            let Some(c) = cfg.catalogs.get(&t.catalog) else { continue };
            if let Err(e) = mark_one(c, &t.catalog, &t.table, &table, added).await {
                tracing::warn!(pipeline = %pipeline, table = %table, destination = %t.table, error = %e, "could not mark the destination of a table that came or went");
            }
        }
    }
}

/// Sets (the source `table` is gone) or removes (`came`) [`GONE_PROPERTY`] on destination `dest`.
async fn mark_one(c: &crate::config::CatalogConfig, label: &str, dest: &str, table: &str, came: bool) -> crate::error::Result<()> {
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

    #[test]
    fn a_stop_pipeline_keeps_its_gone_tables_and_changes_name_what_came_and_went() {
        let text = r#"
[catalogs.lake]
type = "hadoop"
warehouse = "/tmp/lake"
[[pipelines]]
name = "s"
source = { catalog = "lake", tables = ["a.*"], on_drop = "stop" }
[[pipelines.sinks]]
type = "iceberg"
catalog = "lake"
table = "r.{table}"
"#;
        let cfg = ServiceConfig::parse(text).unwrap();
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
        let text = r#"
[catalogs.lake]
type = "hadoop"
warehouse = "/tmp/lake"
[[pipelines]]
name = "all"
source = { catalog = "lake", tables = ["sales.*"], table = "sales.orders" }
[[pipelines.sinks]]
type = "iceberg"
catalog = "lake"
table = "replica.all"
"#;
        let Err(crate::error::Error::Config(problems)) = ServiceConfig::parse(text) else { panic!("refused") };
        assert!(problems.iter().any(|p| p.contains("not both")), "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("would receive every table") && p.contains("sinks[0]")), "{problems:?}");
    }
}

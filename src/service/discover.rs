//! Discovery: the tables each pipeline of table patterns stands for, found by listing its catalog.
//!
//! Each catalog a pattern names is listed once per discovery, whatever the number of pipelines on it
//! ([`crate::catalog::Catalog::list_tables`]: one query for sqlite, a directory walk for hadoop, paginated list
//! calls per namespace for REST); every pipeline of patterns on it then selects its tables from that one listing
//! (pure: [`select`]). A catalog that cannot be listed leaves its pipelines with the tables found before — an outage
//! of the catalog stops no pipeline that is running — and is reported. Tables that appear start their pipelines at
//! the next reload of the running set; tables that are gone (dropped, renamed, excluded) stop theirs, and their
//! destinations stay as they are.
use std::collections::BTreeMap;
use std::time::Instant;

use super::config::{Discovered, ServiceConfig};
use super::telemetry::Telemetry;
use crate::catalog::Catalog;

/// What `cfg`'s pipelines of patterns stand for now: each catalog listed once; a catalog that fails keeps its
/// pipelines' entries of `before`. Events (tables added and gone, calls, failures) go to `telemetry`.
pub(crate) async fn discover(cfg: &ServiceConfig, before: &Discovered, telemetry: &Telemetry) -> Discovered {
    let mut listings: BTreeMap<&str, Option<Vec<String>>> = BTreeMap::new();
    for pl in cfg.pipelines.iter().filter(|pl| pl.source.patterns().is_some()) {
        let name = pl.source.catalog.as_str();
        if listings.contains_key(name) {
            continue;
        }
        let Some(c) = cfg.catalogs.get(name) else { continue };
        let t0 = Instant::now();
        let listed = match Catalog::shared(c, name).await {
            Ok(catalog) => catalog.list_tables().await,
            Err(e) => Err(e),
        };
        telemetry.catalog_listed(name, listed.as_ref().map(|(t, calls)| (t.len(), *calls)), t0.elapsed().as_secs_f64());
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

/// Each pipeline of patterns with the tables of its catalog's listing that match (sorted); a catalog without a
/// listing (`None`: it failed) keeps the pipeline's entry of `before`. Pure.
pub(crate) fn select(cfg: &ServiceConfig, listings: &BTreeMap<&str, Option<Vec<String>>>, before: &Discovered) -> Discovered {
    let mut out = Discovered::new();
    for pl in &cfg.pipelines {
        let Some(patterns) = pl.source.patterns() else { continue };
        let tables = match listings.get(pl.source.catalog.as_str()) {
            Some(Some(names)) => patterns.select(names).into_iter().cloned().collect(),
            _ => before.get(&pl.name).cloned().unwrap_or_default(),
        };
        out.insert(pl.name.clone(), tables);
    }
    out
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

//! What following a rewrite of the source's history costs (issue 49), against copying the source afresh.
//!
//! The benchmark table (`common::build_table`: N rows, then one merge-on-read snapshot updating 10 % and deleting
//! 2 % of them) is replicated into a filesystem target. Then, in the same sitting, each measured as a `cdc sync`
//! child process (wall, CPU, peak RSS):
//! - **bootstrap**: the copy of the base snapshot into an empty target — what "drop the target and sync again"
//!   costs, the only way out before (and the baseline);
//! - **forward**: the measured snapshot applied (the ordinary path);
//! - **rollback**: the owner rolls the source back to the base snapshot; the sync undoes the measured snapshot (its
//!   changes inverted: the cheapest exact path, proportional to what was undone);
//! - **replace**: the source's head becomes a snapshot without parent holding the measured snapshot's files (what
//!   `CREATE OR REPLACE` leaves); with no common history the sync deletes every row of the base and inserts every
//!   row of the head.
//!
//! Prints Markdown (copied into README.md). `cargo bench --bench resync [-- --rows 1000000,10000000]`
mod common;

use std::process::Command;

use iceberg::spec::{Snapshot, SnapshotReference, SnapshotRetention, Summary, MAIN_BRANCH};
use iceberg::{TableRequirement, TableUpdate};
use iceberg_cdc::catalog::Catalog;
use iceberg_cdc::config::Config;

const CDC: &str = env!("CARGO_BIN_EXE_cdc");

fn sync(cfg: &std::path::Path, extra: &[&str]) -> common::Measure {
    let mut cmd = Command::new(CDC);
    cmd.args(["sync", "--config", cfg.to_str().unwrap()]).args(extra);
    common::measure(&mut cmd)
}

/// Moves the source's main branch to `snapshot` (a rollback).
async fn set_main(catalog: &Catalog, snapshot: i64) {
    let t = catalog.load_table("bench.orders").await.unwrap();
    let head = t.metadata().current_snapshot_id();
    let update = TableUpdate::SetSnapshotRef {
        ref_name: MAIN_BRANCH.into(),
        reference: SnapshotReference::new(snapshot, SnapshotRetention::branch(None, None, None)),
    };
    catalog.commit(&t, vec![TableRequirement::RefSnapshotIdMatch { r#ref: MAIN_BRANCH.into(), snapshot_id: head }], vec![update]).await.unwrap();
}

/// Adds a snapshot without parent whose manifest list is `like`'s, and makes it the head (a replacement).
async fn replace_with_copy_of(catalog: &Catalog, like: i64) {
    let t = catalog.load_table("bench.orders").await.unwrap();
    let meta = t.metadata();
    let like = meta.snapshot_by_id(like).unwrap();
    let id = like.snapshot_id() ^ 0x5eed;
    let snapshot = Snapshot::builder()
        .with_manifest_list(like.manifest_list())
        .with_snapshot_id(id)
        .with_sequence_number(meta.next_sequence_number())
        .with_summary(Summary { operation: iceberg::spec::Operation::Overwrite, additional_properties: Default::default() })
        .with_schema_id(meta.current_schema_id())
        .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
        .build();
    let head = meta.current_snapshot_id();
    let updates = vec![
        TableUpdate::AddSnapshot { snapshot },
        TableUpdate::SetSnapshotRef {
            ref_name: MAIN_BRANCH.into(),
            reference: SnapshotReference::new(id, SnapshotRetention::branch(None, None, None)),
        },
    ];
    catalog.commit(&t, vec![TableRequirement::RefSnapshotIdMatch { r#ref: MAIN_BRANCH.into(), snapshot_id: head }], updates).await.unwrap();
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sizes: Vec<i64> = args
        .iter()
        .position(|a| a == "--rows")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000_000, 10_000_000]);
    println!("| rows | path | changes applied | wall (s) | CPU (s) | peak RSS (MB) | vs bootstrap (wall) |");
    println!("|---:|---|---|---:|---:|---:|---:|");
    for rows in sizes {
        let dir = tempfile::tempdir().unwrap();
        let target = format!(
            "[target]\ntable = \"replica.orders\"\n[target.catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n",
            dir.path().join("twh").display()
        );
        let t = common::build_table(dir.path(), rows, &common::hadoop_catalog(dir.path()), &target).await;
        let cfg = Config::load(&t.config).unwrap();
        let catalog = Catalog::connect(&cfg.source.catalog, "source").await.unwrap();
        let measured = catalog.load_table("bench.orders").await.unwrap().metadata().current_snapshot_id().unwrap();
        let boot = sync(&t.config, &["--to-snapshot", &t.base.to_string()]);
        let forward = sync(&t.config, &[]);
        set_main(&catalog, t.base).await;
        let rollback = sync(&t.config, &[]);
        replace_with_copy_of(&catalog, measured).await;
        let replace = sync(&t.config, &[]);
        let updated = rows / 10;
        let deleted = rows / 50;
        for (name, what, m) in [
            ("bootstrap", format!("{rows} rows copied"), &boot),
            ("forward", format!("{updated} updates, {deleted} deletes"), &forward),
            ("rollback (inverse of the snapshot)", format!("{updated} updates, {deleted} inserts"), &rollback),
            ("replace (no common history)", format!("{rows} deletes, {} inserts", rows - deleted), &replace),
        ] {
            println!("| {rows} | {name} | {what} | {:.2} | {:.2} | {:.0} | {:.2}× |", m.wall, m.cpu, m.rss_mb, m.wall / boot.wall);
        }
    }
}

//! Drives the real `cdc` binary on local tables (sqlite + hadoop catalogs) built with iceberg-rust: equality
//! deletes checked against iceberg-rust's own table scan, the memory budget, and every class of bad input.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use futures::TryStreamExt;
use iceberg::table::Table;
use iceberg_cdc::catalog::Catalog;
use iceberg_cdc::config::Config;
use iceberg_cdc::error::exit;
use iceberg_cdc::quickstart;
use serde_json::Value;

const CDC: &str = env!("CARGO_BIN_EXE_cdc");

fn cdc(args: &[&str]) -> Output {
    Command::new(CDC).args(args).output().expect("run cdc")
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "cdc failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn config(dir: &Path, body: &str) -> PathBuf {
    let p = dir.join(format!("cfg-{}.toml", uuid::Uuid::new_v4()));
    std::fs::write(&p, body).unwrap();
    p
}

fn sql_config(warehouse: &Path, extra_source: &str, engine: &str) -> String {
    format!(
        "[source]\ntable = \"{}\"\n{extra_source}\n[source.catalog]\ntype = \"sql\"\nwarehouse = \"{}\"\n{engine}\n",
        quickstart::TABLE,
        warehouse.display()
    )
}

/// Rows of `table` at `snapshot` as canonical JSON strings, read by iceberg-rust's scan (which applies equality deletes).
async fn scan_rows(table: &Table, snapshot: Option<i64>) -> Vec<String> {
    let Some(id) = snapshot else { return Vec::new() };
    let stream = table.scan().snapshot_id(id).select_all().build().unwrap().to_arrow().await.unwrap();
    let batches: Vec<_> = stream.try_collect().await.unwrap();
    let mut rows = Vec::new();
    for b in batches {
        let schema = b.schema();
        for r in 0..b.num_rows() {
            let mut m = serde_json::Map::new();
            for (i, f) in schema.fields().iter().enumerate() {
                let mut s = String::new();
                iceberg_cdc::output::json_value(&mut s, b.column(i).as_ref(), f, r).unwrap();
                m.insert(f.name().clone(), serde_json::from_str(&s).unwrap());
            }
            rows.push(Value::Object(m).to_string());
        }
    }
    rows
}

fn multiset_minus(a: &[String], b: &[String]) -> Vec<String> {
    let mut counts: HashMap<&String, i64> = HashMap::new();
    for x in b {
        *counts.entry(x).or_default() += 1;
    }
    let mut out = Vec::new();
    for x in a {
        let c = counts.entry(x).or_default();
        if *c > 0 {
            *c -= 1;
        } else {
            out.push(x.clone());
        }
    }
    out
}

fn id_of(row: &str) -> i64 {
    serde_json::from_str::<Value>(row).unwrap()["id"].as_i64().unwrap()
}

/// Expected change rows (type, row) of one snapshot, paired by `id`.
fn expected(before: &[String], after: &[String]) -> Vec<(String, String)> {
    let removed = multiset_minus(before, after);
    let added = multiset_minus(after, before);
    let mut out = Vec::new();
    for r in &removed {
        let t = if added.iter().any(|a| id_of(a) == id_of(r)) { "UPDATE_BEFORE" } else { "DELETE" };
        out.push((t.to_string(), r.clone()));
    }
    for a in &added {
        let t = if removed.iter().any(|r| id_of(r) == id_of(a)) { "UPDATE_AFTER" } else { "INSERT" };
        out.push((t.to_string(), a.clone()));
    }
    out.sort();
    out
}

fn parse_changes(jsonl: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = jsonl
        .lines()
        .map(|l| {
            let mut v: serde_json::Map<String, Value> = serde_json::from_str(l).unwrap();
            let t = v.remove("_change_type").unwrap().as_str().unwrap().to_string();
            v.retain(|k, _| !k.starts_with("_c"));
            (t, Value::Object(v).to_string())
        })
        .collect();
    out.sort();
    out
}

async fn quickstart_table(dir: &Path) -> (Catalog, Table, PathBuf) {
    let qs = dir.join("qs");
    // quickstart prints changes to stdout; run it through the binary to keep this test's stdout clean
    ok(cdc(&["quickstart", "--dir", qs.to_str().unwrap()]));
    let cfg = Config::load(&qs.join("cdc.toml")).unwrap();
    let catalog = Catalog::connect(&cfg.source.catalog, "source").await.unwrap();
    let table = catalog.load_table(quickstart::TABLE).await.unwrap();
    (catalog, table, qs.join("warehouse"))
}

#[tokio::test(flavor = "multi_thread")]
async fn equality_deletes_match_iceberg_rust_scan() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    // one more commit deleting by a non-key column set (equality ids = customer)
    let b = quickstart::orders_batch(&table, &[(0, "donald", 0)]).unwrap();
    let del = iceberg_cdc::sink::iceberg::files::write_equality_deletes(&table, vec![2], &[b]).await.unwrap();
    let c = iceberg_cdc::sink::iceberg::rowdelta::RowDelta::new().add_delete_files(del).prepare(&table).await.unwrap();
    let table = catalog.commit(&table, c.requirements, c.updates).await.unwrap();

    let cfg = config(dir.path(), &sql_config(&wh, "", ""));
    let lineage = iceberg_cdc::source::lineage::main_lineage(table.metadata());
    assert_eq!(lineage.len(), 5);
    let mut total = 0;
    for s in &lineage {
        let parent = s.parent_snapshot_id();
        let want = expected(&scan_rows(&table, parent).await, &scan_rows(&table, Some(s.snapshot_id())).await);
        let mut args = vec!["changes", "--config", cfg.to_str().unwrap()];
        let (from, to) = (parent.map(|p| p.to_string()), s.snapshot_id().to_string());
        if let Some(f) = &from {
            args.extend(["--from-snapshot", f]);
        }
        args.extend(["--to-snapshot", &to]);
        let got = parse_changes(&ok(cdc(&args)));
        assert_eq!(got, want, "snapshot {}", s.snapshot_id());
        total += got.len();
    }
    assert!(total >= 15, "the scenario produced changes ({total})");
    // the last snapshot deleted donald by customer name
    let last = parse_changes(&ok(cdc(&["changes", "--config", cfg.to_str().unwrap(), "--from-snapshot", &lineage[3].snapshot_id().to_string()])));
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].0, "DELETE");
    assert!(last[0].1.contains("donald"));
}

#[tokio::test(flavor = "multi_thread")]
async fn small_memory_budget_spills_and_gives_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    let names: Vec<String> = (0..60_000).map(|i| format!("customer-{i}")).collect();
    let rows: Vec<(i64, &str, i128)> = (0..60_000).map(|i| (100 + i as i64, names[i].as_str(), i as i128)).collect();
    let table = quickstart::commit_changes(&catalog, &table, &rows, &[]).await.unwrap();
    let upd: Vec<(i64, &str, i128)> = rows.iter().step_by(4).map(|r| (r.0, r.1, r.2 + 1)).collect();
    let _ = quickstart::commit_changes(&catalog, &table, &upd, &[]).await.unwrap();

    let spill = dir.path().join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let small = config(dir.path(), &sql_config(&wh, "", &format!("[engine]\nmemory_budget = \"1MiB\"\nspill_dir = \"{}\"\n", spill.display())));
    let big = config(dir.path(), &sql_config(&wh, "", ""));
    let out_small = cdc(&["changes", "--config", small.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out_small.stderr).to_string();
    let a = ok(out_small);
    let b = ok(cdc(&["changes", "--config", big.to_str().unwrap()]));
    assert_eq!(a, b, "spilled and in-memory runs must print the same rows in the same order");
    assert!(!stderr.contains(" 0.0 MB spilled"), "the small budget must spill: {stderr}");
    assert_eq!(a.lines().filter(|l| l.contains("UPDATE_AFTER")).count(), 15_000 + 2);
    assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0, "spill files are removed");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_clear_errors_and_distinct_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let (_catalog, table, wh) = quickstart_table(dir.path()).await;
    let lineage = iceberg_cdc::source::lineage::main_lineage(table.metadata());
    let (first, last) = (lineage[0].snapshot_id().to_string(), lineage[3].snapshot_id().to_string());
    let good = config(dir.path(), &sql_config(&wh, "", ""));
    let good = good.to_str().unwrap();

    // config: unknown key, several problems at once
    let c = config(dir.path(), "[source]\ntable = \"nodot\"\nbogus = 1\n[source.catalog]\ntype = \"rest\"\n");
    let out = cdc(&["changes", "--config", c.to_str().unwrap()]);
    assert_eq!(code(&out), exit::CONFIG);
    let c = config(dir.path(), "[source]\ntable = \"nodot\"\n[source.catalog]\ntype = \"rest\"\n");
    let out = cdc(&["changes", "--config", c.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), exit::CONFIG);
    assert!(err.contains("source.table") && err.contains("source.catalog.uri"), "{err}");
    let out = cdc(&["changes", "--config", "/nonexistent/cdc.toml"]);
    assert_eq!(code(&out), exit::CONFIG);

    // unknown table
    let c = config(dir.path(), &sql_config(&wh, "", "").replace(quickstart::TABLE, "demo.nope"));
    let out = cdc(&["changes", "--config", c.to_str().unwrap()]);
    assert_eq!(code(&out), exit::NOT_FOUND, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("demo.nope"));

    // A after B, unknown (expired) snapshot
    let out = cdc(&["changes", "--config", good, "--from-snapshot", &last, "--to-snapshot", &first]);
    assert_eq!(code(&out), exit::RANGE);
    assert!(String::from_utf8_lossy(&out.stderr).contains("comes after"));
    let out = cdc(&["changes", "--config", good, "--from-snapshot", "12345"]);
    assert_eq!(code(&out), exit::EXPIRED);
    assert!(String::from_utf8_lossy(&out.stderr).contains("expired"));
    let out = cdc(&["changes", "--config", good, "--from-timestamp", "yesterday"]);
    assert_eq!(code(&out), exit::CONFIG);
    let out = cdc(&["changes", "--config", good, "--from-snapshot", "1", "--from-timestamp", "2"]);
    assert_eq!(code(&out), exit::USAGE);

    // key columns: missing, float-free but missing column
    let c = config(dir.path(), &sql_config(&wh, "key_columns = [\"nope\"]", ""));
    let out = cdc(&["changes", "--config", c.to_str().unwrap()]);
    assert_eq!(code(&out), exit::SCHEMA);
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));

    // A on another line of history: a snapshot that is not an ancestor (hadoop table with a rolled-back branch)
    // is covered by the Spark peer tests; here: corrupt data file
    let data_dir = wh.join("demo").join("orders").join("data");
    let victim = std::fs::read_dir(&data_dir).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).find(|p| p.to_string_lossy().contains("data-")).unwrap();
    std::fs::write(&victim, b"not parquet at all").unwrap();
    let out = cdc(&["changes", "--config", good]);
    assert_eq!(code(&out), exit::DATA, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains(victim.file_name().unwrap().to_str().unwrap()));

    // unreachable REST catalog
    let c = config(dir.path(), "[source]\ntable = \"a.b\"\n[source.catalog]\ntype = \"rest\"\nuri = \"http://127.0.0.1:9\"\n");
    let out = cdc(&["snapshots", "--config", c.to_str().unwrap()]);
    assert_eq!(code(&out), exit::CATALOG, "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn output_file_is_atomic_and_parquet_typed() {
    let dir = tempfile::tempdir().unwrap();
    let qs = dir.path().join("qs");
    ok(cdc(&["quickstart", "--dir", qs.to_str().unwrap()]));
    let cfg = qs.join("cdc.toml");
    let out = dir.path().join("changes.parquet");
    ok(cdc(&["changes", "--config", cfg.to_str().unwrap(), "--format", "parquet", "--output", out.to_str().unwrap()]));
    let f = std::fs::File::open(&out).unwrap();
    let r = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).unwrap();
    let schema = r.schema().clone();
    assert_eq!(schema.field_with_name("amount").unwrap().data_type(), &arrow_schema::DataType::Decimal128(10, 2));
    assert_eq!(schema.field_with_name("_change_ordinal").unwrap().data_type(), &arrow_schema::DataType::Int32);
    let rows: usize = r.build().unwrap().map(|b| b.unwrap().num_rows()).sum();
    assert_eq!(rows, 15);
    // a failing run leaves no file behind
    let bad = dir.path().join("bad.parquet");
    let out = cdc(&["changes", "--config", cfg.to_str().unwrap(), "--from-snapshot", "1", "--output", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(!bad.exists());
    assert!(std::fs::read_dir(dir.path()).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().starts_with(".cdc-out-")));
}

fn sync_config(source_wh: &Path, target: &str, target_wh: &Path, extra: &str) -> String {
    format!(
        "{}\n[target]\ntable = \"{target}\"\n{extra}\n[target.catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n",
        sql_config(source_wh, "", ""),
        target_wh.display()
    )
}

fn target_snapshot_count(target_wh: &Path, table: &str) -> usize {
    let (ns, t) = table.split_once('.').unwrap();
    let dir = target_wh.join(ns).join(t).join("metadata");
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries.filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().starts_with("snap-")).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn sync_resumes_is_idempotent_and_refuses_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let (_c, table, wh) = quickstart_table(dir.path()).await;
    let tw = dir.path().join("target");
    let lineage = iceberg_cdc::source::lineage::main_lineage(table.metadata());
    let ids: Vec<String> = lineage.iter().map(|s| s.snapshot_id().to_string()).collect();
    let cfg = config(dir.path(), &sync_config(&wh, "replica.orders", &tw, ""));
    let cfg = cfg.to_str().unwrap();
    ok(cdc(&["sync", "--config", cfg, "--to-snapshot", &ids[1]]));
    assert_eq!(target_snapshot_count(&tw, "replica.orders"), 1, "bootstrap is one commit");
    // a gap: progress is at ids[1], --from starts after ids[2]
    let out = cdc(&["sync", "--config", cfg, "--from-snapshot", &ids[2]]);
    assert_eq!(code(&out), exit::RANGE);
    assert!(String::from_utf8_lossy(&out.stderr).contains("gap"), "{}", String::from_utf8_lossy(&out.stderr));
    // an older --from is fine: what is applied is skipped
    ok(cdc(&["sync", "--config", cfg, "--from-snapshot", &ids[0]]));
    assert_eq!(target_snapshot_count(&tw, "replica.orders"), 3);
    let again = ok(cdc(&["sync", "--config", cfg, "--json"]));
    assert!(again.contains("\"source_snapshots_applied\": 0"), "{again}");
    assert_eq!(target_snapshot_count(&tw, "replica.orders"), 3, "nothing new, nothing committed");
    // the target equals the source, read by iceberg-rust's scan (applies equality deletes)
    let tcat = Catalog::connect(&Config::parse(&std::fs::read_to_string(cfg).unwrap()).unwrap().target.unwrap().catalog, "t").await.unwrap();
    let target = tcat.load_table("replica.orders").await.unwrap();
    let mut want = scan_rows(&table, Some(lineage.last().unwrap().snapshot_id())).await;
    let mut got = scan_rows(&target, target.metadata().current_snapshot_id()).await;
    want.sort();
    got.sort();
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread")]
async fn sync_bad_input_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_c, table, wh) = quickstart_table(dir.path()).await;
    let tw = dir.path().join("target");
    // an existing target that lacks a column and has a narrower type
    let tcfg = Config::parse(&sync_config(&wh, "replica.bad", &tw, "")).unwrap().target.unwrap();
    let tcat = Catalog::connect(&tcfg.catalog, "target").await.unwrap();
    let schema = iceberg::spec::Schema::builder()
        .with_fields(vec![
            iceberg::spec::NestedField::required(1, "id", iceberg::spec::Type::Primitive(iceberg::spec::PrimitiveType::Int)).into(),
            iceberg::spec::NestedField::optional(2, "customer", iceberg::spec::Type::Primitive(iceberg::spec::PrimitiveType::String)).into(),
        ])
        .build()
        .unwrap();
    let creation = iceberg::TableCreation::builder().name("bad".into()).schema(schema).build();
    tcat.create_table("replica.bad", creation).await.unwrap();
    let cfg = config(dir.path(), &sync_config(&wh, "replica.bad", &tw, ""));
    let out = cdc(&["sync", "--config", cfg.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), exit::SCHEMA, "{err}");
    assert!(err.contains("`id` is long in the source but int") && err.contains("no column `amount`") && err.contains("no column `updated_at`"), "{err}");
    assert_eq!(target_snapshot_count(&tw, "replica.bad"), 0);

    // equality columns that do not exist
    let cfg = config(dir.path(), &sync_config(&wh, "replica.nokey", &tw, "equality_columns = [\"nope\"]"));
    let out = cdc(&["sync", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code(&out), exit::SCHEMA, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!tw.join("replica").join("nokey").exists(), "nothing created");

    // no equality columns at all: a source without identifier fields and nothing configured
    let scat = Catalog::connect(&Config::parse(&sql_config(&wh, "", "")).unwrap().source.catalog, "source").await.unwrap();
    let keyless = iceberg::spec::Schema::builder()
        .with_fields(vec![iceberg::spec::NestedField::optional(1, "v", iceberg::spec::Type::Primitive(iceberg::spec::PrimitiveType::String)).into()])
        .build()
        .unwrap();
    let t = scat.create_table("demo.keyless", iceberg::TableCreation::builder().name("keyless".into()).schema(keyless).build()).await.unwrap();
    let arrow = std::sync::Arc::new(iceberg::arrow::schema_to_arrow_schema(t.metadata().current_schema()).unwrap());
    let b = arrow_array::RecordBatch::try_new(arrow, vec![std::sync::Arc::new(arrow_array::StringArray::from(vec!["x"]))]).unwrap();
    let files = iceberg_cdc::sink::iceberg::files::write_data(&t, &[b]).await.unwrap();
    let c = iceberg_cdc::sink::iceberg::rowdelta::RowDelta::new().add_data_files(files).prepare(&t).await.unwrap();
    scat.commit(&t, c.requirements, c.updates).await.unwrap();
    let body = sync_config(&wh, "replica.keyless", &tw, "").replace(&format!("table = \"{}\"", quickstart::TABLE), "table = \"demo.keyless\"");
    let out = cdc(&["sync", "--config", config(dir.path(), &body).to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), exit::SCHEMA, "{err}");
    assert!(err.contains("no equality columns"), "{err}");
    assert!(!tw.join("replica").join("keyless").exists(), "nothing created");

    // unreachable target catalog
    let body = sync_config(&wh, "replica.x", &tw, "").replace(
        &format!("type = \"hadoop\"\nwarehouse = \"{}\"", tw.display()),
        "type = \"rest\"\nuri = \"http://127.0.0.1:9\"",
    );
    let out = cdc(&["sync", "--config", config(dir.path(), &body).to_str().unwrap()]);
    assert_eq!(code(&out), exit::CATALOG, "{}", String::from_utf8_lossy(&out.stderr));

    // no [target] section
    let out = cdc(&["sync", "--config", config(dir.path(), &sql_config(&wh, "", "")).to_str().unwrap()]);
    assert_eq!(code(&out), exit::CONFIG);
    assert_eq!(iceberg_cdc::source::lineage::main_lineage(table.metadata()).len(), 4, "the source is untouched");
}

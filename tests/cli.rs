//! Drives the real `cdc` binary on local tables (sqlite + hadoop catalogs) built with iceberg-rust: equality
//! deletes checked against iceberg-rust's own table scan, the memory budget, and every class of bad input.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

/// Rows of `table` at `snapshot` as canonical JSON strings, read by iceberg-rust's scan (which applies equality
/// deletes; `scan_snapshot` retries the scans that iceberg-rust 0.10 leaves hanging).
async fn scan_rows(table: &Table, snapshot: Option<i64>) -> Vec<String> {
    let Some(id) = snapshot else { return Vec::new() };
    let batches = quickstart::scan_snapshot(table, id, None).await.unwrap();
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

/// The rows a table holds after `changes` (its whole changelog, in order): inserted and updated-to rows in, deleted
/// and updated-from rows out.
fn fold(changes: &[(String, String)]) -> Vec<String> {
    let (ins, del): (Vec<_>, Vec<_>) = changes.iter().partition(|(t, _)| t == "INSERT" || t == "UPDATE_AFTER");
    multiset_minus(&ins.into_iter().map(|c| c.1.clone()).collect::<Vec<_>>(), &del.into_iter().map(|c| c.1.clone()).collect::<Vec<_>>())
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
    ok(cdc(&["quickstart", "--changes-only", "--dir", qs.to_str().unwrap()]));
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
    let lineage = iceberg_cdc::spec::lineage::main_lineage(table.metadata());
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

/// An equality delete of three keys applies to every older data file, a 300k-row one included: the scan reads the
/// key column of that file and the pages of the three rows (the offset index our writer adds), not the file; its
/// changes still match iceberg-rust's scan. Older files whose key range the delete misses are not read at all.
#[tokio::test(flavor = "multi_thread")]
async fn an_equality_delete_of_a_few_keys_reads_keys_and_their_pages() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    let names: Vec<String> = (0..300_000u64).map(|i| format!("customer-{i:08}-{}", i.wrapping_mul(2_654_435_761) % 1_000_003)).collect();
    let rows: Vec<(i64, &str, i128)> = (0..300_000).map(|i| (1_000 + i as i64, names[i].as_str(), i as i128 * 37)).collect();
    // appended without equality deletes (iceberg-rust's scan, the oracle, crawls through 300k of them)
    let b = quickstart::orders_batch(&table, &rows).unwrap();
    let files = iceberg_cdc::sink::iceberg::files::write_data(&table, &[b]).await.unwrap();
    let c = iceberg_cdc::sink::iceberg::rowdelta::RowDelta::new().add_data_files(files).prepare(&table).await.unwrap();
    let table = catalog.commit(&table, c.requirements, c.updates).await.unwrap();
    let table = quickstart::commit_changes(&catalog, &table, &[], &[1_005, 101_000, 250_999]).await.unwrap();
    let big =
        walk(&wh).into_iter().filter(|p| p.extension().is_some_and(|e| e == "parquet")).map(|p| std::fs::metadata(p).unwrap().len()).max().unwrap();
    assert!(big > 2_000_000, "the 300k-row file is large enough to tell a full read from a partial one ({big} B)");

    let cfg = config(dir.path(), &sql_config(&wh, "", ""));
    let lineage = iceberg_cdc::spec::lineage::main_lineage(table.metadata());
    let (parent, last) = (lineage[lineage.len() - 2].snapshot_id(), lineage[lineage.len() - 1].snapshot_id());
    let out = cdc(&["changes", "--config", cfg.to_str().unwrap(), "--from-snapshot", &parent.to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let got = parse_changes(&ok(out));
    let want = expected(&scan_rows(&table, Some(parent)).await, &scan_rows(&table, Some(last)).await);
    assert_eq!(got, want);
    assert_eq!(got.iter().filter(|c| c.0 == "DELETE").count(), 3, "{got:?}");
    // the quickstart's files hold ids below 1 005: the delete's key range misses them, so they are not even opened
    assert!(stderr.contains(" 1 files / "), "only the 300k-row file is read: {stderr}");
    let mb: f64 = stderr.split(" MB read").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    // the key column is a fifth of the file, and each key's row costs a page of every column (~1/9 of a column)
    assert!(mb * 1e6 < 0.6 * big as f64, "read {mb} MB for three keys of a {big} B file: {stderr}");
}

/// A one-snapshot range at the end of a long history (issue 51): the quickstart's table, then 300 appends, each
/// leaving a manifest of its own (as writers that never merge manifests do). `cdc changes` of the last append reads
/// that append's manifest and data file only — as many as the same range right after the quickstart — and the
/// rows are the ones iceberg-rust's scan finds; an equality delete at the end still finds every row it deletes.
#[tokio::test(flavor = "multi_thread")]
async fn a_range_at_the_end_of_a_long_history_reads_only_what_it_changed() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, mut table, wh) = quickstart_table(dir.path()).await;
    let cfg = config(dir.path(), &sql_config(&wh, "", ""));
    let append = |table: Table, id: i64| {
        let catalog = &catalog;
        async move {
            let b = quickstart::orders_batch(&table, &[(id, "appended", id as i128)]).unwrap();
            let files = iceberg_cdc::sink::iceberg::files::write_data(&table, &[b]).await.unwrap();
            let c = iceberg_cdc::sink::iceberg::rowdelta::RowDelta::new().add_data_files(files).prepare(&table).await.unwrap();
            catalog.commit(&table, c.requirements, c.updates).await.unwrap()
        }
    };
    let read = |table: &Table| {
        let lineage = iceberg_cdc::spec::lineage::main_lineage(table.metadata());
        let parent = lineage[lineage.len() - 2].snapshot_id().to_string();
        let out = cdc(&["changes", "--config", cfg.to_str().unwrap(), "--from-snapshot", &parent]);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        (parse_changes(&ok(out)), stderr)
    };
    table = append(table, 1000).await;
    let (_, short) = read(&table);
    assert!(short.contains(" 1 manifests, 1 files / "), "right after the quickstart: {short}");
    for i in 1..=300 {
        table = append(table, 1000 + i).await;
    }
    let manifests =
        table.manifest_list_reader(table.metadata().current_snapshot().unwrap()).load().await.unwrap().consume_entries().into_iter().count();
    assert!(manifests > 300, "one manifest per append: {manifests}");
    let (got, long) = read(&table);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(long.contains(" 1 manifests, 1 files / "), "at the end of a 300-append history: {long}");

    // an equality delete reaches older files: every data manifest it can apply to is read, and the rows are right
    let lineage = iceberg_cdc::spec::lineage::main_lineage(table.metadata());
    let before = lineage[lineage.len() - 1].snapshot_id();
    let table = quickstart::commit_changes(&catalog, &table, &[], &[1_007, 1_250, 3]).await.unwrap();
    let (got, _) = read(&table);
    assert_eq!(got, expected(&scan_rows(&table, Some(before)).await, &scan_rows(&table, table.metadata().current_snapshot_id()).await));
    assert_eq!(got.iter().filter(|c| c.0 == "DELETE").count(), 3, "{got:?}");
}

/// A delete comparing a field the kept live files leave out (issue 51): after 30 appends of a manifest each, one
/// `cdc changes` follows equality deletes by `id` (the identifier field: the live files are kept with the bounds
/// of `id` only), then by `customer`, then by `id` again. Each snapshot's rows are the ones iceberg-rust's scan
/// finds, and the delete by `customer` reads the one appended file whose names can match it, not all 30: the live
/// files were learned again with the bounds of `customer`.
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_on_another_field_is_planned_with_that_fields_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, mut table, wh) = quickstart_table(dir.path()).await;
    let cfg = config(dir.path(), &sql_config(&wh, "", ""));
    let names: Vec<String> = (0..30).map(|i| format!("zz-{i:02}")).collect();
    for (i, name) in names.iter().enumerate() {
        let b = quickstart::orders_batch(&table, &[(1000 + i as i64, name, i as i128)]).unwrap();
        let files = iceberg_cdc::sink::iceberg::files::write_data(&table, &[b]).await.unwrap();
        let c = iceberg_cdc::sink::iceberg::rowdelta::RowDelta::new().add_data_files(files).prepare(&table).await.unwrap();
        table = catalog.commit(&table, c.requirements, c.updates).await.unwrap();
    }
    let from = table.metadata().current_snapshot_id().unwrap();
    table = quickstart::commit_changes(&catalog, &table, &[], &[1_003]).await.unwrap();
    let doomed = quickstart::orders_batch(&table, &[(0, "zz-17", 0)]).unwrap();
    let deletes = iceberg_cdc::sink::iceberg::files::write_equality_deletes(&table, vec![2], &[doomed]).await.unwrap();
    let c = iceberg_cdc::sink::iceberg::rowdelta::RowDelta::new().add_delete_files(deletes).prepare(&table).await.unwrap();
    table = catalog.commit(&table, c.requirements, c.updates).await.unwrap();
    table = quickstart::commit_changes(&catalog, &table, &[], &[1_025]).await.unwrap();

    let out = cdc(&["changes", "--config", cfg.to_str().unwrap(), "--from-snapshot", &from.to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let mut by_snapshot: HashMap<i64, String> = HashMap::new();
    for l in ok(out).lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        by_snapshot.entry(v["_commit_snapshot_id"].as_i64().unwrap()).or_default().push_str(&format!("{l}\n"));
    }
    let lineage = iceberg_cdc::spec::lineage::main_lineage(table.metadata());
    for s in lineage.iter().skip_while(|s| s.snapshot_id() != from).skip(1) {
        let want = expected(&scan_rows(&table, s.parent_snapshot_id()).await, &scan_rows(&table, Some(s.snapshot_id())).await);
        assert_eq!(want.len(), 1, "each snapshot deletes one row");
        assert_eq!(parse_changes(by_snapshot.get(&s.snapshot_id()).map_or("", String::as_str)), want, "snapshot {}", s.snapshot_id());
    }
    // each delete reaches the one appended file whose bounds hold its value, and the quickstart's files whose
    // bounds of that field can (every name lies between theirs; no id does)
    let files: usize = stderr.split(" files / ").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(files < 10, "{files} files read for three one-row deletes: {stderr}");
}

/// Upserts reach every older file (issue 51): each commit below deletes 500 new keys that lie inside an older
/// 30 000-row file's key range (an upserting writer deletes every key it writes), updates two rows (of that file every
/// third commit, else of the commit before) and deletes a row of the commit before. The deletes are too dense for the
/// key-first read (more than a key per 64 rows), so the first commit reads the old file whole and keeps its key column; the later ones find their
/// rows from the kept keys, and read the old file only when it has rows to give. One `cdc changes` over the range
/// gives, snapshot by snapshot, the rows iceberg-rust's scan finds, and reads less than half the bytes that the
/// snapshots read one process each (which keeps nothing from one snapshot to the next).
#[tokio::test(flavor = "multi_thread")]
async fn files_that_equality_deletes_reach_again_are_answered_from_their_kept_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    // names that do not compress, so that a read of the file shows in the megabytes read
    let names: Vec<String> = (0..30_000u64)
        .map(|i| format!("c-{:016x}{:016x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15), i.wrapping_mul(0xc2b2_ae3d_27d4_eb4f).rotate_left(29)))
        .collect();
    let rows: Vec<(i64, &str, i128)> = (0..30_000).map(|i| (10_000 + 2 * i as i64, names[i].as_str(), i as i128)).collect();
    let b = quickstart::orders_batch(&table, &rows).unwrap();
    let files = iceberg_cdc::sink::iceberg::files::write_data(&table, &[b]).await.unwrap();
    let c = iceberg_cdc::sink::iceberg::rowdelta::RowDelta::new().add_data_files(files).prepare(&table).await.unwrap();
    let mut t = catalog.commit(&table, c.requirements, c.updates).await.unwrap();
    let first = t.metadata().current_snapshot_id().unwrap();
    for i in 0..6i64 {
        let mut up: Vec<(i64, &str, i128)> = (0..500).map(|j| (10_001 + 2 * (i * 500 + j), "new", j as i128)).collect();
        // two rows updated: of the old file every third commit, else of the commit before
        let updated = if i % 3 == 0 { [10_000 + 2_000 * i, 10_014 + 2_000 * i] } else { [10_003 + 2 * (i - 1) * 500, 10_007 + 2 * (i - 1) * 500] };
        up.extend(updated.map(|id| (id, "upd", i as i128)));
        let deletes = if i > 0 { vec![10_001 + 2 * ((i - 1) * 500 + 5)] } else { vec![] };
        t = quickstart::commit_changes(&catalog, &t, &up, &deletes).await.unwrap();
    }
    let cfg = config(dir.path(), &sql_config(&wh, "", ""));
    let mb_read = |stderr: &str| -> f64 { stderr.split(" MB read").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap() };
    let out = cdc(&["changes", "--config", cfg.to_str().unwrap(), "--from-snapshot", &first.to_string()]);
    let range_mb = mb_read(&String::from_utf8_lossy(&out.stderr));
    let mut by_snapshot: HashMap<i64, String> = HashMap::new();
    for l in ok(out).lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        let s = by_snapshot.entry(v["_commit_snapshot_id"].as_i64().unwrap()).or_default();
        s.push_str(l);
        s.push('\n');
    }
    let lineage = iceberg_cdc::spec::lineage::main_lineage(t.metadata());
    let mut one_by_one_mb = 0.0;
    for s in lineage.iter().skip_while(|s| s.snapshot_id() != first).skip(1) {
        let parent = s.parent_snapshot_id();
        let want = expected(&scan_rows(&t, parent).await, &scan_rows(&t, Some(s.snapshot_id())).await);
        assert_eq!(parse_changes(by_snapshot.get(&s.snapshot_id()).map_or("", String::as_str)), want, "snapshot {}", s.snapshot_id());
        assert!(want.iter().filter(|c| c.0 == "UPDATE_AFTER").count() == 2, "two rows updated: {want:?}");
        let out = cdc(&[
            "changes",
            "--config",
            cfg.to_str().unwrap(),
            "--from-snapshot",
            &parent.unwrap().to_string(),
            "--to-snapshot",
            &s.snapshot_id().to_string(),
        ]);
        one_by_one_mb += mb_read(&String::from_utf8_lossy(&out.stderr));
        assert_eq!(parse_changes(&ok(out)), want, "snapshot {} alone", s.snapshot_id());
    }
    assert_eq!(by_snapshot.len(), 6, "six snapshots changed rows");
    assert!(one_by_one_mb >= 1.0, "one process per snapshot reads the old file each time ({one_by_one_mb} MB)");
    assert!(range_mb * 2.0 < one_by_one_mb, "the range read {range_mb} MB, its snapshots one by one {one_by_one_mb} MB");
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A table of 60 000 rows, then a snapshot updating a quarter of them, and a config whose 1 MiB budget makes
/// `cdc changes` of it spill to `spill`.
struct SpillingTable {
    wh: PathBuf,
    small: PathBuf,
    spill: PathBuf,
}

async fn spilling_table(dir: &Path) -> SpillingTable {
    let (catalog, table, wh) = quickstart_table(dir).await;
    let names: Vec<String> = (0..60_000).map(|i| format!("customer-{i}")).collect();
    let rows: Vec<(i64, &str, i128)> = (0..60_000).map(|i| (100 + i as i64, names[i].as_str(), i as i128)).collect();
    let table = quickstart::commit_changes(&catalog, &table, &rows, &[]).await.unwrap();
    let upd: Vec<(i64, &str, i128)> = rows.iter().step_by(4).map(|r| (r.0, r.1, r.2 + 1)).collect();
    let _ = quickstart::commit_changes(&catalog, &table, &upd, &[]).await.unwrap();
    let spill = dir.join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let small = config(dir, &sql_config(&wh, "", &format!("[engine]\nmemory_budget = \"1MiB\"\nspill_dir = \"{}\"\n", spill.display())));
    SpillingTable { wh, small, spill }
}

#[tokio::test(flavor = "multi_thread")]
async fn small_memory_budget_spills_and_gives_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let SpillingTable { wh, small, spill } = spilling_table(dir.path()).await;
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
async fn a_spill_that_cannot_be_written_fails_with_an_io_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let SpillingTable { small, spill, .. } = spilling_table(dir.path()).await;

    // a full disk, as far as the spill files see it: no file may grow past 256 KiB — room for the sqlite catalog's
    // writes (tens of KiB), not for the spill files (MiBs); the output is a pipe, not a file
    let out = Command::new("bash")
        .args(["-c", "trap '' XFSZ; ulimit -f 256; exec \"$0\" \"$@\"", CDC, "changes", "--config", small.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 10, "an I/O error, not an internal one: {stderr}");
    assert!(stderr.contains(&spill.display().to_string()) && stderr.contains("engine.spill_dir"), "names the spill file and the setting: {stderr}");
    assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0, "spill files are removed after a failure too");
}

/// Peak RSS of a `cdc sync` (initial copy, then a snapshot updating a quarter of the rows) of a table of `rows` rows
/// in files of 40k rows (the layout stays the same, only the table grows), as the process reports it, in MB.
async fn sync_peak_rss_mb(dir: &Path, rows: usize, budget: &str) -> (f64, f64) {
    let (catalog, mut table, wh) = quickstart_table(dir).await;
    let names: Vec<String> = (0..rows).map(|i| format!("customer-{i:08}-{}", "x".repeat(24))).collect();
    let all: Vec<(i64, &str, i128)> = (0..rows).map(|i| (100 + i as i64, names[i].as_str(), i as i128)).collect();
    // appends (no equality deletes: their keys are held in memory by design, in proportion to the delete files)
    for chunk in all.chunks(40_000) {
        let data = iceberg_cdc::sink::iceberg::files::write_data(&table, &[quickstart::orders_batch(&table, chunk).unwrap()]).await.unwrap();
        let c = iceberg_cdc::sink::iceberg::rowdelta::RowDelta::new().add_data_files(data).prepare(&table).await.unwrap();
        table = catalog.commit(&table, c.requirements, c.updates).await.unwrap();
    }
    let s1 = table.metadata().current_snapshot_id().unwrap();
    let upd: Vec<(i64, &str, i128)> = all.iter().step_by(4).map(|r| (r.0, r.1, r.2 + 1)).collect();
    let _ = quickstart::commit_changes(&catalog, &table, &upd, &[]).await.unwrap();
    let twh = dir.join("target");
    let engine = format!("[engine]\nmemory_budget = \"{budget}\"\nread_concurrency = 2\n");
    let cfg = config(dir, &format!("{}{engine}", sync_config(&wh, "db.copy", &twh, "")));
    let rss = |out: String| serde_json::from_str::<Value>(&out).unwrap()["peak_rss_bytes"].as_f64().unwrap() / 1e6;
    let boot = rss(ok(cdc(&["sync", "--config", cfg.to_str().unwrap(), "--to-snapshot", &s1.to_string(), "--json"])));
    let sync = rss(ok(cdc(&["sync", "--config", cfg.to_str().unwrap(), "--json"])));
    (boot, sync)
}

#[tokio::test(flavor = "multi_thread")]
async fn peak_memory_stays_flat_when_the_input_grows_tenfold() {
    // 16 MiB budget: 40k rows fit in it, 400k rows (~40 MB of change rows to net) do not
    let (small, large) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (boot_s, sync_s) = sync_peak_rss_mb(small.path(), 40_000, "16MiB").await;
    let (boot_l, sync_l) = sync_peak_rss_mb(large.path(), 400_000, "16MiB").await;
    eprintln!("peak RSS MB: bootstrap {boot_s:.0} -> {boot_l:.0}, sync {sync_s:.0} -> {sync_l:.0}");
    let budget_mb = 16.8;
    for (what, s, l) in [("bootstrap", boot_s, boot_l), ("sync", sync_s, sync_l)] {
        assert!(s > 0.0, "peak RSS is reported");
        // budget plus a fixed overhead (runtime, catalogs, Parquet footers, row groups in flight)
        assert!(l <= budget_mb + 128.0, "{what}: 400k rows peaked at {l:.0} MB, over the 16 MiB budget + 128 MB");
    }
    // the copy of ten times the rows grows by about the budget (measured 11–17 MB: the budget fills up, plus allocator
    // noise between runs); the sync's change set (one snapshot updating 100k keys) is ten times larger too and still
    // grows by ~45 MB beyond it (known: issue 10's note)
    assert!(boot_l - boot_s <= 2.0 * budget_mb, "bootstrap: ten times the rows raised peak RSS from {boot_s:.0} to {boot_l:.0} MB");
    assert!(sync_l - sync_s <= 4.0 * budget_mb, "sync: ten times the change rows raised peak RSS from {sync_s:.0} to {sync_l:.0} MB");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_clear_errors_and_distinct_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let (_catalog, table, wh) = quickstart_table(dir.path()).await;
    let lineage = iceberg_cdc::spec::lineage::main_lineage(table.metadata());
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

    // A after B (on the main branch: a swapped range, not a state difference), unknown (expired) snapshot
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
    let victim =
        std::fs::read_dir(&data_dir).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).find(|p| p.to_string_lossy().contains("data-")).unwrap();
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
    ok(cdc(&["quickstart", "--changes-only", "--dir", qs.to_str().unwrap()]));
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
    let lineage = iceberg_cdc::spec::lineage::main_lineage(table.metadata());
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
    let tcat = Catalog::connect(&Config::parse(&std::fs::read_to_string(cfg).unwrap()).unwrap().targets().next().cloned().unwrap().catalog, "t")
        .await
        .unwrap();
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
    // an existing target whose key has an incompatible type and which has a required column the source lacks
    let tcfg = Config::parse(&sync_config(&wh, "replica.bad", &tw, "")).unwrap().targets().next().cloned().unwrap();
    let tcat = Catalog::connect(&tcfg.catalog, "target").await.unwrap();
    let schema = iceberg::spec::Schema::builder()
        .with_fields(vec![
            iceberg::spec::NestedField::required(1, "id", iceberg::spec::Type::Primitive(iceberg::spec::PrimitiveType::String)).into(),
            iceberg::spec::NestedField::optional(2, "customer", iceberg::spec::Type::Primitive(iceberg::spec::PrimitiveType::String)).into(),
            iceberg::spec::NestedField::required(3, "must", iceberg::spec::Type::Primitive(iceberg::spec::PrimitiveType::String)).into(),
        ])
        .build()
        .unwrap();
    let creation = iceberg::TableCreation::builder().name("bad".into()).schema(schema).build();
    tcat.create_table("replica.bad", creation).await.unwrap();
    let cfg = config(dir.path(), &sync_config(&wh, "replica.bad", &tw, ""));
    let out = cdc(&["sync", "--config", cfg.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), exit::SCHEMA, "{err}");
    assert!(err.contains("`id` is long in source snapshot") && err.contains("`must` is required"), "{err}");
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
    let body = sync_config(&wh, "replica.x", &tw, "")
        .replace(&format!("type = \"hadoop\"\nwarehouse = \"{}\"", tw.display()), "type = \"rest\"\nuri = \"http://127.0.0.1:9\"");
    let out = cdc(&["sync", "--config", config(dir.path(), &body).to_str().unwrap()]);
    assert_eq!(code(&out), exit::CATALOG, "{}", String::from_utf8_lossy(&out.stderr));

    // no [target] section
    let out = cdc(&["sync", "--config", config(dir.path(), &sql_config(&wh, "", "")).to_str().unwrap()]);
    assert_eq!(code(&out), exit::CONFIG);
    assert_eq!(iceberg_cdc::spec::lineage::main_lineage(table.metadata()).len(), 4, "the source is untouched");
}

fn progress_history(target_wh: &Path, table: &str) -> Vec<i64> {
    // `cdc snapshots --json` on the target: the recorded source snapshot of every target snapshot, oldest first
    let body = format!("[source]\ntable = \"{table}\"\n[source.catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n", target_wh.display());
    let dir = tempfile::tempdir().unwrap();
    let out = ok(cdc(&["snapshots", "--config", config(dir.path(), &body).to_str().unwrap(), "--json"]));
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str::<Value>(l).ok()?["summary"]["cdc.source-snapshot-id"].as_str()?.parse().ok())
        .collect()
}

/// The progress the hadoop target `table` recorded along its history, asserted strictly increasing in `source`'s
/// sequence numbers: every range applied once, progress never backwards. Returns it, oldest first.
fn assert_applied_once(target_wh: &Path, table: &str, source: &Table, context: &str) -> Vec<i64> {
    let history = progress_history(target_wh, table);
    let seqs: Vec<i64> = history.iter().map(|id| source.metadata().snapshot_by_id(*id).unwrap().sequence_number()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{context}: a range was applied twice or progress went backwards: {history:?}");
    history
}

async fn assert_target_equals_source(cfg: &Path, table: &Table, target: &str) {
    let tcat = Catalog::connect(&Config::load(cfg).unwrap().targets().next().cloned().unwrap().catalog, "t").await.unwrap();
    let t = tcat.load_table(target).await.unwrap();
    let progress = iceberg_cdc::sink::iceberg::progress::read(t.metadata(), &table.metadata().uuid().to_string()).unwrap();
    let mut want = scan_rows(table, Some(progress.source_snapshot_id)).await;
    let mut got = scan_rows(&t, t.metadata().current_snapshot_id()).await;
    want.sort();
    got.sort();
    assert_eq!(got, want, "target differs from the source at its recorded progress");
}

/// `[[sinks]]`: one `cdc sync` writes two target tables (a shorthand `[target]` beside a list entry) from one read;
/// one behind the other catches up alone first, and both end equal to the source, each commit applied once.
#[tokio::test(flavor = "multi_thread")]
async fn one_sync_writes_every_sink_of_its_list() {
    let dir = tempfile::tempdir().unwrap();
    let (_c, table, wh) = quickstart_table(dir.path()).await;
    let (tw, tw2) = (dir.path().join("target"), dir.path().join("target2"));
    let lineage = iceberg_cdc::spec::lineage::main_lineage(table.metadata());
    let second = format!(
        "\n[[sinks]]\ntype = \"iceberg\"\ntable = \"replica.orders2\"\n[sinks.catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n",
        tw2.display()
    );
    // the shorthand alone first: the list's sink starts behind it
    let one = config(dir.path(), &sync_config(&wh, "replica.orders", &tw, ""));
    ok(cdc(&["sync", "--config", one.to_str().unwrap(), "--to-snapshot", &lineage[1].snapshot_id().to_string()]));
    let both = dir.path().join("both.toml");
    std::fs::write(&both, sync_config(&wh, "replica.orders", &tw, "") + &second).unwrap();
    let summary = ok(cdc(&["sync", "--config", both.to_str().unwrap(), "--json"]));
    assert!(summary.contains("\"source_snapshot_id\""), "{summary}");
    assert_target_equals_source(&both, &table, "replica.orders").await;
    let history = assert_applied_once(&tw, "replica.orders", &table, "the shorthand's target");
    assert_eq!(history.last(), Some(&lineage.last().unwrap().snapshot_id()));
    let history2 = assert_applied_once(&tw2, "replica.orders2", &table, "the list's target");
    assert_eq!(history2.last(), history.last(), "both at the source's head");
    let only_second = dir.path().join("second.toml");
    std::fs::write(&only_second, sql_config(&wh, "", "") + &second).unwrap();
    assert_target_equals_source(&only_second, &table, "replica.orders2").await;
    // a problem of a list entry is reported where the file has it
    let bad = dir.path().join("bad.toml");
    for (entry, problem) in [
        (second.replace("replica.orders2", "orders2"), "sinks[0].table: `orders2` must be `namespace.table`"),
        (second.replace("[sinks.catalog]", "tabel = 1\n[sinks.catalog]"), "unknown key `sinks[0].tabel`"),
    ] {
        std::fs::write(&bad, sync_config(&wh, "replica.orders", &tw, "") + &entry).unwrap();
        let out = cdc(&["sync", "--config", bad.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(code(&out) != 0 && err.contains(problem), "{problem}: {err}");
    }
}

/// The JSON-lines sink (`type = "jsonl"`, the smallest destination): a bootstrap copy, then one file per source
/// snapshot, each holding what `cdc changes` gives for it; progress moves only with a landed file, and a run with
/// nothing new writes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_jsonl_sink_holds_the_changes_file_by_file() {
    let dir = tempfile::tempdir().unwrap();
    let (_c, table, wh) = quickstart_table(dir.path()).await;
    let out = dir.path().join("changes");
    let lineage = iceberg_cdc::spec::lineage::main_lineage(table.metadata());
    let ids: Vec<String> = lineage.iter().map(|s| s.snapshot_id().to_string()).collect();
    let cfg = config(dir.path(), &format!("{}\n[[sinks]]\ntype = \"jsonl\"\npath = \"{}\"\n", sql_config(&wh, "", ""), out.display()));
    let cfg = cfg.to_str().unwrap();
    ok(cdc(&["sync", "--config", cfg, "--to-snapshot", &ids[0]]));
    ok(cdc(&["sync", "--config", cfg]));
    ok(cdc(&["sync", "--config", cfg]));
    let progress: Value = serde_json::from_str(&std::fs::read_to_string(out.join("progress.json")).unwrap()).unwrap();
    assert_eq!(progress["commits"], ids.len() as u64, "a copy, then one file per snapshot; the last run wrote nothing: {progress}");
    assert_eq!(progress["source_snapshot_id"].to_string(), ids[ids.len() - 1]);
    let file = |n: usize| std::fs::read_to_string(out.join(format!("{n:010}.jsonl"))).unwrap();
    let copy = parse_changes(&file(1));
    let first = parse_changes(&ok(cdc(&["changes", "--config", cfg, "--to-snapshot", &ids[0]])));
    assert_eq!(copy, first, "the copy is the first snapshot's rows");
    for n in 2..=ids.len() {
        let want = ok(cdc(&["changes", "--config", cfg, "--from-snapshot", &ids[n - 2], "--to-snapshot", &ids[n - 1]]));
        assert_eq!(parse_changes(&file(n)), parse_changes(&want), "file {n}");
    }
    assert_eq!(walk(&out).len(), ids.len() + 1, "the files and progress.json, nothing left behind");
}

/// Issue 11's deterministic sequence: sync to snapshot 1; a second sync to snapshot 3 pauses before its first
/// commit; a third syncs to the end; the paused one resumes. It must not apply anything again, and the progress
/// must never move backwards.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_applier_replans_instead_of_reapplying() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    // more history: three more commits
    let mut t = table.clone();
    for i in 0..3i64 {
        t = quickstart::commit_changes(&catalog, &t, &[(100 + i, "later", 1000 + i as i128), (1, "changed-again", 7 + i as i128)], &[2 + i])
            .await
            .unwrap();
    }
    let ids: Vec<String> = iceberg_cdc::spec::lineage::main_lineage(t.metadata()).iter().map(|s| s.snapshot_id().to_string()).collect();
    let tw = dir.path().join("target");
    let cfg = config(dir.path(), &sync_config(&wh, "replica.paused", &tw, ""));
    let cfg_s = cfg.to_str().unwrap();
    ok(cdc(&["sync", "--config", cfg_s, "--to-snapshot", &ids[1]]));
    let pause = dir.path().join("pause");
    std::fs::create_dir(&pause).unwrap();
    let paused = Command::new(CDC)
        .args(["sync", "--config", cfg_s, "--to-snapshot", &ids[3]])
        .env("CDC_TEST_PAUSE_BEFORE_COMMIT", &pause)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    for _ in 0..600 {
        if pause.join("paused").exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(pause.join("paused").exists(), "the second sync never reached its commit");
    ok(cdc(&["sync", "--config", cfg_s]));
    std::fs::write(pause.join("resume"), b"").unwrap();
    let out = paused.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let history = assert_applied_once(&tw, "replica.paused", &t, "paused applier");
    let last: i64 = ids.last().unwrap().parse().unwrap();
    assert_eq!(*history.last().unwrap(), last, "progress ends at the newest source snapshot: {history:?}");
    assert_target_equals_source(&cfg, &t, "replica.paused").await;
}

/// Several appliers started together on one target (hadoop and sqlite catalogs; the REST catalog is in the peer
/// tests), each to another end snapshot, and twice in a row: the target ends equal to the source at its recorded
/// progress, with every range applied once — also while each applier compacts the target after every commit
/// (compaction thresholds of 1 delete file and 2 small files), racing the others' commits.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_appliers_never_reapply_or_go_backwards() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    let mut t = table.clone();
    for i in 0..6i64 {
        t = quickstart::commit_changes(&catalog, &t, &[(200 + i, "more", 10 + i as i128), (1 + (i % 3), "upd", 20 + i as i128)], &[100 + i])
            .await
            .unwrap();
    }
    let ids: Vec<String> = iceberg_cdc::spec::lineage::main_lineage(t.metadata()).iter().map(|s| s.snapshot_id().to_string()).collect();
    let compacting = "\ncompact_delete_files = 1\ncompact_small_files = 2";
    for (case, (kind, trials, extra)) in [("hadoop", 4, ""), ("sql", 4, ""), ("hadoop", 4, compacting)].into_iter().enumerate() {
        for trial in 0..trials {
            let tw = dir.path().join(format!("target-{case}-{kind}-{trial}"));
            let mut body = sync_config(&wh, "replica.race", &tw, &format!("commit_retries = 50\nretry_backoff = \"20ms\"{extra}"));
            if kind == "sql" {
                body = body.replace("type = \"hadoop\"", "type = \"sql\"");
            }
            let cfg = config(dir.path(), &body);
            let cfg_s = cfg.to_str().unwrap();
            if trial % 2 == 1 {
                // an existing target at some snapshot
                ok(cdc(&["sync", "--config", cfg_s, "--to-snapshot", &ids[2]]));
            }
            let n = 2 + trial % 3;
            let procs: Vec<_> = (0..n)
                .map(|k| {
                    let end = &ids[ids.len() - 1 - (k * 2) % 4];
                    Command::new(CDC)
                        .args(["sync", "--config", cfg_s, "--to-snapshot", end])
                        .stdout(std::process::Stdio::piped())
                        .stderr(std::process::Stdio::piped())
                        .spawn()
                        .unwrap()
                })
                .collect();
            for p in procs {
                let out = p.wait_with_output().unwrap();
                assert!(out.status.success(), "{kind} trial {trial}: {}", String::from_utf8_lossy(&out.stderr));
            }
            if kind == "hadoop" {
                assert_applied_once(&tw, "replica.race", &t, &format!("{kind} trial {trial}"));
            }
            if !extra.is_empty() && trial % 2 == 1 {
                // (a fresh target is one bootstrap commit: nothing to compact)
                let body = format!("[source]\ntable = \"replica.race\"\n[source.catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n", tw.display());
                let out = ok(cdc(&["snapshots", "--config", config(dir.path(), &body).to_str().unwrap(), "--json"]));
                assert!(out.contains("\"replace\""), "trial {trial}: no compaction committed: {out}");
            }
            assert_target_equals_source(&cfg, &t, "replica.race").await;
        }
    }
}

/// A small tmpfs mounted at a new directory `dir` (the disk-full tests; needs root), unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir(dir).unwrap();
        let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(dir).status().unwrap();
        assert!(mounted.success(), "this test mounts a small tmpfs (run as root)");
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A full disk under the target or the output: the I/O exit code, the path, the cause once, nothing committed.
#[tokio::test(flavor = "multi_thread")]
async fn disk_full_names_the_file_and_exits_with_the_io_code() {
    let dir = tempfile::tempdir().unwrap();
    let (_c, _table, wh) = quickstart_table(dir.path()).await;
    let full = dir.path().join("full");
    let _mounted = Tmpfs::mount(&full, "12k");
    // a filler leaves almost no room
    let _ = std::fs::write(full.join("filler"), vec![0u8; 8 * 1024]);

    let tw = full.join("target");
    let cfg = config(dir.path(), &sync_config(&wh, "replica.full", &tw, ""));
    let out = cdc(&["sync", "--config", cfg.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), exit::IO, "{err}");
    assert!(err.contains(full.to_str().unwrap()), "the message names the file: {err}");
    let error_line: String = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(error_line.matches("No space left on device").count(), 1, "the cause once: {err}");
    // every file the failed commit wrote is gone again: no data, delete or manifest file, no metadata temp file
    fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                files_under(&e.path(), out);
            } else {
                out.push(e.path());
            }
        }
    }
    let mut left = Vec::new();
    files_under(&tw, &mut left);
    left.retain(|p| ["parquet", "avro", "puffin", "tmp"].iter().any(|x| p.extension().is_some_and(|e| e == *x)));
    assert!(left.is_empty(), "left behind: {left:?}");

    // now fill the disk completely
    let _ = std::fs::write(full.join("filler2"), vec![0u8; 64 * 1024]);
    for (format, name) in [("parquet", "x.parquet"), ("jsonl", "x.jsonl")] {
        let qcfg = config(dir.path(), &sql_config(&wh, "", ""));
        let target = full.join(name);
        let out = cdc(&["changes", "--config", qcfg.to_str().unwrap(), "--format", format, "--output", target.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), exit::IO, "{format}: {err}");
        assert!(err.contains(full.to_str().unwrap()), "{format}: the message names where: {err}");
        assert!(!target.exists(), "{format}: no partial output");
    }
}

/// Types Spark cannot write (uuid, fixed, time, timestamp_ns on v3) beside nested maps and lists, in a table written
/// by iceberg-rust: `cdc changes` renders them in the spec's JSON, and `cdc sync` copies them exactly (the target read
/// back by iceberg-rust's scan equals the source).
#[tokio::test(flavor = "multi_thread")]
async fn types_spark_cannot_write_go_through_changes_and_sync() {
    use arrow_array::builder::{Int64Builder, MapBuilder, StringBuilder};
    use arrow_array::{
        ArrayRef, FixedSizeBinaryArray, Int64Array, ListArray, RecordBatch, StructArray, Time64MicrosecondArray, TimestampNanosecondArray,
    };
    use iceberg::spec::{ListType, MapType, NestedField, PrimitiveType as P, Schema, StructType, Type};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let cat = Catalog::connect(&Config::parse(&sql_config(&wh, "", "")).unwrap().source.catalog, "source").await.unwrap();
    let p = |t: P| Type::Primitive(t);
    let schema = Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", p(P::Long)).into(),
            NestedField::optional(2, "u", p(P::Uuid)).into(),
            NestedField::optional(3, "fx", p(P::Fixed(4))).into(),
            NestedField::optional(4, "t", p(P::Time)).into(),
            NestedField::optional(5, "tn", p(P::TimestampNs)).into(),
            NestedField::optional(
                6,
                "m",
                Type::Map(MapType::new(NestedField::required(7, "key", p(P::String)).into(), NestedField::optional(8, "value", p(P::Long)).into())),
            )
            .into(),
            NestedField::optional(9, "l", Type::List(ListType::new(NestedField::optional(10, "element", p(P::Uuid)).into()))).into(),
            NestedField::optional(11, "s", Type::Struct(StructType::new(vec![NestedField::optional(12, "f", p(P::Fixed(2))).into()]))).into(),
        ])
        .with_identifier_field_ids(vec![1])
        .build()
        .unwrap();
    let creation = iceberg::TableCreation::builder().name("types".into()).schema(schema).format_version(iceberg::spec::FormatVersion::V3).build();
    let mut t = cat.create_table("demo.types", creation).await.unwrap();
    let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(t.metadata().current_schema()).unwrap());
    let batch = |ids: &[i64], salt: u8| -> RecordBatch {
        let n = ids.len();
        let uuid = |i: i64| {
            let mut b = [0u8; 16];
            b[0] = salt;
            b[15] = i as u8;
            b
        };
        let mut mb = MapBuilder::new(None, StringBuilder::new(), Int64Builder::new());
        for &i in ids {
            mb.keys().append_value("k");
            mb.values().append_value(i * salt as i64);
            mb.append(true).unwrap();
        }
        let arrow_schema::DataType::Map(entries, _) = arrow.field(5).data_type().clone() else { panic!() };
        let arrow_schema::DataType::Struct(kv) = entries.data_type().clone() else { panic!() };
        let m = mb.finish();
        let kv_array = StructArray::new(kv, m.entries().columns().to_vec(), None);
        let m: ArrayRef = Arc::new(arrow_array::MapArray::try_new(entries, m.offsets().clone(), kv_array, None, false).unwrap());
        let arrow_schema::DataType::List(el) = arrow.field(6).data_type().clone() else { panic!() };
        let values = FixedSizeBinaryArray::try_from_iter(ids.iter().map(|&i| uuid(i + 100))).unwrap();
        let offsets = arrow_buffer::OffsetBuffer::from_lengths(vec![1; n]);
        let l: ArrayRef = Arc::new(ListArray::new(el, offsets, Arc::new(values), None));
        let arrow_schema::DataType::Struct(sf) = arrow.field(7).data_type().clone() else { panic!() };
        let s: ArrayRef =
            Arc::new(StructArray::new(sf, vec![Arc::new(FixedSizeBinaryArray::try_from_iter(ids.iter().map(|_| [salt, 0xAB])).unwrap())], None));
        RecordBatch::try_new(
            arrow.clone(),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(FixedSizeBinaryArray::try_from_iter(ids.iter().map(|&i| uuid(i))).unwrap()),
                Arc::new(FixedSizeBinaryArray::try_from_iter(ids.iter().map(|&i| [salt, 1, 2, i as u8])).unwrap()),
                Arc::new(Time64MicrosecondArray::from(ids.iter().map(|&i| 3_600_000_000 + i).collect::<Vec<_>>())),
                Arc::new(TimestampNanosecondArray::from(ids.iter().map(|&i| 1_700_000_000_123_456_789 + i).collect::<Vec<_>>())),
                m,
                l,
                s,
            ],
        )
        .unwrap()
    };
    // snapshot 1: ids 1..3; snapshot 2: id 2 changes (equality delete + new row), id 4 is new
    let files = iceberg_cdc::sink::iceberg::files::write_data(&t, &[batch(&[1, 2, 3], 1)]).await.unwrap();
    let c = iceberg_cdc::sink::iceberg::rowdelta::RowDelta::new().add_data_files(files).prepare(&t).await.unwrap();
    t = cat.commit(&t, c.requirements, c.updates).await.unwrap();
    let upd = batch(&[2, 4], 2);
    let data = iceberg_cdc::sink::iceberg::files::write_data(&t, std::slice::from_ref(&upd)).await.unwrap();
    let dels = iceberg_cdc::sink::iceberg::files::write_equality_deletes(&t, vec![1], &[upd]).await.unwrap();
    let c = iceberg_cdc::sink::iceberg::rowdelta::RowDelta::new().add_data_files(data).add_delete_files(dels).prepare(&t).await.unwrap();
    t = cat.commit(&t, c.requirements, c.updates).await.unwrap();

    let body = sql_config(&wh, "", "").replace(&format!("table = \"{}\"", quickstart::TABLE), "table = \"demo.types\"");
    let cfg = config(dir.path(), &body);
    let out = ok(cdc(&["changes", "--config", cfg.to_str().unwrap()]));
    let rows: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let kinds: Vec<(String, i64)> = rows.iter().map(|r| (r["_change_type"].as_str().unwrap().to_string(), r["id"].as_i64().unwrap())).collect();
    assert_eq!(
        kinds,
        vec![
            ("INSERT".into(), 1),
            ("INSERT".into(), 2),
            ("INSERT".into(), 3),
            ("UPDATE_BEFORE".into(), 2),
            ("UPDATE_AFTER".into(), 2),
            ("INSERT".into(), 4)
        ]
    );
    let r = &rows[0];
    assert_eq!(r["u"], "01000000-0000-0000-0000-000000000001", "uuid in its canonical form: {r}");
    assert_eq!(r["fx"], "01010201", "fixed as hex: {r}");
    assert_eq!(r["t"], "01:00:00.000001", "{r}");
    assert_eq!(r["tn"], "2023-11-14T22:13:20.123456790", "{r}");
    assert_eq!(r["l"][0], "01000000-0000-0000-0000-000000000065", "{r}");
    let pq = dir.path().join("types.parquet");
    ok(cdc(&["changes", "--config", cfg.to_str().unwrap(), "--format", "parquet", "--output", pq.to_str().unwrap()]));
    assert!(std::fs::metadata(&pq).unwrap().len() > 0);

    let tw = dir.path().join("target");
    let sbody = format!(
        "{body}\n[target]\ntable = \"replica.types\"\nformat_version = 3\n[target.catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n",
        tw.display()
    );
    let scfg = config(dir.path(), &sbody);
    let lineage = iceberg_cdc::spec::lineage::main_lineage(t.metadata());
    ok(cdc(&["sync", "--config", scfg.to_str().unwrap(), "--to-snapshot", &lineage[0].snapshot_id().to_string()]));
    ok(cdc(&["sync", "--config", scfg.to_str().unwrap()]));
    assert_target_equals_source(&scfg, &t, "replica.types").await;
}

/// Range messages say what is wrong: a start after the end, a start that was rolled back, an end the target is
/// already past (nothing to do, exit 0).
#[tokio::test(flavor = "multi_thread")]
async fn range_messages_name_the_real_problem() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    let ids: Vec<String> = iceberg_cdc::spec::lineage::main_lineage(table.metadata()).iter().map(|s| s.snapshot_id().to_string()).collect();
    let tw = dir.path().join("target");
    let cfg = config(dir.path(), &sync_config(&wh, "replica.msgs", &tw, ""));
    let cfg = cfg.to_str().unwrap();

    // --from after --to, on a fresh target: not a "gap"
    let out = cdc(&["sync", "--config", cfg, "--from-snapshot", &ids[3], "--to-snapshot", &ids[1]]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), exit::RANGE, "{err}");
    assert!(err.contains("after the end of the range") && !err.contains("gap"), "{err}");

    // a target already past --to: nothing to do
    ok(cdc(&["sync", "--config", cfg]));
    let out = ok(cdc(&["sync", "--config", cfg, "--to-snapshot", &ids[1], "--json"]));
    assert!(out.contains("\"source_snapshots_applied\": 0"), "{out}");

    // roll the source back to ids[1] and commit on top: ids[3] is off the branch now, with a higher sequence number
    let qcfg = config(dir.path(), &sql_config(&wh, "", ""));
    let undone = ok(cdc(&["changes", "--config", qcfg.to_str().unwrap(), "--from-snapshot", &ids[1], "--to-snapshot", &ids[3]]));
    let head = table.metadata().current_snapshot_id();
    let rollback = vec![iceberg::TableUpdate::SetSnapshotRef {
        ref_name: "main".into(),
        reference: iceberg::spec::SnapshotReference::new(ids[1].parse().unwrap(), iceberg::spec::SnapshotRetention::branch(None, None, None)),
    }];
    let req = vec![iceberg::TableRequirement::RefSnapshotIdMatch { r#ref: "main".into(), snapshot_id: head }];
    let t = catalog.commit(&table, req, rollback).await.unwrap();
    quickstart::commit_changes(&catalog, &t, &[(77, "after-rollback", 1)], &[]).await.unwrap();
    // changes from a snapshot the rollback took off the branch: the state difference (the changes of ids[2] and ids[3]
    // undone)
    let out = ok(cdc(&["changes", "--config", qcfg.to_str().unwrap(), "--from-snapshot", &ids[3], "--to-snapshot", &ids[1]]));
    let kinds = |s: &str| {
        s.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["_change_type"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    let inverse = |k: &String| match k.as_str() {
        "INSERT" => "DELETE",
        "DELETE" => "INSERT",
        "UPDATE_BEFORE" => "UPDATE_BEFORE",
        _ => "UPDATE_AFTER",
    };
    let (mut got, mut want) = (kinds(&out), kinds(&undone).iter().map(|k| inverse(k).to_string()).collect::<Vec<_>>());
    got.sort();
    want.sort();
    assert!(!want.is_empty());
    assert_eq!(got, want, "{out}");
    // the target recorded ids[3], which the rollback took off the branch. Asked to stop: exit 14, nothing committed
    let before = target_snapshot_count(&tw, "replica.msgs");
    let stop = config(dir.path(), &std::fs::read_to_string(cfg).unwrap().replacen("[source]\n", "[source]\non_history_rewrite = \"stop\"\n", 1));
    let out = cdc(&["sync", "--config", stop.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), exit::HISTORY, "{err}");
    assert!(err.contains("rewrite") && err.contains(&ids[3]) && err.contains("on_history_rewrite = \"follow\""), "{err}");
    assert_eq!(target_snapshot_count(&tw, "replica.msgs"), before);
    // followed (the default): one commit, said in the summary, and the target equals the source again
    let out = ok(cdc(&["sync", "--config", cfg, "--json"]));
    let summary: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(summary["history_rewrite"]["kind"], "rewrite", "{out}");
    assert_eq!(summary["history_rewrite"]["from_snapshot"].to_string(), ids[3], "{out}");
    assert_eq!(target_snapshot_count(&tw, "replica.msgs"), before + 1);
    let (_, source) = iceberg_cdc::pipeline::load_source(&iceberg_cdc::config::Config::load(&qcfg).unwrap()).await.unwrap();
    assert_target_equals_source(std::path::Path::new(cfg), &source, "replica.msgs").await;
}

// ---------------------------------------------------------------------------------------------------------------
// The service (`cdc run`) as a child process: systemd notifications on a socket bound here, telemetry over HTTP.

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return (0, String::new()) };
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    let _ = write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// A metric's value from Prometheus text, for the sample whose labels contain `labels`.
fn metric(body: &str, name: &str, labels: &str) -> Option<f64> {
    body.lines().filter(|l| l.starts_with(name) && l.contains(labels)).find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

fn service_toml(source_wh: &Path, target_wh: &Path, port: u16, pipelines: &[(&str, &str, &str)]) -> String {
    let mut s = format!(
        "[service]\npoll_interval = \"200ms\"\nmetrics_address = \"127.0.0.1:{port}\"\nshutdown_timeout = \"10s\"\n\n\
         [catalogs.demo]\ntype = \"sql\"\nwarehouse = \"{}\"\n\n[catalogs.replica]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n",
        source_wh.display(),
        target_wh.display()
    );
    for (name, source, target) in pipelines {
        s += &format!(
            "\n[[pipelines]]\nname = \"{name}\"\nsource = {{ catalog = \"demo\", table = \"{source}\" }}\n\n\
             [[pipelines.sinks]]\ntype = \"iceberg\"\ncatalog = \"replica\"\ntable = \"{target}\"\n"
        );
    }
    s
}

/// Datagrams the service sends to `NOTIFY_SOCKET`, collected by a thread.
struct Notifications {
    got: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Notifications {
    fn bind(path: &Path) -> Notifications {
        let sock = std::os::unix::net::UnixDatagram::bind(path).unwrap();
        let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let g = got.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = sock.recv(&mut buf) {
                g.lock().unwrap().push(String::from_utf8_lossy(&buf[..n]).to_string());
            }
        });
        Notifications { got }
    }
    fn wait_for(&self, needle: &str, secs: u64) -> bool {
        wait_until(secs, || self.got.lock().unwrap().iter().any(|m| m.lines().any(|l| l == needle || l.starts_with(needle))))
    }
}

/// `cdc run --config cfg` under a systemd-like supervisor: its notifications are collected, its watchdog interval is
/// 1 s, its log goes to `dir/service.log`.
/// `dir/service.toml`: one pipeline `orders` (the quickstart table into `replica.orders`) polled every `poll`, its
/// sink with `target_keys` added.
fn orders_service(dir: &Path, source_wh: &Path, target_wh: &Path, port: u16, poll: &str, target_keys: &str) -> PathBuf {
    let cfg = dir.join("service.toml");
    let toml = service_toml(source_wh, target_wh, port, &[("orders", quickstart::TABLE, "replica.orders")])
        .replace("poll_interval = \"200ms\"", &format!("poll_interval = \"{poll}\""))
        .replace("table = \"replica.orders\"\n", &format!("table = \"replica.orders\"\n{target_keys}"));
    std::fs::write(&cfg, toml).unwrap();
    cfg
}

fn spawn_watched_service(dir: &Path, cfg: &Path) -> (std::process::Child, Notifications) {
    let notify = Notifications::bind(&dir.join("notify.sock"));
    let child = Command::new(CDC)
        .args(["run", "--config", cfg.to_str().unwrap()])
        .env("NOTIFY_SOCKET", dir.join("notify.sock"))
        .env("WATCHDOG_USEC", "1000000")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("service.log")).unwrap())
        .spawn()
        .unwrap();
    (child, notify)
}

fn wait_until(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    f()
}

/// Whether the hadoop target `table` records `source`'s current snapshot and holds the same rows.
async fn caught_up(target_wh: &Path, table: &str, source: &Table) -> bool {
    caught_up_in(&catalog_at("hadoop", target_wh).await, table, source).await
}

/// A catalog of kind `kind` (hadoop, sql) over warehouse `wh`.
async fn catalog_at(kind: &str, wh: &Path) -> Catalog {
    let text = format!("[source]\ntable = \"x.y\"\n[source.catalog]\ntype = \"{kind}\"\nwarehouse = \"{}\"\n", wh.display());
    Catalog::connect(&Config::parse(&text).unwrap().source.catalog, "t").await.unwrap()
}

/// Whether `table` of catalog `cat` records `source`'s head as applied, and then holds its rows.
async fn caught_up_in(cat: &Catalog, table: &str, source: &Table) -> bool {
    let Ok(t) = cat.load_table(table).await else { return false };
    let Some(p) = iceberg_cdc::sink::iceberg::progress::read(t.metadata(), &source.metadata().uuid().to_string()) else { return false };
    if Some(p.source_snapshot_id) != source.metadata().current_snapshot_id() {
        return false;
    }
    let mut want = scan_rows(source, source.metadata().current_snapshot_id()).await;
    let mut got = scan_rows(&t, t.metadata().current_snapshot_id()).await;
    want.sort();
    got.sort();
    assert_eq!(got, want, "{table} records the source head but holds other rows");
    true
}

/// Whether `target` of `replica` catches up with `source` of `catalog` (loaded afresh each time) within `secs`.
async fn replica_catches_up(replica: &Catalog, target: &str, catalog: &Catalog, source: &str, secs: u64) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if caught_up_in(replica, target, &catalog.load_table(source).await.unwrap()).await {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    false
}

async fn wait_caught_up(target_wh: &Path, table: &str, catalog: &Catalog, secs: u64) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        let source = catalog.load_table(quickstart::TABLE).await.unwrap();
        if caught_up(target_wh, table, &source).await {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    }
    false
}

/// Waits for a service that was told to stop; one that is still running after `secs` is a hang: its thread
/// stacks (gdb, where installed) go into the panic message, so a CI log shows where it stuck, and it is killed.
fn wait_exit(child: &mut std::process::Child, secs: u64, log: impl Fn() -> String) -> std::process::ExitStatus {
    if wait_until(secs, || child.try_wait().unwrap().is_some()) {
        return child.wait().unwrap();
    }
    let pid = child.id().to_string();
    let stacks = Command::new("gdb")
        .args(["-p", &pid, "-batch", "-ex", "thread apply all bt"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|e| format!("(no stacks: gdb: {e})"));
    let _ = child.kill();
    let _ = child.wait();
    panic!("cdc run (pid {pid}) did not exit {secs} s after it was told to stop.\n--- log ---\n{}\n--- stacks ---\n{stacks}", log());
}

fn signal(child: &std::process::Child, sig: i32) {
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

/// The service keeps its target's history bounded and its files few as it follows the source, and counts it: with
/// `snapshot_retention = "0s"` and `retain_snapshots = 2`, /metrics shows expiry runs, expired snapshots and deleted
/// files, and the target keeps at most a few snapshots while it equals the source; with compaction thresholds of 2
/// files, /metrics shows compactions and the files they rewrote, and the target holds few delete files; with
/// `orphan_sweep_interval = "1s"` an unreferenced file older than `orphan_grace` goes and a young one stays.
#[tokio::test(flavor = "multi_thread")]
async fn the_service_expires_target_snapshots_and_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    let tw = dir.path().join("replica");
    let port = free_port();
    let cfg = orders_service(
        dir.path(),
        &wh,
        &tw,
        port,
        "200ms",
        "snapshot_retention = \"0s\"\nretain_snapshots = 2\ncompact_delete_files = 2\ncompact_small_files = 2\n\
             orphan_sweep_interval = \"1s\"\norphan_grace = \"1h\"\n",
    );
    let (mut child, notify) = spawn_watched_service(dir.path(), &cfg);
    let log = || std::fs::read_to_string(dir.path().join("service.log")).unwrap_or_default();
    assert!(notify.wait_for("READY=1", 30), "no READY=1: {}", log());
    let mut t = table.clone();
    let data = tw.join("replica").join("orders").join("data");
    let (old, young) = (data.join("orphan-old.parquet"), data.join("orphan-young.parquet"));
    for i in 0..6i64 {
        assert!(wait_caught_up(&tw, "replica.orders", &catalog, 30).await, "step {i}: {}", log());
        if i == 0 {
            std::fs::write(&old, b"left by a crashed writer").unwrap();
            let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
            std::fs::File::options().write(true).open(&old).unwrap().set_modified(two_hours_ago).unwrap();
            std::fs::write(&young, b"a commit in flight").unwrap();
            std::thread::sleep(std::time::Duration::from_millis(1100));
        }
        t = quickstart::commit_changes(&catalog, &t, &[(500 + i, "live", i as i128)], &[1 + i]).await.unwrap();
    }
    assert!(wait_caught_up(&tw, "replica.orders", &catalog, 30).await, "{}", log());
    let orders = "pipeline=\"orders\"";
    let m = http_get(port, "/metrics").1;
    assert!(metric(&m, "cdc_maintenance_snapshots_expired_total", orders).unwrap_or(0.0) >= 3.0, "{m}");
    assert!(metric(&m, "cdc_maintenance_files_deleted_total", orders).unwrap_or(0.0) >= 3.0, "{m}");
    assert!(
        metric(&m, "cdc_maintenance_runs_total", &format!("{orders},sink=\"iceberg:replica.orders\",task=\"expire\"")).unwrap_or(0.0) >= 1.0,
        "{m}"
    );
    assert!(m.contains("cdc_maintenance_seconds_total"), "{m}");
    assert!(
        metric(&m, "cdc_maintenance_runs_total", &format!("{orders},sink=\"iceberg:replica.orders\",task=\"compact\"")).unwrap_or(0.0) >= 1.0,
        "{m}"
    );
    assert!(metric(&m, "cdc_maintenance_files_rewritten_total", orders).unwrap_or(0.0) >= 2.0, "{m}");
    assert!(metric(&m, "cdc_maintenance_rewritten_bytes_total", orders).unwrap_or(0.0) > 0.0, "{m}");
    assert_eq!(metric(&m, "cdc_maintenance_orphans_deleted_total", orders), Some(1.0), "{m}");
    assert!(!old.exists() && young.exists(), "the sweep deletes old orphans only");
    let tcat = Catalog::connect(
        &iceberg_cdc::config::CatalogConfig {
            kind: iceberg_cdc::config::CatalogType::Hadoop,
            warehouse: Some(tw.display().to_string()),
            props: Default::default(),
        },
        "t",
    )
    .await
    .unwrap();
    let target = tcat.load_table("replica.orders").await.unwrap();
    assert!(target.metadata().snapshots().len() <= 4, "{} target snapshots", target.metadata().snapshots().len());
    // compaction runs in the background: the last commit's deletes are compacted shortly after it
    let mut deletes = u64::MAX;
    for _ in 0..50 {
        let target = tcat.load_table("replica.orders").await.unwrap();
        let head = target.metadata().current_snapshot().unwrap();
        deletes = head.summary().additional_properties["total-delete-files"].parse().unwrap();
        if deletes < 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(deletes < 3, "{deletes} delete files live after compaction");
    assert_target_equals_source(&config(dir.path(), &sync_config(&wh, "replica.orders", &tw, "")), &t, "replica.orders").await;
    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child, 15, log).success(), "{}", log());
}

/// Compaction in the background while the source keeps committing: 40 source commits 30 ms apart (updates of
/// the same keys, inserts, deletes) followed at a 100 ms poll with compaction thresholds of 3. The compactions run
/// beside the applier and land between its commits (the rebase itself is unit-tested in `compact`); none fails, /metrics
/// counts them (at least two), the delete files settle low once the source stops, every applier commit records progress further
/// than the one before (nothing applied twice), no `replace` snapshot records any, and the target equals the source.
#[tokio::test(flavor = "multi_thread")]
async fn the_service_compacts_in_the_background_while_the_source_commits() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    let tw = dir.path().join("replica");
    let port = free_port();
    let cfg = orders_service(dir.path(), &wh, &tw, port, "100ms", "compact_delete_files = 3\ncompact_small_files = 3\n");
    let (mut child, notify) = spawn_watched_service(dir.path(), &cfg);
    let log = || std::fs::read_to_string(dir.path().join("service.log")).unwrap_or_default();
    assert!(notify.wait_for("READY=1", 30), "no READY=1: {}", log());
    assert!(wait_caught_up(&tw, "replica.orders", &catalog, 30).await, "{}", log());
    let mut t = table.clone();
    for i in 0..40i64 {
        let deletes: Vec<i64> = if i % 2 == 1 { vec![1000 + i - 1] } else { vec![] };
        t = quickstart::commit_changes(&catalog, &t, &[(1000 + i, "new", i as i128), (1 + i % 8, "moved", i as i128)], &deletes).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    }
    assert!(wait_caught_up(&tw, "replica.orders", &catalog, 60).await, "{}", log());
    let tcat = Catalog::connect(
        &Config::load(&config(dir.path(), &sync_config(&wh, "replica.orders", &tw, ""))).unwrap().targets().next().cloned().unwrap().catalog,
        "t",
    )
    .await
    .unwrap();
    let mut deletes = u64::MAX;
    for _ in 0..50 {
        let target = tcat.load_table("replica.orders").await.unwrap();
        deletes = target.metadata().current_snapshot().unwrap().summary().additional_properties["total-delete-files"].parse().unwrap();
        if deletes < 4 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(deletes < 4, "{deletes} delete files live once the source stopped: {}", log());
    let orders = "pipeline=\"orders\",sink=\"iceberg:replica.orders\",task=\"compact\"";
    // (how many depends on how the source's commits were coalesced; a finished one is counted at the next poll)
    assert!(
        wait_until(10, || metric(&http_get(port, "/metrics").1, "cdc_maintenance_runs_total", orders).unwrap_or(0.0) >= 2.0),
        "{}",
        http_get(port, "/metrics").1
    );
    let m = http_get(port, "/metrics").1;
    assert_eq!(metric(&m, "cdc_maintenance_failures_total", orders).unwrap_or(0.0), 0.0, "{m}");
    assert!(log().contains("compacted the target in the background"), "{}", log());

    let target = tcat.load_table("replica.orders").await.unwrap();
    let source_seq: std::collections::HashMap<i64, i64> = t.metadata().snapshots().map(|s| (s.snapshot_id(), s.sequence_number())).collect();
    let mut last = 0;
    for s in iceberg_cdc::spec::lineage::main_lineage(target.metadata()) {
        let at = s.summary().additional_properties.get("cdc.source-snapshot-id").map(|v| source_seq[&v.parse::<i64>().unwrap()]);
        match (s.summary().operation.clone(), at) {
            (iceberg::spec::Operation::Replace, at) => assert_eq!(at, None, "a compaction records no progress"),
            (_, Some(seq)) => {
                assert!(seq > last, "progress went from source sequence {last} to {seq}: a range applied twice");
                last = seq;
            }
            (op, None) => panic!("an applier commit ({op:?}) without progress"),
        }
    }
    assert_target_equals_source(&config(dir.path(), &sync_config(&wh, "replica.orders", &tw, "")), &t, "replica.orders").await;
    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child, 15, log).success(), "{}", log());
}

/// The service end to end: READY and WATCHDOG notifications, the target following source commits, lag 0 and row
/// counts in /metrics, a pipeline whose table is missing failing alone (/readyz), SIGHUP adding a pipeline, SIGTERM
/// giving STOPPING and exit 0.
#[tokio::test(flavor = "multi_thread")]
async fn service_follows_reloads_reports_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    let tw = dir.path().join("replica");
    let port = free_port();
    let cfg = dir.path().join("service.toml");
    std::fs::write(
        &cfg,
        service_toml(&wh, &tw, port, &[("orders", quickstart::TABLE, "replica.orders"), ("ghost", "demo.missing", "replica.ghost")]),
    )
    .unwrap();
    let (mut child, notify) = spawn_watched_service(dir.path(), &cfg);
    let log = || std::fs::read_to_string(dir.path().join("service.log")).unwrap_or_default();
    assert!(notify.wait_for("READY=1", 30), "no READY=1: {}", log());
    assert!(wait_caught_up(&tw, "replica.orders", &catalog, 30).await, "bootstrap: {}", log());

    // the source keeps changing while the service runs
    let mut t = table.clone();
    for i in 0..3i64 {
        t = quickstart::commit_changes(&catalog, &t, &[(300 + i, "live", 5 + i as i128), (1, "live-update", 9 + i as i128)], &[2 + i]).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    }
    assert!(wait_caught_up(&tw, "replica.orders", &catalog, 30).await, "following: {}", log());
    assert!(notify.wait_for("WATCHDOG=1", 10), "no WATCHDOG=1: {:?}", notify.got.lock().unwrap());
    assert!(notify.wait_for("STATUS=", 10));

    let orders = "pipeline=\"orders\"";
    assert!(
        wait_until(10, || metric(&http_get(port, "/metrics").1, "cdc_replication_lag_snapshots", orders) == Some(0.0)),
        "lag: {}",
        http_get(port, "/metrics").1
    );
    let m = http_get(port, "/metrics").1;
    assert!(metric(&m, "cdc_commits_total", orders).unwrap() >= 2.0, "{m}");
    assert_eq!(metric(&m, "cdc_replication_lag_seconds", orders), Some(0.0), "{m}");
    // small commits spill nothing, and say so
    assert_eq!(metric(&m, "cdc_spilled_bytes_total", orders), Some(0.0), "{m}");
    // the bootstrap copy's rows plus every INSERT change after it
    let copied = scan_rows(&table, table.metadata().current_snapshot_id()).await.len();
    let qcfg = config(dir.path(), &sql_config(&wh, "", ""));
    let head = table.metadata().current_snapshot_id().unwrap().to_string();
    let changes = ok(cdc(&["changes", "--config", qcfg.to_str().unwrap(), "--from-snapshot", &head]));
    let inserts = changes.lines().filter(|l| l.contains("\"_change_type\":\"INSERT\"")).count();
    let label = format!("{orders},sink=\"iceberg:replica.orders\",change_type=\"INSERT\"");
    assert_eq!(metric(&m, "cdc_rows_total", &label), Some((copied + inserts) as f64), "{m}");
    assert!(metric(&m, "cdc_errors_total", "pipeline=\"ghost\"").unwrap() >= 1.0, "{m}");
    let (status, body) = http_get(port, "/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("ghost") && body.contains("not found"), "{body}");
    assert_eq!(http_get(port, "/healthz").0, 200);
    assert_eq!(metric(&m, "cdc_pipeline_owned", orders), Some(1.0), "{m}");

    // `cdc status` asks the running instance: the good pipeline is ok and caught up, the broken one fails by name
    let out = cdc(&["status", "--config", cfg.to_str().unwrap(), "--json"]);
    assert_eq!(code(&out), exit::SERVICE, "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let by = |p: &str| lines.iter().find(|l| l["pipeline"] == p).unwrap().clone();
    assert_eq!((by("orders")["state"].as_str(), by("orders")["lag_snapshots"].as_u64()), (Some("ok"), Some(0)), "{lines:?}");
    assert!(by("orders")["owner"].as_str().unwrap().ends_with(&format!("@127.0.0.1:{port}")), "{lines:?}");
    assert_eq!(by("ghost")["state"], "failing", "{lines:?}");
    assert!(by("ghost")["last_error"].as_str().unwrap().contains("not found"), "{lines:?}");
    // asked where no instance runs, every pipeline says so
    let elsewhere = cdc(&["status", "--config", cfg.to_str().unwrap(), "--metrics-address", &format!("127.0.0.1:{}", free_port())]);
    assert_eq!(code(&elsewhere), exit::SERVICE);
    assert_eq!(String::from_utf8_lossy(&elsewhere.stdout).matches("owner unreachable").count(), 2, "{}", String::from_utf8_lossy(&elsewhere.stdout));
    let said = String::from_utf8_lossy(&elsewhere.stderr);
    assert!(said.contains("no instance of this service is running") && !said.contains("catalog"), "said plainly: {said}");

    // SIGHUP: a new pipeline starts, the broken one is removed
    std::fs::write(
        &cfg,
        service_toml(&wh, &tw, port, &[("orders", quickstart::TABLE, "replica.orders"), ("copy", quickstart::TABLE, "replica.copy")]),
    )
    .unwrap();
    signal(&child, libc::SIGHUP);
    assert!(wait_caught_up(&tw, "replica.copy", &catalog, 30).await, "after SIGHUP: {}", log());
    assert!(wait_until(10, || http_get(port, "/readyz").0 == 200), "{}", http_get(port, "/readyz").1);

    // a reload with errors is refused and the running configuration stays
    std::fs::write(&cfg, "[service]\nbogus = 1\n").unwrap();
    signal(&child, libc::SIGHUP);
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "a bad reload must not stop the service");
    assert!(log().contains("reload refused"), "{}", log());
    // … and visible where operators look: metrics and /status
    let m = http_get(port, "/metrics").1;
    assert_eq!(metric(&m, "cdc_config_reload_failures_total", ""), Some(1.0), "{m}");
    assert_eq!(metric(&m, "cdc_config_last_reload_success", ""), Some(0.0), "{m}");
    let status: serde_json::Value = serde_json::from_str(&http_get(port, "/status").1).unwrap();
    assert_eq!(status["last_reload"]["taken"], false, "{status}");
    assert!(status["last_reload"]["error"].as_str().unwrap().contains("bogus"), "{status}");

    signal(&child, libc::SIGTERM);
    // the shutdown timeout is 10 s
    assert!(wait_exit(&mut child, 15, log).success(), "{}", log());
    assert!(notify.wait_for("STOPPING=1", 1));
}

/// SIGKILL the service mid-stream ten times while the source keeps changing, restarting it each time: both targets
/// (equality and position mode) end equal to the source, each key once, every range applied once.
#[tokio::test(flavor = "multi_thread")]
async fn service_survives_sigkill_mid_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    let tw = dir.path().join("replica");
    let cfg = dir.path().join("service.toml");
    // the same stream into an equality-mode and a position-mode target
    let pipelines = [("orders", quickstart::TABLE, "replica.orders"), ("by_position", quickstart::TABLE, "replica.by_position")];
    let body = service_toml(&wh, &tw, free_port(), &pipelines)
        .replace("200ms", "100ms")
        .replace("table = \"replica.by_position\"\n", "table = \"replica.by_position\"\ndelete_mode = \"position\"\n");
    assert!(body.contains("delete_mode"));
    std::fs::write(&cfg, body).unwrap();
    let mut t = table.clone();
    let mut rng = 17u64;
    for round in 0..10i64 {
        let mut child = Command::new(CDC)
            .args(["run", "--config", cfg.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        for k in 0..3i64 {
            let id = 1000 + round * 10 + k;
            t = quickstart::commit_changes(&catalog, &t, &[(id, "k", id as i128), (1 + (id % 5), "u", round as i128)], &[id - 7]).await.unwrap();
        }
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        tokio::time::sleep(std::time::Duration::from_millis(100 + (rng >> 33) % 400)).await;
        signal(&child, libc::SIGKILL);
        child.wait().unwrap();
    }
    let mut child = Command::new(CDC)
        .args(["run", "--config", cfg.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ok = wait_caught_up(&tw, "replica.orders", &catalog, 60).await && wait_caught_up(&tw, "replica.by_position", &catalog, 60).await;
    signal(&child, libc::SIGTERM);
    wait_exit(&mut child, 15, || "(stderr not kept)".into());
    assert!(ok, "the targets did not catch up after the kills");
    assert_applied_once(&tw, "replica.orders", &t, "after the kills");
    assert_applied_once(&tw, "replica.by_position", &t, "after the kills (position mode)");
}

/// The systemd unit passes `systemd-analyze verify` (with the binary built here in place of /usr/local/bin/cdc).
#[test]
fn systemd_unit_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/cdc.service")).unwrap().replace("/usr/local/bin/cdc", CDC);
    let path = dir.path().join("cdc.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&path).output().expect("systemd-analyze (Debian package systemd) is needed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains(path.to_str().unwrap()), "{err}");
}

/// README's first command: the quickstart builds the demo, runs the service while the source changes, shows the
/// replica following, and stops cleanly — twice in a row (a second run continues where the first left off).
#[test]
fn quickstart_replicates_with_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let qs = dir.path().join("qs");
    for run in 0..2 {
        let out = cdc(&["quickstart", "--dir", qs.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "run {run}: {err}");
        assert_eq!(err.matches("caught up in").count(), 3, "run {run}: {err}");
        assert!(err.contains("stopped cleanly"), "{err}");
        assert!(err.contains("10 frances"), "the replica shows the last change: {err}");
    }
}

/// Two services on one pipeline (an overlapping restart, a second host): both run, the source keeps changing, and
/// the target ends equal to the source with every range applied once — the commit requirements make the loser of
/// each race re-plan and skip.
#[tokio::test(flavor = "multi_thread")]
async fn two_services_on_one_pipeline_apply_each_range_once() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    let tw = dir.path().join("replica");
    let spawn = |name: &str| {
        let cfg = dir.path().join(format!("{name}.toml"));
        let body = service_toml(&wh, &tw, free_port(), &[("orders", quickstart::TABLE, "replica.orders")]).replace("200ms", "100ms");
        std::fs::write(&cfg, body).unwrap();
        Command::new(CDC)
            .args(["run", "--config", cfg.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join(format!("{name}.log"))).unwrap())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn("a"), spawn("b"));
    let mut t = table.clone();
    for i in 0..12i64 {
        t = quickstart::commit_changes(&catalog, &t, &[(600 + i, "both", i as i128), (1 + i % 6, "race", i as i128)], &[600 + i - 3]).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    }
    let ok = wait_caught_up(&tw, "replica.orders", &catalog, 60).await;
    for c in [&a, &b] {
        signal(c, libc::SIGTERM);
    }
    let logs = || std::fs::read_to_string(dir.path().join("a.log")).unwrap() + &std::fs::read_to_string(dir.path().join("b.log")).unwrap();
    for mut c in [a, b] {
        assert!(wait_exit(&mut c, 15, logs).success(), "{}", logs());
    }
    let logs = logs();
    assert!(ok, "the target did not catch up: {logs}");
    eprintln!("races seen: {} retried commits, {} re-plans", logs.matches("retrying").count(), logs.matches("discarding this commit").count());
    assert_applied_once(&tw, "replica.orders", &t, "two services");
}

/// Credentials never reach a log line or an error message, at any log level.
#[test]
fn secrets_stay_out_of_logs_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "tok-3f8a9c1e-SECRET";
    let body = format!(
        "[source]\ntable = \"db.t\"\n[source.catalog]\ntype = \"rest\"\nuri = \"http://127.0.0.1:9\"\ntoken = \"{secret}\"\ncredential = \"client:{secret}\"\n\
         \"header.Authorization\" = \"Bearer {secret}\"\n"
    );
    let cfg = config(dir.path(), &body);
    for cmd in ["snapshots", "changes"] {
        let out = Command::new(CDC).args([cmd, "--config", cfg.to_str().unwrap(), "--log", "trace"]).output().unwrap();
        let all = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success());
        assert!(!all.contains(secret), "{cmd} leaked a secret: {all}");
    }
}

/// Whether every hadoop target `replica.t0` … `replica.t{n-1}` records `head` as its progress; the ones that do not.
async fn targets_behind(target_wh: &Path, n: usize, source_uuid: &str, head: i64) -> Vec<usize> {
    let cfg =
        Config::parse(&format!("[source]\ntable = \"replica.t0\"\n[source.catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n", target_wh.display()))
            .unwrap();
    let cat = Catalog::connect(&cfg.source.catalog, "t").await.unwrap();
    let mut behind = Vec::new();
    for i in 0..n {
        let at = match cat.load_table(&format!("replica.t{i}")).await {
            Ok(t) => iceberg_cdc::sink::iceberg::progress::read(t.metadata(), source_uuid).map(|p| p.source_snapshot_id),
            Err(_) => None,
        };
        if at != Some(head) {
            behind.push(i);
        }
    }
    behind
}

/// More pipelines than Tokio's blocking pool holds threads (512, where each loop once held one for good and loop 513
/// waited forever while the service said "ready"): every pipeline runs, catches up, and follows a later commit; the
/// startup log, `cdc check` and /metrics count them all.
#[tokio::test(flavor = "multi_thread")]
async fn every_pipeline_runs_whatever_their_number() {
    const N: usize = 1500;
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    let tw = dir.path().join("replica");
    let port = free_port();
    let names: Vec<(String, String)> = (0..N).map(|i| (format!("p{i}"), format!("replica.t{i}"))).collect();
    let pipelines: Vec<(&str, &str, &str)> = names.iter().map(|(p, t)| (p.as_str(), quickstart::TABLE, t.as_str())).collect();
    let cfg = dir.path().join("service.toml");
    std::fs::write(&cfg, service_toml(&wh, &tw, port, &pipelines).replace("poll_interval = \"200ms\"", "poll_interval = \"2s\"")).unwrap();

    let check = cdc(&["check", "--config", cfg.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(out.contains(&format!("{N} pipelines, {N} loops")) && out.contains(&format!("{N} ok, 0 failed")), "{}", out.lines().last().unwrap_or(""));

    let mut child = Command::new(CDC)
        .args(["run", "--config", cfg.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("service.log")).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(dir.path().join("service.log")).unwrap_or_default();
    let uuid = table.metadata().uuid().to_string();
    let head = table.metadata().current_snapshot_id().unwrap();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(400);
    let mut behind = targets_behind(&tw, N, &uuid, head).await;
    while !behind.is_empty() && std::time::Instant::now() < end {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        behind = targets_behind(&tw, N, &uuid, head).await;
    }
    assert!(
        behind.is_empty(),
        "{} of {N} targets never caught up (first: {:?})\n{}",
        behind.len(),
        &behind[..behind.len().min(5)],
        log().lines().take(40).collect::<Vec<_>>().join("\n")
    );
    assert!(log().contains(&format!("pipelines={N} loops={N} started={N}")), "{}", log().lines().take(5).collect::<Vec<_>>().join("\n"));
    let m = http_get(port, "/metrics").1;
    assert_eq!(
        metric(&m, "cdc_pipelines_running", ""),
        Some(N as f64),
        "{}",
        m.lines().filter(|l| l.starts_with("cdc_pipelines")).collect::<Vec<_>>().join("\n")
    );
    assert_eq!(metric(&m, "cdc_pipelines_configured", ""), Some(N as f64));

    // every loop keeps polling: a new source commit reaches all of them
    let t = quickstart::commit_changes(&catalog, &table, &[(900, "all", 9)], &[1]).await.unwrap();
    let head = t.metadata().current_snapshot_id().unwrap();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(400);
    behind = targets_behind(&tw, N, &uuid, head).await;
    while !behind.is_empty() && std::time::Instant::now() < end {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        behind = targets_behind(&tw, N, &uuid, head).await;
    }
    assert!(behind.is_empty(), "{} of {N} targets did not follow the commit (first: {:?})", behind.len(), &behind[..behind.len().min(5)]);
    assert!(caught_up(&tw, &format!("replica.t{}", N - 1), &t).await);
    assert!(wait_until(30, || http_get(port, "/readyz").0 == 200), "{}", http_get(port, "/readyz").1);
    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child, 30, log).success(), "{}", log());
}

/// A pipeline starved on purpose (its target's version hint is a FIFO with no writer: reading it blocks the loop's
/// thread for good): after `stall_timeout` it fails /readyz and /healthz by name, counts in
/// `cdc_pipeline_overdue`, stops the watchdog and is logged — while the other pipeline stays on schedule; released, it
/// is back on schedule.
#[tokio::test(flavor = "multi_thread")]
async fn a_starved_pipeline_fails_readiness_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, _table, wh) = quickstart_table(dir.path()).await;
    let tw = dir.path().join("replica");
    let meta = tw.join("replica").join("stuck").join("metadata");
    std::fs::create_dir_all(&meta).unwrap();
    let fifo = meta.join("version-hint.text");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    let port = free_port();
    let cfg = dir.path().join("service.toml");
    let body = service_toml(&wh, &tw, port, &[("orders", quickstart::TABLE, "replica.orders"), ("stuck", quickstart::TABLE, "replica.stuck")])
        .replace("[service]\n", "[service]\nstall_timeout = \"2s\"\n");
    std::fs::write(&cfg, body).unwrap();
    let (mut child, notify) = spawn_watched_service(dir.path(), &cfg);
    let log = || std::fs::read_to_string(dir.path().join("service.log")).unwrap_or_default();
    assert!(notify.wait_for("READY=1", 30), "no READY=1: {}", log());
    assert!(wait_caught_up(&tw, "replica.orders", &catalog, 30).await, "{}", log());
    assert!(wait_until(15, || http_get(port, "/readyz").1.contains("stuck (iceberg:replica.stuck): no progress")), "{}", http_get(port, "/readyz").1);
    let (code, body) = http_get(port, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(!body.contains("orders"), "the healthy pipeline is reported too: {body}");
    let (code, body) = http_get(port, "/healthz");
    assert!(code == 503 && body.contains("stuck"), "{code} {body}");
    assert!(wait_until(10, || metric(&http_get(port, "/metrics").1, "cdc_pipeline_overdue", "pipeline=\"stuck\"") == Some(1.0)));
    assert_eq!(metric(&http_get(port, "/metrics").1, "cdc_pipeline_overdue", "pipeline=\"orders\""), Some(0.0));
    assert!(wait_until(10, || log().contains("pipeline overdue")), "{}", log());
    // the watchdog is no longer fed
    let fed = || notify.got.lock().unwrap().iter().filter(|m| m.lines().any(|l| l == "WATCHDOG=1")).count();
    let before = fed();
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(fed(), before, "the watchdog is still fed while a pipeline is stuck");

    // released (the FIFO goes, its reader reads nothing): back on schedule, and the target is created and catches up
    let writer = std::thread::spawn(move || {
        let w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        std::fs::remove_file(&fifo).unwrap();
        drop(w);
    });
    assert!(wait_until(20, || log().contains("pipeline back on schedule")), "{}", log());
    writer.join().unwrap();
    assert!(wait_caught_up(&tw, "replica.stuck", &catalog, 30).await, "{}", log());
    assert!(wait_until(10, || http_get(port, "/healthz").0 == 200 && http_get(port, "/readyz").0 == 200), "{}", http_get(port, "/readyz").1);
    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child, 15, log).success(), "{}", log());
}

/// Metadata files of a table's `metadata/` folder (`*.metadata.json`).
fn metadata_files(table_dir: &Path) -> usize {
    std::fs::read_dir(table_dir.join("metadata"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".metadata.json"))
        .count()
}

/// A target the applier creates keeps its metadata folder bounded: 30 commits (one per source snapshot) leave the
/// current metadata file and the 20 its log keeps, on hadoop and sqlite targets alike — and the target is exact.
#[tokio::test(flavor = "multi_thread")]
async fn created_targets_keep_a_bounded_number_of_metadata_files() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    let mut t = table.clone();
    for i in 0..26i64 {
        t = quickstart::commit_changes(&catalog, &t, &[(1000 + i, "more", i as i128), (1, "again", i as i128)], &[]).await.unwrap();
    }
    let first = iceberg_cdc::spec::lineage::main_lineage(t.metadata())[0].snapshot_id().to_string();
    let tw = dir.path().join("target");
    let hadoop = sync_config(&wh, "replica.orders", &tw, "snapshots_per_commit = 1");
    let sql = hadoop.replace("[target.catalog]\ntype = \"hadoop\"", "[target.catalog]\ntype = \"sql\"");
    for (name, body, table_dir) in [("hadoop", hadoop, tw.join("replica").join("orders")), ("sql", sql, tw.join("replica").join("orders"))] {
        let _ = std::fs::remove_dir_all(&tw);
        let cfg = config(dir.path(), &body);
        ok(cdc(&["sync", "--config", cfg.to_str().unwrap(), "--to-snapshot", &first]));
        let out = ok(cdc(&["sync", "--config", cfg.to_str().unwrap(), "--json"]));
        assert!(out.contains("\"source_snapshots_applied\": 29"), "{name}: {out}");
        assert_eq!(metadata_files(&table_dir), 21, "{name}: the current metadata file and the 20 its log keeps");
        assert_target_equals_source(&cfg, &t, "replica.orders").await;
    }
}

/// The quickstart table plus 55 commits, each an insert, an update and a delete (58 snapshots).
async fn long_history(dir: &Path) -> (Catalog, Table, PathBuf) {
    let (catalog, mut t, wh) = quickstart_table(dir).await;
    for i in 0..55i64 {
        t = quickstart::commit_changes(&catalog, &t, &[(3000 + i, "more", i as i128), (1 + i % 4, "again", i as i128)], &[3000 + i - 3])
            .await
            .unwrap();
    }
    (catalog, t, wh)
}

/// Small manifests are merged in commits (Iceberg Java's merge-append): 58 target commits with inserts, updates and
/// deletes (each adding a data and a delete manifest) leave a current snapshot whose manifests per content stay below
/// the merge threshold, some commits record the merge in their summary, and the target still reads equal to the
/// source — merged entries keep their sequence numbers, so equality deletes apply to exactly the rows they did.
#[tokio::test(flavor = "multi_thread")]
async fn small_manifests_are_merged_as_commits_go() {
    let dir = tempfile::tempdir().unwrap();
    let (_catalog, t, wh) = long_history(dir.path()).await;
    let first = iceberg_cdc::spec::lineage::main_lineage(t.metadata())[0].snapshot_id().to_string();
    let tw = dir.path().join("target");
    // compaction would rewrite the files this test follows (see the compaction test below)
    let cfg = config(dir.path(), &sync_config(&wh, "replica.orders", &tw, "snapshots_per_commit = 1\ncompact = false"));
    ok(cdc(&["sync", "--config", cfg.to_str().unwrap(), "--to-snapshot", &first]));
    ok(cdc(&["sync", "--config", cfg.to_str().unwrap()]));
    assert_target_equals_source(&cfg, &t, "replica.orders").await;

    let tcat = Catalog::connect(&Config::load(&cfg).unwrap().targets().next().cloned().unwrap().catalog, "t").await.unwrap();
    let target = tcat.load_table("replica.orders").await.unwrap();
    let meta = target.metadata();
    let head = meta.current_snapshot().unwrap();
    let list = target.manifest_list_reader(head).load().await.unwrap();
    let deletes = list.entries().iter().filter(|m| m.content == iceberg::spec::ManifestContentType::Deletes).count();
    let data = list.entries().len() - deletes;
    assert!(data < 50 && deletes < 50, "{data} data and {deletes} delete manifests after 58 commits");
    let merged: Vec<_> = iceberg_cdc::spec::lineage::main_lineage(meta)
        .iter()
        .filter_map(|s| s.summary().additional_properties.get("manifests-replaced").cloned())
        .collect();
    assert!(!merged.is_empty(), "no commit merged manifests");
    // a merged manifest lists older files as EXISTING, with the sequence numbers they were added with
    let mut existing = 0;
    for m in list.entries() {
        for e in m.load_manifest(target.file_io()).await.unwrap().entries() {
            if e.status() == iceberg::spec::ManifestStatus::Existing {
                existing += 1;
                assert!(e.sequence_number().unwrap() < head.sequence_number(), "{:?}", e.file_path());
            }
        }
    }
    assert!(existing > 40, "{existing} existing entries");
}

/// Compaction after commits: 58 target commits, each adding a small data file and an equality-delete file,
/// are compacted whenever 4 delete files have piled up (`compact_delete_files = 4`): `replace` snapshots rewrite the
/// data files the deletes apply to and drop the delete files, so the head holds few delete files; the summary
/// counts the compactions; the target equals the source after the run and after a later sync; a compaction never
/// records progress (the next sync resumes where the applier left off).
#[tokio::test(flavor = "multi_thread")]
async fn the_target_is_compacted_as_commits_go() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, mut t, wh) = long_history(dir.path()).await;
    let tw = dir.path().join("target");
    let cfg =
        config(dir.path(), &sync_config(&wh, "replica.orders", &tw, "snapshots_per_commit = 1\ncompact_delete_files = 4\ncompact_small_files = 6"));
    let first = iceberg_cdc::spec::lineage::main_lineage(t.metadata())[0].snapshot_id().to_string();
    ok(cdc(&["sync", "--config", cfg.to_str().unwrap(), "--to-snapshot", &first]));
    let out = ok(cdc(&["sync", "--json", "--config", cfg.to_str().unwrap()]));
    let summary: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(summary["compactions"].as_u64().unwrap() >= 5, "{summary}");
    assert!(summary["files_rewritten"].as_u64().unwrap() >= 20, "{summary}");
    assert_target_equals_source(&cfg, &t, "replica.orders").await;

    let tcat = Catalog::connect(&Config::load(&cfg).unwrap().targets().next().cloned().unwrap().catalog, "t").await.unwrap();
    let target = tcat.load_table("replica.orders").await.unwrap();
    let head = target.metadata().current_snapshot().unwrap();
    let total = |k: &str| head.summary().additional_properties[k].parse::<u64>().unwrap();
    assert!(total("total-delete-files") < 8, "{:?}", head.summary());
    assert!(total("total-data-files") < 12, "{:?}", head.summary());
    let replaces = iceberg_cdc::spec::lineage::main_lineage(target.metadata())
        .iter()
        .filter(|s| s.summary().operation == iceberg::spec::Operation::Replace)
        .inspect(|s| assert!(!s.summary().additional_properties.contains_key("cdc.source-snapshot-id"), "a compaction records no progress"))
        .count();
    assert!(replaces >= 1, "no replace snapshot left on the branch");

    // the next source commits apply on top of the compacted files
    for i in 0..3i64 {
        t = quickstart::commit_changes(&catalog, &t, &[(5000 + i, "late", i as i128), (3000 + i, "moved", i as i128)], &[3010 + i]).await.unwrap();
    }
    ok(cdc(&["sync", "--config", cfg.to_str().unwrap()]));
    assert_target_equals_source(&cfg, &t, "replica.orders").await;
}

/// `cdc maintain` on a target synced without in-commit maintenance (`merge_manifests = false`,
/// `expire_snapshots = false`): it rewrites the many small manifests into few (a `replace` snapshot), expires
/// snapshots beyond the retention, deletes an unreferenced file older than `orphan_grace` and keeps a young one (a
/// commit in flight); the target still equals the source and a later sync continues from its progress. Without a
/// target table it exits with NOT_FOUND.
#[tokio::test(flavor = "multi_thread")]
async fn maintain_rewrites_manifests_expires_and_removes_old_orphans() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    let mut t = table.clone();
    for i in 0..12i64 {
        t = quickstart::commit_changes(&catalog, &t, &[(4000 + i, "more", i as i128), (1 + i % 3, "again", i as i128)], &[4000 + i - 2])
            .await
            .unwrap();
    }
    let first = iceberg_cdc::spec::lineage::main_lineage(t.metadata())[0].snapshot_id().to_string();
    let tw = dir.path().join("target");
    let extra = "snapshots_per_commit = 1\nmerge_manifests = false\nexpire_snapshots = false\nsnapshot_retention = \"0s\"\nretain_snapshots = 2\norphan_grace = \"1h\"";
    let cfg = config(dir.path(), &sync_config(&wh, "replica.orders", &tw, extra));
    let cfg_s = cfg.to_str().unwrap();
    let missing = cdc(&["maintain", "--config", cfg_s]);
    assert_eq!(code(&missing), exit::NOT_FOUND, "{}", String::from_utf8_lossy(&missing.stderr));
    ok(cdc(&["sync", "--config", cfg_s, "--to-snapshot", &first]));
    ok(cdc(&["sync", "--config", cfg_s]));
    let data = tw.join("replica").join("orders").join("data");
    let old = data.join("00000-orphan-old.parquet");
    let young = data.join("00000-orphan-young.parquet");
    for f in [&old, &young] {
        std::fs::write(f, b"not referenced").unwrap();
    }
    let day_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(86_400);
    std::fs::File::options().write(true).open(&old).unwrap().set_modified(day_ago).unwrap();
    // a metadata commit's temp file a full disk left behind, a day old: garbage like any old orphan
    let stale_tmp = tw.join("replica").join("orders").join("metadata").join(".v99-0b3c.tmp");
    std::fs::write(&stale_tmp, b"{").unwrap();
    std::fs::File::options().write(true).open(&stale_tmp).unwrap().set_modified(day_ago).unwrap();

    let out = ok(cdc(&["maintain", "--config", cfg_s, "--json"]));
    let m: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(m["manifests_before"].as_u64().unwrap() >= 20, "{m}");
    assert!(m["manifests_after"].as_u64().unwrap() <= 3, "{m}");
    assert!(m["snapshots_expired"].as_u64().unwrap() >= 10, "{m}");
    assert_eq!(m["orphans_deleted"], 2, "{m}");
    assert_eq!(m["orphans_too_young"], 1, "{m}");
    assert!(!old.exists() && young.exists() && !stale_tmp.exists());
    assert_target_equals_source(&cfg, &t, "replica.orders").await;
    let tcat = Catalog::connect(&Config::load(&cfg).unwrap().targets().next().cloned().unwrap().catalog, "t").await.unwrap();
    let target = tcat.load_table("replica.orders").await.unwrap();
    assert_eq!(target.metadata().current_snapshot().unwrap().summary().operation, iceberg::spec::Operation::Replace);
    assert!(target.metadata().snapshots().len() <= 3, "{}", target.metadata().snapshots().len());

    // replication goes on from the progress the maintained target still records
    for i in 0..2i64 {
        t = quickstart::commit_changes(&catalog, &t, &[(5000 + i, "after", i as i128)], &[4000 + i]).await.unwrap();
    }
    let out = ok(cdc(&["sync", "--config", cfg_s, "--json"]));
    assert!(out.contains("\"source_snapshots_applied\": 2"), "{out}");
    assert_target_equals_source(&cfg, &t, "replica.orders").await;
    // a second pass finds nothing to merge and nothing old to delete
    let again: serde_json::Value = serde_json::from_str(&ok(cdc(&["maintain", "--config", cfg_s, "--json"]))).unwrap();
    assert_eq!(again["orphans_deleted"], 0, "{again}");
}

/// kill -9 anywhere in `cdc maintain` leaves a readable, exact target: SIGKILL at six moments of a pass
/// (compaction, manifest rewrite, expiry, orphan sweep), the target reads equal to the source after each, a full pass then completes, and
/// a later sync resumes from the recorded progress.
#[tokio::test(flavor = "multi_thread")]
async fn maintain_killed_anywhere_leaves_an_exact_target() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    let mut t = table.clone();
    for i in 0..20i64 {
        t = quickstart::commit_changes(&catalog, &t, &[(6000 + i, "more", i as i128), (1 + i % 3, "again", i as i128)], &[6000 + i - 2])
            .await
            .unwrap();
    }
    let first = iceberg_cdc::spec::lineage::main_lineage(t.metadata())[0].snapshot_id().to_string();
    let tw = dir.path().join("target");
    let extra = "snapshots_per_commit = 1\nmerge_manifests = false\nexpire_snapshots = false\nsnapshot_retention = \"0s\"\nretain_snapshots = 2\norphan_grace = \"0s\"";
    let cfg = config(dir.path(), &sync_config(&wh, "replica.orders", &tw, extra));
    let cfg_s = cfg.to_str().unwrap();
    // synced without compaction, so that every pass below starts by compacting
    let sync_cfg = config(dir.path(), &sync_config(&wh, "replica.orders", &tw, &format!("{extra}\ncompact = false")));
    ok(cdc(&["sync", "--config", sync_cfg.to_str().unwrap(), "--to-snapshot", &first]));
    ok(cdc(&["sync", "--config", sync_cfg.to_str().unwrap()]));
    for delay_ms in [5u64, 20, 40, 70, 110, 160] {
        let mut child = Command::new(CDC)
            .args(["maintain", "--config", cfg_s])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        signal(&child, libc::SIGKILL);
        let _ = child.wait();
        assert_target_equals_source(&cfg, &t, "replica.orders").await;
    }
    ok(cdc(&["maintain", "--config", cfg_s]));
    assert_target_equals_source(&cfg, &t, "replica.orders").await;
    t = quickstart::commit_changes(&catalog, &t, &[(7000, "after", 1)], &[6001]).await.unwrap();
    let out = ok(cdc(&["sync", "--config", cfg_s, "--json"]));
    assert!(out.contains("\"source_snapshots_applied\": 1"), "{out}");
    assert_target_equals_source(&cfg, &t, "replica.orders").await;
}

/// Files under `dir` (recursively), as paths.
fn files_under(dir: &Path) -> std::collections::BTreeSet<String> {
    walk(dir).into_iter().map(|p| p.display().to_string()).collect()
}

/// Old target snapshots expire after commits (`snapshot_retention = "0s"`, `retain_snapshots = 3`): 29 commits leave
/// at most 4 snapshots, the manifest lists of the expired ones are deleted, every file the remaining snapshots
/// reference is still there (iceberg-rust's scan reads the target equal to the source), and nothing else is left
/// under `data/` or among the manifests.
#[tokio::test(flavor = "multi_thread")]
async fn old_target_snapshots_expire_and_their_files_go() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    let mut t = table.clone();
    for i in 0..26i64 {
        t = quickstart::commit_changes(&catalog, &t, &[(2000 + i, "more", i as i128), (1 + i % 4, "again", i as i128)], &[2000 + i - 2])
            .await
            .unwrap();
    }
    let first = iceberg_cdc::spec::lineage::main_lineage(t.metadata())[0].snapshot_id().to_string();
    let tw = dir.path().join("target");
    let cfg =
        config(dir.path(), &sync_config(&wh, "replica.orders", &tw, "snapshots_per_commit = 1\nsnapshot_retention = \"0s\"\nretain_snapshots = 3"));
    ok(cdc(&["sync", "--config", cfg.to_str().unwrap(), "--to-snapshot", &first]));
    let out = cdc(&["--log", "info", "sync", "--config", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expired old target snapshots"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_target_equals_source(&cfg, &t, "replica.orders").await;

    let tcat = Catalog::connect(&Config::load(&cfg).unwrap().targets().next().cloned().unwrap().catalog, "t").await.unwrap();
    let target = tcat.load_table("replica.orders").await.unwrap();
    let meta = target.metadata();
    assert!((3..=4).contains(&meta.snapshots().len()), "{} snapshots left", meta.snapshots().len());
    // what the remaining snapshots reference is exactly what is on disk (besides metadata files)
    let mut referenced = std::collections::BTreeSet::new();
    for s in meta.snapshots() {
        referenced.insert(s.manifest_list().to_string());
        let list = target.manifest_list_reader(s).load().await.unwrap();
        for m in list.entries() {
            referenced.insert(m.manifest_path.clone());
            for e in m.load_manifest(target.file_io()).await.unwrap().entries() {
                if e.is_alive() {
                    referenced.insert(e.file_path().to_string());
                }
            }
        }
    }
    let table_dir = tw.join("replica").join("orders");
    let on_disk: std::collections::BTreeSet<String> =
        files_under(&table_dir).into_iter().filter(|p| !p.ends_with(".metadata.json") && !p.ends_with("version-hint.text")).collect();
    let referenced: std::collections::BTreeSet<String> =
        referenced.into_iter().map(|p| p.strip_prefix("file://").or(p.strip_prefix("file:")).unwrap_or(&p).to_string()).collect();
    let missing: Vec<_> = referenced.difference(&on_disk).collect();
    let extra: Vec<_> = on_disk.difference(&referenced).collect();
    assert!(missing.is_empty(), "referenced but deleted: {missing:?}");
    assert!(extra.is_empty(), "left behind by expiry: {extra:?}");
}

/// Content types of every delete file any snapshot of `table` (loaded from `cfg`'s target catalog) lists.
async fn delete_contents(cfg: &Path, table: &str) -> Vec<iceberg::spec::DataContentType> {
    let tcat = Catalog::connect(&Config::load(cfg).unwrap().targets().next().cloned().unwrap().catalog, "t").await.unwrap();
    let target = tcat.load_table(table).await.unwrap();
    let mut out = Vec::new();
    for s in target.metadata().snapshots() {
        for m in target.manifest_list_reader(s).load().await.unwrap().entries() {
            for e in m.load_manifest(target.file_io()).await.unwrap().entries() {
                if e.content_type() != iceberg::spec::DataContentType::Data {
                    out.push(e.content_type());
                }
            }
        }
    }
    out
}

/// `delete_mode = "position"`: the 55 commits of `long_history` (inserts, updates of the same four keys again and
/// again, deletes) replicated commit by commit with compaction after every 4 delete files — so a key's row keeps
/// moving: to a new file when it is updated, into a compacted file when its file is rewritten — and in commits of 4
/// snapshots (rows written and rewritten within one commit). No snapshot of either target lists an equality-delete
/// file, rows are deleted by position (the summary counts them and the files read to find them), and iceberg-rust's
/// scan reads both targets equal to the source, also after later source commits.
#[tokio::test(flavor = "multi_thread")]
async fn position_mode_deletes_each_row_where_it_is_now() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, mut t, wh) = long_history(dir.path()).await;
    let first = iceberg_cdc::spec::lineage::main_lineage(t.metadata())[0].snapshot_id().to_string();
    let tw = dir.path().join("target");
    let cases = [
        ("moving", "snapshots_per_commit = 1\ncompact_delete_files = 4\ncompact_small_files = 4"),
        ("grouped", "snapshots_per_commit = 4\ncompact = false"),
    ];
    let mut cfgs = Vec::new();
    for (name, extra) in cases {
        let table = format!("replica.{name}");
        let cfg = config(dir.path(), &sync_config(&wh, &table, &tw, &format!("delete_mode = \"position\"\n{extra}")));
        std::fs::rename(&cfg, dir.path().join(format!("{name}.toml"))).unwrap();
        let cfg = dir.path().join(format!("{name}.toml"));
        let cfg_s = cfg.to_str().unwrap();
        ok(cdc(&["sync", "--config", cfg_s, "--to-snapshot", &first]));
        let s: serde_json::Value = serde_json::from_str(&ok(cdc(&["sync", "--json", "--config", cfg_s]))).unwrap();
        assert!(s["position_deletes"].as_u64().unwrap() >= 55, "{name}: {s}");
        assert!(s["lookup_files_read"].as_u64().unwrap() > 0, "{name}: {s}");
        if name == "moving" {
            assert!(s["compactions"].as_u64().unwrap() >= 3, "{name}: {s}");
        }
        assert_target_equals_source(&cfg, &t, &table).await;
        cfgs.push((cfg, table));
    }
    for i in 0..3i64 {
        t = quickstart::commit_changes(&catalog, &t, &[(6000 + i, "late", i as i128), (1 + i, "moved", i as i128)], &[3020 + i]).await.unwrap();
    }
    for (cfg, table) in &cfgs {
        ok(cdc(&["sync", "--config", cfg.to_str().unwrap()]));
        assert_target_equals_source(cfg, &t, table).await;
        let contents = delete_contents(cfg, table).await;
        assert!(!contents.is_empty(), "{table}: no delete file at all");
        assert!(contents.iter().all(|c| *c == iceberg::spec::DataContentType::PositionDeletes), "{table}: {contents:?}");
    }
}

/// Two services started with one file's pipelines and `--shard 0/2` / `--shard 1/2`: each starts exactly the
/// pipelines its shard owns (the split the library computes; both get some), together they run every one — all six
/// targets catch up with the source and follow a later commit — and a bad `--shard` is a config error.
#[tokio::test(flavor = "multi_thread")]
async fn shards_split_the_pipelines_of_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, table, wh) = quickstart_table(dir.path()).await;
    let tw = dir.path().join("replica");
    let names: Vec<(String, String)> = (0..6).map(|i| (format!("p{i}"), format!("replica.t{i}"))).collect();
    let pipelines: Vec<(&str, &str, &str)> = names.iter().map(|(n, t)| (n.as_str(), quickstart::TABLE, t.as_str())).collect();
    let mut children = Vec::new();
    for i in 0..2u64 {
        let cfg = dir.path().join(format!("s{i}.toml"));
        std::fs::write(&cfg, service_toml(&wh, &tw, free_port(), &pipelines)).unwrap();
        let child = Command::new(CDC)
            .args(["run", "--config", cfg.to_str().unwrap(), "--shard", &format!("{i}/2")])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join(format!("s{i}.log"))).unwrap())
            .spawn()
            .unwrap();
        children.push(child);
    }
    let log = |i: usize| std::fs::read_to_string(dir.path().join(format!("s{i}.log"))).unwrap_or_default();
    let mut ok = true;
    for (_, t) in &names {
        ok &= wait_caught_up(&tw, t, &catalog, 60).await;
    }
    let t2 = quickstart::commit_changes(&catalog, &table, &[(900, "late", 9)], &[1]).await.unwrap();
    for (_, t) in &names {
        ok &= wait_caught_up(&tw, t, &catalog, 60).await;
    }
    for c in &children {
        signal(c, libc::SIGTERM);
    }
    for (i, c) in children.iter_mut().enumerate() {
        wait_exit(c, 15, || log(i));
    }
    assert!(ok, "not every target caught up:\n{}\n{}", log(0), log(1));
    let mut owned_counts = Vec::new();
    for i in 0..2u64 {
        let shard = iceberg_cdc::service::Shard { index: i, count: 2 };
        let text = log(i as usize);
        let owned: Vec<&str> = names.iter().map(|(n, _)| n.as_str()).filter(|n| shard.owns(n)).collect();
        for (n, _) in &names {
            let started = text.lines().any(|l| l.contains("pipeline started") && l.contains(&format!("pipeline={n} ")));
            assert_eq!(started, owned.contains(&n.as_str()), "shard {i}/2 and pipeline {n}:\n{text}");
        }
        assert!(text.contains(&format!("pipelines={} ", owned.len())) && text.contains("shard="), "{text}");
        owned_counts.push(owned.len());
    }
    assert_eq!(owned_counts.iter().sum::<usize>(), 6);
    assert!(owned_counts.iter().all(|&c| c > 0), "both shards own pipelines: {owned_counts:?}");
    assert_eq!(t2.metadata().current_snapshot_id(), catalog.load_table(quickstart::TABLE).await.unwrap().metadata().current_snapshot_id());
    let bad = cdc(&["run", "--config", dir.path().join("s0.toml").to_str().unwrap(), "--shard", "2/2"]);
    assert_eq!(code(&bad), exit::CONFIG, "{}", String::from_utf8_lossy(&bad.stderr));
}

/// `cdc sync` racing `cdc maintain` on a target with `snapshot_retention = "0s"` (issue 50): maintenance expires the
/// head a sync planned on and deletes its files. The sync never fails on a file another writer removed (it prepares
/// again on the new head, or plans again), the target ends equal to the source, and no file of a failed or repeated
/// commit is left behind: every file under the target is one a snapshot references.
#[tokio::test(flavor = "multi_thread")]
async fn a_sync_that_loses_a_race_to_maintenance_plans_again_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, mut t, wh) = quickstart_table(dir.path()).await;
    let tw = dir.path().join("target");
    // (an orphan grace of 0 would let either sweep delete the other's files before they are committed: never with
    // writers at work, so the default grace here, and a sweep with none once all is quiet)
    let extra = "snapshots_per_commit = 1\nsnapshot_retention = \"0s\"\nretain_snapshots = 1\ncompact_delete_files = 2";
    let cfg = config(dir.path(), &sync_config(&wh, "replica.orders", &tw, extra));
    let cfg_s = cfg.to_str().unwrap().to_string();
    ok(cdc(&["sync", "--config", &cfg_s]));
    for round in 0..12i64 {
        t = quickstart::commit_changes(&catalog, &t, &[(5000 + round, "raced", round as i128), (1 + round % 4, "again", round as i128)], &[])
            .await
            .unwrap();
        let (a, b) = (cfg_s.clone(), cfg_s.clone());
        let sync = std::thread::spawn(move || cdc(&["sync", "--config", &a]));
        let maintain = std::thread::spawn(move || cdc(&["maintain", "--config", &b]));
        let (s, m) = (sync.join().unwrap(), maintain.join().unwrap());
        assert_ne!(code(&s), exit::DATA, "round {round}: a file another writer removed is a lost race: {}", String::from_utf8_lossy(&s.stderr));
        assert!(
            [exit::OK, exit::CATALOG].contains(&code(&s)) && [exit::OK, exit::CATALOG].contains(&code(&m)),
            "round {round}: sync {} / maintain {}",
            String::from_utf8_lossy(&s.stderr),
            String::from_utf8_lossy(&m.stderr)
        );
    }
    ok(cdc(&["sync", "--config", &cfg_s]));
    assert_target_equals_source(&cfg, &t, "replica.orders").await;
    // nothing but referenced files: a last maintenance pass (grace 0s, nothing else running) finds no orphan that a
    // failed or repeated commit left
    let quiet = config(dir.path(), &sync_config(&wh, "replica.orders", &tw, &format!("{extra}\norphan_grace = \"0s\"")));
    let out = ok(cdc(&["maintain", "--config", quiet.to_str().unwrap(), "--json"]));
    let m: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(m["orphans_deleted"], 0, "left behind by the racing commits: {m}");
}

/// A disk that fills up at any step of a sync (issue 50) — the target's creation, a data, equality-delete or
/// deletion-vector file, a manifest, the manifest list, the metadata file: a tmpfs with room for 0 to 12 more pages
/// (a whole sync needs ~6), in three sweeps: a new target; a target already at the quickstart's second snapshot (its
/// next commit holds updates and deletes: equality deletes); the same as a v3 target deleting by position (deletion
/// vectors in a Puffin file). Each failed sync exits 10 naming a file on that disk, and leaves nothing behind: once
/// room is made, a maintenance pass (orphan grace 0) finds no orphan, and the next sync ends equal to the source.
#[tokio::test(flavor = "multi_thread")]
async fn a_disk_that_fills_at_any_step_of_a_sync_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (_c, table, wh) = quickstart_table(dir.path()).await;
    let lineage = iceberg_cdc::spec::lineage::main_lineage(table.metadata());
    let second = lineage[1].snapshot_id().to_string();
    let full = dir.path().join("full");
    let _mounted = Tmpfs::mount(&full, "1m");
    let available = |p: &Path| {
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        st.f_bavail as u64 * st.f_bsize as u64
    };
    let mut failed_on = std::collections::BTreeSet::new();
    let mut succeeded = 0;
    for (extra, start) in [("", None), ("", Some(second.as_str())), ("format_version = 3\ndelete_mode = \"position\"", Some(second.as_str()))] {
        for free_pages in 0..=12u64 {
            for e in std::fs::read_dir(&full).unwrap().flatten() {
                let _ = if e.path().is_dir() { std::fs::remove_dir_all(e.path()) } else { std::fs::remove_file(e.path()) };
            }
            let tw = full.join("target");
            let cfg = config(dir.path(), &sync_config(&wh, "replica.full", &tw, &format!("orphan_grace = \"0s\"\n{extra}")));
            let cfg_s = cfg.to_str().unwrap();
            if let Some(to) = start {
                ok(cdc(&["sync", "--config", cfg_s, "--to-snapshot", to]));
            }
            let filler = full.join("filler");
            std::fs::write(&filler, vec![0u8; available(&full).saturating_sub(free_pages * 4096) as usize]).unwrap();
            let out = cdc(&["sync", "--config", cfg_s]);
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            match code(&out) {
                exit::OK => succeeded += 1,
                exit::IO => {
                    let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or_default().to_string();
                    assert!(line.contains(full.to_str().unwrap()), "{free_pages} pages: the message names the file: {err}");
                    let named = line.split(full.to_str().unwrap()).nth(1).unwrap_or_default();
                    let kind =
                        ["metadata.json", ".tmp", "version-hint", ".avro", "eq-deletes", "data-", ".puffin"].iter().find(|k| named.contains(*k));
                    failed_on.insert(kind.copied().unwrap_or("other"));
                }
                other => panic!("{free_pages} pages: exit {other}: {err}"),
            }
            // room again: nothing the failed sync wrote is left unreferenced, and the next sync completes it
            std::fs::remove_file(&filler).unwrap();
            let m = cdc(&["maintain", "--config", cfg_s, "--json"]);
            if code(&m) == exit::NOT_FOUND {
                let mut left = Vec::new();
                for d in [tw.join("replica").join("full").join("data"), tw.join("replica").join("full").join("metadata")] {
                    left.extend(
                        std::fs::read_dir(&d)
                            .into_iter()
                            .flatten()
                            .flatten()
                            .map(|e| e.path())
                            .filter(|p| p.extension().is_some_and(|x| x == "parquet" || x == "avro" || x == "tmp")),
                    );
                }
                assert!(left.is_empty(), "{free_pages} pages, no table: left behind {left:?}");
            } else {
                let m: serde_json::Value = serde_json::from_str(&ok(m)).unwrap();
                assert_eq!(m["orphans_deleted"], 0, "{free_pages} pages: left behind by the failed sync: {m}\n{err}");
            }
            ok(cdc(&["sync", "--config", cfg_s]));
            if extra.contains("format_version = 3") {
                // iceberg-rust's scan reads no deletion vectors: the target's rows folded from its changelog
                let tcfg = config(
                    dir.path(),
                    &format!("[source]\ntable = \"replica.full\"\n[source.catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n", tw.display()),
                );
                let mut got = fold(&parse_changes(&ok(cdc(&["changes", "--config", tcfg.to_str().unwrap()]))));
                let mut want = scan_rows(&table, table.metadata().current_snapshot_id()).await;
                got.sort();
                want.sort();
                assert_eq!(got, want, "{free_pages} pages: the v3 target differs from the source");
            } else {
                assert_target_equals_source(&cfg, &table, "replica.full").await;
            }
        }
    }
    eprintln!("the disk filled at: {failed_on:?}");
    assert!(succeeded > 0, "enough room for a whole sync at the top of the range");
    for step in ["data-", "eq-deletes", ".puffin", ".avro", ".tmp"] {
        assert!(failed_on.contains(step), "the disk filled at {step}: {failed_on:?}");
    }
}

/// A pipeline of table patterns (issue 53): every matching table of the source catalog is replicated to the name its
/// template gives, excluded and unmatched ones are not; `cdc check` lists the matches; a table created while the
/// service runs is found at the next discovery and followed; a dropped one stops its loop (its replica stays) and is
/// counted.
#[tokio::test(flavor = "multi_thread")]
async fn a_pipeline_of_patterns_follows_the_tables_of_a_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, _, wh) = quickstart_table(dir.path()).await;
    let make = |name: &'static str| {
        let catalog = &catalog;
        async move {
            let creation =
                iceberg::TableCreation::builder().name(name.rsplit('.').next().unwrap().into()).schema(quickstart::demo_schema().unwrap()).build();
            let t = catalog.create_table(name, creation).await.unwrap();
            quickstart::commit_changes(catalog, &t, &[(1, name, 1), (2, name, 2)], &[]).await.unwrap()
        }
    };
    for name in ["sales.orders", "sales.items", "sales.tmp_x", "hr.people"] {
        make(name).await;
    }
    let tw = dir.path().join("replica");
    let port = free_port();
    let cfg = dir.path().join("service.toml");
    let toml = format!(
        "[service]\npoll_interval = \"200ms\"\ndiscover_interval = \"1s\"\nmetrics_address = \"127.0.0.1:{port}\"\nshutdown_timeout = \"10s\"\n\n\
         [catalogs.lake]\ntype = \"sql\"\nwarehouse = \"{}\"\n\n[catalogs.replica]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n\n\
         [[pipelines]]\nname = \"sales\"\nsource = {{ catalog = \"lake\", tables = [\"sales.*\"], exclude = [\"sales.tmp_*\"] }}\n\n\
         [[pipelines.sinks]]\ntype = \"iceberg\"\ncatalog = \"replica\"\ntable = \"replica_{{namespace}}.{{table}}\"\n",
        wh.display(),
        tw.display()
    );
    std::fs::write(&cfg, toml).unwrap();
    let checked = ok(cdc(&["check", "--config", cfg.to_str().unwrap()]));
    assert!(checked.contains("match sales: 2 tables: sales.items, sales.orders"), "{checked}");

    let (mut child, notify) = spawn_watched_service(dir.path(), &cfg);
    let log = || std::fs::read_to_string(dir.path().join("service.log")).unwrap_or_default();
    assert!(notify.wait_for("READY=1", 30), "no READY=1: {}", log());
    let replica = catalog_at("hadoop", &tw).await;
    let equal = |source: &'static str, target: &'static str, secs: u64| replica_catches_up(&replica, target, &catalog, source, secs);
    assert!(equal("sales.orders", "replica_sales.orders", 30).await, "{}", log());
    assert!(equal("sales.items", "replica_sales.items", 30).await, "{}", log());
    for left_out in ["replica_sales/tmp_x", "replica_hr/people"] {
        assert!(!tw.join(left_out).exists(), "{left_out} was replicated: {}", log());
    }
    // a change to a matched table is followed like any pipeline's
    let t = catalog.load_table("sales.orders").await.unwrap();
    quickstart::commit_changes(&catalog, &t, &[(3, "later", 3)], &[1]).await.unwrap();
    assert!(equal("sales.orders", "replica_sales.orders", 30).await, "{}", log());

    // a new table is found at the next discovery (1 s) and followed
    make("sales.returns").await;
    assert!(equal("sales.returns", "replica_sales.returns", 30).await, "{}", log());
    let m = http_get(port, "/metrics").1;
    assert_eq!(metric(&m, "cdc_discovered_tables", "name=\"sales\""), Some(3.0), "{m}");
    assert!(metric(&m, "cdc_pipeline_owned", "pipeline=\"sales:sales.returns\"").is_some(), "its own loop and labels: {m}");

    // a dropped table stops its loop; its replica stays
    let db = rusqlite::Connection::open(wh.join("catalog.db")).unwrap();
    db.execute("DELETE FROM iceberg_tables WHERE table_namespace = 'sales' AND table_name = 'items'", []).unwrap();
    assert!(
        wait_until(15, || metric(&http_get(port, "/metrics").1, "cdc_discovery_table_changes_total", "kind=\"gone\"") == Some(1.0)),
        "{}",
        http_get(port, "/metrics").1
    );
    assert!(wait_until(10, || log().contains("no longer matched")), "{}", log());
    let m = http_get(port, "/metrics").1;
    assert_eq!(metric(&m, "cdc_discovered_tables", "name=\"sales\""), Some(2.0), "{m}");
    assert!(metric(&m, "cdc_pipeline_owned", "pipeline=\"sales:sales.items\"").is_none_or(|v| v == 0.0), "its loop is gone: {m}");
    assert!(tw.join("replica_sales/items/metadata").exists(), "the replica stays");
    // … marked as no longer updated (on_drop = "keep", the default)
    let marked = || async {
        let cat = Catalog::connect(
            &Config::parse(&format!("[source]\ntable = \"x.y\"\n[source.catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n", tw.display()))
                .unwrap()
                .source
                .catalog,
            "t",
        )
        .await
        .unwrap();
        cat.load_table("replica_sales.items").await.unwrap().metadata().properties().get("cdc.source-gone").cloned()
    };
    let end = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while marked().await.is_none() && std::time::Instant::now() < end {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let mark = marked().await.unwrap_or_default();
    assert!(mark.contains("sales.items: the source table is gone"), "{mark:?}: {}", log());
    assert!(wait_until(10, || http_get(port, "/readyz").0 == 200), "{}", http_get(port, "/readyz").1);

    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child, 15, log).success(), "{}", log());
}

/// Issue 53: a table renamed in the source keeps its replica — renamed with it, replication going on from its
/// progress (no copy from scratch) — and with `on_drop = "drop"` a dropped table's replica is dropped once the table
/// has been gone for `drop_grace`, also when it went while the service was stopped (the first discovery after the
/// start finds its replica through the sink's template).
#[tokio::test(flavor = "multi_thread")]
async fn a_renamed_table_keeps_its_replica_and_a_dropped_ones_goes_after_its_grace() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, _, wh) = quickstart_table(dir.path()).await;
    for name in ["sales.orders", "sales.items", "sales.old"] {
        let creation =
            iceberg::TableCreation::builder().name(name.rsplit('.').next().unwrap().into()).schema(quickstart::demo_schema().unwrap()).build();
        let t = catalog.create_table(name, creation).await.unwrap();
        quickstart::commit_changes(&catalog, &t, &[(1, name, 1), (2, name, 2)], &[]).await.unwrap();
    }
    let rw = dir.path().join("replica");
    let port = free_port();
    let cfg = dir.path().join("service.toml");
    let toml = format!(
        "[service]\npoll_interval = \"200ms\"\ndiscover_interval = \"1s\"\nmetrics_address = \"127.0.0.1:{port}\"\nshutdown_timeout = \"10s\"\n\n\
         [catalogs.lake]\ntype = \"sql\"\nwarehouse = \"{}\"\n\n[catalogs.replica]\ntype = \"sql\"\nwarehouse = \"{}\"\n\n\
         [[pipelines]]\nname = \"sales\"\nsource = {{ catalog = \"lake\", tables = [\"sales.*\"], on_drop = \"drop\", drop_grace = \"3s\" }}\n\n\
         [[pipelines.sinks]]\ntype = \"iceberg\"\ncatalog = \"replica\"\ntable = \"replica_{{namespace}}.{{table}}\"\n",
        wh.display(),
        rw.display()
    );
    std::fs::write(&cfg, toml).unwrap();
    let (mut child, notify) = spawn_watched_service(dir.path(), &cfg);
    let log = || std::fs::read_to_string(dir.path().join("service.log")).unwrap_or_default();
    assert!(notify.wait_for("READY=1", 30), "no READY=1: {}", log());
    let replica = catalog_at("sql", &rw).await;
    let equal = |source: &'static str, target: &'static str| replica_catches_up(&replica, target, &catalog, source, 30);
    for t in ["orders", "items", "old"] {
        assert!(replica_catches_up(&replica, &format!("replica_sales.{t}"), &catalog, &format!("sales.{t}"), 30).await, "{}", log());
    }
    let first_snapshot = |t: &Table| t.metadata().snapshots().min_by_key(|s| s.sequence_number()).map(|s| s.snapshot_id());
    let before = first_snapshot(&replica.load_table("replica_sales.orders").await.unwrap());

    // renamed in the source (as Spark's ALTER TABLE … RENAME TO does on a JDBC catalog: the row changes its name)
    let db = rusqlite::Connection::open(wh.join("catalog.db")).unwrap();
    db.execute("UPDATE iceberg_tables SET table_name = 'orders_v2' WHERE table_namespace = 'sales' AND table_name = 'orders'", []).unwrap();
    let t = catalog.load_table("sales.orders_v2").await.unwrap();
    quickstart::commit_changes(&catalog, &t, &[(3, "after the rename", 3)], &[1]).await.unwrap();
    assert!(equal("sales.orders_v2", "replica_sales.orders_v2").await, "{}", log());
    let renamed = replica.load_table("replica_sales.orders_v2").await.unwrap();
    let history: Vec<_> =
        renamed.metadata().snapshots().map(|s| (s.snapshot_id(), s.summary().operation.clone(), s.summary().additional_properties.clone())).collect();
    assert_eq!(first_snapshot(&renamed), before, "the replica was renamed and went on, not copied from scratch: {history:?} {}", log());
    assert!(matches!(replica.load_table("replica_sales.orders").await, Err(iceberg_cdc::error::Error::TableNotFound { .. })));
    let m = http_get(port, "/metrics").1;
    assert_eq!(metric(&m, "cdc_discovery_table_changes_total", "kind=\"renamed\""), Some(1.0), "{m}");

    // dropped: marked at once, dropped after the grace
    db.execute("DELETE FROM iceberg_tables WHERE table_namespace = 'sales' AND table_name = 'items'", []).unwrap();
    let gone = |name: &'static str| {
        let replica = &replica;
        async move {
            let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while std::time::Instant::now() < end {
                if matches!(replica.load_table(name).await, Err(iceberg_cdc::error::Error::TableNotFound { .. })) {
                    return true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            false
        }
    };
    let t0 = std::time::Instant::now();
    assert!(gone("replica_sales.items").await, "{}", log());
    assert!(t0.elapsed() >= std::time::Duration::from_secs(2), "dropped before its grace: {:?}", t0.elapsed());
    assert!(
        wait_until(10, || metric(&http_get(port, "/metrics").1, "cdc_discovery_table_changes_total", "kind=\"dropped\"") == Some(1.0)),
        "{}",
        log()
    );
    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child, 15, log).success(), "{}", log());

    // dropped while the service was stopped: found at the start, dropped after the grace
    db.execute("DELETE FROM iceberg_tables WHERE table_namespace = 'sales' AND table_name = 'old'", []).unwrap();
    std::fs::remove_file(dir.path().join("notify.sock")).unwrap();
    let (mut child, notify) = spawn_watched_service(dir.path(), &cfg);
    assert!(notify.wait_for("READY=1", 30), "no READY=1: {}", log());
    assert!(gone("replica_sales.old").await, "{}", log());
    // what is followed stays
    assert!(equal("sales.orders_v2", "replica_sales.orders_v2").await, "{}", log());
    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child, 15, log).success(), "{}", log());
}

/// `cdc sync` of table patterns (issue 53): a DR copy of a namespace in one command. Every matching table is copied
/// to the name its template gives, with a line per table and a summary; a table that fails (no key) does not stop
/// the others, and the exit code says some failed; a second run resumes each from its progress. A command that
/// reads one table refuses a file of patterns.
#[tokio::test(flavor = "multi_thread")]
async fn a_sync_of_patterns_copies_each_matching_table_and_a_failed_one_stops_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let (catalog, _, wh) = quickstart_table(dir.path()).await;
    for name in ["sales.orders", "sales.items", "sales.tmp_x", "hr.people"] {
        let creation =
            iceberg::TableCreation::builder().name(name.rsplit('.').next().unwrap().into()).schema(quickstart::demo_schema().unwrap()).build();
        let t = catalog.create_table(name, creation).await.unwrap();
        quickstart::commit_changes(&catalog, &t, &[(1, name, 1), (2, name, 2)], &[]).await.unwrap();
    }
    // a matching table without identifier fields: its key cannot be resolved
    let fields = quickstart::demo_schema().unwrap().as_struct().fields().to_vec();
    let keyless = iceberg::spec::Schema::builder().with_fields(fields).build().unwrap();
    let t = catalog.create_table("sales.keyless", iceberg::TableCreation::builder().name("keyless".into()).schema(keyless).build()).await.unwrap();
    let b = quickstart::orders_batch(&t, &[(7, "k", 7)]).unwrap();
    let files = iceberg_cdc::sink::iceberg::files::write_data(&t, &[b]).await.unwrap();
    let c = iceberg_cdc::sink::iceberg::rowdelta::RowDelta::new().add_data_files(files).prepare(&t).await.unwrap();
    catalog.commit(&t, c.requirements, c.updates).await.unwrap();

    let tw = dir.path().join("dr");
    let cfg = config(
        dir.path(),
        &format!(
            "[source]\ntables = [\"sales.*\"]\nexclude = [\"sales.tmp_*\"]\n[source.catalog]\ntype = \"sql\"\nwarehouse = \"{}\"\n\n\
             [target]\ntable = \"dr_{{namespace}}.{{table}}\"\n[target.catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n",
            wh.display(),
            tw.display()
        ),
    );
    let out = cdc(&["sync", "--config", cfg.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(code(&out), exit::PARTIAL, "{said}");
    assert!(said.contains("3 table(s) match: sales.items, sales.keyless, sales.orders"), "{said}");
    assert!(said.contains("sales.keyless: failed") && said.contains("3 table(s): 2 synced, 1 failed"), "{said}");
    assert!(said.contains("1 of 3 tables failed (sales.keyless)"), "{said}");
    for (source, target) in [("sales.orders", "dr_sales.orders"), ("sales.items", "dr_sales.items")] {
        assert!(caught_up(&tw, target, &catalog.load_table(source).await.unwrap()).await, "{target}: {said}");
    }
    assert!(!tw.join("dr_sales/tmp_x").exists() && !tw.join("dr_hr").exists(), "excluded and unmatched tables are not copied");

    // a change, then the same command: each table resumes from its own progress
    let t = catalog.load_table("sales.items").await.unwrap();
    quickstart::commit_changes(&catalog, &t, &[(3, "more", 3)], &[1]).await.unwrap();
    let again = cdc(&["sync", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code(&again), exit::PARTIAL, "{}", String::from_utf8_lossy(&again.stderr));
    assert!(caught_up(&tw, "dr_sales.items", &catalog.load_table("sales.items").await.unwrap()).await);
    // a range names snapshots of one table; other commands read one table
    let ranged = cdc(&["sync", "--config", cfg.to_str().unwrap(), "--to-snapshot", "1"]);
    assert_eq!(code(&ranged), exit::CONFIG, "{}", String::from_utf8_lossy(&ranged.stderr));
    let changes = cdc(&["changes", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code(&changes), exit::CONFIG);
    assert!(String::from_utf8_lossy(&changes.stderr).contains("this command reads one table"), "{}", String::from_utf8_lossy(&changes.stderr));
    // a template that does not name each table is refused
    let one_place = config(dir.path(), &std::fs::read_to_string(&cfg).unwrap().replace("dr_{namespace}.{table}", "dr.all"));
    let refused = cdc(&["sync", "--config", one_place.to_str().unwrap()]);
    assert_eq!(code(&refused), exit::CONFIG);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("would receive every table"), "{}", String::from_utf8_lossy(&refused.stderr));
}

/// Issue 54: `cdc --version` names the commit it was built from; `cdc completions <shell>` and `cdc man` print what
/// shells and `man` load, covering every subcommand.
#[test]
fn version_names_the_commit_and_completions_and_the_man_page_cover_every_command() {
    let version = ok(cdc(&["--version"]));
    let head = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    assert!(version.starts_with(&format!("cdc {} (commit ", env!("CARGO_PKG_VERSION"))), "{version}");
    if std::env::var("CDC_COMMIT").is_err() && !head.is_empty() {
        // built from this checkout (a build between two commits names the one it was built at)
        assert!(version.contains("(commit ") && !version.contains("unknown"), "{version}");
    }
    let bash = ok(cdc(&["completions", "bash"]));
    let zsh = ok(cdc(&["completions", "zsh"]));
    let man = ok(cdc(&["man"]));
    assert!(man.contains(".TH cdc 1") && man.contains("Change data capture"), "{man}");
    for sub in ["run", "status", "check", "changes", "sync", "snapshots", "quickstart", "completions"] {
        assert!(bash.contains(&format!("cdc__{sub}")) || bash.contains(&format!("cdc,{sub}")), "bash completion lacks {sub}");
        assert!(zsh.contains(&format!("'{sub}:")) || zsh.contains(&format!("({sub})")), "zsh completion lacks {sub}");
        assert!(man.contains(&format!("cdc\\-{sub}")) || man.contains(sub), "man page lacks {sub}");
    }
    assert!(code(&cdc(&["completions", "nosuchshell"])) != 0);
}

//! `cdc maintain`: one pass of maintenance over an Iceberg target, for those who run `cdc sync` from cron (the
//! service and every sync already merge manifests in their commits and expire snapshots after them).
//!
//! Steps, each independent of the others' success:
//! 0. **Compact** (unless `compact = false`): every partition with a delete file applying to its data, or with two
//!    or more small data files, is rewritten without a byte bound (see `compact`), in one `replace` commit.
//! 1. **Rewrite manifests**: a `replace` snapshot that merges every group's small manifests (see `merge`), when any
//!    group holds two or more; it requires the head it was planned on and is planned again after a conflict.
//! 2. **Expire snapshots** beyond the target's retention (`snapshot_retention`, `retain_snapshots`), whatever the
//!    due rule of the in-commit expiry says, and delete what only they referenced (see `expire`).
//! 3. **Remove orphan files**: files under the table's `data/` and `metadata/` that no snapshot references — a
//!    commit that never landed, a crashed run — and that are older than `orphan_grace`, so another writer's commit
//!    in flight (its files written, its metadata not yet) is never touched. Metadata JSON files and the version
//!    hint are left to `write.metadata.delete-after-commit.enabled`.
//!
//! Invariant: a file is deleted only when no snapshot of the table as loaded after steps 1–2 references it (every
//! manifest entry of every snapshot counts, live or not, and statistics files too) and it is older than the grace.
use std::collections::HashSet;
use std::time::{Duration, Instant};

use iceberg::table::Table;
use serde::Serialize;

use crate::catalog::Catalog;
use crate::config::TargetConfig;
use crate::error::{Error, Result};
use crate::sink::iceberg::compact;
use crate::sink::iceberg::expire::{self, Retention};
use crate::sink::iceberg::files::remove_unreferenced;
use crate::sink::iceberg::rowdelta::RowDelta;

/// What one maintenance pass did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Maintained {
    /// The target table.
    pub table: String,
    /// What the compaction did (all zero when there was nothing to compact).
    #[serde(flatten)]
    pub compacted: compact::Compacted,
    /// Manifests of the current snapshot before and after the pass.
    pub manifests_before: usize,
    /// See `manifests_before`.
    pub manifests_after: usize,
    /// Snapshots expired.
    pub snapshots_expired: usize,
    /// Files deleted with them (manifest lists, manifests, data and delete files).
    pub expired_files_deleted: usize,
    /// Unreferenced files older than the grace period, deleted.
    pub orphans_deleted: usize,
    /// Unreferenced files left because they are younger than the grace period (or of unknown age).
    pub orphans_too_young: usize,
    /// Steps that failed (named in the log); the others still ran.
    pub failures: Vec<String>,
    /// Wall-clock time of the pass.
    pub seconds: f64,
}

/// Runs one maintenance pass over `cfg`'s table in `catalog`, compacting within `memory_budget`. Returns what it did
/// and the error of the first step that failed (the others still ran); an error only when the table cannot be loaded.
pub async fn maintain(catalog: &Catalog, cfg: &TargetConfig, memory_budget: u64) -> Result<(Maintained, Option<Error>)> {
    let mut first_error = None;
    let started = Instant::now();
    let mut out = Maintained { table: cfg.table.clone(), ..Default::default() };
    let mut table = catalog.load_table(&cfg.table).await?;
    out.manifests_before = manifest_count(&table).await?;

    if cfg.compact {
        let policy = compact::Policy::thorough(cfg);
        match step(catalog, cfg, &mut table, |t| async move { compact::compact(catalog, cfg, &t, &policy, memory_budget).await }).await {
            Ok(Some((t, c))) => {
                out.compacted = c;
                table = t;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(table = %cfg.table, error = %e, "compaction failed");
                out.failures.push(format!("compact: {e}"));
                first_error.get_or_insert(e);
                table = catalog.load_table(&cfg.table).await?;
            }
        }
    }

    match step(catalog, cfg, &mut table, |t| rewrite_manifests(catalog, cfg, t)).await {
        Ok(t) => table = t,
        Err(e) => {
            tracing::warn!(table = %cfg.table, error = %e, "rewriting manifests failed");
            out.failures.push(format!("rewrite manifests: {e}"));
            first_error.get_or_insert(e);
            table = catalog.load_table(&cfg.table).await?;
        }
    }
    let retention = Retention { max_age: cfg.snapshot_retention, min_snapshots: cfg.retain_snapshots, new_head: false };
    match expire::expire(catalog, &table, &retention, true).await {
        Ok(Some((_, e))) => {
            out.snapshots_expired = e.snapshots;
            out.expired_files_deleted = e.manifest_lists + e.manifests + e.files;
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(table = %cfg.table, error = %e, "snapshot expiry failed");
            out.failures.push(format!("expire snapshots: {e}"));
            first_error.get_or_insert(e);
        }
    }
    // what the orphan sweep compares with must be the table as it is now
    let table = catalog.load_table(&cfg.table).await?;
    match remove_orphans(catalog, &table, cfg.orphan_grace).await {
        Ok((deleted, young)) => (out.orphans_deleted, out.orphans_too_young) = (deleted, young),
        Err(e) => {
            tracing::warn!(table = %cfg.table, error = %e, "orphan file removal failed");
            out.failures.push(format!("remove orphan files: {e}"));
            first_error.get_or_insert(e);
        }
    }
    out.manifests_after = manifest_count(&table).await?;
    out.seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        table = %cfg.table, manifests_before = out.manifests_before, manifests_after = out.manifests_after,
        data_files_rewritten = out.compacted.data_files_rewritten, delete_files_removed = out.compacted.delete_files_removed,
        snapshots_expired = out.snapshots_expired, files_deleted = out.expired_files_deleted, orphans_deleted = out.orphans_deleted,
        "maintenance done"
    );
    Ok((out, first_error))
}

/// Runs a maintenance step on `table`, planning it again on the table as it is now while it loses races to other
/// writers ([`lost_race`]); `table` ends as the one the last attempt ran on.
async fn step<T, F, Fut>(catalog: &Catalog, cfg: &TargetConfig, table: &mut Table, mut run: F) -> Result<T>
where
    F: FnMut(Table) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut attempts = 0;
    loop {
        attempts += 1;
        match run(table.clone()).await {
            Err(e) => match lost_race(catalog, cfg, table, &e, attempts).await {
                Some(moved) => {
                    tracing::info!(table = %cfg.table, error = %e, "another writer moved the table during maintenance; planning the step again");
                    *table = moved;
                }
                None => return Err(e),
            },
            done => return done,
        }
    }
}

/// A step that failed on `planned` lost a race when another writer moved the table meanwhile, or when a file it
/// read is gone (another writer's expiry deleted it with a snapshot the step planned on — its head may even be the
/// same again by the time we look): the table as it is now, to plan the step again on — at most [`RACE_ATTEMPTS`]
/// times, so a file that is really missing still fails the step. `None`: the failure stands.
async fn lost_race(catalog: &Catalog, cfg: &TargetConfig, planned: &Table, e: &Error, attempts: u32) -> Option<Table> {
    if attempts >= RACE_ATTEMPTS {
        return None;
    }
    let now = catalog.load_table(&cfg.table).await.ok()?;
    let moved = now.metadata().current_snapshot_id() != planned.metadata().current_snapshot_id();
    (moved || e.is_missing_file()).then_some(now)
}

/// Plans of one maintenance step, when other writers keep moving the table under it.
const RACE_ATTEMPTS: u32 = 4;

async fn manifest_count(table: &Table) -> Result<usize> {
    let Some(head) = table.metadata().current_snapshot() else { return Ok(0) };
    let list = table
        .manifest_list_reader(head)
        .load()
        .await
        .map_err(|e| Error::data(head.manifest_list(), format!("cannot read manifest list: {e}")).with_cause(e))?;
    Ok(list.entries().len())
}

/// Step 1: merges the current snapshot's small manifests in a `replace` commit; returns the table after it (the
/// same table when there was nothing to merge). Also the last step of a target's rest (`Upkeep::rest`).
pub(crate) async fn rewrite_manifests(catalog: &Catalog, cfg: &TargetConfig, mut table: Table) -> Result<Table> {
    for attempt in 1..=cfg.commit_retries.max(1) {
        if table.metadata().current_snapshot().is_none() {
            return Ok(table);
        }
        let prepared = RowDelta::new().rewrite_manifests().prepare(&table).await?;
        if prepared.merged.0 == 0 {
            remove_unreferenced(table.file_io(), prepared.metadata_files).await;
            return Ok(table);
        }
        let files = prepared.metadata_files.clone();
        match catalog.commit(&table, prepared.requirements, prepared.updates).await {
            Ok(t) => {
                tracing::info!(table = %cfg.table, merged = prepared.merged.0, written = prepared.merged.1, "rewrote the target's manifests");
                return Ok(t);
            }
            Err(e) if e.is_retryable() && attempt < cfg.commit_retries && !matches!(e, Error::CommitUnknown { .. }) => {
                remove_unreferenced(table.file_io(), files).await;
                tokio::time::sleep(crate::backoff::delay(cfg.retry_backoff, attempt)).await;
                table = catalog.load_table(&cfg.table).await?;
            }
            Err(e) => {
                // an unknown outcome keeps its files (orphans at worst, removed by a later pass)
                if !matches!(e, Error::CommitUnknown { .. }) {
                    remove_unreferenced(table.file_io(), files).await;
                }
                return Err(e);
            }
        }
    }
    Ok(table)
}

/// Step 3: deletes the unreferenced files under `data/` and `metadata/` older than `grace`; returns how many went and
/// how many unreferenced ones were too young.
pub(crate) async fn remove_orphans(catalog: &Catalog, table: &Table, grace: Duration) -> Result<(usize, usize)> {
    let meta = table.metadata();
    let location = meta.location().trim_end_matches('/');
    let referenced = referenced_files(table).await?;
    let now = chrono::Utc::now().timestamp_millis();
    let oldest_allowed = now - grace.as_millis() as i64;
    let mut doomed = Vec::new();
    let mut young = 0;
    for dir in ["data", "metadata"] {
        for f in catalog.list_files(table, &format!("{location}/{dir}")).await? {
            if dir == "metadata" && !sweepable_metadata(&f.path) {
                continue; // metadata JSON, version hints, anything not ours
            }
            if referenced.contains(&normalize(&f.path)) {
                continue;
            }
            if f.modified_ms == 0 || f.modified_ms > oldest_allowed {
                young += 1;
                continue;
            }
            doomed.push(f.path);
        }
    }
    if !doomed.is_empty() {
        tracing::info!(files = doomed.len(), first = %doomed[0], "deleting orphan files");
    }
    let n = doomed.len();
    remove_unreferenced(table.file_io(), doomed).await;
    Ok((n, young))
}

/// Whether a file under `metadata/` is the sweep's to judge: manifests and manifest lists (`.avro`), Puffin files,
/// and the temporary files a metadata commit writes before its rename (`.v3-<uuid>.tmp`, `.hint-<uuid>.tmp`), which a
/// crash or a full disk can leave behind — never referenced, so once older than the grace they are garbage.
fn sweepable_metadata(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".avro") || name.ends_with(".puffin") || (name.starts_with('.') && name.ends_with(".tmp"))
}

/// Every file a snapshot of `table` references: manifest lists, manifests, every entry's file (live or not),
/// statistics files.
async fn referenced_files(table: &Table) -> Result<HashSet<String>> {
    let meta = table.metadata();
    let mut out = HashSet::new();
    let mut seen_manifests = HashSet::new();
    for s in meta.snapshots() {
        out.insert(normalize(s.manifest_list()));
        let list = table
            .manifest_list_reader(s)
            .load()
            .await
            .map_err(|e| Error::data(s.manifest_list(), format!("cannot read manifest list: {e}")).with_cause(e))?;
        for m in list.entries() {
            if !seen_manifests.insert(m.manifest_path.clone()) {
                continue;
            }
            out.insert(normalize(&m.manifest_path));
            let manifest = crate::source::files::manifest(table.file_io(), m).await?;
            out.extend(manifest.entries().iter().map(|e| normalize(e.file_path())));
        }
    }
    out.extend(meta.statistics_iter().map(|s| normalize(&s.statistics_path)));
    out.extend(meta.partition_statistics_iter().map(|s| normalize(&s.statistics_path)));
    Ok(out)
}

/// A path as a listing and a manifest both spell it: without `file:` schemes, `//` collapsed after the scheme.
pub(crate) fn normalize(p: &str) -> String {
    let p = p.strip_prefix("file://").or_else(|| p.strip_prefix("file:")).unwrap_or(p);
    let (scheme, rest) = match p.split_once("://") {
        Some((s, r)) => (format!("{s}://"), r),
        None => (String::new(), p),
    };
    let mut out = scheme;
    let mut last_slash = false;
    for c in rest.chars() {
        if c == '/' && last_slash {
            continue;
        }
        last_slash = c == '/';
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{normalize, sweepable_metadata};

    #[test]
    fn the_sweep_judges_manifests_puffins_and_stale_commit_temp_files_only() {
        for p in
            ["/t/metadata/snap-1-1-a.avro", "/t/metadata/a-m0.avro", "/t/metadata/x.puffin", "/t/metadata/.v7-0b3c.tmp", "/t/metadata/.hint-9.tmp"]
        {
            assert!(sweepable_metadata(p), "{p}");
        }
        for p in ["/t/metadata/v7.metadata.json", "/t/metadata/version-hint.text", "/t/metadata/00001-a.metadata.json", "/t/metadata/notes.tmp"] {
            assert!(!sweepable_metadata(p), "{p}");
        }
    }

    #[test]
    fn paths_compare_whatever_their_spelling() {
        assert_eq!(normalize("file:/wh/t/data/a.parquet"), "/wh/t/data/a.parquet");
        assert_eq!(normalize("file:///wh/t//data/a.parquet"), "/wh/t/data/a.parquet");
        assert_eq!(normalize("gs://b/wh//t/x.avro"), "gs://b/wh/t/x.avro");
        assert_eq!(normalize("/wh/t/data/a.parquet"), "/wh/t/data/a.parquet");
    }
}

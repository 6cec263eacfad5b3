//! Snapshot expiry for the targets the applier writes: a target committed every few seconds must not keep every
//! snapshot it ever had (each one grows the metadata file every later commit rewrites and every reader parses).
//!
//! Algorithm:
//! 1. **Plan** (pure, [`plan`]): expire the snapshots older than `max_age` that are neither among the newest
//!    `min_snapshots` of the main branch's history, nor the snapshot of a tag, nor on the history of another branch
//!    (branches and tags are the owner's; expiry only shortens main's past).
//! 2. **Due** ([`due`]): only when the expirable snapshots are at least a quarter of those that stay, so the
//!    manifest-list reads it costs are paid once per many commits, and the metadata stays within 1.25 × what the
//!    retention needs.
//! 3. **Commit** one `remove-snapshots` update that requires the table and the main head it was planned on: as one
//!    more update of the applier's next commit (no commit of its own), or alone (`cdc maintain`), where a conflict
//!    (another writer committed) just skips this round.
//! 4. **Delete what only the expired snapshots referenced** ([`Expiry`]: inline, or beside the next commits in the
//!    service), computed by reachability after the commit: their manifest lists; their manifests that no remaining
//!    snapshot lists; and the data and delete files live in those manifests that no remaining manifest holds live. In the common streaming case every manifest of an expired
//!    snapshot is still listed by a newer one, so only manifest lists are read. Deletion is best effort: a file left
//!    behind is an orphan, never a broken table.
//!
//! Invariant: a file is deleted only when no snapshot that remains references it. Files that no snapshot references
//! at all (an in-flight commit of another writer, a crashed run) are never touched here.
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use iceberg::spec::{SnapshotRef, TableMetadata};
use iceberg::table::Table;
use iceberg::{TableRequirement, TableUpdate};

use crate::catalog::Catalog;
use crate::error::{Error, Result};

/// How much history a target keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Retention {
    /// Snapshots younger than this stay.
    pub max_age: Duration,
    /// The newest snapshots of the main branch that stay whatever their age (at least 1: the head).
    pub min_snapshots: usize,
    /// The expiry rides on a commit that gives main a new head: that head counts among the `min_snapshots`, so the
    /// current history keeps one fewer — none with 1, the current head included.
    pub new_head: bool,
}

/// What one expiry did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Expired {
    pub snapshots: usize,
    pub manifest_lists: usize,
    pub manifests: usize,
    pub files: usize,
}

/// A branch or tag of the table: its name, snapshot and whether it is a branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ref {
    pub name: String,
    pub snapshot_id: i64,
    pub branch: bool,
}

/// The table's branches and tags. iceberg-rust 0.10.1 has no accessor for them, so they are read from the metadata's
/// JSON form (expiry runs once per many commits).
pub(crate) fn refs(meta: &TableMetadata) -> Vec<Ref> {
    let json = serde_json::to_value(meta).unwrap_or_default();
    let mut out: Vec<Ref> = json["refs"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(name, r)| Some(Ref { name: name.clone(), snapshot_id: r["snapshot-id"].as_i64()?, branch: r["type"].as_str() != Some("tag") }))
        .collect();
    if out.is_empty() {
        out.extend(main_ref(meta));
    }
    out
}

/// The main branch as a ref (at the current snapshot).
fn main_ref(meta: &TableMetadata) -> Option<Ref> {
    meta.current_snapshot_id().map(|id| Ref { name: "main".into(), snapshot_id: id, branch: true })
}

/// Snapshots of `meta` to expire at `now_ms` under `retention` (see the module docs), oldest first.
pub(crate) fn plan(meta: &TableMetadata, refs: &[Ref], now_ms: i64, retention: &Retention) -> Vec<i64> {
    let mut keep: HashSet<i64> = HashSet::new();
    for r in refs {
        let history = crate::spec::lineage::ancestors(meta, Some(r.snapshot_id)).map(|s| s.snapshot_id());
        match (r.branch, r.name == "main") {
            (true, true) => keep.extend(history.take(retention.min_snapshots.max(1) - usize::from(retention.new_head))),
            (true, false) => keep.extend(history),
            (false, _) => {
                keep.insert(r.snapshot_id);
            }
        }
    }
    let cutoff = now_ms.saturating_sub(retention.max_age.as_millis() as i64);
    let mut out: Vec<&SnapshotRef> = meta.snapshots().filter(|s| !keep.contains(&s.snapshot_id()) && s.timestamp_ms() < cutoff).collect();
    out.sort_by_key(|s| (s.sequence_number(), s.timestamp_ms()));
    out.into_iter().map(|s| s.snapshot_id()).collect()
}

/// Whether `expirable` of `total` snapshots are worth an expiry now: a quarter or more of those that would stay.
pub(crate) fn due(expirable: usize, total: usize) -> bool {
    expirable > 0 && 4 * expirable >= total.saturating_sub(expirable)
}

/// Expires what `retention` allows on `table` when due (`force`: whenever anything is expirable), in a commit of its
/// own (`cdc maintain`; the applier's commits carry theirs, see [`due_now`]); returns the table after the expiry and
/// what it removed, or `None` when nothing was due or another writer committed first (the next round retries).
pub(crate) async fn expire(catalog: &Catalog, table: &Table, retention: &Retention, force: bool) -> Result<Option<(Table, Expired)>> {
    let meta = table.metadata();
    let Some(ids) = due_now(meta, retention, force) else { return Ok(None) };
    let requirements = vec![
        TableRequirement::UuidMatch { uuid: meta.uuid() },
        TableRequirement::RefSnapshotIdMatch { r#ref: "main".to_string(), snapshot_id: meta.current_snapshot_id() },
    ];
    let after = match catalog.commit(table, requirements, vec![TableUpdate::RemoveSnapshots { snapshot_ids: ids.clone() }]).await {
        Ok(t) => t,
        Err(Error::Conflict { message, .. }) => {
            tracing::debug!(%message, "snapshot expiry skipped: the target changed meanwhile");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let expired = ids.iter().filter_map(|id| meta.snapshot_by_id(*id).cloned()).collect();
    let report = Expiry::committed(expired, &after).delete_unreachable().await?;
    Ok(Some((after, report)))
}

/// The snapshots of `meta` to expire now under `retention` (steps 1 and 2; `force`: whenever any is expirable), or
/// `None` when it is not worth a commit yet. An applier commit carries them as one more update (the service's
/// expiries cost no commit of their own).
pub(crate) fn due_now(meta: &TableMetadata, retention: &Retention, force: bool) -> Option<Vec<i64>> {
    let now = chrono::Utc::now().timestamp_millis();
    let worth = |n: usize| if force { n > 0 } else { due(n, meta.snapshots().len()) };
    // after every commit, so first the cheap bound: with main as the only ref, other refs can only keep more
    let main_only: Vec<Ref> = main_ref(meta).into_iter().collect();
    if !worth(plan(meta, &main_only, now, retention).len()) {
        return None;
    }
    let ids = plan(meta, &refs(meta), now, retention);
    worth(ids.len()).then_some(ids)
}

/// Snapshots removed by a committed expiry, whose files are not deleted yet.
pub(crate) struct Expiry {
    /// The table after the expiry (its file IO reads and deletes).
    table: Table,
    expired: Vec<SnapshotRef>,
    /// The snapshots the expiry's commit left.
    remaining: Vec<SnapshotRef>,
}

impl Expiry {
    /// The removal of `expired`, committed as `after` (alone or with other updates).
    pub(crate) fn committed(expired: Vec<SnapshotRef>, after: &Table) -> Expiry {
        Expiry { table: after.clone(), expired, remaining: after.metadata().snapshots().cloned().collect() }
    }

    /// Snapshots the expiry removed.
    pub(crate) fn snapshots(&self) -> usize {
        self.expired.len()
    }

    /// Deletes what only the expired snapshots referenced (step 4); reports the whole expiry.
    pub(crate) async fn delete_unreachable(self) -> Result<Expired> {
        let report = delete_unreachable(&self.table, &self.expired, &self.remaining).await?;
        Ok(Expired { snapshots: self.expired.len(), ..report })
    }
}

/// Deletes what `expired` snapshots referenced and no `remaining` one does (module docs, step 4).
async fn delete_unreachable(table: &Table, expired: &[SnapshotRef], remaining: &[SnapshotRef]) -> Result<Expired> {
    let gone_manifests = manifests_of(table, expired).await?;
    let kept_manifests = manifests_of(table, remaining).await?;
    let only_gone: Vec<iceberg::spec::ManifestFile> =
        gone_manifests.into_iter().filter(|(p, _)| !kept_manifests.contains_key(p)).map(|(_, m)| m).collect();
    let mut files = Vec::new();
    if !only_gone.is_empty() {
        let gone_files = live_files(table, only_gone.clone()).await?;
        let kept_files = live_files(table, kept_manifests.into_values().collect()).await?;
        files = gone_files.into_iter().filter(|f| !kept_files.contains(f)).collect();
    }
    let lists: Vec<String> = expired.iter().map(|s| s.manifest_list().to_string()).collect();
    let report = Expired { snapshots: 0, manifest_lists: lists.len(), manifests: only_gone.len(), files: files.len() };
    let doomed: Vec<String> = files.into_iter().chain(only_gone.into_iter().map(|m| m.manifest_path)).chain(lists).collect();
    super::files::remove_unreferenced(table.file_io(), doomed).await;
    Ok(report)
}

/// The manifests the snapshots list, by path.
async fn manifests_of(table: &Table, snapshots: &[SnapshotRef]) -> Result<HashMap<String, iceberg::spec::ManifestFile>> {
    let mut out = HashMap::new();
    for s in snapshots {
        let list = table
            .manifest_list_reader(s)
            .load()
            .await
            .map_err(|e| Error::data(s.manifest_list(), format!("cannot read manifest list: {e}")).with_cause(e))?;
        out.extend(list.consume_entries().into_iter().map(|m| (m.manifest_path.clone(), m)));
    }
    Ok(out)
}

/// Paths of the data and delete files live in `snapshots` (what a reader of any of them reads).
pub(crate) async fn live_files_of(table: &Table, snapshots: &[SnapshotRef]) -> Result<HashSet<String>> {
    live_files(table, manifests_of(table, snapshots).await?.into_values().collect()).await
}

/// Paths of the files live (added or existing) in the manifests.
async fn live_files(table: &Table, manifests: Vec<iceberg::spec::ManifestFile>) -> Result<HashSet<String>> {
    let mut out = HashSet::new();
    for m in manifests {
        let manifest = crate::source::files::manifest(table.file_io(), &m).await?;
        out.extend(manifest.entries().iter().filter(|e| e.is_alive()).map(|e| e.file_path().to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v2 table with `snapshots` (id = sequence number, parent, timestamp ms) and `refs`.
    fn table(snapshots: &[(i64, Option<i64>, i64)], refs: serde_json::Value, head: i64) -> TableMetadata {
        let snaps: Vec<crate::spec::testing::Snap> =
            snapshots.iter().map(|(id, parent, ts)| (*id, *parent, *id, *ts, serde_json::json!({}))).collect();
        crate::spec::testing::metadata(&snaps, refs, serde_json::json!({}), head)
    }

    fn chain(n: i64) -> Vec<(i64, Option<i64>, i64)> {
        (1..=n).map(|i| (i, (i > 1).then_some(i - 1), i * 1000)).collect()
    }

    #[test]
    fn old_snapshots_beyond_the_newest_few_expire() {
        let meta = table(&chain(10), serde_json::json!({"main": {"snapshot-id": 10, "type": "branch"}}), 10);
        let r = refs(&meta);
        assert_eq!(r, vec![Ref { name: "main".into(), snapshot_id: 10, branch: true }]);
        let keep3 = Retention { max_age: Duration::ZERO, min_snapshots: 3, new_head: false };
        assert_eq!(plan(&meta, &r, 100_000, &keep3), vec![1, 2, 3, 4, 5, 6, 7]);
        // the age decides too: snapshots of the last 5.5 s stay (6..10 are at 6 000..10 000 ms)
        let young = Retention { max_age: Duration::from_millis(5_500), min_snapshots: 1, new_head: false };
        assert_eq!(plan(&meta, &r, 11_000, &young), vec![1, 2, 3, 4, 5]);
        // min_snapshots 0 still keeps the head
        assert_eq!(plan(&meta, &r, 100_000, &Retention { max_age: Duration::ZERO, min_snapshots: 0, new_head: false }), (1..10).collect::<Vec<_>>());
        // riding on a commit that moves main: its new head is one of the newest 3, and with 1 the current head goes too
        assert_eq!(plan(&meta, &r, 100_000, &Retention { new_head: true, ..keep3 }), (1..=8).collect::<Vec<_>>());
        let only_new = Retention { max_age: Duration::ZERO, min_snapshots: 1, new_head: true };
        assert_eq!(plan(&meta, &r, 100_000, &only_new), (1..=10).collect::<Vec<_>>());
    }

    #[test]
    fn tags_and_other_branches_keep_what_they_point_at() {
        // main: 1..6; a tag on 2; a branch "audit" forked at 3 with its own snapshot 7
        let mut snaps = chain(6);
        snaps.push((7, Some(3), 7000));
        let meta = table(
            &snaps,
            serde_json::json!({"main": {"snapshot-id": 6, "type": "branch"}, "v1": {"snapshot-id": 2, "type": "tag"},
                               "audit": {"snapshot-id": 7, "type": "branch"}}),
            6,
        );
        let plan = plan(&meta, &refs(&meta), 100_000, &Retention { max_age: Duration::ZERO, min_snapshots: 1, new_head: false });
        assert_eq!(plan, vec![4, 5], "2 is tagged, 1..3 are the audit branch's history, 6 is main's head");
    }

    #[test]
    fn expiry_waits_until_a_quarter_of_what_stays_is_expirable() {
        assert!(!due(0, 10));
        assert!(due(1, 2), "one of two: a tiny retention expires every time");
        assert!(!due(10, 60), "10 expirable beside 50 that stay: not yet");
        assert!(due(13, 63));
    }
}

//! Replication progress, recorded in the target's own snapshot summaries (like Flink's
//! `flink.max-committed-checkpoint-id`): a commit and the progress it records are one atomic step.
//!
//! The same commit also writes it to a table property, `cdc.progress.<source table uuid>`, because snapshot
//! summaries do not survive the target owner's maintenance: after a compaction (a `replace` snapshot without our
//! keys) and `expire_snapshots(retain_last => 1)` no snapshot on the main branch records progress, and a run would
//! find a table full of rows it cannot place. The property survives both. It is only believed where the summaries
//! cannot answer, and only when the target still descends from the commit that wrote it: that snapshot must be gone
//! (expired), not merely off the main branch (rolled back from), and every snapshot left on the branch must be newer
//! (a higher sequence number) than it. A summary on the branch always wins: after a rollback it is the truth, while a
//! property never rolls back.
use std::collections::HashMap;

use iceberg::spec::TableMetadata;
use iceberg::TableUpdate;

/// Summary key: the source table the progress is of.
pub const SOURCE_TABLE_UUID: &str = "cdc.source-table-uuid";
/// Summary key: its name, for people.
pub const SOURCE_TABLE: &str = "cdc.source-table";
/// Summary key: the source snapshot the target is at.
pub const SOURCE_SNAPSHOT_ID: &str = "cdc.source-snapshot-id";
/// Summary key: that snapshot's sequence number.
pub const SOURCE_SEQUENCE_NUMBER: &str = "cdc.source-sequence-number";
/// Summary key: the commit follows a rewrite of the source's history (`rollback`, `rewrite`, `replace`, `recreate`).
pub const RESYNC: &str = "cdc.resync";
/// Summary key: the source snapshot the target was at before it (absent for a dropped table's).
pub const RESYNC_FROM: &str = "cdc.resync-from-snapshot-id";
/// Summary key: source snapshots whose changes it undid.
pub const RESYNC_UNDONE: &str = "cdc.resync-undone-snapshots";
/// Summary key: the version of `cdc` that wrote the commit.
pub const WRITER: &str = "cdc.writer";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// Where a target is in its source.
pub struct Progress {
    /// The last source snapshot applied.
    pub source_snapshot_id: i64,
    /// Its sequence number.
    pub source_sequence_number: i64,
    /// Target snapshot that recorded it.
    pub target_snapshot_id: i64,
}

/// Prefix of the table property that keeps a source's progress where snapshot expiry cannot take it.
pub const PROPERTY_PREFIX: &str = "cdc.progress.";

/// The newest progress recorded for `source_uuid` on the target's main branch: by a snapshot summary on the branch,
/// else by the table property when the target still descends from the commit that wrote it (see the module docs).
pub fn read(target: &TableMetadata, source_uuid: &str) -> Option<Progress> {
    from_summaries(target, source_uuid).or_else(|| from_property(target, source_uuid))
}

/// The table-property update a commit adds to record its progress: the source snapshot and sequence number it
/// applied through, and the target snapshot (and its sequence number) that records them.
pub fn property_update(source_uuid: &str, source: (i64, i64), target_snapshot_id: i64, target_sequence_number: i64) -> TableUpdate {
    let value = format!("{}:{}:{target_snapshot_id}:{target_sequence_number}", source.0, source.1);
    TableUpdate::SetProperties { updates: HashMap::from([(format!("{PROPERTY_PREFIX}{source_uuid}"), value)]) }
}

fn from_property(target: &TableMetadata, source_uuid: &str) -> Option<Progress> {
    let value = target.properties().get(&format!("{PROPERTY_PREFIX}{source_uuid}"))?;
    let parts: Vec<i64> = value.split(':').map(str::parse).collect::<Result<_, _>>().ok()?;
    let [source_snapshot_id, source_sequence_number, target_snapshot_id, target_sequence_number] = parts[..] else { return None };
    let lineage = crate::spec::lineage::main_lineage(target);
    let expired = target.snapshot_by_id(target_snapshot_id).is_none();
    let newer = lineage.first().is_some_and(|oldest| oldest.sequence_number() > target_sequence_number);
    (expired && newer).then_some(Progress { source_snapshot_id, source_sequence_number, target_snapshot_id })
}

fn from_summaries(target: &TableMetadata, source_uuid: &str) -> Option<Progress> {
    for s in crate::spec::lineage::main_lineage(target).iter().rev() {
        let p = &s.summary().additional_properties;
        if p.get(SOURCE_TABLE_UUID).map(String::as_str) != Some(source_uuid) {
            continue;
        }
        let id = p.get(SOURCE_SNAPSHOT_ID)?.parse().ok()?;
        let seq = p.get(SOURCE_SEQUENCE_NUMBER).and_then(|v| v.parse().ok()).unwrap_or(-1);
        return Some(Progress { source_snapshot_id: id, source_sequence_number: seq, target_snapshot_id: s.snapshot_id() });
    }
    None
}

/// The snapshot summary entries recording progress at source snapshot `snapshot_id`.
pub fn properties(source_uuid: &str, source_table: &str, snapshot_id: i64, sequence_number: i64) -> HashMap<String, String> {
    HashMap::from([
        (SOURCE_TABLE_UUID.to_string(), source_uuid.to_string()),
        (SOURCE_TABLE.to_string(), source_table.to_string()),
        (SOURCE_SNAPSHOT_ID.to_string(), snapshot_id.to_string()),
        (SOURCE_SEQUENCE_NUMBER.to_string(), sequence_number.to_string()),
        (WRITER.to_string(), format!("iceberg-cdc {}", env!("CARGO_PKG_VERSION"))),
    ])
}

/// Summary key: a recreated source's bootstrap — the uuid of the dropped table whose rows it replaced.
pub const RESYNC_FROM_TABLE: &str = "cdc.resync-from-source-table-uuid";

/// The progress a target records of another source table of the same name (`name`, not `source_uuid`): the table
/// that was dropped before one of this name was created — its uuid and the last snapshot applied. By the newest
/// snapshot summary on the main branch that records a source; else by a progress property, when exactly one
/// other source has one (maintenance took the summaries).
pub fn dropped_source(target: &TableMetadata, source_uuid: &str, name: &str) -> Option<(String, i64)> {
    for s in crate::spec::lineage::main_lineage(target).iter().rev() {
        let p = &s.summary().additional_properties;
        let Some(uuid) = p.get(SOURCE_TABLE_UUID) else { continue };
        if uuid == source_uuid || p.get(SOURCE_TABLE).map(String::as_str) != Some(name) {
            return None;
        }
        return Some((uuid.clone(), p.get(SOURCE_SNAPSHOT_ID)?.parse().ok()?));
    }
    let mut others = target.properties().iter().filter_map(|(k, v)| Some((k.strip_prefix(PROPERTY_PREFIX)?, v))).filter(|(u, _)| *u != source_uuid);
    match (others.next(), others.next()) {
        (Some((uuid, v)), None) => Some((uuid.to_string(), v.split(':').next()?.parse().ok()?)),
        _ => None,
    }
}

/// The snapshot summary entries of the bootstrap that replaces a dropped source's rows with its successor's.
pub fn recreate_properties(dropped_uuid: &str, snapshot: i64) -> HashMap<String, String> {
    HashMap::from([
        (RESYNC.to_string(), crate::sink::RewriteKind::Recreate.as_str().to_string()),
        (RESYNC_FROM_TABLE.to_string(), dropped_uuid.to_string()),
        (RESYNC_FROM.to_string(), snapshot.to_string()),
    ])
}

/// The snapshot summary entries of a commit that follows `rw` (its progress is recorded by [`properties`]).
pub fn rewrite_properties(rw: &crate::sink::Rewrite) -> HashMap<String, String> {
    let mut p = HashMap::from([(RESYNC.to_string(), rw.kind.as_str().to_string()), (RESYNC_UNDONE.to_string(), rw.undo.len().to_string())]);
    if let Some(from) = rw.from {
        p.insert(RESYNC_FROM.to_string(), from.to_string());
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "5a1c6e2e-0000-4000-8000-000000000001";

    /// A v2 target whose main branch is `main` (oldest first), with every snapshot of `all`:
    /// (id, parent, sequence number, records progress of this source snapshot).
    fn target(all: &[(i64, Option<i64>, i64, Option<i64>)], main: i64, property: Option<&str>) -> TableMetadata {
        let snaps: Vec<crate::spec::testing::Snap> = all
            .iter()
            .map(|(id, parent, seq, progress)| {
                let summary = match progress {
                    Some(p) => {
                        serde_json::json!({SOURCE_TABLE_UUID: SOURCE, SOURCE_TABLE: "db.t", SOURCE_SNAPSHOT_ID: p.to_string(), SOURCE_SEQUENCE_NUMBER: p.to_string()})
                    }
                    None => serde_json::json!({}),
                };
                (*id, *parent, *seq, 1_700_000_000_000 + seq, summary)
            })
            .collect();
        let props = match property {
            Some(v) => serde_json::json!({format!("{PROPERTY_PREFIX}{SOURCE}"): v}),
            None => serde_json::json!({}),
        };
        crate::spec::testing::metadata(&snaps, serde_json::json!({"main": {"snapshot-id": main, "type": "branch"}}), props, main)
    }

    #[test]
    fn progress_survives_compaction_and_expiry_through_the_property() {
        // ours (seq 3, source snapshot 30) was compacted (seq 4, no summary keys) and expired
        let t = target(&[(4, Some(3), 4, None)], 4, Some("30:30:3:3"));
        let p = read(&t, SOURCE).expect("the property answers when no summary does");
        assert_eq!((p.source_snapshot_id, p.source_sequence_number, p.target_snapshot_id), (30, 30, 3));
        // a summary on the branch wins over the property
        let t = target(&[(2, None, 2, Some(20)), (4, Some(2), 4, None)], 4, Some("30:30:3:3"));
        assert_eq!(read(&t, SOURCE).unwrap().source_snapshot_id, 20);
        // no progress anywhere
        assert_eq!(read(&target(&[(4, None, 4, None)], 4, None), SOURCE), None);
    }

    #[test]
    fn the_property_is_not_believed_where_the_target_no_longer_descends_from_it() {
        // the commit that wrote it is still there, off the main branch: rolled back from
        let t = target(&[(1, None, 1, None), (3, Some(1), 3, Some(30))], 1, Some("30:30:3:3"));
        assert_eq!(read(&t, SOURCE), None);
        // expired, but the branch holds a snapshot older than it: the owner went back past it
        let t = target(&[(1, None, 1, None), (5, Some(1), 5, None)], 5, Some("30:30:3:3"));
        assert_eq!(read(&t, SOURCE), None);
        // unreadable values are no progress
        assert_eq!(read(&target(&[(4, Some(3), 4, None)], 4, Some("30:x:3:3")), SOURCE), None);
        assert_eq!(read(&target(&[(4, Some(3), 4, None)], 4, Some("30:30:3")), SOURCE), None);
    }

    #[test]
    fn a_dropped_source_of_the_same_name_is_found_by_summary_or_its_only_property() {
        let t = target(&[(2, None, 2, Some(20))], 2, None);
        assert_eq!(dropped_source(&t, "a-new-uuid", "db.t"), Some((SOURCE.to_string(), 20)));
        assert_eq!(dropped_source(&t, "a-new-uuid", "db.other"), None, "another table's progress");
        assert_eq!(dropped_source(&t, SOURCE, "db.t"), None, "the same table");
        // the summaries gone to maintenance: the one progress property answers
        let t = target(&[(4, Some(3), 4, None)], 4, Some("30:30:3:3"));
        assert_eq!(dropped_source(&t, "a-new-uuid", "db.t"), Some((SOURCE.to_string(), 30)));
    }

    #[test]
    fn a_commit_records_its_progress_as_a_property() {
        let TableUpdate::SetProperties { updates } = property_update(SOURCE, (30, 31), 3, 4) else { panic!("not a property update") };
        assert_eq!(updates, HashMap::from([(format!("{PROPERTY_PREFIX}{SOURCE}"), "30:31:3:4".to_string())]));
    }
}

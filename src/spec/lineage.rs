//! Snapshot lineage of a table's main branch and resolution of a user's range (start exclusive, end inclusive).
use iceberg::spec::{SnapshotRef, TableMetadata};

use crate::error::{Error, Result};

/// A range bound as the user gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// A snapshot id.
    Snapshot(i64),
    /// Epoch milliseconds: the last snapshot committed at or before this time.
    TimestampMs(i64),
}

/// `id` and its ancestors, newest first; stops at the first parent that was expired.
pub fn ancestors(meta: &TableMetadata, id: Option<i64>) -> impl Iterator<Item = SnapshotRef> + '_ {
    let mut cur = id.and_then(|id| meta.snapshot_by_id(id).cloned());
    std::iter::from_fn(move || {
        let s = cur.take()?;
        cur = s.parent_snapshot_id().and_then(|p| meta.snapshot_by_id(p).cloned());
        Some(s)
    })
}

/// Whether `ancestor` is `of` or one of its ancestors.
pub fn is_ancestor(meta: &TableMetadata, ancestor: i64, of: i64) -> bool {
    ancestors(meta, Some(of)).any(|s| s.snapshot_id() == ancestor)
}

/// Main-branch ancestry, oldest first, ending at the current snapshot. Stops at the first parent that was expired.
pub fn main_lineage(meta: &TableMetadata) -> Vec<SnapshotRef> {
    let mut out: Vec<_> = ancestors(meta, meta.current_snapshot_id()).collect();
    out.reverse();
    out
}

/// The schema a snapshot was written with (the current one for snapshots that do not say).
pub fn snapshot_schema(meta: &TableMetadata, snapshot: Option<&SnapshotRef>) -> iceberg::spec::SchemaRef {
    snapshot.and_then(|s| s.schema_id()).and_then(|id| meta.schema_by_id(id)).cloned().unwrap_or_else(|| meta.current_schema().clone())
}

/// Resolves (A exclusive, B inclusive] into the snapshots whose changes are read, oldest first.
/// No `from`: from the first snapshot that still exists (inclusive). No `to`: the current snapshot.
pub fn resolve_range(table: &str, meta: &TableMetadata, from: Option<Bound>, to: Option<Bound>) -> Result<Vec<SnapshotRef>> {
    let lineage = main_lineage(meta);
    if lineage.is_empty() {
        return Ok(Vec::new());
    }
    let end_id = match to {
        None => lineage.last().unwrap().snapshot_id(),
        Some(Bound::Snapshot(id)) => {
            meta.snapshot_by_id(id).ok_or(Error::SnapshotNotFound { table: table.into(), snapshot: id })?;
            id
        }
        Some(Bound::TimestampMs(ts)) => match lineage.iter().rev().find(|s| s.timestamp_ms() <= ts) {
            Some(s) => s.snapshot_id(),
            None => {
                return Err(Error::Range(format!(
                    "--to-timestamp {} is before the first snapshot of `{table}` ({})",
                    fmt_ms(ts),
                    fmt_ms(lineage[0].timestamp_ms())
                )))
            }
        },
    };
    // Ancestry of B, oldest first (B may be off the main branch's head but must be reachable through parents).
    let mut chain: Vec<_> = ancestors(meta, Some(end_id)).collect();
    chain.reverse();
    if !lineage.iter().any(|s| s.snapshot_id() == end_id) {
        return Err(Error::Range(format!("snapshot {end_id} is not on the main branch of `{table}`")));
    }
    let start = match from {
        None => return Ok(chain),
        Some(Bound::Snapshot(id)) => {
            meta.snapshot_by_id(id).ok_or(Error::SnapshotNotFound { table: table.into(), snapshot: id })?;
            id
        }
        Some(Bound::TimestampMs(ts)) => match chain.iter().rev().find(|s| s.timestamp_ms() <= ts) {
            Some(s) => s.snapshot_id(),
            None => return Ok(chain), // T before every snapshot: everything is after it
        },
    };
    match chain.iter().position(|s| s.snapshot_id() == start) {
        Some(i) => Ok(chain.split_off(i + 1)),
        None => {
            // Tell "A after B" apart from "A on another line of history" (rolled back, another branch).
            let on_main = lineage.iter().any(|s| s.snapshot_id() == start);
            if on_main && is_ancestor(meta, end_id, start) {
                Err(Error::Range(format!("start snapshot {start} comes after end snapshot {end_id}; swap --from and --to")))
            } else {
                Err(Error::Range(format!(
                    "start snapshot {start} is not an ancestor of end snapshot {end_id} in `{table}` (the history was rewritten or the snapshot is on another branch); pick a start from `cdc snapshots`"
                )))
            }
        }
    }
}

/// Milliseconds since the epoch as an RFC 3339 UTC timestamp.
pub fn fmt_ms(ms: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

/// RFC 3339 or epoch milliseconds.
pub fn parse_timestamp(s: &str) -> Result<i64, String> {
    if let Ok(ms) = s.trim().parse::<i64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(s.trim())
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("`{s}` is neither RFC 3339 (2024-05-01T12:00:00Z) nor epoch milliseconds: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(parse_timestamp("1700000000000").unwrap(), 1_700_000_000_000);
        assert_eq!(parse_timestamp("1970-01-01T00:00:01Z").unwrap(), 1000);
        assert!(parse_timestamp("yesterday").is_err());
    }
}

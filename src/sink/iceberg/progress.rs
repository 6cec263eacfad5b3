//! Replication progress, recorded in the target's own snapshot summaries (like Flink's
//! `flink.max-committed-checkpoint-id`): a commit and the progress it records are one atomic step.
use std::collections::HashMap;

use iceberg::spec::TableMetadata;

pub const SOURCE_TABLE_UUID: &str = "cdc.source-table-uuid";
pub const SOURCE_TABLE: &str = "cdc.source-table";
pub const SOURCE_SNAPSHOT_ID: &str = "cdc.source-snapshot-id";
pub const SOURCE_SEQUENCE_NUMBER: &str = "cdc.source-sequence-number";
pub const WRITER: &str = "cdc.writer";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub source_snapshot_id: i64,
    pub source_sequence_number: i64,
    /// Target snapshot that recorded it.
    pub target_snapshot_id: i64,
}

/// The newest progress recorded for `source_uuid` on the target's main branch.
pub fn read(target: &TableMetadata, source_uuid: &str) -> Option<Progress> {
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

pub fn properties(source_uuid: &str, source_table: &str, snapshot_id: i64, sequence_number: i64) -> HashMap<String, String> {
    HashMap::from([
        (SOURCE_TABLE_UUID.to_string(), source_uuid.to_string()),
        (SOURCE_TABLE.to_string(), source_table.to_string()),
        (SOURCE_SNAPSHOT_ID.to_string(), snapshot_id.to_string()),
        (SOURCE_SEQUENCE_NUMBER.to_string(), sequence_number.to_string()),
        (WRITER.to_string(), format!("iceberg-cdc {}", env!("CARGO_PKG_VERSION"))),
    ])
}

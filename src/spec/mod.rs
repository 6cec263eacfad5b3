//! Iceberg-spec helpers that both the read side (`source`) and the write side (`sink`) use: lineage of a table's main
//! branch, the deletion-vector codec, projecting Arrow data by Iceberg field id, and encoding any Iceberg type for
//! row comparison. Neither side imports the other; both import this.
mod avro;
pub(crate) mod data_file;
pub(crate) mod dv;
pub(crate) mod integrity;
pub mod lineage;
pub(crate) mod manifest;
pub(crate) mod manifest_list;
pub(crate) mod name_mapping;
#[cfg(test)]
mod parser_props;
pub(crate) mod projection;
pub(crate) mod recent;
pub(crate) mod row_lineage;
pub(crate) mod rowenc;

/// The most one Avro read may allocate for one value or reserve for one array or map (16 MiB): the blocks of
/// manifests and manifest lists are 16–64 KB, their strings paths and bounds.
const AVRO_MAX_ALLOCATION: usize = 16 << 20;

/// Bounds what the Avro decoder (manifests, manifest lists) allocates for a length it reads from the file, before
/// any is read. The decoder's own default (512 MiB) checks an array's or map's element *count*, not its bytes, so
/// a damaged count of a few hundred million reserved tens of GB and aborted the process (found by
/// `parser_props`); at 16 Mi elements a reservation stays a virtual-memory figure the allocator grants, and the
/// damaged file ends in a typed error when its bytes run out. Idempotent; the first call in the process counts.
pub fn bound_avro_allocations() {
    apache_avro::util::max_allocation_bytes(AVRO_MAX_ALLOCATION);
}

/// Reserved field ids of position-delete files (Iceberg spec): `file_path` and `pos`.
pub const POS_DELETE_FILE_PATH_ID: i32 = 2147483546;
/// See [`POS_DELETE_FILE_PATH_ID`].
pub const POS_DELETE_POS_ID: i32 = 2147483545;

/// Table metadata for unit tests, built from its JSON form.
#[cfg(test)]
pub(crate) mod testing {
    use iceberg::spec::TableMetadata;
    use serde_json::{json, Value};

    /// One snapshot: id, parent, sequence number, commit time (ms) and summary entries beside `operation`.
    pub(crate) type Snap = (i64, Option<i64>, i64, i64, Value);

    /// A v2 table (one `long` column, unpartitioned) holding `snapshots`, with branches and tags `refs` (as metadata
    /// files write them), table `properties`, and main's head `head`.
    pub(crate) fn metadata(snapshots: &[Snap], refs: Value, properties: Value, head: i64) -> TableMetadata {
        let snaps: Vec<Value> = snapshots
            .iter()
            .map(|(id, parent, seq, ts, extra)| {
                let mut summary = json!({"operation": "append"});
                for (k, v) in extra.as_object().into_iter().flatten() {
                    summary[k] = v.clone();
                }
                let mut s = json!({"snapshot-id": id, "sequence-number": seq, "timestamp-ms": ts,
                    "manifest-list": format!("/t/metadata/snap-{id}.avro"), "summary": summary, "schema-id": 0});
                if let Some(p) = parent {
                    s["parent-snapshot-id"] = (*p).into();
                }
                s
            })
            .collect();
        serde_json::from_value(json!({
            "format-version": 2, "table-uuid": "5a1c6e2e-0000-4000-8000-0000000000ff", "location": "/t",
            "last-sequence-number": snapshots.iter().map(|s| s.2).max().unwrap_or(0),
            "last-updated-ms": snapshots.iter().map(|s| s.3).max().unwrap_or(0) + 1, "last-column-id": 1, "current-schema-id": 0,
            "schemas": [{"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "required": true, "type": "long"}]}],
            "default-spec-id": 0, "partition-specs": [{"spec-id": 0, "fields": []}], "last-partition-id": 999,
            "default-sort-order-id": 0, "sort-orders": [{"order-id": 0, "fields": []}], "properties": properties,
            "current-snapshot-id": head, "snapshots": snaps, "refs": refs, "snapshot-log": [], "metadata-log": []
        }))
        .expect("valid test metadata")
    }
}

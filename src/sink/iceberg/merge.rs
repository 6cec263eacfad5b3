//! Manifest merging, as Iceberg Java's merge-append does it: without it every commit adds a manifest per content
//! (data, deletes) that readers must open forever — a streaming target ends with thousands of tiny manifests.
//!
//! Algorithm: the parent's manifests are grouped by (content, partition spec). A group is merged once it holds at
//! least `commit.manifest.min-count-to-merge` manifests (the table property; [`DEFAULT_MIN_COUNT`] when unset)
//! counting the one this commit adds: its manifests smaller than `commit.manifest.target-size-bytes` are packed,
//! newest first, into bins of at most that size, and each bin of two or more becomes one manifest. So a group holds
//! fewer than the minimum count of small manifests plus those at the target size: the count follows the data, not
//! the number of commits. `commit.manifest-merge.enabled = false` turns it off, as in Java.
//!
//! Invariants: a merged manifest lists every live entry of the manifests it replaces as `EXISTING`, with its snapshot
//! id and data and file sequence numbers unchanged (they decide which deletes apply to which rows); `DELETED` entries
//! are dropped (they only describe older snapshots). In a v3 table's data manifests each entry carries the
//! `first_row_id` it inherited (`spec::row_lineage`), so that its rows keep their `_row_id`. Merging is an
//! optimization: a bin that fails to merge stays as it was.
use std::collections::BTreeMap;

use iceberg::spec::{
    FormatVersion, ManifestContentType, ManifestFile, ManifestWriter, ManifestWriterBuilder, PartitionSpecRef, SchemaRef, TableMetadata,
};
use iceberg::table::Table;

use crate::error::{Error, Result};
use crate::spec::row_lineage;

/// Java's `commit.manifest-merge.enabled` (default true).
pub(crate) const ENABLED_PROP: &str = "commit.manifest-merge.enabled";
/// Java's `commit.manifest.min-count-to-merge`.
pub(crate) const MIN_COUNT_PROP: &str = "commit.manifest.min-count-to-merge";
/// Java's `commit.manifest.target-size-bytes` (default 8 MiB).
pub(crate) const TARGET_SIZE_PROP: &str = "commit.manifest.target-size-bytes";
/// Manifests of one group that trigger a merge when the table does not say: half of Java's 100, so that a target's
/// two groups (data, deletes) stay near 100 manifests together.
pub(crate) const DEFAULT_MIN_COUNT: usize = 50;
const DEFAULT_TARGET_SIZE: u64 = 8 << 20;

/// When and how much to merge, from the table's properties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MergePolicy {
    /// Merging happens at all.
    pub(crate) enabled: bool,
    /// Manifests of one group (this commit's included) that trigger a merge.
    pub(crate) min_count: usize,
    /// Largest manifest a merge writes, in bytes; manifests this large stay as they are.
    pub(crate) target_size: u64,
}

impl MergePolicy {
    /// The policy `meta`'s properties set (Java's names and semantics; unset ones take our defaults).
    pub(crate) fn of(meta: &TableMetadata) -> Self {
        let p = meta.properties();
        MergePolicy {
            enabled: p.get(ENABLED_PROP).is_none_or(|v| !v.eq_ignore_ascii_case("false")),
            min_count: p.get(MIN_COUNT_PROP).and_then(|v| v.parse().ok()).filter(|n| *n >= 2).unwrap_or(DEFAULT_MIN_COUNT),
            target_size: p.get(TARGET_SIZE_PROP).and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(DEFAULT_TARGET_SIZE),
        }
    }
}

/// What merging did in one commit (Java's summary keys).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MergeStats {
    /// Manifests written by merging.
    pub(crate) created: usize,
    /// Manifests they replace.
    pub(crate) replaced: usize,
}

/// The bins to merge in one group: `lengths` are its manifests' sizes, newest first; `adding` the manifests this
/// commit adds to the group. Returns bins of indices into `lengths`, each of two or more manifests. Pure.
pub(crate) fn bins(lengths: &[u64], adding: usize, policy: &MergePolicy) -> Vec<Vec<usize>> {
    if !policy.enabled || lengths.len() + adding < policy.min_count {
        return Vec::new();
    }
    let mut out: Vec<Vec<usize>> = Vec::new();
    let (mut bin, mut size) = (Vec::new(), 0u64);
    for (i, &len) in lengths.iter().enumerate() {
        if len >= policy.target_size {
            continue; // full already
        }
        if !bin.is_empty() && size + len > policy.target_size {
            out.push(std::mem::take(&mut bin));
            size = 0;
        }
        bin.push(i);
        size += len;
    }
    out.push(bin);
    out.retain(|b| b.len() >= 2);
    out
}

/// Merges `manifests` (the parent's, newest first) by `policy` for a commit adding `adding` manifests per (deletes?,
/// spec) and snapshot `snapshot_id`, writing merged manifests under `<location>/metadata/<prefix>-merged-<n>.avro`. Returns the
/// manifests the new snapshot keeps (merged ones in place of their bins), the paths written, and what it did.
pub(crate) async fn merge(
    table: &Table,
    schema: &SchemaRef,
    snapshot_id: i64,
    manifests: Vec<ManifestFile>,
    adding: &BTreeMap<(bool, i32), usize>,
    prefix: &str,
    policy: MergePolicy,
) -> (Vec<ManifestFile>, Vec<String>, MergeStats) {
    let meta = table.metadata();
    let mut stats = MergeStats::default();
    let mut written = Vec::new();
    if !policy.enabled {
        return (manifests, written, stats);
    }
    let mut groups: BTreeMap<(bool, i32), Vec<usize>> = BTreeMap::new();
    for (i, m) in manifests.iter().enumerate() {
        groups.entry((m.content == ManifestContentType::Deletes, m.partition_spec_id)).or_default().push(i);
    }
    // the manifest that replaces each merged one's first member; the others go
    let mut replaced: BTreeMap<usize, Option<ManifestFile>> = BTreeMap::new();
    for ((deletes, spec_id), members) in groups {
        let content = if deletes { ManifestContentType::Deletes } else { ManifestContentType::Data };
        let lengths: Vec<u64> = members.iter().map(|i| manifests[*i].manifest_length.max(0) as u64).collect();
        for bin in bins(&lengths, adding.get(&(deletes, spec_id)).copied().unwrap_or(0), &policy) {
            let files: Vec<&ManifestFile> = bin.iter().map(|b| &manifests[members[*b]]).collect();
            let path = format!("{}/metadata/{prefix}-merged-{}.avro", meta.location(), written.len());
            match merge_bin(table, schema, snapshot_id, content, spec_id, &files, &path).await {
                Ok(m) => {
                    stats.created += 1;
                    stats.replaced += files.len();
                    replaced.insert(members[bin[0]], Some(m));
                    for b in &bin[1..] {
                        replaced.insert(members[*b], None);
                    }
                    written.push(path);
                }
                Err(e) => {
                    tracing::warn!(error = %e, manifests = files.len(), "merging small manifests failed; they stay as they are");
                    crate::sink::iceberg::files::remove_unreferenced(table.file_io(), vec![path]).await;
                }
            }
        }
    }
    let kept = manifests
        .into_iter()
        .enumerate()
        .filter_map(|(i, m)| match replaced.remove(&i) {
            Some(merged) => merged,
            None => Some(m),
        })
        .collect();
    (kept, written, stats)
}

/// A writer of a `content` manifest at `path`, for files of partition spec `spec_id`, in `table`'s format version,
/// added by snapshot `snapshot_id`; and that spec.
pub(crate) fn manifest_writer(
    table: &Table,
    schema: &SchemaRef,
    snapshot_id: i64,
    content: ManifestContentType,
    spec_id: i32,
    path: &str,
) -> Result<(ManifestWriter, PartitionSpecRef)> {
    let meta = table.metadata();
    let spec = meta
        .partition_spec_by_id(spec_id)
        .cloned()
        .ok_or_else(|| Error::Internal(format!("a manifest names partition spec {spec_id}, which the table lacks")))?;
    let builder = ManifestWriterBuilder::new(table.file_io().new_output(path)?, Some(snapshot_id), schema.clone(), spec.as_ref().clone());
    let w = match (meta.format_version(), content) {
        (FormatVersion::V3, ManifestContentType::Data) => builder.build_v3_data(),
        (FormatVersion::V3, ManifestContentType::Deletes) => builder.build_v3_deletes(),
        (FormatVersion::V2, ManifestContentType::Data) => builder.build_v2_data(),
        (FormatVersion::V2, ManifestContentType::Deletes) => builder.build_v2_deletes(),
        (FormatVersion::V1, _) => builder.build_v1(),
    };
    Ok((w, spec))
}

/// One merged manifest of `files` (all of `content` in spec `spec_id`) at `path`.
async fn merge_bin(
    table: &Table,
    schema: &SchemaRef,
    snapshot_id: i64,
    content: ManifestContentType,
    spec_id: i32,
    files: &[&ManifestFile],
    path: &str,
) -> Result<ManifestFile> {
    let (mut w, _) = manifest_writer(table, schema, snapshot_id, content, spec_id, path)?;
    for f in files {
        let manifest = crate::source::files::manifest(table.file_io(), f).await?;
        for (e, file) in row_lineage::live_entries(table.metadata().format_version(), f, &manifest)? {
            let (Some(snapshot), Some(seq)) = (e.snapshot_id, e.sequence_number) else {
                return Err(Error::data(&f.manifest_path, "a live entry without snapshot id or sequence number after inheritance"));
            };
            w.add_existing_file(file, snapshot, seq, e.file_sequence_number.or(Some(seq)))?;
        }
    }
    Ok(w.write_manifest_file().await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: MergePolicy = MergePolicy { enabled: true, min_count: 4, target_size: 100 };

    #[test]
    fn a_group_below_the_minimum_count_is_left_alone() {
        assert!(bins(&[10, 10], 1, &P).is_empty(), "3 < 4");
        assert_eq!(bins(&[10, 10, 10], 1, &P), vec![vec![0, 1, 2]], "the new manifest makes 4");
        assert!(bins(&[10; 9], 1, &MergePolicy { enabled: false, ..P }).is_empty());
    }

    #[test]
    fn small_manifests_are_packed_newest_first_up_to_the_target_size() {
        // 60 + 30 fit; 50 starts a new bin with 40; 150 is full already and stays; a bin of one is no merge
        assert_eq!(bins(&[60, 30, 50, 40, 150, 90], 0, &MergePolicy { min_count: 2, ..P }), vec![vec![0, 1], vec![2, 3]]);
        assert!(bins(&[150, 200, 99], 1, &P).is_empty());
    }

    #[test]
    fn the_policy_reads_javas_table_properties() {
        let mut meta = crate::spec::testing::metadata(&[], serde_json::json!({}), serde_json::json!({}), -1);
        assert_eq!(MergePolicy::of(&meta), MergePolicy { enabled: true, min_count: DEFAULT_MIN_COUNT, target_size: DEFAULT_TARGET_SIZE });
        meta = crate::spec::testing::metadata(
            &[],
            serde_json::json!({}),
            serde_json::json!({ENABLED_PROP: "FALSE", MIN_COUNT_PROP: "7", TARGET_SIZE_PROP: "1024"}),
            -1,
        );
        assert_eq!(MergePolicy::of(&meta), MergePolicy { enabled: false, min_count: 7, target_size: 1024 });
    }
}

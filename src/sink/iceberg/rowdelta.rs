//! Row-delta commits: one atomic snapshot that adds data files and delete files (equality deletes, position
//! deletes, deletion vectors) to a table. iceberg-rust 0.10.1 only has `fast_append` (data files) and keeps its
//! commit plumbing private, so the snapshot is built here from its public parts: manifests
//! (`ManifestWriterBuilder`), a manifest list (`ManifestListWriter`) and `Snapshot::builder`, and handed to the
//! catalog as `TableRequirement`s + `TableUpdate`s — the same shape a REST `CommitTableRequest` has.
use std::collections::HashMap;
use std::sync::Arc;

use iceberg::spec::{
    DataContentType, DataFile, FormatVersion, ManifestContentType, ManifestFile, ManifestListWriter, Operation, Schema, Snapshot, SnapshotReference,
    SnapshotRetention, SnapshotSummaryCollector, Summary, MAIN_BRANCH,
};
use iceberg::table::Table;
use iceberg::{TableRequirement, TableUpdate};

use crate::error::{Error, Result};
use crate::sink::iceberg::merge::{self, MergeStats};

/// Summary totals carried forward from the parent and adjusted by what this snapshot adds and removes.
const TOTALS: [(&str, &str, &str); 6] = [
    ("total-records", "added-records", "deleted-records"),
    ("total-files-size", "added-files-size", "removed-files-size"),
    ("total-data-files", "added-data-files", "deleted-data-files"),
    ("total-delete-files", "added-delete-files", "removed-delete-files"),
    ("total-position-deletes", "added-position-deletes", "removed-position-deletes"),
    ("total-equality-deletes", "added-equality-deletes", "removed-equality-deletes"),
];

#[derive(Default)]
/// A row-delta commit being built: data files, delete files, summary and table properties, an optional new schema.
pub struct RowDelta {
    data: Vec<DataFile>,
    /// Delete files with the partition spec they were written in (`None`: the table's default spec).
    deletes: Vec<(Option<i32>, DataFile)>,
    properties: HashMap<String, String>,
    schema: Option<Schema>,
    table_properties: HashMap<String, String>,
    /// Merge the parent's small manifests by the table's policy (see `merge`).
    merge_manifests: bool,
    /// A manifest rewrite: no files, every small manifest merged, a `replace` snapshot.
    rewrite: bool,
    /// The data sequence number of the data files added (`None`: the new snapshot's): a compaction's files keep the
    /// one of the snapshot it read, so that deletes committed since still apply to them.
    data_sequence_number: Option<i64>,
    /// Live files (data or deletes) of the parent this snapshot removes: a compaction, a `replace` snapshot.
    remove: std::collections::HashSet<String>,
    /// Data files whose deletion vectors (and position-delete files that reference them alone) this snapshot
    /// replaces with new ones.
    replace_deletes_of: std::collections::HashSet<String>,
    /// Every live file of the parent goes: the snapshot holds only what this commit adds.
    remove_all: bool,
}

/// What a commit is made of, ready for [`crate::catalog::Catalog::commit`].
pub struct PreparedCommit {
    /// The id of the snapshot the commit adds.
    pub snapshot_id: i64,
    /// The new snapshot's sequence number.
    pub sequence_number: i64,
    /// What the table must still be for the commit to apply.
    pub requirements: Vec<TableRequirement>,
    /// The metadata updates of the commit.
    pub updates: Vec<TableUpdate>,
    /// The manifests and the manifest list this commit wrote (garbage unless it lands).
    pub metadata_files: Vec<String>,
    /// Manifests of the parent merged into fewer (replaced, written).
    pub merged: (usize, usize),
}

impl RowDelta {
    /// An empty row delta.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds data files.
    pub fn add_data_files(mut self, files: impl IntoIterator<Item = DataFile>) -> Self {
        self.data.extend(files);
        self
    }
    /// Gives the data files added the data sequence number `seq` instead of the new snapshot's (Iceberg Java's
    /// `RewriteFiles.dataSequenceNumber`): at most the parent's, so that deletes up to `seq` do not apply to them and
    /// later ones do.
    pub fn data_sequence_number(mut self, seq: i64) -> Self {
        self.data_sequence_number = Some(seq);
        self
    }
    /// Adds delete files in the table's default spec.
    pub fn add_delete_files(mut self, files: impl IntoIterator<Item = DataFile>) -> Self {
        self.deletes.extend(files.into_iter().map(|f| (None, f)));
        self
    }
    /// Delete files written in partition spec `spec_id` rather than the default one (e.g. global equality deletes
    /// in the unpartitioned spec of a table whose spec evolved).
    pub fn add_delete_files_in_spec(mut self, spec_id: i32, files: impl IntoIterator<Item = DataFile>) -> Self {
        self.deletes.extend(files.into_iter().map(|f| (Some(spec_id), f)));
        self
    }
    /// Custom snapshot summary entries (how writers record progress).
    pub fn set_snapshot_properties(mut self, props: HashMap<String, String>) -> Self {
        self.properties.extend(props);
        self
    }

    /// A new current schema, added in the same commit as the files (which are written in it).
    pub fn set_schema(mut self, schema: Schema) -> Self {
        self.schema = Some(schema);
        self
    }
    /// Merges the parent's small manifests in this commit, by the table's `commit.manifest.*` properties.
    pub fn merge_manifests(mut self, merge: bool) -> Self {
        self.merge_manifests = merge;
        self
    }
    /// Makes this commit a manifest rewrite (Spark's `rewrite_manifests`): it adds no files, merges every group's
    /// small manifests whatever their count, and is a `replace` snapshot. When nothing is worth merging, the
    /// prepared commit's `merged` is `(0, 0)` and it should not be committed.
    pub fn rewrite_manifests(mut self) -> Self {
        self.merge_manifests = true;
        self.rewrite = true;
        self
    }
    /// Removes live files (data or delete files, by path) of the parent: with data files added in their place, a
    /// compaction (`replace` snapshot: the rows stay the same). The manifests that list them are rewritten with
    /// their entries `DELETED` (keeping their sequence numbers) and the others `EXISTING`. Deletion vectors go by
    /// their data file ([`Self::replace_deletes_of`]): one Puffin file holds the vectors of many data files.
    pub fn remove_files(mut self, paths: impl IntoIterator<Item = String>) -> Self {
        self.remove.extend(paths);
        self
    }
    /// Removes the live deletion vectors of these data files, and the position-delete files that reference one of
    /// them alone: the commit adds deletion vectors that hold their positions and more (v3 allows one vector per
    /// data file). Unlike [`Self::remove_files`] this deletes rows: the snapshot is an `overwrite`.
    pub fn replace_deletes_of(mut self, data_paths: impl IntoIterator<Item = String>) -> Self {
        self.replace_deletes_of.extend(data_paths);
        self
    }
    /// Removes every live file of the parent (data, delete files, deletion vectors), each listed `DELETED` as
    /// [`Self::remove_files`] does: the new snapshot (an `overwrite`) holds only the files this commit adds. A
    /// replica whose source was dropped and created again under its name starts over this way.
    pub fn remove_all(mut self) -> Self {
        self.remove_all = true;
        self
    }
    /// Table properties set in the same commit.
    pub fn set_table_properties(mut self, props: HashMap<String, String>) -> Self {
        self.table_properties.extend(props);
        self
    }

    /// Writes the manifests and the manifest list, and returns the snapshot as catalog updates pinned to the
    /// table's uuid and current main-branch head (optimistic concurrency).
    /// What it wrote before a failure (a full disk, a lost connection) is removed again: a prepare that fails leaves
    /// nothing behind, and names the file it could not write (an I/O error, exit code 10).
    pub async fn prepare(self, table: &Table) -> Result<PreparedCommit> {
        let mut written = Vec::new();
        let prepared = self.prepare_writing(table, &mut written).await;
        if prepared.is_err() {
            crate::sink::iceberg::files::remove_unreferenced(table.file_io(), written).await;
        }
        prepared
    }

    /// [`Self::prepare`], recording in `metadata_files` every file it starts writing (before it writes it).
    async fn prepare_writing(self, table: &Table, metadata_files: &mut Vec<String>) -> Result<PreparedCommit> {
        let meta = table.metadata();
        if self.data.iter().any(|f| f.content_type() != DataContentType::Data) {
            return Err(Error::Internal("add_data_files got a delete file".into()));
        }
        if self.deletes.iter().any(|(_, f)| f.content_type() == DataContentType::Data) {
            return Err(Error::Internal("add_delete_files got a data file".into()));
        }
        if self.rewrite && (!self.data.is_empty() || !self.deletes.is_empty()) {
            return Err(Error::Internal("a manifest rewrite adds no files".into()));
        }
        let version = meta.format_version();
        if version == FormatVersion::V1 && !self.deletes.is_empty() {
            return Err(Error::Schema("format v1 tables cannot hold delete files; upgrade the table to v2".into()));
        }
        if version == FormatVersion::V3
            && self.deletes.iter().any(|(_, f)| f.content_type() == DataContentType::PositionDeletes && f.content_offset().is_none())
        {
            return Err(Error::Internal("v3 tables take deletion vectors, not position-delete files".into()));
        }
        let snapshot_id = new_snapshot_id(table);
        let parent = meta.current_snapshot();
        let seq = meta.next_sequence_number();
        let commit_uuid = uuid::Uuid::new_v4();
        let (schema, schema_id) = match &self.schema {
            Some(s) => {
                let id = crate::sink::iceberg::evolve::added_schema_id(meta, s);
                (Arc::new(s.clone().into_builder().with_schema_id(id).build()?), id)
            }
            None => (meta.current_schema().clone(), meta.current_schema_id()),
        };

        if self.data_sequence_number.is_some_and(|s| s < 0 || s >= seq) {
            return Err(Error::Internal(format!("a data sequence number must be below the new snapshot's ({seq})")));
        }
        let data_seq = self.data_sequence_number.unwrap_or(seq);
        let mut manifests: Vec<ManifestFile> = match parent {
            Some(p) => crate::spec::manifest_list::read(table.file_io(), p, version).await?.as_ref().clone(),
            None => Vec::new(),
        };
        let mut collector = SnapshotSummaryCollector::default();
        // manifests rewritten with removed entries stay out of merging: their DELETED entries tell incremental
        // readers what this snapshot removed
        let mut rewritten = Vec::new();
        if !self.remove.is_empty() || !self.replace_deletes_of.is_empty() || self.remove_all {
            let prefix = format!("{}/metadata/{commit_uuid}-r", meta.location());
            let removed = Removed { paths: &self.remove, deletes_of: &self.replace_deletes_of, all: self.remove_all };
            (manifests, rewritten) = remove_entries(table, &schema, snapshot_id, manifests, removed, &prefix, &mut collector, metadata_files).await?;
        }
        // One manifest per content and partition spec: a manifest holds files of one spec (a table whose spec
        // evolved writes equality deletes with its unpartitioned spec, data with the default one).
        let default_spec = meta.default_partition_spec_id();
        let mut groups: std::collections::BTreeMap<(u8, i32), (ManifestContentType, Vec<&DataFile>)> = std::collections::BTreeMap::new();
        for f in &self.data {
            groups.entry((0, default_spec)).or_insert_with(|| (ManifestContentType::Data, Vec::new())).1.push(f);
        }
        for (spec, f) in &self.deletes {
            groups.entry((1, spec.unwrap_or(default_spec))).or_insert_with(|| (ManifestContentType::Deletes, Vec::new())).1.push(f);
        }
        let mut merged = MergeStats::default();
        if self.merge_manifests {
            let adding = groups.keys().map(|(content, spec)| ((*content == 1, *spec), 1)).collect();
            let mut policy = merge::MergePolicy::of(meta);
            if self.rewrite {
                (policy.enabled, policy.min_count) = (true, 2);
            }
            let (kept, written, stats) = merge::merge(table, &schema, snapshot_id, manifests, &adding, &commit_uuid.to_string(), policy).await;
            manifests = kept;
            metadata_files.extend(written);
            merged = stats;
        }
        for m in rewritten.into_iter().rev() {
            manifests.insert(0, m);
        }
        for (n, ((_, spec_id), (content, files))) in groups.into_iter().enumerate() {
            let path = format!("{}/metadata/{commit_uuid}-m{n}.avro", meta.location());
            let (mut w, spec) = merge::manifest_writer(table, &schema, snapshot_id, content, spec_id, &path)?;
            for f in files {
                collector.add_file(f, schema.clone(), spec.clone());
                let seq = if content == ManifestContentType::Data { data_seq } else { seq };
                w.add_file(f.clone(), seq)?;
            }
            metadata_files.push(path.clone());
            // New manifests first: readers find this snapshot's files without scanning old ones.
            manifests.insert(0, w.write_manifest_file().await.map_err(|e| Error::io(&path, e, false))?);
        }

        let list_path = format!("{}/metadata/snap-{snapshot_id}-0-{commit_uuid}.avro", meta.location());
        metadata_files.push(list_path.clone());
        let out = table.file_io().new_output(&list_path)?.writer().await.map_err(|e| Error::io(&list_path, e, false))?;
        let parent_id = parent.map(|p| p.snapshot_id());
        let first_row_id = meta.next_row_id();
        let mut list = match version {
            FormatVersion::V1 => ManifestListWriter::v1(out, snapshot_id, parent_id),
            FormatVersion::V2 => ManifestListWriter::v2(out, snapshot_id, parent_id, seq),
            FormatVersion::V3 => ManifestListWriter::v3(out, snapshot_id, parent_id, seq, Some(first_row_id)),
        };
        list.add_manifests(manifests.into_iter())?;
        let next_row_id = list.next_row_id();
        list.close().await.map_err(|e| Error::io(&list_path, e, false))?;

        let mut props = collector.build();
        let prev = parent.map(|p| p.summary().additional_properties.clone()).unwrap_or_default();
        for (total, added, removed) in TOTALS {
            let n = |m: &HashMap<String, String>, k: &str| m.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            props.insert(total.to_string(), (n(&prev, total) + n(&props, added)).saturating_sub(n(&props, removed)).to_string());
        }
        if merged.created > 0 {
            props.insert("manifests-created".into(), (metadata_files.len() - 1).to_string());
            props.insert("manifests-replaced".into(), merged.replaced.to_string());
        }
        props.extend(self.properties);
        // a compaction adds no delete file: it only moves rows (`replace`); deletes added change rows
        let operation = match (self.rewrite, self.deletes.is_empty(), self.remove.is_empty()) {
            _ if self.remove_all => Operation::Overwrite,
            (true, _, _) => Operation::Replace,
            (false, false, _) => Operation::Overwrite,
            (false, true, false) => Operation::Replace,
            (false, true, true) => Operation::Append,
        };
        let builder = Snapshot::builder()
            .with_manifest_list(list_path)
            .with_snapshot_id(snapshot_id)
            .with_parent_snapshot_id(parent_id)
            .with_sequence_number(seq)
            .with_summary(Summary { operation, additional_properties: props })
            .with_schema_id(schema_id)
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis().max(meta.last_updated_ms() + 1));
        let snapshot = match next_row_id {
            Some(next) => builder.with_row_range(first_row_id, next - first_row_id).build(),
            None => builder.build(),
        };
        let mut requirements = vec![
            TableRequirement::UuidMatch { uuid: meta.uuid() },
            TableRequirement::RefSnapshotIdMatch { r#ref: MAIN_BRANCH.to_string(), snapshot_id: parent_id },
            // the files are written in a schema and a partition spec planned from these
            TableRequirement::CurrentSchemaIdMatch { current_schema_id: meta.current_schema_id() },
            TableRequirement::DefaultSpecIdMatch { default_spec_id: meta.default_partition_spec_id() },
        ];
        let mut updates = Vec::new();
        if let Some(s) = self.schema {
            requirements.push(TableRequirement::LastAssignedFieldIdMatch { last_assigned_field_id: meta.last_column_id() });
            updates.push(TableUpdate::AddSchema { schema: s });
            updates.push(TableUpdate::SetCurrentSchema { schema_id: -1 });
        }
        updates.push(TableUpdate::AddSnapshot { snapshot });
        updates.push(TableUpdate::SetSnapshotRef {
            ref_name: MAIN_BRANCH.to_string(),
            reference: SnapshotReference::new(snapshot_id, SnapshotRetention::branch(None, None, None)),
        });
        if !self.table_properties.is_empty() {
            updates.push(TableUpdate::SetProperties { updates: self.table_properties });
        }
        let metadata_files = std::mem::take(metadata_files);
        Ok(PreparedCommit { snapshot_id, sequence_number: seq, requirements, updates, metadata_files, merged: (merged.replaced, merged.created) })
    }
}

/// What a snapshot removes: files by path, and the deletion vectors (or single-file position deletes) of data files.
#[derive(Clone, Copy)]
struct Removed<'a> {
    paths: &'a std::collections::HashSet<String>,
    deletes_of: &'a std::collections::HashSet<String>,
    /// Every live file goes ([`RowDelta::remove_all`]).
    all: bool,
}

impl Removed<'_> {
    fn matches(&self, f: &DataFile) -> bool {
        self.all
            || self.paths.contains(f.file_path())
            || (f.content_type() == DataContentType::PositionDeletes && f.referenced_data_file().is_some_and(|r| self.deletes_of.contains(&r)))
    }
}

/// Rewrites the manifests of `manifests` that list a live file `remove` matches: that entry `DELETED` (its sequence
/// numbers kept, as the spec asks), the others `EXISTING`. Returns the manifests left untouched and the rewritten ones;
/// an error when a file to remove by path is not live in any manifest (the plan is stale).
#[allow(clippy::too_many_arguments)]
async fn remove_entries(
    table: &Table,
    schema: &iceberg::spec::SchemaRef,
    snapshot_id: i64,
    manifests: Vec<ManifestFile>,
    remove: Removed<'_>,
    prefix: &str,
    collector: &mut SnapshotSummaryCollector,
    written: &mut Vec<String>,
) -> Result<(Vec<ManifestFile>, Vec<ManifestFile>)> {
    let meta = table.metadata();
    let (mut kept, mut rewritten) = (Vec::new(), Vec::new());
    // paths, not entries: a Puffin file holds the deletion vectors of many data files, each an entry of its own
    let mut found = std::collections::HashSet::new();
    for m in manifests {
        let manifest = crate::source::files::manifest(table.file_io(), &m).await?;
        if !manifest.entries().iter().any(|e| e.is_alive() && remove.matches(&e.data_file)) {
            kept.push(m);
            continue;
        }
        let path = format!("{prefix}{}.avro", rewritten.len());
        let (mut w, spec) = merge::manifest_writer(table, schema, snapshot_id, m.content, m.partition_spec_id, &path)?;
        written.push(path);
        // a copied entry of a v3 data manifest carries the first row id it inherited (row lineage)
        for (e, file) in crate::spec::row_lineage::live_entries(meta.format_version(), &m, &manifest)? {
            let (Some(snapshot), Some(seq)) = (e.snapshot_id, e.sequence_number) else {
                return Err(Error::data(&m.manifest_path, "a live entry without snapshot id or sequence number after inheritance"));
            };
            let file_seq = e.file_sequence_number.or(Some(seq));
            if remove.matches(&file) {
                if remove.paths.contains(e.file_path()) {
                    if file.content_offset().is_some() {
                        // the Puffin file holds other data files' vectors too: those would go with it
                        return Err(Error::Internal(format!(
                            "{} holds deletion vectors: remove them by their data file (replace_deletes_of), not by path",
                            e.file_path()
                        )));
                    }
                    found.insert(e.file_path().to_string());
                }
                collector.remove_file(&file, schema.clone(), spec.clone());
                w.add_delete_file(file, seq, file_seq)?;
            } else {
                w.add_existing_file(file, snapshot, seq, file_seq)?;
            }
        }
        rewritten.push(w.write_manifest_file().await?);
    }
    if found.len() != remove.paths.len() {
        return Err(Error::Conflict {
            table: meta.location().to_string(),
            message: format!(
                "{} of the {} files to remove are no longer live (another writer changed the table)",
                remove.paths.len() - found.len(),
                remove.paths.len()
            ),
        });
    }
    Ok((kept, rewritten))
}

fn new_snapshot_id(table: &Table) -> i64 {
    loop {
        let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
        let id = ((a ^ b) & (i64::MAX as u64)) as i64;
        if id != 0 && table.metadata().snapshot_by_id(id).is_none() {
            return id;
        }
    }
}

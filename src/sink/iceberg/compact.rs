//! Compaction of a target: a streaming applier adds a small data file and an equality-delete file per partition
//! with nearly every commit, so readers open ever more files and join ever more deletes. Compaction rewrites the
//! live rows of those files into few, full ones and drops the delete files nothing needs any more.
//!
//! Algorithm:
//! 1. **Due** ([`due`], pure, cheap): from the head's summary totals — enough delete files or data files were added
//!    since the last plan. Planning reads every manifest, so it is not done after every commit.
//! 2. **Plan** ([`plan`], pure): data files are grouped by partition (spec and partition value). A group is compacted
//!    when at least `compact_delete_files` delete files apply to its files, or it holds at least
//!    `compact_small_files` files smaller than ¾ of `target_file_size`; then its small files and the files deletes
//!    apply to are rewritten. Groups go most deletes first, files oldest first, up to `max_bytes` of data (at least
//!    one file). A delete file is removed when every live data file it applies to is rewritten (or none is left).
//! 3. **Rewrite**: the chosen files' live rows (deletes applied by `cdc`'s own reader) are written into new files of
//!    the table's current schema and default spec, closed at `target_file_size`, within the memory budget.
//! 4. **Commit** ([`commit`]) one `replace` snapshot (`RowDelta::remove_files`). The new files get the data sequence
//!    number of the head the plan was made on, so that equality deletes committed since still apply to their rows. A
//!    commit that lands in between (the applier's, while a compaction runs in the background) is rebased on, unless
//!    something since contradicts the rewrite ([`rebase_blocker`]): a schema or spec change, a rollback, a position
//!    delete that may point into a rewritten file, or a file to remove that is no longer live. Then the round is
//!    skipped and its files removed, so a compaction never undoes or duplicates another commit.
//!
//! Invariants: the rows a reader sees are the same before and after (deletes up to the planned head were applied and
//! no longer apply to the new files — their sequence numbers are not above the new files' — and every later equality
//! delete does); a delete file goes only when no data file that stays can match it, and no file added after the plan
//! can (it has a higher data sequence number). Progress is untouched: the `replace` snapshot records none, so the
//! newest applier commit below it (or the table property) still answers.
//!
//! Row lineage (format v3): each row keeps its `_row_id` and `_last_updated_sequence_number` — read as stored or
//! inherited, written as columns of the new files (`spec::row_lineage`), as Iceberg Java's rewrite does.
//!
//! Not compacted: a head whose schema is not the current one.
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use arrow_array::RecordBatch;
use iceberg::spec::{DataFile, FormatVersion};
use iceberg::table::Table;

use crate::catalog::Catalog;
use crate::config::TargetConfig;
use crate::error::{Error, Result};
use crate::sink::iceberg::files::{remove_unreferenced, Content, PartitionedWriter, WriteLimits};
use crate::sink::iceberg::rowdelta::RowDelta;
use crate::source::changelog::{ChangelogScan, ScanOptions};
use crate::source::files::{self, FileEntry};

/// When a partition is compacted and how much one pass rewrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    /// Delete files applying to a group's data files that make it due.
    pub(crate) min_delete_files: usize,
    /// Small data files in a group that make it due.
    pub(crate) min_small_files: usize,
    /// A data file smaller than this is small.
    pub(crate) small_below: u64,
    /// Data bytes one pass rewrites at most (at least one file).
    pub(crate) max_bytes: u64,
    /// Whether a group's small files are merged by tiers ([`tier`]): after commits, so that a file earlier passes
    /// grew is not rewritten by every pass. `cdc maintain` and a target at rest merge them all.
    pub(crate) tiered: bool,
}

impl Policy {
    /// The policy `cfg` configures for compactions after commits.
    pub(crate) fn of(cfg: &TargetConfig) -> Self {
        Policy {
            min_delete_files: cfg.compact_delete_files.max(1),
            min_small_files: cfg.compact_small_files.max(2),
            small_below: cfg.target_file_size / 4 * 3,
            max_bytes: cfg.compact_max_bytes.max(1),
            tiered: true,
        }
    }
    /// `cdc maintain`'s: any delete file or two small files in a group, no byte bound.
    pub(crate) fn thorough(cfg: &TargetConfig) -> Self {
        Policy { max_bytes: u64::MAX, ..Policy::at_rest(cfg) }
    }
    /// A target at rest's (see `compact_idle_after`): as thorough as `cdc maintain`'s, a pass bounded like one
    /// after commits.
    pub(crate) fn at_rest(cfg: &TargetConfig) -> Self {
        Policy { min_delete_files: 1, min_small_files: 2, tiered: false, ..Policy::of(cfg) }
    }
}

/// Where a target stood when compaction was last planned: its head's total data and delete files.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    /// `total-data-files` of the head.
    pub(crate) data_files: u64,
    /// `total-delete-files` of the head.
    pub(crate) delete_files: u64,
}

impl Mark {
    /// The totals `table`'s head summary records (zero when it records none).
    pub(crate) fn of(table: &Table) -> Mark {
        let Some(head) = table.metadata().current_snapshot() else { return Mark::default() };
        let p = &head.summary().additional_properties;
        let n = |k: &str| p.get(k).and_then(|v| v.parse().ok()).unwrap_or(0);
        Mark { data_files: n("total-data-files"), delete_files: n("total-delete-files") }
    }
}

/// Whether planning is worth it: since `last`, enough delete files or data files were added for a group to be due.
/// Pure.
pub(crate) fn due(last: Mark, now: Mark, policy: &Policy) -> bool {
    now.delete_files.saturating_sub(last.delete_files) >= policy.min_delete_files as u64
        || now.data_files.saturating_sub(last.data_files) >= policy.min_small_files as u64
        // the table shrank below the mark (another writer compacted): start over from here
        || now.delete_files < last.delete_files && now.delete_files >= policy.min_delete_files as u64
}

/// A live data file as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Its partition group (equal for files of one spec and partition value).
    pub(crate) group: usize,
    /// File size in bytes.
    pub(crate) bytes: u64,
    /// Indices of the delete files that apply to it.
    pub(crate) deletes: Vec<usize>,
}

/// How much larger than the bytes already chosen a small file may be and still join a tiered pass.
const TIER_RATIO: u64 = 2;

/// The clean small files (`small`, indices into `data`) a tiered pass merges, oldest first: smallest first, each at
/// most [`TIER_RATIO`] times the bytes chosen before it (the files deletes apply to, `forced`, count as chosen).
///
/// Merging every small file of a group at each pass rewrites the file the passes before wrote every time: a
/// streaming target's partition below three quarters of `target_file_size` would be rewritten whole every
/// `compact_small_files` commits, a cost growing with the table. By tiers, a file waits until the files beside it add
/// up to half of it, so a row is rewritten about log₂(its file's size / a commit's) times, and a group keeps about
/// that many files beside those not yet merged. Pure.
fn tier(data: &[Candidate], forced: &[usize], mut small: Vec<usize>) -> Vec<usize> {
    small.sort_by_key(|&i| (data[i].bytes, i));
    let mut chosen_bytes: u64 = forced.iter().map(|&i| data[i].bytes).sum();
    let mut out = Vec::new();
    for i in small {
        if chosen_bytes > 0 && data[i].bytes > chosen_bytes.saturating_mul(TIER_RATIO) {
            break;
        }
        chosen_bytes = chosen_bytes.saturating_add(data[i].bytes);
        out.push(i);
    }
    out.sort_unstable();
    out
}

/// What one compaction does.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Indices of the data files to rewrite.
    pub(crate) rewrite: Vec<usize>,
    /// Indices of the delete files to remove.
    pub(crate) drop_deletes: Vec<usize>,
}

/// The compaction of `data` (live data files, oldest first) and `deletes` delete files under `policy` (see the
/// module docs). Pure.
pub(crate) fn plan(data: &[Candidate], deletes: usize, policy: &Policy) -> Plan {
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, c) in data.iter().enumerate() {
        groups.entry(c.group).or_default().push(i);
    }
    // (delete files, small files, members to rewrite) of each due group
    let mut due: Vec<(usize, usize, Vec<usize>)> = Vec::new();
    for members in groups.into_values() {
        let applying: HashSet<usize> = members.iter().flat_map(|i| data[*i].deletes.iter().copied()).collect();
        // files deletes apply to are rewritten whatever their size (that is what drops the deletes)
        let (forced, clean): (Vec<usize>, Vec<usize>) = members.iter().partition(|i| !data[**i].deletes.is_empty());
        let clean_small: Vec<usize> = clean.into_iter().filter(|i| data[*i].bytes < policy.small_below).collect();
        let clean_small = if policy.tiered { tier(data, &forced, clean_small) } else { clean_small };
        let small = forced.iter().filter(|i| data[**i].bytes < policy.small_below).count() + clean_small.len();
        if applying.len() < policy.min_delete_files && small < policy.min_small_files {
            continue;
        }
        let mut chosen: Vec<usize> = forced.into_iter().chain(clean_small).collect();
        chosen.sort_unstable();
        if chosen.len() == 1 && data[chosen[0]].deletes.is_empty() {
            continue; // one small file rewritten is the same file again
        }
        due.push((applying.len(), small, chosen));
    }
    due.sort_by_key(|d| std::cmp::Reverse((d.0, d.1)));
    let mut out = Plan::default();
    let mut bytes = 0u64;
    'groups: for (_, _, chosen) in due {
        for i in chosen {
            if !out.rewrite.is_empty() && bytes.saturating_add(data[i].bytes) > policy.max_bytes {
                break 'groups;
            }
            bytes = bytes.saturating_add(data[i].bytes);
            out.rewrite.push(i);
        }
    }
    let rewritten: HashSet<usize> = out.rewrite.iter().copied().collect();
    let mut needed = vec![false; deletes];
    for (i, c) in data.iter().enumerate() {
        if !rewritten.contains(&i) {
            for d in &c.deletes {
                needed[*d] = true;
            }
        }
    }
    out.drop_deletes = (0..deletes).filter(|d| !needed[*d]).collect();
    // delete files that apply to nothing are worth a commit of their own only in numbers
    if out.rewrite.is_empty() && out.drop_deletes.len() < policy.min_delete_files {
        return Plan::default();
    }
    out
}

/// What one compaction did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Compacted {
    /// Data files rewritten.
    pub data_files_rewritten: usize,
    /// Delete files removed.
    pub delete_files_removed: usize,
    /// Data files written in their place.
    pub data_files_written: usize,
    /// Bytes of the files removed (data and delete files).
    pub bytes_rewritten: u64,
    /// Rows the new files hold.
    pub rows: u64,
}

/// Plans and commits one compaction of `table` under `policy`, rewriting with a writer bounded by `memory_budget`:
/// [`rewrite`], then [`commit`] on `table` (rebased when another commit lands first). Returns the table after it and
/// what it did; `None` when there was nothing to do, the target is not compactable (see the module docs) or the
/// rewrite could not be committed (this round is skipped).
pub(crate) async fn compact(
    catalog: &Catalog,
    cfg: &TargetConfig,
    table: &Table,
    policy: &Policy,
    memory_budget: u64,
) -> Result<Option<(Table, Compacted)>> {
    match rewrite(cfg, table, policy, memory_budget).await? {
        Some(r) => commit(catalog, cfg, r, table.clone()).await,
        None => Ok(None),
    }
}

/// A compaction's files, written and not yet committed.
pub(crate) struct Rewritten {
    /// The table as it was planned on.
    planned: Table,
    /// New data files holding the live rows of `rewritten`.
    written: Vec<DataFile>,
    /// The data files rewritten (what a later position delete must not reference).
    rewritten: Vec<Arc<FileEntry>>,
    /// The delete files the compaction removes, by path.
    dropped: Vec<String>,
    /// The data files whose deletion vectors the compaction removes: vectors are removed by the file they apply to,
    /// not by path (one Puffin file holds the vectors of many data files, and those of files that stay must stay).
    dropped_vectors_of: Vec<String>,
    /// Every delete file live at the planned head (anything else was added since).
    planned_deletes: HashSet<String>,
    out: Compacted,
}

/// Plans one compaction of `table` under `policy` and writes its files (see the module docs); `None` when there is
/// nothing to do or the target is not compactable.
pub(crate) async fn rewrite(cfg: &TargetConfig, table: &Table, policy: &Policy, memory_budget: u64) -> Result<Option<Rewritten>> {
    let meta = table.metadata();
    let Some(head) = meta.current_snapshot().cloned() else { return Ok(None) };
    let schema = crate::spec::lineage::snapshot_schema(meta, Some(&head));
    if schema.schema_id() != meta.current_schema_id() {
        return Ok(None);
    }
    let lineage = meta.format_version() >= FormatVersion::V3;
    let concurrency = 2;
    let files = files::plan(table, &head, concurrency).await?;
    let mut data: Vec<Arc<FileEntry>> = files.data_after.values().cloned().collect();
    data.sort_by(|a, b| (a.seq, a.path()).cmp(&(b.seq, b.path())));
    let deletes = &files.deletes_after;
    let mut groups: std::collections::HashMap<(i32, &iceberg::spec::Struct), usize> = std::collections::HashMap::new();
    let candidates: Vec<Candidate> = data
        .iter()
        .map(|f| {
            let n = groups.len();
            let group = *groups.entry((f.spec_id, f.partition())).or_insert(n);
            let applying = deletes.iter().enumerate().filter(|(_, d)| files::delete_applies(d, f)).map(|(i, _)| i).collect();
            Candidate { group, bytes: f.file.file_size_in_bytes(), deletes: applying }
        })
        .collect();
    let chosen = plan(&candidates, deletes.len(), policy);
    if chosen.rewrite.is_empty() && chosen.drop_deletes.is_empty() {
        return Ok(None);
    }
    let rewrite: HashSet<String> = chosen.rewrite.iter().map(|i| data[*i].path().to_string()).collect();
    let mut out = Compacted {
        data_files_rewritten: chosen.rewrite.len(),
        delete_files_removed: chosen.drop_deletes.len(),
        bytes_rewritten: chosen.rewrite.iter().map(|i| data[*i].file.file_size_in_bytes()).sum::<u64>()
            + chosen.drop_deletes.iter().map(|i| deletes[*i].file.file_size_in_bytes()).sum::<u64>(),
        ..Default::default()
    };

    // rewrite: the scan's rows (with their lineage on v3), into files of the default spec
    let opts = ScanOptions {
        memory_budget: memory_budget / 2,
        configured_budget: memory_budget,
        spill_dir: std::env::temp_dir(),
        concurrency,
        key_order: false,
    };
    let scan = ChangelogScan::new(table, &schema, Vec::new(), opts)?;
    let written_schema =
        if lineage { Arc::new(crate::spec::row_lineage::with_lineage_columns(meta.current_schema())?) } else { meta.current_schema().clone() };
    let writer = PartitionedWriter::new(
        table,
        &written_schema,
        meta.default_partition_spec(),
        Content::Data,
        cfg.target_file_size as usize,
        WriteLimits::within(memory_budget / 2, written_schema.as_struct().fields().len(), true),
        &[],
    )?;
    let mut sink = Rewrite { writer, rows: 0 };
    let written = match scan.scan_live(&head, &files, Some(&rewrite), lineage, &mut sink).await {
        Ok(_) => {
            let opened = sink.writer.opened().to_vec();
            match sink.writer.finish().await {
                Ok(f) => f,
                Err(e) => {
                    remove_unreferenced(table.file_io(), opened).await;
                    return Err(e);
                }
            }
        }
        Err(e) => {
            remove_unreferenced(table.file_io(), sink.writer.opened().to_vec()).await;
            return Err(e);
        }
    };
    out.rows = sink.rows;
    out.data_files_written = written.len();
    Ok(Some(Rewritten {
        planned: table.clone(),
        written,
        rewritten: chosen.rewrite.iter().map(|i| data[*i].clone()).collect(),
        dropped: chosen.drop_deletes.iter().filter(|i| !deletes[**i].is_dv()).map(|i| deletes[*i].path().to_string()).collect(),
        dropped_vectors_of: chosen
            .drop_deletes
            .iter()
            .filter_map(|i| deletes[*i].is_dv().then(|| deletes[*i].file.referenced_data_file()).flatten())
            .collect(),
        planned_deletes: deletes.iter().map(|d| d.path().to_string()).collect(),
        out,
    }))
}

/// Commits `r` as one `replace` snapshot on `table` (the target as now known). When the head moved since the plan,
/// the rewrite is rebased onto it if nothing since contradicts it ([`rebase_blocker`]): the new files keep the
/// planned head's data sequence number, so equality deletes committed since still apply to their rows, and the
/// removed files must all still be live. A conflict reloads and tries again (3 attempts); a rewrite that cannot be
/// committed is skipped and its files removed. Returns the table after the commit and what it did.
pub(crate) async fn commit(catalog: &Catalog, cfg: &TargetConfig, r: Rewritten, mut table: Table) -> Result<Option<(Table, Compacted)>> {
    let planned_head =
        r.planned.metadata().current_snapshot().cloned().ok_or_else(|| Error::Internal("a compaction planned on an empty table".into()))?;
    let new_paths: Vec<String> = r.written.iter().map(|f| f.file_path().to_string()).collect();
    let removed: Vec<String> = r.rewritten.iter().map(|f| f.path().to_string()).chain(r.dropped.iter().cloned()).collect();
    let io = r.planned.file_io().clone();
    let skip = |why: String| {
        let garbage = new_paths.clone();
        let io = io.clone();
        async move {
            tracing::info!(table = %cfg.table, reason = %why, "the compaction is skipped; it is planned again later");
            remove_unreferenced(&io, garbage).await;
            Ok(None)
        }
    };
    for attempt in 1..=3 {
        if table.metadata().current_snapshot_id() != Some(planned_head.snapshot_id()) {
            if let Some(why) = rebase_blocker(&r, &planned_head, &table).await? {
                return skip(why).await;
            }
        }
        let delta = RowDelta::new()
            .add_data_files(r.written.iter().cloned())
            .data_sequence_number(planned_head.sequence_number())
            .remove_files(removed.iter().cloned())
            .replace_deletes_of(r.dropped_vectors_of.iter().cloned())
            .merge_manifests(cfg.merge_manifests);
        let prepared = match delta.prepare(&table).await {
            Ok(p) => p,
            // a file to remove is gone: another writer rewrote or removed it
            Err(Error::Conflict { message, .. }) => return skip(message).await,
            Err(e) => {
                remove_unreferenced(&io, new_paths).await;
                return Err(e);
            }
        };
        let manifests = prepared.metadata_files.clone();
        match catalog.commit(&table, prepared.requirements, prepared.updates).await {
            Ok(after) => {
                let since = commits_since(table.metadata(), planned_head.snapshot_id()).unwrap_or_default();
                if since > 0 {
                    tracing::info!(table = %cfg.table, commits = since, "the compaction was rebased on the commits that landed since its plan");
                }
                return Ok(Some((after, r.out)));
            }
            Err(Error::Conflict { message, .. }) if attempt < 3 => {
                tracing::info!(table = %cfg.table, %message, attempt, "another commit came before the compaction's; rebasing it");
                remove_unreferenced(&io, manifests).await;
                table = catalog.load_table(&cfg.table).await?;
            }
            // an unknown outcome keeps its files: the commit may still land (orphans at worst)
            Err(e @ Error::CommitUnknown { .. }) => return Err(e),
            Err(e) => {
                remove_unreferenced(&io, new_paths.into_iter().chain(manifests).collect()).await;
                return Err(e);
            }
        }
    }
    skip("other commits kept coming first".into()).await
}

/// Why a rewrite planned on `planned_head` must not be committed on `table`'s head, if it must not: the schema or
/// default spec changed (the files were written in the planned ones), the planned head is not an ancestor of the
/// head (a rollback, or expired: what happened since is unknown), or a position delete added since may reference a
/// rewritten file (its rows would come back). Equality deletes added since are fine: they apply to the new files.
async fn rebase_blocker(r: &Rewritten, planned_head: &iceberg::spec::SnapshotRef, table: &Table) -> Result<Option<String>> {
    let (meta, planned) = (table.metadata(), r.planned.metadata());
    if meta.current_schema_id() != planned.current_schema_id() || meta.default_partition_spec_id() != planned.default_partition_spec_id() {
        return Ok(Some("the target's schema or partition spec changed since it was planned".into()));
    }
    let Some(head) = meta.current_snapshot().cloned() else { return Ok(Some("the target has no snapshot any more".into())) };
    if commits_since(meta, planned_head.snapshot_id()).is_none() {
        return Ok(Some("the snapshot it was planned on is no longer an ancestor of the head".into()));
    }
    let now = files::plan(table, &head, 2).await?;
    let referencing = now.deletes_after.iter().filter(|d| {
        d.file.content_type() == iceberg::spec::DataContentType::PositionDeletes
            && !r.planned_deletes.contains(d.path())
            && r.rewritten.iter().any(|f| files::delete_applies(d, f))
    });
    Ok(referencing
        .map(|d| d.path().to_string())
        .next()
        .map(|p| format!("the position deletes in {p}, added since it was planned, may reference a rewritten file")))
}

/// How many commits of the main branch came after snapshot `planned` (`None`: it is not an ancestor of the head, or
/// the chain between them was expired).
fn commits_since(meta: &iceberg::spec::TableMetadata, planned: i64) -> Option<usize> {
    let mut at = meta.current_snapshot()?.clone();
    let mut n = 0;
    while at.snapshot_id() != planned {
        at = meta.snapshot_by_id(at.parent_snapshot_id()?)?.clone();
        n += 1;
    }
    Some(n)
}

/// Writes a compaction's rows (table rows from the scan, with their lineage on v3) as data files.
struct Rewrite {
    writer: PartitionedWriter,
    rows: u64,
}

impl crate::change::ChangeConsumer for Rewrite {
    async fn write(&mut self, rows: RecordBatch) -> Result<()> {
        self.rows += rows.num_rows() as u64;
        self.writer.write(&rows).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Policy = Policy { min_delete_files: 3, min_small_files: 3, small_below: 100, max_bytes: 1000, tiered: false };

    fn c(group: usize, bytes: u64, deletes: &[usize]) -> Candidate {
        Candidate { group, bytes, deletes: deletes.to_vec() }
    }

    #[test]
    fn a_group_is_compacted_once_enough_deletes_apply_to_it() {
        // group 0: three delete files apply (0, 1, 2): its files with deletes and its small files go; the big
        // clean one stays. group 1: one delete file, one small file: not due
        let data = [c(0, 500, &[0, 1]), c(0, 50, &[2]), c(0, 500, &[]), c(1, 50, &[3])];
        let p = plan(&data, 4, &P);
        assert_eq!(p.rewrite, vec![0, 1]);
        assert_eq!(p.drop_deletes, vec![0, 1, 2], "delete 3 still applies to a file that stays");
        // below the threshold nothing happens
        assert_eq!(plan(&data[..2], 4, &Policy { min_delete_files: 4, ..P }), Plan::default());
    }

    #[test]
    fn small_files_are_packed_once_there_are_enough() {
        let data = [c(0, 10, &[]), c(0, 20, &[]), c(0, 30, &[]), c(0, 700, &[]), c(1, 10, &[]), c(1, 10, &[])];
        let p = plan(&data, 0, &P);
        assert_eq!(p.rewrite, vec![0, 1, 2], "the full file and the group of two small ones stay");
        assert!(p.drop_deletes.is_empty());
    }

    #[test]
    fn after_commits_small_files_are_merged_by_tiers() {
        let tiered = Policy { small_below: 10_000, max_bytes: u64::MAX, tiered: true, ..P };
        // a file earlier passes grew (5 000 B) beside three commits' files: those three go, it stays
        let data = [c(0, 5_000, &[]), c(0, 10, &[]), c(0, 12, &[]), c(0, 11, &[])];
        assert_eq!(plan(&data, 0, &tiered).rewrite, vec![1, 2, 3]);
        assert_eq!(plan(&data, 0, &Policy { tiered: false, ..tiered }).rewrite, vec![0, 1, 2, 3], "merged whole");
        // it joins once the others reach half of it; a file a delete applies to counts as chosen
        let data = [c(0, 5_000, &[]), c(0, 1_000, &[]), c(0, 1_200, &[]), c(0, 1_100, &[])];
        assert_eq!(plan(&data, 0, &tiered).rewrite, vec![0, 1, 2, 3]);
        let data = [c(0, 5_000, &[]), c(0, 3_000, &[0]), c(0, 10, &[])];
        assert_eq!(plan(&data, 1, &Policy { min_delete_files: 1, ..tiered }).rewrite, vec![0, 1, 2]);
        // two commits' files beside a large one are not yet enough to be due
        assert_eq!(plan(&[c(0, 5_000, &[]), c(0, 10, &[]), c(0, 10, &[])], 0, &tiered), Plan::default());
    }

    /// A streaming target, replayed: every commit adds one file of 1 000 B and compaction runs after each when due
    /// (the chosen files becoming one file of their bytes). Tiered, each byte is rewritten about log₂(commits /
    /// `min_small_files`) times and a partition keeps a few dozen files at most; merged whole, bytes rewritten grow with the
    /// square of the commits.
    #[test]
    fn tiers_rewrite_each_byte_a_logarithmic_number_of_times() {
        let replay = |tiered: bool| {
            let policy = Policy { min_delete_files: 3, min_small_files: 16, small_below: u64::MAX, max_bytes: u64::MAX, tiered };
            let (mut files, mut rewritten, mut most) = (Vec::<u64>::new(), 0u64, 0usize);
            for _ in 0..4_000 {
                files.push(1_000);
                let data: Vec<Candidate> = files.iter().map(|&b| c(0, b, &[])).collect();
                let p = plan(&data, 0, &policy);
                if !p.rewrite.is_empty() {
                    let merged: u64 = p.rewrite.iter().map(|&i| files[i]).sum();
                    rewritten += merged;
                    let gone: HashSet<usize> = p.rewrite.iter().copied().collect();
                    files = files.iter().enumerate().filter(|(i, _)| !gone.contains(i)).map(|(_, b)| *b).collect();
                    files.push(merged);
                }
                most = most.max(files.len());
            }
            assert_eq!(files.iter().sum::<u64>(), 4_000_000, "no bytes lost or doubled");
            (rewritten as f64 / 4_000_000.0, most)
        };
        let (amplification, most) = replay(true);
        // (measured: 5.8 times, 20 files)
        assert!(amplification < 8.0, "tiered: each byte rewritten {amplification:.1} times");
        assert!(most <= 30, "tiered: {most} files at most");
        let (whole, _) = replay(false);
        assert!(whole > 100.0, "merged whole: each byte rewritten {whole:.1} times");
    }

    #[test]
    fn a_delete_that_applies_to_a_file_that_stays_is_kept() {
        // an unpartitioned table: the byte bound stops after the first two files; delete 0 applies to all three
        let data = [c(0, 400, &[0, 1]), c(0, 400, &[0, 2]), c(0, 400, &[0])];
        let p = plan(&data, 3, &P);
        assert_eq!(p.rewrite, vec![0, 1]);
        assert_eq!(p.drop_deletes, vec![1, 2]);
        // without the bound all go, and every delete with them
        let p = plan(&data, 3, &Policy { max_bytes: u64::MAX, ..P });
        assert_eq!((p.rewrite, p.drop_deletes), (vec![0, 1, 2], vec![0, 1, 2]));
    }

    #[test]
    fn the_byte_bound_takes_the_group_with_most_deletes_first_and_at_least_one_file() {
        let data = [c(0, 50, &[0, 1, 2]), c(1, 900, &[3, 4, 5, 6]), c(1, 900, &[3])];
        let p = plan(&data, 7, &P);
        assert_eq!(p.rewrite, vec![1], "group 1 has more deletes; its second file would pass the bound");
        assert_eq!(p.drop_deletes, vec![4, 5, 6]);
    }

    #[test]
    fn deletes_that_apply_to_nothing_go_when_there_are_enough_of_them() {
        let data = [c(0, 500, &[])];
        assert_eq!(plan(&data, 2, &P), Plan::default(), "two dangling deletes are not worth a commit");
        assert_eq!(plan(&data, 3, &P), Plan { rewrite: vec![], drop_deletes: vec![0, 1, 2] });
        // a lone small file is never rewritten into itself
        assert_eq!(plan(&[c(0, 10, &[])], 0, &Policy { min_small_files: 2, ..P }), Plan::default());
    }

    #[test]
    fn at_rest_one_delete_file_or_two_small_files_are_enough_within_the_same_byte_bound() {
        let cfg: TargetConfig =
            toml::from_str("table = \"t\"\ncompact_max_bytes = \"1KiB\"\n[catalog]\ntype = \"hadoop\"\nwarehouse = \"/w\"\n").unwrap();
        let rest = Policy::at_rest(&cfg);
        assert_eq!((rest.min_delete_files, rest.min_small_files, rest.max_bytes, rest.tiered), (1, 2, 1024, false));
        assert!(Policy::of(&cfg).tiered, "after commits, small files are merged by tiers");
        assert_eq!(Policy::thorough(&cfg).max_bytes, u64::MAX);
        let small = rest.small_below / 2;
        // one delete file on one small file: nothing after commits, all of it at rest
        let data = [c(0, small, &[0])];
        assert_eq!(plan(&data, 1, &Policy::of(&cfg)), Plan::default());
        assert_eq!(plan(&data, 1, &rest), Plan { rewrite: vec![0], drop_deletes: vec![0] });
        assert_eq!(plan(&[c(0, 10, &[]), c(0, 10, &[])], 0, &rest).rewrite, vec![0, 1]);
    }

    /// The quickstart's table (equality deletes for every update and delete) with `commits` more, and its catalog
    /// and a target configuration naming it.
    async fn table_with_deletes(dir: &std::path::Path, commits: i64) -> (Catalog, TargetConfig, Table) {
        let cfg: TargetConfig = toml::from_str(&format!(
            "table = \"{}\"\n[catalog]\ntype = \"sql\"\nwarehouse = \"{}\"\n",
            crate::quickstart::TABLE,
            dir.join("warehouse").display()
        ))
        .unwrap();
        let catalog = Catalog::connect(&cfg.catalog, "target").await.unwrap();
        let mut t = crate::quickstart::create_demo(&catalog).await.unwrap();
        for i in 0..commits {
            t = crate::quickstart::commit_changes(&catalog, &t, &[(10 + i, "new", 100), (1 + i % 3, "upd", i as i128)], &[10 + i - 1]).await.unwrap();
        }
        (catalog, cfg, t)
    }

    fn total(t: &Table, key: &str) -> u64 {
        t.metadata().current_snapshot().unwrap().summary().additional_properties[key].parse().unwrap()
    }

    /// A rewrite planned on one head and committed after more commits (updates and deletes of rewritten rows,
    /// inserts) keeps every row as iceberg-rust's own scan reads it: the new files keep the planned head's data
    /// sequence number, so the later equality deletes still apply to them. A second rewrite of the same files,
    /// planned on the same head, is then skipped and its files removed.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_rewrite_rebased_over_later_commits_keeps_every_row() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, cfg, t) = table_with_deletes(dir.path(), 6).await;
        let policy = Policy::thorough(&cfg);
        let r = rewrite(&cfg, &t, &policy, 64 << 20).await.unwrap().expect("due");
        let twin = rewrite(&cfg, &t, &policy, 64 << 20).await.unwrap().expect("due");
        let twin_files: Vec<String> = twin.written.iter().map(|f| f.file_path().to_string()).collect();
        let mut later = t.clone();
        for i in 0..3i64 {
            later = crate::quickstart::commit_changes(&catalog, &later, &[(1 + i, "later", 7), (50 + i, "later", 7)], &[2 + i * 3]).await.unwrap();
        }
        let before = crate::quickstart::rows(&later).await.unwrap();
        let (after, done) = commit(&catalog, &cfg, r, later.clone()).await.unwrap().expect("rebased and committed");
        assert!(done.data_files_rewritten >= 7 && done.delete_files_removed >= 7, "{done:?}");
        let head = after.metadata().current_snapshot().unwrap();
        assert_eq!(head.summary().operation, iceberg::spec::Operation::Replace);
        assert_eq!(head.parent_snapshot_id(), later.metadata().current_snapshot_id(), "committed on the newest head");
        assert_eq!(crate::quickstart::rows(&after).await.unwrap(), before, "the rows a reader sees are unchanged");
        assert!(total(&after, "total-delete-files") <= 3, "only the later commits' delete files stay: {:?}", head.summary());

        assert!(commit(&catalog, &cfg, twin, after.clone()).await.unwrap().is_none(), "its files are no longer live");
        assert!(twin_files.iter().all(|f| !std::path::Path::new(f.trim_start_matches("file:")).exists()), "a skipped rewrite leaves no file");
        assert_eq!(catalog.load_table(&cfg.table).await.unwrap().metadata().current_snapshot_id(), after.metadata().current_snapshot_id());
    }

    /// A position delete committed after the plan that points into a rewritten file blocks the rebase: committing
    /// the rewrite would bring the deleted row back.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_later_position_delete_into_a_rewritten_file_blocks_the_rebase() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, cfg, t) = table_with_deletes(dir.path(), 4).await;
        let r = rewrite(&cfg, &t, &Policy::thorough(&cfg), 64 << 20).await.unwrap().expect("due");
        let victim = r.rewritten[0].path().to_string();
        let path = format!("{}/data/later-pos-deletes.parquet", t.metadata().location());
        let partition = crate::sink::iceberg::deletes::Partition { spec_id: 0, value: iceberg::spec::Struct::empty() };
        let positions = std::collections::BTreeMap::from([(victim, roaring::RoaringTreemap::from_iter([0u64]))]);
        let pd = crate::sink::iceberg::deletes::write_position_delete_file(t.file_io(), &path, &partition, &positions).await.unwrap();
        let c = RowDelta::new().add_delete_files([pd]).prepare(&t).await.unwrap();
        let later = catalog.commit(&t, c.requirements, c.updates).await.unwrap();
        let before = crate::quickstart::rows(&later).await.unwrap();
        assert!(commit(&catalog, &cfg, r, later.clone()).await.unwrap().is_none());
        let now = catalog.load_table(&cfg.table).await.unwrap();
        assert_eq!(now.metadata().current_snapshot_id(), later.metadata().current_snapshot_id(), "nothing committed");
        assert_eq!(crate::quickstart::rows(&now).await.unwrap(), before);
    }

    #[test]
    fn planning_is_due_when_enough_files_came_since_the_last_plan() {
        let m = |d, x| Mark { data_files: d, delete_files: x };
        assert!(!due(m(10, 10), m(12, 12), &P));
        assert!(due(m(10, 10), m(10, 13), &P));
        assert!(due(m(10, 10), m(13, 10), &P));
        assert!(due(Mark::default(), m(0, 3), &P));
        // another writer compacted: the totals fell below the mark
        assert!(due(m(10, 40), m(10, 5), &P));
        assert!(!due(m(10, 40), m(10, 1), &P));
    }
}

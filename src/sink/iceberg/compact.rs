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
//! 4. **Commit** one `replace` snapshot (`RowDelta::remove_files`) that requires the head it was planned on: another
//!    commit in between skips this round (its files are removed), so a compaction never undoes or duplicates one.
//!
//! Invariants: the rows a reader sees are the same before and after (the new files get the new snapshot's sequence
//! number, so the deletes that were applied — all older — no longer apply to them, and any later equality delete
//! does); a delete file goes only when no data file that stays can match it. Progress is untouched: the `replace`
//! snapshot records none, so the newest applier commit below it (or the table property) still answers.
//!
//! Not compacted: format v3 targets (iceberg-rust 0.10.1 cannot carry a row's `_row_id` into a rewritten file, and
//! new row ids would break row lineage) and a head whose schema is not the current one.
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use arrow_array::RecordBatch;
use iceberg::spec::FormatVersion;
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
}

impl Policy {
    /// The policy `cfg` configures for compactions after commits.
    pub(crate) fn of(cfg: &TargetConfig) -> Self {
        Policy {
            min_delete_files: cfg.compact_delete_files.max(1),
            min_small_files: cfg.compact_small_files.max(2),
            small_below: cfg.target_file_size / 4 * 3,
            max_bytes: cfg.compact_max_bytes.max(1),
        }
    }
    /// `cdc maintain`'s: any delete file or two small files in a group, no byte bound.
    pub(crate) fn thorough(cfg: &TargetConfig) -> Self {
        Policy { min_delete_files: 1, min_small_files: 2, max_bytes: u64::MAX, ..Policy::of(cfg) }
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
        let small = members.iter().filter(|i| data[**i].bytes < policy.small_below).count();
        if applying.len() < policy.min_delete_files && small < policy.min_small_files {
            continue;
        }
        let chosen: Vec<usize> = members.into_iter().filter(|i| data[*i].bytes < policy.small_below || !data[*i].deletes.is_empty()).collect();
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

/// Plans and commits one compaction of `table` under `policy`, rewriting with a writer bounded by `memory_budget`.
/// Returns the table after it and what it did; `None` when there was nothing to do, the target is not compactable
/// (see the module docs) or another commit came first (this round is skipped).
pub(crate) async fn compact(
    catalog: &Catalog,
    cfg: &TargetConfig,
    table: &Table,
    policy: &Policy,
    memory_budget: u64,
) -> Result<Option<(Table, Compacted)>> {
    let meta = table.metadata();
    let Some(head) = meta.current_snapshot().cloned() else { return Ok(None) };
    let schema = crate::spec::lineage::snapshot_schema(meta, Some(&head));
    if meta.format_version() == FormatVersion::V3 || schema.schema_id() != meta.current_schema_id() {
        return Ok(None);
    }
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

    // rewrite: the scan's rows (change rows) cut to the table's columns, into files of the default spec
    let opts = ScanOptions {
        memory_budget: memory_budget / 2,
        configured_budget: memory_budget,
        spill_dir: std::env::temp_dir(),
        concurrency,
        key_order: false,
    };
    let scan = ChangelogScan::new(table, &schema, Vec::new(), opts)?;
    let columns = schema.as_struct().fields().len();
    let writer = PartitionedWriter::new(
        table,
        meta.current_schema(),
        meta.default_partition_spec(),
        Content::Data,
        cfg.target_file_size as usize,
        WriteLimits::within(memory_budget / 2, columns, true),
        &[],
    )?;
    let mut sink = Rewrite { writer, columns, rows: 0 };
    let written = match scan.scan_live(&head, &files, Some(&rewrite), &mut sink).await {
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
    let new_paths: Vec<String> = written.iter().map(|f| f.file_path().to_string()).collect();
    let removed = rewrite.into_iter().chain(chosen.drop_deletes.iter().map(|i| deletes[*i].path().to_string()));
    let prepared = match RowDelta::new().add_data_files(written).remove_files(removed).merge_manifests(cfg.merge_manifests).prepare(table).await {
        Ok(p) => p,
        Err(e) => {
            remove_unreferenced(table.file_io(), new_paths).await;
            return Err(e);
        }
    };
    let mut garbage = new_paths;
    garbage.extend(prepared.metadata_files.iter().cloned());
    match catalog.commit(table, prepared.requirements, prepared.updates).await {
        Ok(after) => Ok(Some((after, out))),
        Err(Error::Conflict { message, .. }) => {
            tracing::info!(table = %cfg.table, %message, "another commit came before the compaction; it is planned again later");
            remove_unreferenced(table.file_io(), garbage).await;
            Ok(None)
        }
        // an unknown outcome keeps its files: the commit may still land (orphans at worst)
        Err(e @ Error::CommitUnknown { .. }) => Err(e),
        Err(e) => {
            remove_unreferenced(table.file_io(), garbage).await;
            Err(e)
        }
    }
}

/// Writes a compaction's rows (change rows from the scan, all INSERTs) as data files.
struct Rewrite {
    writer: PartitionedWriter,
    /// The table's columns: the change rows' first ones.
    columns: usize,
    rows: u64,
}

impl crate::change::ChangeConsumer for Rewrite {
    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        let data = batch.project(&(0..self.columns).collect::<Vec<_>>())?;
        self.rows += data.num_rows() as u64;
        self.writer.write(&data).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Policy = Policy { min_delete_files: 3, min_small_files: 3, small_below: 100, max_bytes: 1000 };

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

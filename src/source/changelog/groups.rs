//! Carry-over groups of a copy-on-write rewrite: the rows a group's worker receives, how its survivors are netted,
//! and how groups are fitted into the memory budget (split into parts, the least one-pass budget).
use super::*;

/// What a carry-over group's worker receives: rows in the protocol's order, then the end.
pub(super) enum GroupRows {
    Rows(FileRows),
    Done,
}

/// Where a carry-over group's survivors go.
#[derive(Clone)]
pub(super) enum GroupNet {
    /// Into the snapshot's netter, shared by every group (its merge puts the whole snapshot in key order).
    Shared(Arc<std::sync::Mutex<Netter>>, Option<Arc<Slim>>),
    /// Into a netter of the group's own, whose netted rows go to `tx` when the group is done (partition-aligned
    /// groups; see `ScanOptions::key_order`).
    /// Either way `slim`: removed rows carry only what the sink reads of them (see `super::slim`).
    Own { data_schema: SchemaRef, key_idx: Vec<usize>, budget: u64, tx: tokio::sync::mpsc::Sender<RecordBatch>, slim: Option<Arc<Slim>> },
}

impl GroupNet {
    pub(super) fn slim(&self) -> Option<Arc<Slim>> {
        match self {
            GroupNet::Own { slim, .. } | GroupNet::Shared(_, slim) => slim.clone(),
        }
    }

    /// The side carry-over takes whole first: the removed rows when they are slim (a fraction of a row to hold or
    /// spill), else the added rows.
    pub(super) fn first_side(&self) -> Side {
        if self.slim().is_some() {
            Side::Removed
        } else {
            Side::Added
        }
    }
}

/// A group's survivors on their way, in the group's worker: made from its [`GroupNet`].
pub(super) enum Survivors {
    Shared(Arc<std::sync::Mutex<Netter>>),
    Own(Box<Netter>, tokio::sync::mpsc::Sender<RecordBatch>),
}

impl Survivors {
    pub(super) fn new(net: GroupNet, spill_dir: &std::path::Path) -> Result<Self> {
        Ok(match net {
            GroupNet::Shared(n, _) => Survivors::Shared(n),
            GroupNet::Own { data_schema, key_idx, budget, tx, .. } => {
                // carry-over has cancelled every identical pair already (and slim removed rows hold placeholders)
                let netter = Netter::new(data_schema, key_idx, budget, spill_dir)?.without_cancelling();
                Survivors::Own(Box::new(netter), tx)
            }
        })
    }

    pub(super) fn push(&mut self, side: Side, batch: RecordBatch) -> Result<()> {
        match self {
            Survivors::Shared(n) => n.lock().map_err(|_| Error::Internal("the netter's lock is poisoned".into()))?.push(side, batch),
            Survivors::Own(n, _) => n.push(side, batch),
        }
    }

    /// An own netter nets the group and sends its rows on; its statistics, or None when the receiver is gone. A
    /// shared netter is finished by the scan: nothing to do here.
    pub(super) async fn finish(self) -> Result<Option<NetStats>> {
        let Survivors::Own(netter, tx) = self else {
            return Ok(Some(NetStats::default()));
        };
        let mut merge = netter.finish()?;
        while let Some(b) = merge.next_batch()? {
            if tx.send(b).await.is_err() {
                return Ok(None);
            }
        }
        Ok(Some(merge.stats()))
    }
}

/// Upper bounds on the rows of one carry-over group's sides (manifest record counts): the side carry-over takes
/// first, which its plan is sized by, and the other.
#[derive(Clone, Copy)]
pub(super) struct GroupRowsBound {
    pub(super) first: u64,
    pub(super) second: u64,
}

/// Whether carry-over can match a group of `rows` with `share` bytes of the scan's budget: rows a side within what it
/// numbers, and a plan that fits ([`CarryOver::parts_for`]). Else what to do about it: the configured budget that
/// would do (the share is a fixed part of it, so the least share with a plan is scaled back), or partitioning the table.
pub(super) fn group_fits(rows: GroupRowsBound, share: u64, opts: &ScanOptions) -> std::result::Result<(), String> {
    let plan = CarryOver::parts_for(rows.first, share);
    if rows.first.max(rows.second) >= MAX_MATCHER_ROWS && plan != Some(1) {
        return Err(format!(
            "carry-over matches at most {MAX_MATCHER_ROWS} rows a side in one partition; partition the table (e.g. by bucket(N, key)) so that a rewrite touches smaller partitions"
        ));
    }
    if plan.is_none() {
        let needed = (CarryOver::least_share(rows.first) as u128 * opts.memory_budget.max(1) as u128).div_ceil(share.max(1) as u128);
        return Err(format!(
            "matching its rows needs engine.memory_budget = \"{}MiB\" or more (it is {} MiB); raise it in the config",
            opts.configured_for(u64::try_from(needed).unwrap_or(u64::MAX)) >> 20,
            opts.configured_budget.div_ceil(1 << 20)
        ));
    }
    Ok(())
}

/// An upper bound on the rows a group's files add or remove (manifest record counts of the files that can).
pub(super) fn side_upper(jobs: &[FileJob], side: Side) -> u64 {
    jobs.iter().filter(|j| if side == Side::Added { j.can_add() } else { j.can_remove() }).map(|j| j.file.file.record_count()).sum()
}

/// What one carry-over group may use: bytes of memory, concurrent file reads, and, when groups take turns with
/// the share, the turn it waits for before reading.
pub(super) struct GroupBudget {
    pub(super) share: u64,
    pub(super) reads: usize,
    pub(super) turn: Option<Arc<tokio::sync::Semaphore>>,
}

/// What one carry-over group did.
pub(super) struct GroupDone {
    /// (files, rows, bytes) read.
    pub(super) totals: (u64, u64, u64),
    pub(super) carry: CarryStats,
    /// The group's own netting (zero when it shared the snapshot's netter).
    pub(super) net: NetStats,
}

/// What pushing a snapshot's rows through carry-over gives back: the sums over its groups.
#[derive(Default)]
pub(super) struct CarryPushed {
    /// (files, rows, bytes) read.
    pub(super) totals: (u64, u64, u64),
    pub(super) carry: CarryStats,
    pub(super) net: NetStats,
    pub(super) in_parts: Option<InParts>,
}

/// How the carry-over groups of one snapshot share the carry-over part of a scan budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct GroupPlan {
    /// Bytes each group may hold.
    pub(super) share: u64,
    /// Whether groups take turns with a larger share (some group would be split into parts at an even split).
    pub(super) solo: bool,
    /// Whether every group matches in one part, in memory.
    pub(super) one_pass: bool,
}

impl GroupPlan {
    /// The plan for groups of `rows` (each the rows of the side carry-over takes first) with a scan `budget`, `k`
    /// groups at once.
    ///
    /// When groups would have to be split, they take turns instead: one group at a time holds the carry-over
    /// share (at 100 M rows 43 of a group's 77 parts stay resident instead of 25, so less of the removed side is
    /// spilled: 15.8 → 13.3 GB), and hands it on as soon as its resident parts are matched; the next group then
    /// reads and matches while this one matches its other parts from disk and streams its survivors, so both
    /// cores stay busy. The finishing group still holds a part's matcher, its survivor lists' buffers, its
    /// parts' file buffers and the batches it streams: a quarter of the share is left for that (with an eighth,
    /// peak RSS reached 394 MB at 100 M rows, over budget + 128 MB).
    pub(super) fn new(rows: &[u64], budget: u64, k: usize) -> Self {
        let carry_share = share_of(budget, CARRY_SHARE);
        let fits = |share: u64| rows.iter().all(|r| CarryOver::parts_for(*r, share) == Some(1));
        let solo = k > 1 && !fits(carry_share / k as u64);
        let share = if solo { carry_share - carry_share / 4 } else { (carry_share / k as u64).max(1) };
        GroupPlan { share, solo, one_pass: fits(share) }
    }

    /// The least scan budget with which every group of `rows` matches in one part (its matcher in memory): from
    /// there a rewrite costs the same per row whatever its size.
    pub(super) fn least_one_pass_budget(rows: &[u64], k: usize) -> u64 {
        least_bytes(|budget| GroupPlan::new(rows, budget, k).one_pass)
    }
}

/// A snapshot whose carry-over groups did not all match in memory: some were split into parts and spilled, which
/// costs more per row than one pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InParts {
    /// Rows of the largest group (the side carry-over takes first).
    pub largest_group_rows: u64,
    /// The least `engine.memory_budget` with which every group would have matched in one part.
    pub one_pass_budget: u64,
}

//! The runner's decisions, as pure functions of the source's metadata and what the sinks record: which of a
//! pipeline's sinks share one read of the source ([`shared_reads`], fixed by their configuration), where a run starts
//! ([`decide_start`]), which commits it makes ([`chunks`]), and how sinks at different progress share one read
//! ([`share`]). The apply loop in `pipeline` only carries them out, so every rule here is tested without a catalog.
//!
//! Invariants: a run never re-applies a source snapshot a sink records, never skips one (a `--from` that would is a
//! gap error), and never moves a sink's progress backwards along the source's history; every plan's last commit is
//! forced, so the sink ends recording exactly the end of the range.
//!
//! History rewrites: when the sink's progress `p` is no longer on the history of the range's end `e` (the owner rolled
//! back, cherry-picked onto another line, set the current snapshot to an orphan, or replaced the table), the plan is
//! one commit that brings the sink from the source's state at `p` to its state at `e` ([`Start::Rewritten`]): with a
//! common ancestor `c` (the newest ancestor of `p` that is also one of `e`), the inverse of the changes of `(c, p]`,
//! newest first, then the changes of `(c, e]` — a rollback is the case `c = e`; without one, every row of `p` deleted
//! and every row of `e` inserted. Both are exact for any sink that applies change rows in order, and need only
//! snapshots the source still has. A progress still on the current main branch is never undone: a `--to` before it
//! is simply done.
use iceberg::spec::{SnapshotRef, TableMetadata};

use crate::config::{OnHistoryRewrite, SinkConfig};
use crate::error::{Error, Result};
use crate::sink::{Chunk, Initial, Rewrite, RewriteKind};
use crate::spec::lineage::{self, Bound};

/// Where a run starts, decided from the sink's recorded progress and the user's `--from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// Copy the source's contents at the end snapshot (the sink has no progress and no `--from`).
    Bootstrap,
    /// Apply the changes after this source snapshot.
    After(i64),
    /// Apply every change from the source's first snapshot (a sink that starts at the beginning).
    Beginning,
    /// The sink is already at or past the end of the range.
    Done(i64),
    /// The sink's progress `from` is off the end's history: undo back to `common` (none: every row of `from`), then
    /// apply up to the end.
    Rewritten {
        /// The sink's progress.
        from: i64,
        /// The newest snapshot on both histories.
        common: Option<i64>,
        /// What happened, by the shape of the histories.
        kind: RewriteKind,
    },
}

/// The source range a run covers: the table's metadata, its name (for messages) and the range's end snapshot.
#[derive(Clone, Copy)]
pub(crate) struct Range<'a> {
    pub(crate) meta: &'a TableMetadata,
    pub(crate) name: &'a str,
    pub(crate) end: &'a SnapshotRef,
}

impl Range<'_> {
    /// The schema of the source at `snapshot` (the rows of its changes come in it).
    pub(crate) fn schema_at(&self, snapshot: &SnapshotRef) -> iceberg::spec::SchemaRef {
        lineage::snapshot_schema(self.meta, Some(snapshot))
    }

    /// Snapshot `id` of the source, or a message naming it.
    pub(crate) fn snapshot(&self, id: i64) -> Result<SnapshotRef> {
        self.meta.snapshot_by_id(id).cloned().ok_or(Error::SnapshotNotFound { table: self.name.into(), snapshot: id })
    }
}

/// Resolves a `--from` bound (snapshot id or timestamp) to a snapshot id of the table.
pub(crate) fn resolve_bound(table: &str, meta: &TableMetadata, b: Bound) -> Result<i64> {
    match b {
        Bound::Snapshot(id) => meta.snapshot_by_id(id).map(|s| s.snapshot_id()).ok_or(Error::SnapshotNotFound { table: table.into(), snapshot: id }),
        Bound::TimestampMs(ts) => lineage::main_lineage(meta)
            .iter()
            .rev()
            .find(|s| s.timestamp_ms() <= ts)
            .map(|s| s.snapshot_id())
            .ok_or_else(|| Error::Range(format!("no snapshot of `{table}` at or before {}", lineage::fmt_ms(ts)))),
    }
}

/// Decides where a run over `range` starts for sink `target`, from its recorded progress (a source snapshot id),
/// `--from` and where the sink starts without progress.
///
/// | recorded | `--from` | start |
/// |---|---|---|
/// | none | none | bootstrap copy, or the beginning (per sink) |
/// | none | a | after a |
/// | p ≥ end | any | done |
/// | p, expired | any | error: recreate the target |
/// | p, off the end's history (rolled back, replaced) | any | the history was rewritten: follow it, or stop by `policy` |
/// | p | none, or a ≤ p | after p (what is applied is skipped) |
/// | p | a > p | error: a gap |
///
/// "Past the end" needs p on the source's current main branch: a p the source rolled back from is rewritten even
/// when the end is one of its ancestors. A `--from` that is not an ancestor of the end is an error in every row.
pub(crate) fn decide_start(
    range: Range,
    target: &str,
    from: Option<i64>,
    recorded: Option<i64>,
    initial: Initial,
    policy: OnHistoryRewrite,
) -> Result<Start> {
    let Range { meta, name, end } = range;
    let end = end.snapshot_id();
    let on_history = |id: i64| lineage::is_ancestor(meta, id, end);
    if let Some(a) = from {
        if a != end && !on_history(a) {
            return Err(if lineage::is_ancestor(meta, end, a) {
                Error::Range(format!("--from snapshot {a} is after the end of the range ({end}); the start must be older than the end"))
            } else {
                Error::Range(format!(
                    "--from snapshot {a} is not on the history of snapshot {end} in `{name}` (rolled back, or on another branch); pick a start from `cdc snapshots`"
                ))
            });
        }
    }
    let Some(p) = recorded else {
        return Ok(match (from, initial) {
            (Some(a), _) => Start::After(a),
            (None, Initial::Copy) => Start::Bootstrap,
            (None, Initial::Beginning) => Start::Beginning,
        });
    };
    if meta.snapshot_by_id(p).is_none() {
        return Err(Error::Range(format!(
            "the target `{target}` is at source snapshot {p}, which no longer exists in `{name}` (expired); the changes since then cannot be read — drop the target and sync again to copy the source afresh"
        )));
    }
    let on_main = meta.current_snapshot_id().is_some_and(|head| lineage::is_ancestor(meta, p, head));
    if p == end || (on_main && lineage::is_ancestor(meta, end, p)) {
        return Ok(Start::Done(p)); // already at or past the end
    }
    if !on_history(p) {
        let common = lineage::ancestors(meta, Some(p)).map(|s| s.snapshot_id()).find(|&s| on_history(s));
        let kind = match common {
            Some(c) if c == end => RewriteKind::Rollback,
            Some(_) => RewriteKind::Rewrite,
            None => RewriteKind::Replace,
        };
        if policy == OnHistoryRewrite::Stop {
            return Err(Error::HistoryRewritten { table: name.into(), target: target.into(), kind: kind.as_str(), from: p.to_string(), to: end });
        }
        return Ok(Start::Rewritten { from: p, common, kind });
    }
    match from {
        // what is already applied is skipped
        Some(a) if a == p || lineage::is_ancestor(meta, a, p) => Ok(Start::After(p)),
        Some(a) => Err(Error::Range(format!(
            "gap: the target `{target}` is at source snapshot {p} but --from starts after {a}; the changes in between would be lost. Run without --from to resume, or use --from-snapshot {p}"
        ))),
        None => Ok(Start::After(p)),
    }
}

/// The commits of a run that starts at `start` (not [`Start::Done`]): one bootstrap copy of the end snapshot, or the
/// snapshots after the start in groups of `per_commit`, the last one forced (it records how far the run got). Each
/// commit's schema is that of its last snapshot; bases are set as commits land.
pub(crate) fn chunks(range: Range, start: Start, per_commit: usize) -> Result<Vec<Chunk>> {
    let lower = match start {
        Start::Bootstrap => {
            return Ok(vec![Chunk {
                snapshots: vec![range.end.clone()],
                bootstrap: true,
                schema: range.schema_at(range.end),
                base: None,
                must_commit: true,
                rewrite: None,
            }])
        }
        Start::Done(_) => return Ok(Vec::new()),
        Start::Rewritten { from, common, kind } => return Ok(vec![rewrite_chunk(range, from, common, kind)?]),
        Start::After(a) => Some(Bound::Snapshot(a)),
        Start::Beginning => None,
    };
    let snapshots = lineage::resolve_range(range.name, range.meta, lower, Some(Bound::Snapshot(range.end.snapshot_id())))?;
    let groups: Vec<&[SnapshotRef]> = snapshots.chunks(per_commit.max(1)).collect();
    let n = groups.len();
    Ok(groups
        .into_iter()
        .enumerate()
        .map(|(i, g)| Chunk {
            snapshots: g.to_vec(),
            bootstrap: false,
            schema: range.schema_at(g.last().expect("chunks are not empty")),
            base: None,
            must_commit: i + 1 == n,
            rewrite: None,
        })
        .collect())
}

/// The one commit that follows a rewrite of the source's history from `from` to the range's end (see the module
/// docs): every snapshot it reads exists, since `common` was found walking `from`'s ancestors.
fn rewrite_chunk(range: Range, from: i64, common: Option<i64>, kind: RewriteKind) -> Result<Chunk> {
    let end = range.end.clone();
    let from_snap = range.snapshot(from)?;
    let (undo, clear, snapshots) = match common {
        Some(c) => {
            let undo: Vec<SnapshotRef> = lineage::ancestors(range.meta, Some(from)).take_while(|s| s.snapshot_id() != c).collect();
            let forward = if c == end.snapshot_id() {
                Vec::new()
            } else {
                lineage::resolve_range(range.name, range.meta, Some(Bound::Snapshot(c)), Some(Bound::Snapshot(end.snapshot_id())))?
            };
            (undo, None, forward)
        }
        None => (Vec::new(), Some(from_snap), Vec::new()),
    };
    Ok(Chunk {
        schema: range.schema_at(&end),
        rewrite: Some(Rewrite { kind, from: Some(from), to: end, undo, copy: clear.is_some(), clear }),
        snapshots,
        bootstrap: false,
        base: None,
        must_commit: true,
    })
}

/// Which of a pipeline's sinks share one read of the source (one loop of the service, one [`crate::sink::fanout::FanOut`]),
/// as indices into `sinks`: one Iceberg table and one Kafka topic do — the topic then carries what the table committed,
/// in the same commits; any other set reads once per sink, so that each fails, lags and is counted alone. The Iceberg
/// table comes first in a shared read (commit order: the table before the topic).
pub(crate) fn shared_reads<C>(sinks: &[SinkConfig<C>]) -> Vec<Vec<usize>> {
    let tables: Vec<usize> = (0..sinks.len()).filter(|&i| matches!(sinks[i], SinkConfig::Iceberg(_))).collect();
    let others: Vec<usize> = (0..sinks.len()).filter(|&i| !matches!(sinks[i], SinkConfig::Iceberg(_))).collect();
    match (tables.as_slice(), others.as_slice()) {
        ([t], [k]) if matches!(sinks[*k], SinkConfig::Kafka(_)) => vec![vec![*t, *k]],
        _ => (0..sinks.len()).map(|i| vec![i]).collect(),
    }
}

/// How sinks fed by one read of the source run.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Sharing {
    /// Nothing recorded anywhere and the sinks start differently (a copy here, every change there), or sinks at
    /// different progress of which one is on a line the source's history left: each runs alone.
    Separately,
    /// The sinks at these indices first catch up alone to `to`, the most advanced progress; then all run together.
    CatchUp { behind: Vec<usize>, to: i64 },
    /// All record the same progress: one shared run.
    Together,
}

/// Decides how sinks recording `recorded` (in the same order as `initials`) share a run over the source `meta`.
pub(crate) fn share(meta: &TableMetadata, recorded: &[Option<i64>], initials: &[Initial]) -> Sharing {
    // a progress the source's main branch left (a rewritten history): each sink follows the rewrite from its own
    let on_main = |p: i64| meta.current_snapshot_id().is_some_and(|head| lineage::is_ancestor(meta, p, head));
    if recorded.iter().flatten().any(|p| !on_main(*p)) && recorded.iter().any(|p| *p != recorded[0]) {
        return Sharing::Separately;
    }
    // the most advanced progress on the source's history (None: nothing recorded)
    let ahead = recorded.iter().flatten().copied().fold(None, |best: Option<i64>, p| match best {
        Some(b) if lineage::is_ancestor(meta, p, b) => Some(b),
        _ => Some(p),
    });
    match ahead {
        None if initials.iter().any(|i| *i != initials[0]) => Sharing::Separately,
        Some(to) if recorded.iter().any(|p| *p != ahead) => {
            Sharing::CatchUp { behind: recorded.iter().enumerate().filter(|(_, p)| **p != ahead).map(|(i, _)| i).collect(), to }
        }
        _ => Sharing::Together,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_table_and_one_topic_share_a_read_and_any_other_set_reads_alone() {
        let text = "[source]\ntable='a.b'\n[source.catalog]\ntype='hadoop'\nwarehouse='/w'\n";
        let kafka = |topic: &str| format!("[[sinks]]\ntype='kafka'\nbootstrap_servers='k:9092'\ntopic='{topic}'\n");
        let iceberg = |table: &str| format!("[[sinks]]\ntype='iceberg'\ntable='{table}'\n[sinks.catalog]\ntype='sql'\nwarehouse='/r'\n");
        let reads = |sinks: &[String]| shared_reads(&crate::config::Config::parse(&format!("{text}{}", sinks.concat())).unwrap().sinks);
        assert_eq!(reads(&[kafka("t"), iceberg("r.t")]), [vec![1, 0]], "the table first");
        assert_eq!(reads(&[iceberg("r.t"), iceberg("r.u")]), [vec![0], vec![1]]);
        assert_eq!(reads(&[iceberg("r.t"), kafka("t"), kafka("u")]), [vec![0], vec![1], vec![2]]);
        assert_eq!(reads(&[kafka("t")]), [vec![0]]);
    }
    use crate::spec::testing::metadata;
    use serde_json::json;

    /// main: 1 ← 2 ← 3 ← 4; a rolled-back branch 2 ← 9.
    fn table() -> TableMetadata {
        let s = |id, parent, seq| (id, parent, seq, 1_000 * id, json!({}));
        metadata(&[s(1, None, 1), s(2, Some(1), 2), s(3, Some(2), 3), s(4, Some(3), 4), s(9, Some(2), 5)], json!({}), json!({}), 4)
    }

    fn start(end: i64, from: Option<i64>, recorded: Option<i64>, initial: Initial) -> Result<Start> {
        let meta = table();
        let end = meta.snapshot_by_id(end).unwrap().clone();
        decide_start(Range { meta: &meta, name: "db.t", end: &end }, "r.t", from, recorded, initial, OnHistoryRewrite::Follow)
    }

    fn err(r: Result<Start>) -> String {
        r.expect_err("an error").to_string()
    }

    #[test]
    fn every_row_of_the_start_table() {
        use Initial::{Beginning, Copy};
        // nothing recorded
        assert_eq!(start(4, None, None, Copy).unwrap(), Start::Bootstrap);
        assert_eq!(start(4, None, None, Beginning).unwrap(), Start::Beginning);
        assert_eq!(start(4, Some(2), None, Copy).unwrap(), Start::After(2));
        // recorded at or past the end
        assert_eq!(start(4, None, Some(4), Copy).unwrap(), Start::Done(4));
        assert_eq!(start(3, None, Some(4), Copy).unwrap(), Start::Done(4));
        assert_eq!(start(3, Some(1), Some(4), Copy).unwrap(), Start::Done(4));
        // resume: what is applied is skipped
        assert_eq!(start(4, None, Some(2), Copy).unwrap(), Start::After(2));
        assert_eq!(start(4, Some(1), Some(2), Copy).unwrap(), Start::After(2));
        assert_eq!(start(4, Some(2), Some(2), Copy).unwrap(), Start::After(2));
        // a gap
        let e = err(start(4, Some(3), Some(2), Copy));
        assert!(e.contains("gap") && e.contains("--from-snapshot 2"), "{e}");
        // progress expired
        assert!(err(start(4, None, Some(77), Copy)).contains("no longer exists"));
        // progress on a line the source left (9 forks from 2): undone back to 2, then 3 and 4 applied
        assert_eq!(start(4, None, Some(9), Copy).unwrap(), Start::Rewritten { from: 9, common: Some(2), kind: RewriteKind::Rewrite });
        assert_eq!(start(2, None, Some(9), Copy).unwrap(), Start::Rewritten { from: 9, common: Some(2), kind: RewriteKind::Rollback });
        // --from after the end, or off its history
        assert!(err(start(2, Some(4), None, Copy)).contains("after the end of the range"));
        assert!(err(start(4, Some(9), None, Copy)).contains("not on the history"));
    }

    /// main after a rollback to 2: 1 ← 2 (current); 2 ← 3 ← 4 left behind; 7 ← 8 a replacement's own line.
    fn rolled_back() -> TableMetadata {
        let s = |id, parent, seq| (id, parent, seq, 1_000 * id, json!({}));
        metadata(&[s(1, None, 1), s(2, Some(1), 2), s(3, Some(2), 3), s(4, Some(3), 4), s(7, None, 5), s(8, Some(7), 6)], json!({}), json!({}), 2)
    }

    #[test]
    fn a_progress_the_source_left_is_followed_back_never_taken_for_done() {
        let meta = rolled_back();
        let at = |end: i64, recorded: i64, policy| {
            let end = meta.snapshot_by_id(end).unwrap().clone();
            decide_start(Range { meta: &meta, name: "db.t", end: &end }, "r.t", None, Some(recorded), Initial::Copy, policy)
        };
        // the source went back from 4 to 2: 2 is an ancestor of 4, yet the target is not done — it holds 3 and 4
        assert_eq!(at(2, 4, OnHistoryRewrite::Follow).unwrap(), Start::Rewritten { from: 4, common: Some(2), kind: RewriteKind::Rollback });
        // a progress still on the main branch past a --to is done
        assert_eq!(at(1, 2, OnHistoryRewrite::Follow).unwrap(), Start::Done(2));
        // a replacement shares nothing with 4
        assert_eq!(at(8, 4, OnHistoryRewrite::Follow).unwrap(), Start::Rewritten { from: 4, common: None, kind: RewriteKind::Replace });
        // stop: a clear error with its own exit code, never done
        let e = at(2, 4, OnHistoryRewrite::Stop).unwrap_err();
        assert_eq!(e.exit_code(), crate::error::exit::HISTORY);
        assert!(e.to_string().contains("rollback") && e.to_string().contains("on_history_rewrite"), "{e}");
    }

    #[test]
    fn a_rewrite_is_one_commit_undoing_newest_first_then_applying_forward() {
        let meta = rolled_back();
        let ids = |v: &[SnapshotRef]| v.iter().map(|s| s.snapshot_id()).collect::<Vec<_>>();
        let chunk = |end: i64, from, common, kind| {
            let end = meta.snapshot_by_id(end).unwrap().clone();
            let cs = chunks(Range { meta: &meta, name: "db.t", end: &end }, Start::Rewritten { from, common, kind }, 10).unwrap();
            assert_eq!(cs.len(), 1);
            cs.into_iter().next().unwrap()
        };
        let c = chunk(2, 4, Some(2), RewriteKind::Rollback);
        let rw = c.rewrite.as_ref().unwrap();
        assert_eq!((ids(&rw.undo), ids(&c.snapshots), c.last().snapshot_id(), c.steps()), (vec![4, 3], vec![], 2, 2));
        assert!(c.must_commit && rw.clear.is_none() && !rw.copy);
        let c = chunk(8, 4, None, RewriteKind::Replace);
        let rw = c.rewrite.as_ref().unwrap();
        assert_eq!((rw.clear.as_ref().map(|s| s.snapshot_id()), rw.copy, ids(&rw.undo), c.last().snapshot_id()), (Some(4), true, vec![], 8));
    }

    #[test]
    fn chunks_group_snapshots_and_force_the_last_commit() {
        let meta = table();
        let end = meta.snapshot_by_id(4).unwrap().clone();
        let range = Range { meta: &meta, name: "db.t", end: &end };
        let ids = |c: &Chunk| c.snapshots.iter().map(|s| s.snapshot_id()).collect::<Vec<_>>();
        let cs = chunks(range, Start::After(1), 2).unwrap();
        assert_eq!(cs.iter().map(ids).collect::<Vec<_>>(), vec![vec![2, 3], vec![4]]);
        assert_eq!(cs.iter().map(|c| c.must_commit).collect::<Vec<_>>(), vec![false, true]);
        assert!(cs.iter().all(|c| !c.bootstrap && c.base.is_none()));
        let cs = chunks(range, Start::Beginning, 1).unwrap();
        assert_eq!(cs.iter().map(ids).collect::<Vec<_>>(), vec![vec![1], vec![2], vec![3], vec![4]]);
        // a per-commit of 0 is taken as 1, not a panic
        assert_eq!(chunks(range, Start::After(3), 0).unwrap().len(), 1);
        let boot = chunks(range, Start::Bootstrap, 2).unwrap();
        assert_eq!((boot.len(), ids(&boot[0]), boot[0].bootstrap, boot[0].must_commit), (1, vec![4], true, true));
        assert!(chunks(range, Start::Done(4), 2).unwrap().is_empty());
    }

    #[test]
    fn sinks_behind_catch_up_alone_before_sharing_a_read() {
        let meta = table();
        use Initial::{Beginning, Copy};
        assert_eq!(share(&meta, &[Some(2), Some(2)], &[Copy, Beginning]), Sharing::Together);
        assert_eq!(share(&meta, &[None, None], &[Copy, Copy]), Sharing::Together);
        assert_eq!(share(&meta, &[None, None], &[Copy, Beginning]), Sharing::Separately);
        assert_eq!(share(&meta, &[Some(2), Some(4)], &[Copy, Copy]), Sharing::CatchUp { behind: vec![0], to: 4 });
        assert_eq!(share(&meta, &[Some(4), None, Some(3)], &[Copy, Copy, Copy]), Sharing::CatchUp { behind: vec![1, 2], to: 4 });
        // one sink on a line the source left (9): no catching up to it; each follows the rewrite alone
        assert_eq!(share(&meta, &[Some(9), Some(3)], &[Copy, Copy]), Sharing::Separately);
        // all on it: one shared read still
        assert_eq!(share(&meta, &[Some(9), Some(9)], &[Copy, Copy]), Sharing::Together);
    }
}

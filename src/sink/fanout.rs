//! Several sinks fed by one read of the source.
//!
//! [`FanOut`] is a [`Sink`] over sinks that record the same progress: every commit of the runner is begun, written
//! and committed in each of them, so each source snapshot is scanned once for all. Sinks keep their own progress;
//! when they disagree (a new sink, one that failed after another committed, different start positions), the ones
//! behind first catch up alone to the most advanced one ([`run`] does this), and the shared run starts from there.
//!
//! Invariant: a commit is valid in each sink on that sink's own recorded progress, which equals the chunk's base; a
//! sink that fails after another committed leaves the two apart, which the next run's catch-up repairs — never by
//! applying a range twice to any sink.
use ::iceberg::spec::SchemaRef;
use ::iceberg::table::Table;
use arrow_array::RecordBatch;
use futures::future::BoxFuture;
use futures::FutureExt;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::pipeline::{run_once, CommitReport, RunControl, SyncSummary};
use crate::sink::{Chunk, Committed, Initial, Sink, SourceInfo};
use crate::spec::lineage::{self, Bound};

/// Sinks at the same progress, written together.
pub struct FanOut<'a> {
    sinks: Vec<&'a mut dyn Sink>,
}

impl<'a> FanOut<'a> {
    /// Wraps `sinks` (at least one).
    pub fn new(sinks: Vec<&'a mut dyn Sink>) -> Self {
        FanOut { sinks }
    }
}

impl Sink for FanOut<'_> {
    fn label(&self) -> String {
        self.sinks.iter().map(|s| s.label()).collect::<Vec<_>>().join("+")
    }

    fn initial(&self) -> Initial {
        self.sinks.first().map(|s| s.initial()).unwrap_or(Initial::Copy)
    }

    fn snapshots_per_commit(&self) -> Option<usize> {
        self.sinks.iter().filter_map(|s| s.snapshots_per_commit()).min()
    }

    fn reserved_memory(&self) -> u64 {
        self.sinks.iter().map(|s| s.reserved_memory()).sum()
    }

    fn needs_key_order(&self) -> bool {
        self.sinks.iter().any(|s| s.needs_key_order())
    }

    fn removed_columns(&self) -> Option<Vec<i32>> {
        let mut ids = Vec::new();
        for s in &self.sinks {
            ids.extend(s.removed_columns()?);
        }
        ids.sort_unstable();
        ids.dedup();
        Some(ids)
    }

    fn recorded<'b>(&'b mut self, source: &'b SourceInfo) -> BoxFuture<'b, Result<Option<i64>>> {
        async move {
            let mut all = Vec::new();
            for s in self.sinks.iter_mut() {
                all.push(s.recorded(source).await?);
            }
            agree(&all, "recorded")
        }
        .boxed()
    }

    fn prepare<'b>(&'b mut self, source: &'b SourceInfo, schema: &'b SchemaRef, bootstrap: bool) -> BoxFuture<'b, Result<Option<i64>>> {
        async move {
            let mut all = Vec::new();
            for s in self.sinks.iter_mut() {
                all.push(s.prepare(source, schema, bootstrap).await?);
            }
            // another writer moved one of them meanwhile: fail this run; the next one catches up first
            agree(&all, "are at")
                .map_err(|_| Error::Conflict { table: self.label(), message: format!("the sinks drifted apart while planning ({all:?})") })
        }
        .boxed()
    }

    fn begin<'b>(&'b mut self, source: &'b SourceInfo, chunk: &'b Chunk) -> BoxFuture<'b, Result<()>> {
        async move {
            for s in self.sinks.iter_mut() {
                s.begin(source, chunk).await?;
            }
            Ok(())
        }
        .boxed()
    }

    fn write(&mut self, batch: RecordBatch) -> BoxFuture<'_, Result<()>> {
        async move {
            for s in self.sinks.iter_mut() {
                s.write(batch.clone()).await?;
            }
            Ok(())
        }
        .boxed()
    }

    fn commit<'b>(&'b mut self, source: &'b SourceInfo, stop: Option<&'b tokio::sync::watch::Receiver<bool>>) -> BoxFuture<'b, Result<Committed>> {
        async move {
            let mut first: Option<Committed> = None;
            let n = self.sinks.len();
            for i in 0..n {
                match self.sinks[i].commit(source, stop).await {
                    Ok(Committed::Replan) => {
                        for s in self.sinks[i + 1..].iter_mut() {
                            s.abort().await;
                        }
                        return Ok(Committed::Replan);
                    }
                    Ok(c) => {
                        if first.as_ref().is_none_or(|f| matches!(f, Committed::Empty)) {
                            first = Some(c);
                        }
                    }
                    Err(e) => {
                        // the sinks before this one committed: they are ahead now, the next run catches the rest up
                        for s in self.sinks[i + 1..].iter_mut() {
                            s.abort().await;
                        }
                        return Err(e);
                    }
                }
            }
            Ok(first.unwrap_or(Committed::Empty))
        }
        .boxed()
    }

    fn abort(&mut self) -> BoxFuture<'_, ()> {
        async move {
            for s in self.sinks.iter_mut() {
                s.abort().await;
            }
        }
        .boxed()
    }

    fn retries(&self) -> u32 {
        self.sinks.iter().map(|s| s.retries()).sum()
    }

    fn created(&self) -> bool {
        self.sinks.iter().any(|s| s.created())
    }
}

fn agree(all: &[Option<i64>], what: &str) -> Result<Option<i64>> {
    match all.first() {
        Some(p) if all.iter().all(|q| q == p) => Ok(*p),
        Some(_) => Err(Error::Conflict {
            table: "fan-out".into(),
            message: format!("the sinks {what} different progress {all:?}; the next run catches them up"),
        }),
        None => Ok(None),
    }
}

/// Runs `sinks` over the source range with one read: the sinks behind the most advanced one catch up alone (to its
/// progress), then all of them share the rest of the range. Returns one summary per sink's catch-up (if any) and
/// the shared run's.
pub async fn run(
    cfg: &Config,
    source: &Table,
    sinks: Vec<&mut dyn Sink>,
    from: Option<Bound>,
    to: Option<Bound>,
    control: &RunControl,
    mut on_commit: impl FnMut(&CommitReport),
) -> Result<SyncSummary> {
    let meta = source.metadata();
    let Some(current) = meta.current_snapshot() else {
        // nothing to read; each sink records nothing
        let mut fan = FanOut::new(sinks);
        return run_once(cfg, source, &mut fan, from, to, control, &mut on_commit).await;
    };
    let info = crate::pipeline::source_info(cfg, source, current)?;
    let mut sinks = sinks;
    let mut recorded = Vec::new();
    for s in sinks.iter_mut() {
        recorded.push(s.recorded(&info).await?);
    }
    // the most advanced progress on the source's history (None: nothing recorded)
    let ahead = recorded.iter().flatten().copied().fold(None, |best: Option<i64>, p| match best {
        Some(b) if lineage::is_ancestor(meta, p, b) => Some(b),
        _ => Some(p),
    });
    let mut catch_up = SyncSummary::default();
    if ahead.is_none() && sinks.iter().any(|s| s.initial() != sinks[0].initial()) {
        // nothing recorded anywhere and different start positions (a copy here, every change there): each alone
        let mut last = SyncSummary::default();
        for s in sinks.iter_mut() {
            last = run_once(cfg, source, &mut **s, from, to, control, &mut on_commit).await?;
        }
        return Ok(last);
    }
    if recorded.iter().any(|p| *p != ahead) {
        if let Some(a) = ahead {
            for (s, p) in sinks.iter_mut().zip(&recorded) {
                if *p != ahead {
                    tracing::info!(sink = %s.label(), from = ?p, to = a, "catching up alone before the shared read");
                    let r = run_once(cfg, source, &mut **s, from, Some(Bound::Snapshot(a)), control, &mut on_commit).await?;
                    catch_up.source_snapshots_applied += r.source_snapshots_applied;
                }
            }
        }
    }
    let mut fan = FanOut::new(sinks);
    let mut summary = run_once(cfg, source, &mut fan, from, to, control, &mut on_commit).await?;
    summary.source_snapshots_applied += catch_up.source_snapshots_applied;
    Ok(summary)
}

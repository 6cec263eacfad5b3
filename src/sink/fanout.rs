//! Several sinks fed by one read of the source.
//!
//! [`FanOut`] is a [`Sink`] over sinks that record the same progress: every commit of the runner is begun, written
//! and committed in each of them, so each source snapshot is scanned once for all. Sinks keep their own progress;
//! when they disagree (a new sink, one that failed after another committed, different start positions), the ones
//! behind first catch up alone to the most advanced one (the runner in `pipeline` does this), and the shared run
//! starts from there.
//!
//! Invariant: a commit is valid in each sink on that sink's own recorded progress, which equals the chunk's base; a
//! sink that fails after another committed leaves the two apart, which the next run's catch-up repairs — never by
//! applying a range twice to any sink.
use ::iceberg::spec::SchemaRef;
use arrow_array::RecordBatch;
use futures::future::BoxFuture;
use futures::FutureExt;

use crate::error::{Error, Result};
use crate::sink::{Chunk, Committed, Initial, Sink, SourceInfo};

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

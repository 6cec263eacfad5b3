//! Several sinks fed by one read of the source.
//!
//! [`FanOut`] is a [`Sink`] over sinks that record the same progress: every commit of the runner is begun, written
//! and committed in each of them, so each source snapshot is scanned once for all. Sinks keep their own progress;
//! when they disagree (a new sink, one that failed after another committed, different start positions), the ones
//! behind first catch up alone to the most advanced one (the runner in `pipeline` does this), and the shared run
//! starts from there.
//!
//! A fan-out has no upkeep of its own: it lives for one run, and the service drives each sink's upkeep itself.
//!
//! Invariant: a commit is valid in each sink on that sink's own recorded progress, which equals the chunk's base; a
//! sink that fails after another committed leaves the two apart, which the next run's catch-up repairs — never by
//! applying a range twice to any sink.
use ::iceberg::spec::SchemaRef;
use arrow_array::RecordBatch;

use crate::error::{Error, Result};
use crate::sink::{Chunk, Committed, Profile, Sink, SourceInfo};

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

#[async_trait::async_trait]
impl Sink for FanOut<'_> {
    fn label(&self) -> String {
        self.sinks.iter().map(|s| s.label()).collect::<Vec<_>>().join("+")
    }

    fn profile(&self) -> Profile {
        Profile::together(&self.sinks.iter().map(|s| s.profile()).collect::<Vec<_>>())
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

    async fn recorded(&mut self, source: &SourceInfo) -> Result<Option<i64>> {
        let mut all = Vec::new();
        for s in self.sinks.iter_mut() {
            all.push(s.recorded(source).await?);
        }
        agree(&all, "recorded")
    }

    async fn prepare(&mut self, source: &SourceInfo, schema: &SchemaRef, bootstrap: bool) -> Result<Option<i64>> {
        let mut all = Vec::new();
        for s in self.sinks.iter_mut() {
            all.push(s.prepare(source, schema, bootstrap).await?);
        }
        // another writer moved one of them meanwhile: fail this run; the next one catches up first
        agree(&all, "are at")
            .map_err(|_| Error::Conflict { table: self.label(), message: format!("the sinks drifted apart while planning ({all:?})") })
    }

    async fn begin(&mut self, source: &SourceInfo, chunk: &Chunk) -> Result<()> {
        for s in self.sinks.iter_mut() {
            s.begin(source, chunk).await?;
        }
        Ok(())
    }

    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        for s in self.sinks.iter_mut() {
            s.write(batch.clone()).await?;
        }
        Ok(())
    }

    async fn commit(&mut self, source: &SourceInfo, stop: Option<&tokio::sync::watch::Receiver<bool>>) -> Result<Committed> {
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

    async fn abort(&mut self) {
        for s in self.sinks.iter_mut() {
            s.abort().await;
        }
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

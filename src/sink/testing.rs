//! A seam for tests that drive the real binary: [`PauseBeforeCommit`] wraps a sink and holds the process's first
//! commit — after its rows are written, before the catalog call — until the test says go. Tests use it to put another
//! writer's commit between our plan and our commit. Only `main` installs it (when the test asks, see
//! [`PauseBeforeCommit::from_env`]); no sink knows about it.
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ::iceberg::spec::SchemaRef;
use arrow_array::RecordBatch;
use futures::future::BoxFuture;
use futures::FutureExt;

use crate::error::Result;
use crate::sink::{Chunk, Committed, Initial, Sink, SourceInfo};

/// The environment variable a test sets to a directory: the first commit creates `<dir>/paused` and waits until
/// `<dir>/resume` exists.
pub const PAUSE_ENV: &str = "CDC_TEST_PAUSE_BEFORE_COMMIT";

/// Whether a commit of this process paused already (only the first one does).
static PAUSED: AtomicBool = AtomicBool::new(false);

/// A sink whose first commit in the process waits for the test (see the module header).
pub struct PauseBeforeCommit {
    inner: Box<dyn Sink>,
    dir: PathBuf,
}

impl PauseBeforeCommit {
    /// Wraps every sink in `sinks` when the test set [`PAUSE_ENV`]; returns them unchanged otherwise.
    pub fn from_env(sinks: Vec<Box<dyn Sink>>) -> Vec<Box<dyn Sink>> {
        let Some(dir) = std::env::var_os(PAUSE_ENV) else { return sinks };
        sinks.into_iter().map(|inner| Box::new(PauseBeforeCommit { inner, dir: PathBuf::from(&dir) }) as Box<dyn Sink>).collect()
    }

    async fn pause(dir: PathBuf) {
        if PAUSED.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = std::fs::write(dir.join("paused"), b"");
        while !dir.join("resume").exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Sink for PauseBeforeCommit {
    fn label(&self) -> String {
        self.inner.label()
    }
    fn initial(&self) -> Initial {
        self.inner.initial()
    }
    fn snapshots_per_commit(&self) -> Option<usize> {
        self.inner.snapshots_per_commit()
    }
    fn mark(&mut self) -> BoxFuture<'_, Result<Option<String>>> {
        self.inner.mark()
    }
    fn recorded<'a>(&'a mut self, source: &'a SourceInfo) -> BoxFuture<'a, Result<Option<i64>>> {
        self.inner.recorded(source)
    }
    fn prepare<'a>(&'a mut self, source: &'a SourceInfo, schema: &'a SchemaRef, bootstrap: bool) -> BoxFuture<'a, Result<Option<i64>>> {
        self.inner.prepare(source, schema, bootstrap)
    }
    fn begin<'a>(&'a mut self, source: &'a SourceInfo, chunk: &'a Chunk) -> BoxFuture<'a, Result<()>> {
        self.inner.begin(source, chunk)
    }
    fn reserved_memory(&self) -> u64 {
        self.inner.reserved_memory()
    }
    fn needs_key_order(&self) -> bool {
        self.inner.needs_key_order()
    }
    fn removed_columns(&self) -> Option<Vec<i32>> {
        self.inner.removed_columns()
    }
    fn write(&mut self, batch: RecordBatch) -> BoxFuture<'_, Result<()>> {
        self.inner.write(batch)
    }
    fn commit<'a>(&'a mut self, source: &'a SourceInfo, stop: Option<&'a tokio::sync::watch::Receiver<bool>>) -> BoxFuture<'a, Result<Committed>> {
        async move {
            Self::pause(self.dir.clone()).await;
            self.inner.commit(source, stop).await
        }
        .boxed()
    }
    fn abort(&mut self) -> BoxFuture<'_, ()> {
        self.inner.abort()
    }
    fn take_maintenance(&mut self) -> crate::sink::MaintenanceStats {
        self.inner.take_maintenance()
    }
    fn rest_after(&self) -> Option<Duration> {
        self.inner.rest_after()
    }
    fn rest(&mut self) -> BoxFuture<'_, Result<crate::sink::Rest>> {
        self.inner.rest()
    }
    fn retries(&self) -> u32 {
        self.inner.retries()
    }
    fn created(&self) -> bool {
        self.inner.created()
    }
}

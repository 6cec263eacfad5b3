//! A seam for tests that drive the real binary: [`PauseBeforeCommit`] wraps a sink and holds the process's first
//! commit — after its rows are written, before the catalog call — until the test says go. Tests use it to put another
//! writer's commit between our plan and our commit. Only `main` installs it (when the test asks, see
//! [`PauseBeforeCommit::from_env`]); no sink knows about it.
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ::iceberg::spec::SchemaRef;
use arrow_array::RecordBatch;

use crate::error::Result;
use crate::sink::{Chunk, Committed, Profile, Sink, SourceInfo, Upkeep};

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

#[async_trait::async_trait]
impl Sink for PauseBeforeCommit {
    fn label(&self) -> String {
        self.inner.label()
    }
    fn profile(&self) -> Profile {
        self.inner.profile()
    }
    fn upkeep(&mut self) -> Option<&mut dyn Upkeep> {
        self.inner.upkeep()
    }
    async fn mark(&mut self) -> Result<Option<String>> {
        self.inner.mark().await
    }
    async fn recorded(&mut self, source: &SourceInfo) -> Result<Option<i64>> {
        self.inner.recorded(source).await
    }
    async fn prepare(&mut self, source: &SourceInfo, schema: &SchemaRef, bootstrap: bool) -> Result<Option<i64>> {
        self.inner.prepare(source, schema, bootstrap).await
    }
    async fn begin(&mut self, source: &SourceInfo, chunk: &Chunk) -> Result<()> {
        self.inner.begin(source, chunk).await
    }
    fn removed_columns(&self) -> Option<Vec<i32>> {
        self.inner.removed_columns()
    }
    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        self.inner.write(batch).await
    }
    async fn commit(&mut self, source: &SourceInfo, stop: Option<&tokio::sync::watch::Receiver<bool>>) -> Result<Committed> {
        Self::pause(self.dir.clone()).await;
        self.inner.commit(source, stop).await
    }
    async fn abort(&mut self) {
        self.inner.abort().await
    }
    fn retries(&self) -> u32 {
        self.inner.retries()
    }
    fn created(&self) -> bool {
        self.inner.created()
    }
}

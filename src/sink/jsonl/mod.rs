//! A directory of JSON-lines files as a [`Sink`]: the smallest complete destination, and the example of one.
//!
//! Each commit is one file, `<dir>/<n>.jsonl` (`n` from 1, zero-padded to 10 digits), holding the commit's change rows
//! as `cdc changes --format jsonl` prints them; `<dir>/progress.json` records how many commits landed and the
//! source snapshot the last one brought the directory to. A reader takes the files up to `commits` in order; a
//! file above it is a commit that did not land.
//!
//! Exactly once: the file is written under a temporary name and renamed into place, then `progress.json` is
//! replaced the same way — that rename is the commit. A crash between the two leaves file `n + 1` beside a progress
//! of `n`; the next run plans from that progress and writes file `n + 1` again, replacing it. Nothing else writes
//! the directory's progress (two writers of one directory are not supported), so [`Sink::prepare`] never replans.
use std::path::{Path, PathBuf};

use ::iceberg::spec::SchemaRef;
use arrow_array::RecordBatch;
use serde::{Deserialize, Serialize};

use crate::config::JsonlConfig;
use crate::error::{Error, Result};
use crate::output::{self, ChangeWriter};
use crate::sink::{Chunk, CommitStats, Committed, Initial, Profile, Sink, SourceInfo};

/// What `progress.json` holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
struct Progress {
    /// The source table the directory follows.
    source_uuid: String,
    /// The source snapshot the last commit brought the directory to.
    source_snapshot_id: Option<i64>,
    /// Commits landed: files `1..=commits` hold them.
    commits: u64,
}

/// A directory of JSON-lines change files (see the module header).
pub struct JsonlSink {
    cfg: JsonlConfig,
    memory_budget: u64,
    progress: Progress,
    open: Option<Open>,
}

/// The commit being written.
struct Open {
    last: i64,
    writer: Option<Box<dyn ChangeWriter>>,
    stats: CommitStats,
    started: std::time::Instant,
}

impl JsonlSink {
    /// A sink writing into `cfg.path`.
    pub fn new(cfg: JsonlConfig, memory_budget: u64) -> Self {
        JsonlSink { cfg, memory_budget, progress: Progress::default(), open: None }
    }

    fn progress_file(&self) -> PathBuf {
        self.cfg.path.join("progress.json")
    }

    fn file(&self, n: u64) -> PathBuf {
        self.cfg.path.join(format!("{n:010}.jsonl"))
    }
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::Io { path: path.display().to_string(), message: e.to_string(), retryable: false, cause: None }.with_cause(e)
}

#[async_trait::async_trait]
impl Sink for JsonlSink {
    fn label(&self) -> String {
        format!("jsonl:{}", self.cfg.path.display())
    }

    /// A copy first, one file per source snapshot (as `cdc changes` would split them); the writer's share of the
    /// budget is the one `cdc changes` gives its output.
    fn profile(&self) -> Profile {
        Profile {
            initial: Initial::Copy,
            snapshots_per_commit: 1,
            reserved_memory: crate::config::share_of(self.memory_budget, output::OUTPUT_SHARE),
            needs_key_order: true,
        }
    }

    async fn mark(&mut self) -> Result<Option<String>> {
        Ok(Some(format!("{}", self.progress.commits)))
    }

    async fn recorded(&mut self, source: &SourceInfo) -> Result<Option<i64>> {
        let path = self.progress_file();
        let progress: Progress = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| Error::data(path.display().to_string(), format!("not a progress file ({e}); move the directory aside")))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Progress { source_uuid: source.uuid.clone(), ..Progress::default() },
            Err(e) => return Err(io_error(&path, e)),
        };
        if progress.source_uuid != source.uuid {
            return Err(Error::Range(format!(
                "{} holds the changes of another table (uuid {}, `{}` is {}): give this source its own directory",
                self.cfg.path.display(),
                progress.source_uuid,
                source.name,
                source.uuid
            )));
        }
        self.progress = progress;
        Ok(self.progress.source_snapshot_id)
    }

    async fn prepare(&mut self, _: &SourceInfo, _: &SchemaRef, _: bool) -> Result<Option<i64>> {
        std::fs::create_dir_all(&self.cfg.path).map_err(|e| io_error(&self.cfg.path, e))?;
        Ok(self.progress.source_snapshot_id)
    }

    async fn begin(&mut self, _: &SourceInfo, chunk: &Chunk) -> Result<()> {
        let stats = CommitStats::default();
        self.open = Some(Open { last: chunk.last().snapshot_id(), writer: None, stats, started: std::time::Instant::now() });
        Ok(())
    }

    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        // the commit's file is opened with its first rows (their schema is the writer's)
        let first = self.open.as_ref().is_some_and(|o| o.writer.is_none());
        let writer = if first {
            let (file, budget) = (self.file(self.progress.commits + 1), self.profile().reserved_memory);
            Some(output::open(output::Format::Jsonl, Some(&file), batch.schema(), budget)?)
        } else {
            None
        };
        let open = self.open.as_mut().ok_or_else(|| Error::Internal("write without begin".into()))?;
        if writer.is_some() {
            open.writer = writer;
        }
        open.stats.data_rows += batch.num_rows() as u64;
        open.writer.as_mut().expect("opened above").write(&batch)
    }

    async fn commit(&mut self, source: &SourceInfo, stop: Option<&tokio::sync::watch::Receiver<bool>>) -> Result<Committed> {
        let open = self.open.take().ok_or_else(|| Error::Internal("commit without begin".into()))?;
        if stop.is_some_and(|s| *s.borrow()) {
            return Err(Error::Cancelled);
        }
        let n = self.progress.commits + 1;
        let file = self.file(n);
        match open.writer {
            Some(w) => w.finish()?,
            None => std::fs::write(&file, b"").map_err(|e| io_error(&file, e))?,
        }
        let next = Progress { source_uuid: source.uuid.clone(), source_snapshot_id: Some(open.last), commits: n };
        let tmp = self.cfg.path.join(".progress.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(&next).expect("plain data")).map_err(|e| io_error(&tmp, e))?;
        std::fs::rename(&tmp, self.progress_file()).map_err(|e| io_error(&self.progress_file(), e))?;
        self.progress = next;
        let mut stats = open.stats;
        stats.files = 1;
        stats.seconds = open.started.elapsed().as_secs_f64();
        Ok(Committed::Done { id: n as i64, stats })
    }

    /// The unfinished file's temporary name goes with its writer.
    async fn abort(&mut self) {
        self.open = None;
    }

    fn retries(&self) -> u32 {
        0
    }

    fn created(&self) -> bool {
        false
    }
}

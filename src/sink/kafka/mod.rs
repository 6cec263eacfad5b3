//! The Kafka sink: the change stream of one source table on a topic, exactly once.
//!
//! Algorithm: a transactional producer with a stable `transactional.id` per pipeline. `recorded` first calls
//! `init_transactions`, which fences any older instance with the same id and aborts its open transaction, then reads
//! the sink's last progress record from the compacted progress topic with `read_committed` (to the high watermark).
//! Each commit of the runner is one Kafka transaction holding the chunk's messages and, last, a progress record
//! (source uuid, snapshot id, sequence number); a transaction that grows past `max_transaction_rows` /
//! `max_transaction_bytes` is committed early with a *partial* progress record (the previous snapshot plus the
//! number of change rows of the chunk already published) and a new one begins. On restart the runner plans from the
//! recorded snapshot and the sink skips the already published rows — the engine's row order per snapshot is
//! deterministic — so a crash at any moment neither loses nor repeats a message to a `read_committed` consumer.
//!
//! Invariants: progress is only written inside the transaction of the messages it covers; a Debezium update pair is
//! never split across transactions; a fenced producer (another instance took over) is a permanent error.
pub(crate) mod auth;
pub(crate) mod encode;

use std::sync::Arc;
use std::time::Duration;

use ::iceberg::spec::SchemaRef;
use arrow_array::RecordBatch;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::{Message as _, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::config::{KafkaConfig, KafkaInitial};
use crate::error::{Error, Result};
use crate::sink::{Chunk, CommitStats, Committed, Initial, Profile, Sink, SourceInfo};
use auth::KafkaContext;
use encode::{headers, Encoder, Message, SourceMeta};

/// Timeout of the blocking transaction calls.
const TXN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long reading the progress topic may take.
const PROGRESS_READ_TIMEOUT: Duration = Duration::from_secs(120);

/// A progress record: where a pipeline's Kafka sink is in its source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// The source table's uuid (a recreated table is another source).
    pub source_uuid: String,
    /// The last source snapshot whose changes are all published (`None`: none yet).
    pub snapshot_id: Option<i64>,
    /// That snapshot's sequence number.
    pub sequence_number: Option<i64>,
    /// Change rows after `snapshot_id` already published by transactions of an unfinished chunk.
    #[serde(default)]
    pub partial_rows: u64,
    /// When the record was written (ms since the epoch).
    pub written_at_ms: i64,
    /// The topic the pipeline publishes to (its configured pattern); records written before it was kept have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
}

impl Progress {
    /// Progress of `source` at `snapshot` (id, sequence number), `partial_rows` into what follows it, as of now, of a
    /// pipeline publishing to `topic`.
    fn at(source: &SourceInfo, snapshot: Option<(i64, i64)>, partial_rows: u64, topic: &str) -> Self {
        Progress {
            source_uuid: source.uuid.clone(),
            snapshot_id: snapshot.map(|s| s.0),
            sequence_number: snapshot.map(|s| s.1),
            partial_rows,
            written_at_ms: chrono::Utc::now().timestamp_millis(),
            topic: Some(topic.to_string()),
        }
    }
}

type Prod = ThreadedProducer<KafkaContext>;

struct Open {
    /// Last snapshot of the chunk and its sequence number.
    last: (i64, i64),
    /// Recorded progress the chunk starts from.
    base: Option<i64>,
    base_seq: Option<i64>,
    /// Rows of the chunk consumed so far (published or skipped), and still to skip.
    rows_done: u64,
    skip: u64,
    skipping_last: bool,
    rows_in_txn: u64,
    bytes_in_txn: u64,
    stats: CommitStats,
    started: std::time::Instant,
    /// The chunk follows a rewrite of the source's history of this kind: its messages say so.
    resync: Option<&'static str>,
}

/// A Kafka topic as a [`Sink`].
pub struct KafkaSink {
    cfg: KafkaConfig,
    /// The pipeline's name: the key of its progress records and the default transactional id's suffix.
    pipeline: String,
    producer: Option<Arc<Prod>>,
    topic: String,
    encoder: Option<Encoder>,
    progress: Option<Progress>,
    open: Option<Open>,
    /// The source of the open commit (early transaction commits write progress records).
    open_source: Option<SourceInfo>,
    context: Option<KafkaContext>,
    retries: u32,
    /// Transactions committed (early ones included) and aborted, for metrics.
    pub transactions: u64,
    /// Transactions aborted.
    pub aborts: u64,
    /// The engine's memory budget; the scan leaves [`KAFKA_SHARE`] of it to the producer.
    memory_budget: u64,
}

/// The part of `engine.memory_budget` the scan leaves to the producer (numerator, denominator): librdkafka's queue of
/// messages not yet delivered (100 000 by default, ~32 MB of the bench's Debezium messages) and a batch's encoded
/// messages. On the scan's whole budget, publishing the 100 M-row bench's MERGE peaked at 410 MB RSS, over budget +
/// 128 MB; with this share 306 MB. Bounding the queue by bytes as well (`queue.buffering.max.kbytes` at the share)
/// cost ~20 % CPU at 10 M rows (smaller batches) and is left to `properties`.
const KAFKA_SHARE: (u64, u64) = (1, 8);

impl KafkaSink {
    /// A sink for `pipeline` (its name keys the progress records), within `engine.memory_budget` = `memory_budget`
    /// (the scan leaves [`KAFKA_SHARE`] of it to the producer).
    pub fn new(cfg: KafkaConfig, pipeline: impl Into<String>, memory_budget: u64) -> Self {
        KafkaSink {
            cfg,
            pipeline: pipeline.into(),
            producer: None,
            topic: String::new(),
            encoder: None,
            progress: None,
            open: None,
            open_source: None,
            context: None,
            retries: 0,
            transactions: 0,
            aborts: 0,
            memory_budget,
        }
    }

    /// The source snapshot whose changes are all published, as this instance knows it.
    pub fn progress_snapshot(&self) -> Option<i64> {
        self.progress.as_ref().and_then(|p| p.snapshot_id)
    }

    fn transactional_id(&self) -> String {
        self.cfg.transactional_id.clone().unwrap_or_else(|| format!("cdc-{}", self.pipeline))
    }

    fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        auth::auth_defaults(self.cfg.auth.as_deref(), &mut c);
        for (k, v) in &self.cfg.properties {
            c.set(k, v);
        }
        c.set("bootstrap.servers", &self.cfg.bootstrap_servers);
        c
    }

    /// The client context: Google tokens for OAUTHBEARER when `auth = "google"` (created once per sink).
    fn context(&mut self) -> Result<KafkaContext> {
        if let Some(c) = &self.context {
            return Ok(c.clone());
        }
        let c = auth::context_for(self.cfg.auth.as_deref(), self.cfg.principal.as_deref(), "kafka")?;
        self.context = Some(c.clone());
        Ok(c)
    }

    fn error(&self, what: &str, e: KafkaError) -> Error {
        let code = e.rdkafka_error_code();
        if matches!(code, Some(RDKafkaErrorCode::Fenced | RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch)) {
            return Error::Fenced { transactional_id: self.transactional_id() };
        }
        let retryable = !matches!(
            code,
            Some(
                RDKafkaErrorCode::MessageSizeTooLarge
                    | RDKafkaErrorCode::TopicAuthorizationFailed
                    | RDKafkaErrorCode::ClusterAuthorizationFailed
                    | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
            )
        );
        Error::Kafka { what: what.to_string(), message: e.to_string(), retryable, cause: None }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&Prod) -> std::result::Result<T, KafkaError> + Send + 'static,
    ) -> Result<T> {
        let p = self.producer.clone().ok_or_else(|| Error::Internal("Kafka producer not connected".into()))?;
        match tokio::task::spawn_blocking(move || f(&p)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.error(what, e)),
            Err(e) => Err(Error::failed(what, e)),
        }
    }

    /// Creates the producer and fences older instances (once per sink).
    async fn connect(&mut self) -> Result<()> {
        if self.producer.is_some() {
            return Ok(());
        }
        let mut c = self.client_config();
        c.set("transactional.id", self.transactional_id()).set("enable.idempotence", "true");
        if !self.cfg.properties.contains_key("partitioner") {
            // the Java client's partitioner: Java and librdkafka producers place a key on the same partition
            c.set("partitioner", "murmur2_random");
        }
        if !self.cfg.properties.contains_key("transaction.timeout.ms") {
            c.set("transaction.timeout.ms", "60000");
        }
        let ctx = self.context()?;
        let p: Prod = c.create_with_context(ctx).map_err(|e| self.error("creating the producer", e))?;
        self.producer = Some(Arc::new(p));
        self.ensure_progress_topic().await?;
        // fences an older instance of this pipeline and aborts whatever it left open
        self.blocking("init_transactions", |p| p.init_transactions(TXN_TIMEOUT)).await?;
        Ok(())
    }

    async fn ensure_progress_topic(&self) -> Result<()> {
        let ctx = self.context.clone().unwrap_or_default();
        let admin: AdminClient<KafkaContext> =
            self.client_config().create_with_context(ctx).map_err(|e| self.error("creating the admin client", e))?;
        let topic = NewTopic::new(&self.cfg.progress_topic, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact");
        let res = admin.create_topics([&topic], &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)))).await;
        match res {
            Ok(results) => {
                for r in results {
                    if let Err((name, code)) = r {
                        if code != RDKafkaErrorCode::TopicAlreadyExists {
                            return Err(Error::Kafka {
                                what: format!("creating the progress topic {name}"),
                                message: code.to_string(),
                                retryable: true,
                                cause: None,
                            });
                        }
                    }
                }
                Ok(())
            }
            Err(e) => Err(self.error("creating the progress topic", e)),
        }
    }

    /// The last progress record of this pipeline (read_committed, to the high watermark).
    async fn read_progress(&self) -> Result<Option<Progress>> {
        let mut c = self.client_config();
        c.set("group.id", format!("cdc-progress-reader-{}", uuid::Uuid::new_v4()))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest");
        let ctx = self.context.clone().unwrap_or_default();
        let consumer: BaseConsumer<KafkaContext> = c.create_with_context(ctx).map_err(|e| self.error("creating the progress reader", e))?;
        let topic = self.cfg.progress_topic.clone();
        let key = self.pipeline.clone();
        let fetch = tokio::task::spawn_blocking(move || -> std::result::Result<Option<Vec<u8>>, KafkaError> {
            let (_, high) = consumer.fetch_watermarks(&topic, 0, Duration::from_secs(30))?;
            tracing::debug!(topic, high, "reading the progress topic");
            if high <= 0 {
                return Ok(None);
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&topic, 0, Offset::Beginning)?;
            consumer.assign(&tpl)?;
            let deadline = std::time::Instant::now() + PROGRESS_READ_TIMEOUT;
            let mut last = None;
            loop {
                if let Some(m) = consumer.poll(Duration::from_millis(200)) {
                    let m = m?;
                    if m.key() == Some(key.as_bytes()) {
                        last = m.payload().map(<[u8]>::to_vec);
                    }
                }
                let pos = consumer.position()?;
                let at = pos.find_partition(&topic, 0).and_then(|p| p.offset().to_raw()).unwrap_or(-1);
                if at >= high {
                    return Ok(last);
                }
                if std::time::Instant::now() > deadline {
                    return Err(KafkaError::MessageConsumption(RDKafkaErrorCode::OperationTimedOut));
                }
            }
        })
        .await
        .map_err(|e| Error::failed("reading the progress topic", e))?;
        let bytes = fetch.map_err(|e| self.error("reading the progress topic", e))?;
        bytes
            .map(|b| {
                serde_json::from_slice::<Progress>(&b).map_err(|e| {
                    Error::Kafka {
                        what: format!("progress record of `{}` in {}", self.pipeline, self.cfg.progress_topic),
                        message: format!("unreadable: {e}"),
                        retryable: false,
                        cause: None,
                    }
                    .with_cause(e)
                })
            })
            .transpose()
    }

    fn send(&self, topic: &str, key: Option<&str>, value: Option<&str>, hdrs: Option<OwnedHeaders>) -> Result<()> {
        let p = self.producer.as_ref().ok_or_else(|| Error::Internal("Kafka producer not connected".into()))?;
        let mut rec: BaseRecord<'_, str, str> = BaseRecord::to(topic);
        if let Some(k) = key {
            rec = rec.key(k);
        }
        if let Some(v) = value {
            rec = rec.payload(v);
        }
        if let Some(h) = hdrs {
            rec = rec.headers(h);
        }
        loop {
            match p.send(rec) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    // the local queue is full: let the background thread deliver
                    rec = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(self.error("producing", e)),
            }
        }
    }

    /// Produces `p` to the progress topic (inside the open transaction).
    fn progress_record(&self, p: &Progress) -> Result<()> {
        let v = serde_json::to_string(p).map_err(|e| Error::failed("encoding a progress record", e))?;
        self.send(&self.cfg.progress_topic, Some(&self.pipeline), Some(&v), None)
    }

    fn produce(&self, m: &Message) -> Result<u64> {
        // numbers formatted on the stack: three `to_string`s per message showed in profiles
        let (mut snapshot, mut sequence, mut ordinal) = (itoa::Buffer::new(), itoa::Buffer::new(), itoa::Buffer::new());
        let h = OwnedHeaders::new_with_capacity(4)
            .insert(Header { key: headers::CHANGE_TYPE, value: Some(m.change_type) })
            .insert(Header { key: headers::SNAPSHOT_ID, value: Some(snapshot.format(m.snapshot_id)) })
            .insert(Header { key: headers::SEQUENCE_NUMBER, value: Some(sequence.format(m.sequence_number)) })
            .insert(Header { key: headers::ORDINAL, value: Some(ordinal.format(m.ordinal)) });
        let h = match self.open.as_ref().and_then(|o| o.resync) {
            Some(kind) => h.insert(Header { key: headers::RESYNC, value: Some(kind) }),
            None => h,
        };
        self.send(&self.topic, m.key.as_deref(), m.value.as_deref(), Some(h))?;
        Ok((m.key.as_ref().map_or(0, String::len) + m.value.as_ref().map_or(0, String::len)) as u64)
    }

    /// Commits the open transaction early (with partial progress) and begins the next one.
    async fn roll_transaction(&mut self, source: &SourceInfo) -> Result<()> {
        let (base, base_seq, rows_done) = {
            let o = self.open.as_ref().ok_or_else(|| Error::Internal("no open transaction".into()))?;
            (o.base, o.base_seq, o.rows_done)
        };
        let progress = Progress::at(source, base.zip(base_seq), rows_done, &self.cfg.topic);
        self.progress_record(&progress)?;
        self.blocking("commit_transaction", |p| p.commit_transaction(TXN_TIMEOUT)).await?;
        self.transactions += 1;
        self.blocking("begin_transaction", |p| p.begin_transaction()).await?;
        if let Some(o) = self.open.as_mut() {
            o.rows_in_txn = 0;
            o.bytes_in_txn = 0;
        }
        self.progress = Some(progress);
        Ok(())
    }

    async fn write_batch(&mut self, batch: RecordBatch, source: Option<&SourceInfo>) -> Result<()> {
        let mut msgs = Vec::new();
        self.encoder.as_mut().ok_or_else(|| Error::Internal("write without begin".into()))?.encode(&batch, &mut msgs)?;
        for (m, rows) in msgs {
            let open = self.open.as_mut().ok_or_else(|| Error::Internal("write without begin".into()))?;
            // already published by an earlier transaction of this chunk (before a restart)
            if open.skip > 0 && rows <= open.skip && (rows != 0 || open.skipping_last) {
                open.skip -= rows;
                open.rows_done += rows;
                open.skipping_last = true;
                continue;
            }
            if rows == 0 && open.skipping_last {
                continue; // the tombstone of a skipped delete
            }
            open.skipping_last = false;
            let bytes = self.produce(&m)?;
            let open = self.open.as_mut().expect("checked above");
            open.rows_done += rows;
            open.rows_in_txn += rows;
            open.bytes_in_txn += bytes;
            open.stats.bytes += bytes;
            open.stats.data_rows += 1;
            match m.change_type {
                "INSERT" => open.stats.inserts += 1,
                "DELETE" if m.value.is_some() => open.stats.deletes += 1,
                "UPDATE_AFTER" => open.stats.updates += 1,
                _ => {}
            }
            let full = open.rows_in_txn >= self.cfg.max_transaction_rows || open.bytes_in_txn >= self.cfg.max_transaction_bytes;
            let pending = self.encoder.as_ref().is_some_and(Encoder::has_pending);
            if full && !pending {
                let source = source.ok_or_else(|| Error::Internal("transaction roll without source".into()))?;
                self.roll_transaction(source).await?;
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Sink for KafkaSink {
    fn label(&self) -> String {
        format!("kafka:{}", if self.topic.is_empty() { self.cfg.topic.clone() } else { self.topic.clone() })
    }

    /// Reserves the producer's queue and encoded batches ([`KAFKA_SHARE`] of the budget); rows come in key order (a
    /// restart resumes inside a snapshot by counting rows); every new snapshot of a poll in one transaction.
    fn profile(&self) -> Profile {
        Profile {
            initial: match self.cfg.initial {
                KafkaInitial::Snapshot => Initial::Copy,
                KafkaInitial::Earliest => Initial::Beginning,
                // `recorded` writes the current snapshot as progress before anything else
                KafkaInitial::Latest => Initial::Copy,
            },
            snapshots_per_commit: self.cfg.snapshots_per_commit.unwrap_or(crate::sink::MAX_SNAPSHOTS_PER_COMMIT),
            reserved_memory: crate::config::share_of(self.memory_budget, KAFKA_SHARE),
            needs_key_order: true,
        }
    }

    /// The progress this instance wrote last (it fenced every other one when it connected); `None` before it
    /// connected.
    async fn mark(&mut self) -> Result<Option<String>> {
        let mark = self.producer.as_ref().and(self.progress.as_ref()).map(|p| format!("{:?}+{}", p.snapshot_id, p.partial_rows));
        Ok(mark)
    }

    async fn recorded(&mut self, source: &SourceInfo) -> Result<Option<i64>> {
        let (ns, table) = source.name.rsplit_once('.').unwrap_or(("", source.name.as_str()));
        self.topic = self.cfg.topic.replace("{namespace}", ns).replace("{table}", table).replace("{pipeline}", &self.pipeline);
        if self.producer.is_some() && self.progress.is_some() {
            // this instance fenced every other one when it connected: what it wrote last is the progress
            return Ok(self.progress_snapshot());
        }
        self.connect().await?;
        let mut progress = self.read_progress().await?;
        if let Some(p) = &progress {
            if p.source_uuid != source.uuid {
                return Err(Error::Range(format!(
                    "the progress of `{}` in {} belongs to another table (uuid {}, `{}` is {}): the source was recreated; use another transactional_id/pipeline name or delete the progress record",
                    self.pipeline, self.cfg.progress_topic, p.source_uuid, source.name, source.uuid
                )));
            }
            // Two pipelines of one name (`cdc sync` names its pipeline after the source table) publishing to
            // different topics would share this record: the second would take the first's progress as its own
            // and skip what its topic never got.
            if let Some(theirs) = p.topic.as_deref().filter(|t| *t != self.cfg.topic) {
                return Err(Error::Range(format!(
                    "the progress of `{}` in {} is that of another destination (topic `{theirs}`, this pipeline publishes to `{}`): two pipelines of one source share it; give this one its own `progress_topic` (or, in the service, its own pipeline name)",
                    self.pipeline, self.cfg.progress_topic, self.cfg.topic
                )));
            }
        }
        if progress.is_none() && self.cfg.initial == KafkaInitial::Latest {
            // start after the current snapshot, durably, before any change is read
            if let Some(cur) = source.metadata.current_snapshot() {
                let at = (cur.snapshot_id(), cur.sequence_number());
                let p = Progress::at(source, Some(at), 0, &self.cfg.topic);
                self.blocking("begin_transaction", |p| p.begin_transaction()).await?;
                self.progress_record(&p)?;
                self.blocking("commit_transaction", |p| p.commit_transaction(TXN_TIMEOUT)).await?;
                self.transactions += 1;
                // what was just committed (reading it back right away can race a new topic's leader election)
                progress = Some(p);
            }
        }
        tracing::debug!(pipeline = %self.pipeline, progress = ?progress, "Kafka sink progress");
        self.progress = progress;
        Ok(self.progress.as_ref().and_then(|p| p.snapshot_id))
    }

    async fn prepare(&mut self, _source: &SourceInfo, _schema: &SchemaRef, _bootstrap: bool) -> Result<Option<i64>> {
        // nobody else writes this pipeline's progress: the producer fenced every older instance
        Ok(self.progress.as_ref().and_then(|p| p.snapshot_id))
    }

    async fn begin(&mut self, source: &SourceInfo, chunk: &Chunk) -> Result<()> {
        let (ns, table) = source.name.rsplit_once('.').unwrap_or(("", source.name.as_str()));
        let mut enc = Encoder::new(
            self.cfg.format,
            self.cfg.tombstones,
            self.cfg.schemas_enable,
            SourceMeta { namespace: ns.to_string(), table: table.to_string() },
            source.key_ids.clone(),
        );
        enc.set_snapshot(chunk.bootstrap);
        self.encoder = Some(enc);
        self.open_source = Some(source.clone());
        let base_seq = chunk.base.and_then(|b| source.metadata.snapshot_by_id(b)).map(|s| s.sequence_number());
        let skip = match &self.progress {
            Some(p) if p.snapshot_id == chunk.base => p.partial_rows,
            _ => 0,
        };
        self.blocking("begin_transaction", |p| p.begin_transaction()).await?;
        self.open = Some(Open {
            last: (chunk.last().snapshot_id(), chunk.last().sequence_number()),
            base: chunk.base,
            base_seq,
            rows_done: 0,
            skip,
            skipping_last: false,
            rows_in_txn: 0,
            bytes_in_txn: 0,
            stats: CommitStats::default(),
            started: std::time::Instant::now(),
            resync: chunk.rewrite.as_ref().map(|r| r.kind.as_str()),
        });
        Ok(())
    }

    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        let source = self.open_source.clone();
        self.write_batch(batch, source.as_ref()).await
    }

    async fn commit(&mut self, source: &SourceInfo, stop: Option<&tokio::sync::watch::Receiver<bool>>) -> Result<Committed> {
        let open = self.open.take().ok_or_else(|| Error::Internal("commit without begin".into()))?;
        if stop.is_some_and(|s| *s.borrow()) {
            self.open = Some(open);
            self.abort().await;
            return Err(Error::Cancelled);
        }
        // rows still to skip reach into the next chunk (a restart planned shorter chunks than before)
        let progress = Progress::at(source, Some(open.last), open.skip, &self.cfg.topic);
        self.progress_record(&progress)?;
        self.blocking("commit_transaction", |p| p.commit_transaction(TXN_TIMEOUT)).await?;
        self.transactions += 1;
        self.progress = Some(progress);
        let mut stats = open.stats;
        stats.seconds = open.started.elapsed().as_secs_f64();
        Ok(Committed::Done { id: open.last.0, stats })
    }

    async fn abort(&mut self) {
        if self.open.take().is_some() && self.producer.is_some() {
            self.aborts += 1;
            if let Err(e) = self.blocking("abort_transaction", |p| p.abort_transaction(TXN_TIMEOUT)).await {
                tracing::warn!(error = %e, "aborting the Kafka transaction failed; the broker aborts it after transaction.timeout.ms");
            }
        }
    }

    fn retries(&self) -> u32 {
        self.retries
    }

    fn created(&self) -> bool {
        false
    }
}

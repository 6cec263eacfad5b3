//! `[cluster]`: many services, one set of pipelines, shared through Kafka's consumer-group protocol — the
//! coordinator Kafka Connect and Kafka Streams rely on.
//!
//! Algorithm:
//! - At start the control topic (`<group>.pipelines` by default) is created when missing, with
//!   `cluster.partitions` partitions; its real partition count (from the broker's metadata) is what every instance
//!   maps pipelines with: pipeline → [`partition_of`] its name. Nothing is ever written to the topic.
//! - A consumer joins the group on the topic with the cooperative-sticky assignor (incremental rebalances: an
//!   instance joining or leaving moves only the partitions that must move; the others' pipelines keep running). Its
//!   poll thread serves the rebalance callbacks:
//!   - **revoke**: the partitions leave the owned set, and the callback waits (up to the revoke deadline) until the
//!     service has stopped those pipelines' loops — each finishes or abandons its in-flight commit — before the
//!     group hands them to another instance;
//!   - **assign**: the partitions join the owned set; the service starts their pipelines.
//! - The service follows the owned set ([`Membership::changed`]) and acknowledges each change once its loops match
//!   it ([`Membership::applied`]).
//!
//! Invariants: an instance runs a pipeline only while it owns its partition, give or take the revoke deadline and a
//! lost session (an instance cut off from the brokers keeps running until it notices). Correctness never depends on
//! that: two instances that briefly run one pipeline stay exact through the catalog's commit requirements.
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, TopicPartitionList};
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::service::config::{partition_of, ClusterConfig};

/// The control-topic partitions this instance owns, and how many changes of that set there have been.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Owned {
    /// Owned partitions of the control topic.
    pub(crate) partitions: BTreeSet<i32>,
    /// Changes so far: the service acknowledges a change by its number.
    pub(crate) change: u64,
}

/// This instance's membership of the group: which pipelines it owns, as the group decides.
pub(crate) struct Membership {
    owned: watch::Receiver<Owned>,
    acks: mpsc::Sender<u64>,
    /// The control topic's partition count (every instance maps with the same one).
    partitions: i32,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Membership {
    /// Creates the control topic when missing and joins the group. A revocation waits for the service at most
    /// `revoke_deadline` (its shutdown timeout: what an in-flight commit may take).
    pub(crate) async fn join(cfg: &ClusterConfig, revoke_deadline: Duration) -> Result<Membership> {
        let topic = cfg.topic();
        let partitions = ensure_topic(cfg, &topic).await?;
        if partitions != cfg.partitions {
            tracing::warn!(topic = %topic, partitions, configured = cfg.partitions, "the control topic exists with another partition count; every instance uses the topic's");
        }
        let (tx, owned) = watch::channel(Owned::default());
        let (acks, acks_rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let context = GroupContext { owned: tx, acks: Mutex::new(acks_rx), stop: stop.clone(), revoke_deadline };
        let mut client = client_config(cfg);
        client
            .set("group.id", &cfg.group)
            .set("session.timeout.ms", cfg.session_timeout.as_millis().to_string())
            .set("heartbeat.interval.ms", (cfg.session_timeout.as_millis() / 3).max(100).to_string())
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        if !cfg.properties.contains_key("group.protocol") && !cfg.properties.contains_key("partition.assignment.strategy") {
            client.set("partition.assignment.strategy", "cooperative-sticky");
        }
        let consumer: BaseConsumer<GroupContext> =
            client.create_with_context(context).map_err(|e| kafka_error(cfg, "cannot create the group's consumer", e))?;
        consumer.subscribe(&[&topic]).map_err(|e| kafka_error(cfg, "cannot join the group", e))?;
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("cdc-cluster".into())
            .spawn(move || {
                let mut warned = Instant::now() - Duration::from_secs(60);
                while !stopping.load(Ordering::SeqCst) {
                    // serves heartbeats' results and the rebalance callbacks; the topic carries no message
                    if let Some(Err(e)) = consumer.poll(Duration::from_millis(200)) {
                        if warned.elapsed() > Duration::from_secs(30) {
                            tracing::warn!(error = %e, "the cluster's Kafka group reports an error; retrying");
                            warned = Instant::now();
                        }
                    }
                }
                // leaving the group: revocations no longer wait (the service is stopping every loop anyway)
                consumer.unsubscribe();
            })
            .map_err(|e| Error::Internal(format!("cannot start the cluster's thread: {e}")))?;
        tracing::info!(group = %cfg.group, topic = %topic, partitions, "joined the cluster's group; waiting for an assignment");
        Ok(Membership { owned, acks, partitions, stop, thread: Some(thread) })
    }

    /// Whether this instance owns `pipeline` now.
    pub(crate) fn owns(&self, pipeline: &str) -> bool {
        self.owned.borrow().partitions.contains(&partition_of(pipeline, self.partitions))
    }

    /// The owned set, once it differs from the last one seen.
    pub(crate) async fn changed(&mut self) -> Owned {
        if self.owned.changed().await.is_err() {
            // the poll thread is gone: the set can no longer change
            std::future::pending::<()>().await;
        }
        self.owned.borrow_and_update().clone()
    }

    /// The service's loops now match change `change`: a revocation waiting for it may let go.
    pub(crate) fn applied(&self, change: u64) {
        let _ = self.acks.send(change);
    }
}

impl Drop for Membership {
    /// Leaves the group (its partitions go to the other instances at once, without waiting for the session timeout).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The consumer's context: turns rebalances into changes of the owned set.
struct GroupContext {
    owned: watch::Sender<Owned>,
    acks: Mutex<mpsc::Receiver<u64>>,
    stop: Arc<AtomicBool>,
    revoke_deadline: Duration,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    /// A revocation: the partitions leave the owned set, and the group waits until their loops have stopped.
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(list) = rebalance else { return };
        let revoked = partitions_in(list);
        if revoked.is_empty() {
            return;
        }
        let change = self.update(|owned| owned.retain(|p| !revoked.contains(p)));
        tracing::info!(partitions = ?revoked, "the cluster's group takes partitions from this instance");
        if self.stop.load(Ordering::SeqCst) {
            return;
        }
        let deadline = Instant::now() + self.revoke_deadline;
        let acks = self.acks.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match acks.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(n) if n >= change => return,
                Ok(_) => continue,
                Err(_) => {
                    tracing::warn!(deadline = ?self.revoke_deadline, "pipelines taken by the group did not stop in time; they may briefly run twice (the catalog keeps them exact)");
                    return;
                }
            }
        }
    }

    /// An assignment: the partitions join the owned set.
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(list) => {
                let assigned = partitions_in(list);
                if !assigned.is_empty() {
                    tracing::info!(partitions = ?assigned, "the cluster's group gives partitions to this instance");
                    self.update(|owned| owned.extend(assigned));
                }
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "the cluster's group failed to rebalance; retrying"),
            Rebalance::Revoke(_) => {}
        }
    }
}

impl GroupContext {
    /// Changes the owned set; returns the change's number.
    fn update(&self, f: impl FnOnce(&mut BTreeSet<i32>)) -> u64 {
        let mut change = 0;
        self.owned.send_modify(|o| {
            f(&mut o.partitions);
            o.change += 1;
            change = o.change;
        });
        change
    }
}

fn partitions_in(list: &TopicPartitionList) -> BTreeSet<i32> {
    list.elements().iter().map(|e| e.partition()).collect()
}

fn client_config(cfg: &ClusterConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (k, v) in &cfg.properties {
        c.set(k, v);
    }
    c.set("bootstrap.servers", &cfg.bootstrap_servers);
    c
}

fn kafka_error(cfg: &ClusterConfig, what: &str, e: rdkafka::error::KafkaError) -> Error {
    Error::Kafka {
        what: format!("[cluster] {what}"),
        message: format!("brokers {}, group {}: {e}; check cluster.bootstrap_servers and cluster.properties", cfg.bootstrap_servers, cfg.group),
        retryable: true,
        cause: None,
    }
}

/// Creates the control topic when missing (replication: the brokers' default); returns its partition count.
async fn ensure_topic(cfg: &ClusterConfig, topic: &str) -> Result<i32> {
    let admin: AdminClient<DefaultClientContext> = client_config(cfg).create().map_err(|e| kafka_error(cfg, "cannot create an admin client", e))?;
    let new = NewTopic::new(topic, cfg.partitions, TopicReplication::Fixed(-1));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))).request_timeout(Some(Duration::from_secs(30)));
    let created = admin.create_topics([&new], &opts).await.map_err(|e| kafka_error(cfg, "cannot create the control topic", e))?;
    for r in created {
        match r {
            Ok(_) => tracing::info!(topic, partitions = cfg.partitions, "created the cluster's control topic"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, code)) => {
                return Err(kafka_error(cfg, &format!("cannot create the control topic `{t}`"), rdkafka::error::KafkaError::AdminOp(code)));
            }
        }
    }
    let (cfg2, topic2) = (cfg.clone(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let metadata = admin
            .inner()
            .fetch_metadata(Some(&topic2), Duration::from_secs(30))
            .map_err(|e| kafka_error(&cfg2, "cannot read the control topic's metadata", e))?;
        let n = metadata.topics().iter().find(|t| t.name() == topic2).map_or(0, |t| t.partitions().len());
        if n == 0 {
            return Err(kafka_error(
                &cfg2,
                &format!("the control topic `{topic2}` has no partitions"),
                rdkafka::error::KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownTopicOrPartition),
            ));
        }
        Ok(n as i32)
    })
    .await
    .map_err(|e| Error::Internal(format!("control topic metadata task: {e}")))?
}

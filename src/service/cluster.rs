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
//!   - **lost** (a revocation because the coordinator could not be reached for the session timeout: a broker outage,
//!     a network cut): the partitions stay in the owned set — replication does not pause for the coordinator — and
//!     are *held*: the group's next assignment replaces them (those it gives back stay, the others leave), or, with
//!     no assignment for `outage_grace`, they leave.
//! - The service follows the owned set ([`Membership::changed`]) and acknowledges each change once its loops match
//!   it ([`Membership::applied`]).
//!
//! Invariants: an instance runs a pipeline only while it owns its partition, give or take the revoke deadline and,
//! when it lost contact with the coordinator, `outage_grace` (the others may have been given its pipelines
//! meanwhile). Correctness never depends on that: two instances that run one pipeline stay exact through the
//! catalog's commit requirements.
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, TopicPartitionList};
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::service::config::{partition_of, ClusterConfig};
use crate::sink::kafka::auth::{auth_defaults, KafkaContext};

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
    /// `metrics_address` (the instance's telemetry address, or `off`) goes into the group member's client id, where
    /// `cdc status` finds it.
    pub(crate) async fn join(cfg: &ClusterConfig, revoke_deadline: Duration, metrics_address: &str) -> Result<Membership> {
        let topic = cfg.topic();
        let kafka = context_for(cfg)?;
        let partitions = ensure_topic(cfg, &topic, kafka.clone()).await?;
        if partitions != cfg.partitions {
            tracing::warn!(topic = %topic, partitions, configured = cfg.partitions, "the control topic exists with another partition count; every instance uses the topic's");
        }
        let (tx, owned) = watch::channel(Owned::default());
        let (acks, acks_rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let context = GroupContext {
            owned: tx,
            acks: Mutex::new(acks_rx),
            stop: stop.clone(),
            revoke_deadline,
            kafka,
            held: Mutex::new(None),
            outage_grace: cfg.outage_grace,
        };
        let mut client = client_config(cfg);
        client
            .set("group.id", &cfg.group)
            .set("client.id", format!("{CLIENT_ID_PREFIX}{metrics_address}"))
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
                    consumer.context().release_held_after_grace();
                }
                // leaving the group: revocations no longer wait (the service is stopping every loop anyway)
                consumer.unsubscribe();
            })
            .map_err(|e| Error::failed("starting the cluster's thread", e))?;
        tracing::info!(group = %cfg.group, topic = %topic, partitions, "joined the cluster's group; waiting for an assignment");
        Ok(Membership { owned, acks, partitions, stop, thread: Some(thread) })
    }

    /// Whether this instance owns `pipeline` now.
    pub(crate) fn owns(&self, pipeline: &str) -> bool {
        self.owned.borrow().partitions.contains(&partition_of(pipeline, self.partitions))
    }

    /// [`Self::owns`] for another task: it follows the assignment as it changes.
    pub(crate) fn owner(&self) -> impl Fn(&str) -> bool + Send + Sync + 'static {
        let (owned, partitions) = (self.owned.clone(), self.partitions);
        move |pipeline| owned.borrow().partitions.contains(&partition_of(pipeline, partitions))
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

/// Group members' client ids are this and their telemetry address.
const CLIENT_ID_PREFIX: &str = "cdc@";

/// A member of the cluster's group as `cdc status` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    /// Where its `/status` answers (`None`: telemetry off, or not a `cdc` member).
    pub(crate) address: Option<String>,
    /// The host the broker sees it connect from.
    pub(crate) host: String,
    /// The control-topic partitions assigned to it.
    pub(crate) partitions: BTreeSet<i32>,
}

/// The members of `cfg`'s group with their assignments, and the control topic's partition count (what pipelines map
/// with). Classic-protocol groups only (`group.protocol = "consumer"` groups are not described by this call).
pub(crate) async fn members(cfg: &ClusterConfig) -> Result<(Vec<Member>, i32)> {
    let cfg = cfg.clone();
    let context = context_for(&cfg)?;
    tokio::task::spawn_blocking(move || {
        let topic = cfg.topic();
        let consumer: BaseConsumer<KafkaContext> =
            client_config(&cfg).create_with_context(context).map_err(|e| kafka_error(&cfg, "cannot create a client", e))?;
        let timeout = Duration::from_secs(15);
        let metadata =
            consumer.fetch_metadata(Some(&topic), timeout).map_err(|e| kafka_error(&cfg, "cannot read the control topic's metadata", e))?;
        let partitions = metadata.topics().iter().find(|t| t.name() == topic).map_or(0, |t| t.partitions().len()) as i32;
        let groups = consumer.fetch_group_list(Some(&cfg.group), timeout).map_err(|e| kafka_error(&cfg, "cannot describe the group", e))?;
        let mut out = Vec::new();
        for g in groups.groups() {
            for m in g.members() {
                let host = m.client_host().trim_start_matches('/').to_string();
                let address = m.client_id().strip_prefix(CLIENT_ID_PREFIX).filter(|a| *a != "off").map(|a| reachable_address(a, &host));
                let partitions = m.assignment().map(|b| decode_assignment(b, &topic)).unwrap_or_default();
                out.push(Member { address, host, partitions });
            }
        }
        Ok((out, partitions))
    })
    .await
    .map_err(|e| Error::failed("group description task", e))?
}

/// A telemetry address bound to every interface (`0.0.0.0:9464`) is reached at the member's host.
fn reachable_address(address: &str, host: &str) -> String {
    match address.parse::<std::net::SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => format!("{host}:{}", a.port()),
        _ => address.to_string(),
    }
}

/// The partitions of `topic` in a classic consumer-protocol assignment: `version: i16`, then `[topic: string (i16
/// length), partitions: [i32]]` (arrays with an i32 count), then user data. A malformed one decodes as far as it goes.
fn decode_assignment(bytes: &[u8], topic: &str) -> BTreeSet<i32> {
    let mut out = BTreeSet::new();
    let mut at = 2usize; // version
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = bytes.get(at..at + n)?;
        at += n;
        Some(s)
    };
    let i32_of = |b: &[u8]| i32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    let _ = (|| -> Option<()> {
        let topics = i32_of(take(4)?);
        for _ in 0..topics.max(0) {
            let len = i16::from_be_bytes(take(2)?.try_into().ok()?).max(0) as usize;
            let name = std::str::from_utf8(take(len)?).ok()?.to_string();
            let count = i32_of(take(4)?);
            for _ in 0..count.max(0) {
                let p = i32_of(take(4)?);
                if name == topic {
                    out.insert(p);
                }
            }
        }
        Some(())
    })();
    out
}

/// The consumer's context: turns rebalances into changes of the owned set.
struct GroupContext {
    owned: watch::Sender<Owned>,
    acks: Mutex<mpsc::Receiver<u64>>,
    stop: Arc<AtomicBool>,
    revoke_deadline: Duration,
    /// Tokens for OAUTHBEARER (`auth = "google"`).
    kafka: KafkaContext,
    /// Partitions kept running after the coordinator was lost, and since when ([`Held`]).
    held: Mutex<Option<Held>>,
    /// How long held partitions stay without a new assignment.
    outage_grace: Duration,
}

/// Partitions this instance keeps after it lost contact with the group's coordinator (see the module header).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    since: Instant,
    partitions: BTreeSet<i32>,
}

/// The owned set once the group assigns `assigned` after partitions were `held`: the held ones the group did not
/// give back leave, the assigned ones join. Pure.
fn after_outage(owned: &BTreeSet<i32>, held: &BTreeSet<i32>, assigned: &BTreeSet<i32>) -> BTreeSet<i32> {
    owned.iter().filter(|p| !held.contains(p) || assigned.contains(p)).chain(assigned).copied().collect()
}

impl ClientContext for GroupContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, config: Option<&str>) -> std::result::Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        self.kafka.generate_oauth_token(config)
    }
}

impl ConsumerContext for GroupContext {
    /// A revocation: the partitions leave the owned set, and the group waits until their loops have stopped. A lost
    /// assignment (the coordinator was not reached): they are held instead, and keep running.
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(list) = rebalance else { return };
        let revoked = partitions_in(list);
        if revoked.is_empty() {
            return;
        }
        if consumer.assignment_lost() && !self.stop.load(Ordering::SeqCst) {
            let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            let h = held.get_or_insert_with(|| Held { since: Instant::now(), partitions: BTreeSet::new() });
            h.partitions.extend(revoked);
            tracing::warn!(
                partitions = h.partitions.len(),
                grace_seconds = self.outage_grace.as_secs_f64(),
                "lost contact with the cluster's group coordinator; this instance keeps running its pipelines until the group assigns again or the grace ends"
            );
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
                    tracing::warn!(
                        deadline_seconds = self.revoke_deadline.as_secs_f64(),
                        "pipelines taken by the group did not stop in time; they may briefly run twice (the catalog keeps them exact)"
                    );
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
                if let Some(held) = self.held.lock().unwrap_or_else(PoisonError::into_inner).take() {
                    tracing::info!(partitions = ?assigned, held = held.partitions.len(), "the cluster's group answers again; its assignment replaces the pipelines held meanwhile");
                    self.update(|owned| *owned = after_outage(owned, &held.partitions, &assigned));
                } else if !assigned.is_empty() {
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
    /// Held partitions leave the owned set once `outage_grace` passed without a new assignment.
    fn release_held_after_grace(&self) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.as_ref().is_some_and(|h| h.since.elapsed() >= self.outage_grace) {
            let h = held.take().expect("checked");
            tracing::warn!(
                partitions = h.partitions.len(),
                grace_seconds = self.outage_grace.as_secs_f64(),
                "no assignment from the cluster's group within the outage grace; giving its pipelines up"
            );
            self.update(|owned| owned.retain(|p| !h.partitions.contains(p)));
        }
    }

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
    auth_defaults(cfg.auth.as_deref(), &mut c);
    for (k, v) in &cfg.properties {
        c.set(k, v);
    }
    c.set("bootstrap.servers", &cfg.bootstrap_servers);
    c
}

/// The clients' context: Google tokens for OAUTHBEARER when `auth = "google"`.
fn context_for(cfg: &ClusterConfig) -> Result<KafkaContext> {
    crate::sink::kafka::auth::context_for(cfg.auth.as_deref(), cfg.principal.as_deref(), "cluster")
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
async fn ensure_topic(cfg: &ClusterConfig, topic: &str, context: KafkaContext) -> Result<i32> {
    let admin: AdminClient<KafkaContext> =
        client_config(cfg).create_with_context(context).map_err(|e| kafka_error(cfg, "cannot create an admin client", e))?;
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
    .map_err(|e| Error::failed("control topic metadata task", e))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_an_outage_the_groups_assignment_replaces_what_was_held() {
        let set = |v: &[i32]| v.iter().copied().collect::<BTreeSet<i32>>();
        // held 1,2,3 of 1..=4 (4 was never lost); the group gives back 2 and adds 7
        assert_eq!(after_outage(&set(&[1, 2, 3, 4]), &set(&[1, 2, 3]), &set(&[2, 7])), set(&[2, 4, 7]));
        // nothing given back: every held partition leaves
        assert_eq!(after_outage(&set(&[1, 2]), &set(&[1, 2]), &set(&[])), set(&[]));
    }

    #[test]
    fn the_groups_clients_take_auth_defaults_then_the_users_properties() {
        let cfg: ClusterConfig = toml::from_str(
            "bootstrap_servers = \"k:9092\"\ngroup = \"g\"\nauth = \"google\"\nproperties = { \"security.protocol\" = \"SASL_PLAINTEXT\" }\n",
        )
        .unwrap();
        let c = client_config(&cfg);
        assert_eq!(c.get("sasl.mechanism"), Some("OAUTHBEARER"));
        assert_eq!(c.get("security.protocol"), Some("SASL_PLAINTEXT"), "the user's properties win");
        assert_eq!(c.get("bootstrap.servers"), Some("k:9092"));
    }

    fn assignment(topics: &[(&str, &[i32])]) -> Vec<u8> {
        let mut b = vec![0u8, 1];
        b.extend((topics.len() as i32).to_be_bytes());
        for (t, ps) in topics {
            b.extend((t.len() as i16).to_be_bytes());
            b.extend(t.as_bytes());
            b.extend((ps.len() as i32).to_be_bytes());
            for p in *ps {
                b.extend(p.to_be_bytes());
            }
        }
        b.extend((-1i32).to_be_bytes()); // no user data
        b
    }

    #[test]
    fn an_assignment_decodes_to_the_control_topics_partitions() {
        let b = assignment(&[("other", &[1, 2]), ("lake.pipelines", &[0, 7, 31])]);
        assert_eq!(decode_assignment(&b, "lake.pipelines"), BTreeSet::from([0, 7, 31]));
        assert_eq!(decode_assignment(&b, "missing"), BTreeSet::new());
        // cut short: what was read stays, nothing panics
        assert_eq!(decode_assignment(&b[..b.len() - 12], "lake.pipelines"), BTreeSet::from([0]));
        assert_eq!(decode_assignment(&[], "lake.pipelines"), BTreeSet::new());
    }

    #[test]
    fn an_address_on_every_interface_is_reached_at_the_members_host() {
        assert_eq!(reachable_address("0.0.0.0:9464", "10.0.0.5"), "10.0.0.5:9464");
        assert_eq!(reachable_address("127.0.0.1:9000", "10.0.0.5"), "127.0.0.1:9000");
    }
}

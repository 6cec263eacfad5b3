//! `[cluster]` in a build without the `kafka` cargo feature: the same interface as `cluster.rs`, refusing to join.
//! Validation already refuses a `[cluster]` section in such a build; these stand in so the service compiles.
use std::collections::BTreeSet;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::service::config::ClusterConfig;

/// The control-topic partitions this instance owns, and how many changes of that set there have been.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Owned {
    /// Owned partitions of the control topic.
    pub(crate) partitions: BTreeSet<i32>,
    /// Changes so far.
    pub(crate) change: u64,
}

/// Never built: joining is refused.
pub(crate) struct Membership(std::convert::Infallible);

impl Membership {
    /// Refuses: this build has no Kafka.
    pub(crate) async fn join(_: &ClusterConfig, _: Duration, _: &str) -> Result<Membership> {
        Err(Error::Config(vec![format!("cluster: {}", crate::config::LEFT_OUT_KAFKA)]))
    }

    pub(crate) fn owns(&self, _: &str) -> bool {
        match self.0 {}
    }

    pub(crate) fn owner(&self) -> impl Fn(&str) -> bool + Send + Sync + 'static {
        match self.0 {}
        #[allow(unreachable_code)]
        |_: &str| false
    }

    pub(crate) async fn changed(&mut self) -> Owned {
        match self.0 {}
    }

    pub(crate) fn applied(&self, _: u64) {
        match self.0 {}
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        match self.0 {}
    }
}

/// A member of the cluster's group as `cdc status` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) address: Option<String>,
    pub(crate) host: String,
    pub(crate) partitions: BTreeSet<i32>,
}

/// Refuses: this build has no Kafka.
pub(crate) async fn members(_: &ClusterConfig) -> Result<(Vec<Member>, i32)> {
    Err(Error::Config(vec![format!("cluster: {}", crate::config::LEFT_OUT_KAFKA)]))
}

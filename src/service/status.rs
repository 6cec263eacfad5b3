//! `cdc status --config service.toml`: every pipeline of a service file with the instance that runs it, its state,
//! lag and last error — asked of the running instances, not worked out from the tables.
//!
//! Which instances: with `[cluster]`, the members of the group (each member's client id carries its telemetry
//! address; its assignment says which pipelines it owns); without, the one instance at the file's
//! `service.metrics_address` (or `--metrics-address`). Each is asked its `/status`. A pipeline no member owns is
//! `unowned`; one whose owner does not answer is `owner unreachable`; one its owner does not run (yet) is `not
//! running`.
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::service::config::{partition_of, ServiceConfig};
use crate::service::http::InstanceStatus;

/// One pipeline sink's line of `cdc status`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PipelineStatus {
    /// The pipeline's name.
    pub pipeline: String,
    /// The sink's label.
    pub sink: String,
    /// The instance running it (`host@address` as it names itself, or the address asked); `None`: no owner.
    pub owner: Option<String>,
    /// `ok`, `failing`, `stopped`, `not started`, `overdue: …`, `not running`, `unowned`, `owner unreachable`.
    pub state: String,
    /// Source snapshots not yet applied, as its owner's last poll saw them.
    pub lag_snapshots: Option<u64>,
    /// Seconds of lag, likewise.
    pub lag_seconds: Option<f64>,
    /// The last poll's error.
    pub last_error: Option<String>,
}

/// The status of every pipeline sink of the file at `path`, asked of its running instances; `metrics_address`
/// overrides the file's (the instance to ask without a cluster).
pub async fn status(path: &Path, metrics_address: Option<String>) -> Result<Vec<PipelineStatus>> {
    let cfg = ServiceConfig::load(path)?;
    // the tables pipelines of patterns stand for now (a catalog that cannot be listed: none of its tables)
    let listings = super::discover::list_catalogs(&cfg).await.into_iter().map(|(name, listed, _)| (name, listed.ok().map(|(t, _)| t))).collect();
    let found = super::discover::select(&cfg, &listings, &Default::default());
    let runs = cfg.runs(&found);
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().map_err(|e| Error::Internal(format!("http client: {e}")))?;
    // (how the owner is named, the address to ask — none with telemetry off —, the pipelines it owns: None = all)
    let owners: Vec<(String, Option<String>, Option<Vec<String>>)> = match &cfg.cluster {
        Some(c) => {
            let (members, partitions) = super::cluster::members(c).await?;
            members
                .into_iter()
                .map(|m| {
                    let owned =
                        runs.iter().filter(|r| m.partitions.contains(&partition_of(&r.pipeline, partitions))).map(|r| r.pipeline.clone()).collect();
                    (m.address.clone().unwrap_or_else(|| format!("{} (telemetry off)", m.host)), m.address, Some(owned))
                })
                .collect()
        }
        None => {
            let address = metrics_address.unwrap_or(cfg.service.metrics_address.clone());
            vec![(address.clone(), Some(address), None)]
        }
    };
    let mut answers = Vec::new();
    for (name, address, owned) in owners {
        let answer = match &address {
            Some(a) => ask(&http, a).await,
            None => None,
        };
        answers.push((name, owned, answer));
    }
    Ok(runs
        .iter()
        .map(|r| {
            let owner = answers.iter().find(|(_, owned, _)| owned.as_ref().is_none_or(|o| o.contains(&r.pipeline)));
            let mut line = PipelineStatus {
                pipeline: r.pipeline.clone(),
                sink: r.sink.clone(),
                owner: None,
                state: "unowned".into(),
                lag_snapshots: None,
                lag_seconds: None,
                last_error: None,
            };
            let Some((name, _, answer)) = owner else { return line };
            line.owner = Some(name.clone());
            match answer {
                None => line.state = "owner unreachable".into(),
                Some(a) => {
                    line.owner = Some(a.instance.clone());
                    match a.pipelines.iter().find(|l| l.pipeline == r.pipeline && l.sink == r.sink) {
                        None => line.state = "not running".into(),
                        Some(l) => {
                            line.state = l.state.clone();
                            (line.lag_snapshots, line.lag_seconds, line.last_error) =
                                (Some(l.lag_snapshots), Some(l.lag_seconds), l.last_error.clone());
                        }
                    }
                }
            }
            line
        })
        .collect())
}

/// An instance's `/status`, or `None` when it does not answer with one.
async fn ask(http: &reqwest::Client, address: &str) -> Option<InstanceStatus> {
    let r = http.get(format!("http://{address}/status")).send().await.ok()?;
    r.json().await.ok()
}

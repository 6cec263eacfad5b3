//! iceberg-cdc: change data capture for Apache Iceberg tables.
//!
//! Data flows one way: `source` (lineage, planning, reading, the changelog scan) → `change` (row types and metadata
//! columns) → `pipeline` (the only module that sees both sides) → outputs and sinks.
#![warn(missing_docs)]
pub(crate) mod auth;
mod backoff;
pub mod catalog;
pub(crate) mod change;
pub mod config;
pub mod error;
pub mod output;
pub(crate) mod pattern;
pub mod pipeline;
pub mod quickstart;
pub(crate) mod redact;
pub mod service;
pub mod sink;
pub(crate) mod source;
pub mod spec;
pub(crate) mod storage;
#[cfg(test)]
mod test_alloc;
#[cfg(test)]
pub(crate) mod test_rng;

pub use error::{Error, Result};

/// This machine's host name, as the kernel reports it (`localhost` when it cannot be read): named in Hive locks and
/// in the service's `/status`.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "localhost".into())
}

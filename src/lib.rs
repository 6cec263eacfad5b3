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
pub mod pipeline;
pub mod quickstart;
pub mod service;
pub mod sink;
pub(crate) mod source;
pub mod spec;
pub(crate) mod storage;

pub use error::{Error, Result};

//! iceberg-cdc: change data capture for Apache Iceberg tables.
//!
//! Data flows one way: `source` (lineage, planning, reading, the changelog scan) → `change` (row types and metadata
//! columns) → `pipeline` (the only module that sees both sides) → outputs and sinks.
pub mod auth;
mod backoff;
pub mod catalog;
pub mod change;
pub mod config;
pub mod error;
pub mod output;
pub mod pipeline;
pub mod quickstart;
pub mod service;
pub mod sink;
pub mod source;
pub mod spec;
pub mod storage;

pub use error::{Error, Result};

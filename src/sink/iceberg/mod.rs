//! Writing to Iceberg tables: data and equality-delete files, and the row-delta commit iceberg-rust 0.10.1 lacks.
pub mod apply;
mod commit;
pub mod deletes;
pub mod evolve;
pub(crate) mod expire;
pub mod files;
pub(crate) mod location;
pub mod progress;
pub mod rowdelta;
pub(crate) mod split;
pub mod target;

pub use commit::IcebergSink;

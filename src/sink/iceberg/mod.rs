//! Writing to Iceberg tables: data and equality-delete files, and the row-delta commit iceberg-rust 0.10.1 lacks.
pub(crate) mod apply;
mod commit;
pub mod compact;
pub(crate) mod deletes;
pub(crate) mod evolve;
pub(crate) mod expire;
pub mod files;
pub(crate) mod locate;
pub(crate) mod location;
pub mod maintain;
pub(crate) mod merge;
pub mod progress;
pub mod rowdelta;
pub(crate) mod split;
pub(crate) mod target;

pub use commit::IcebergSink;

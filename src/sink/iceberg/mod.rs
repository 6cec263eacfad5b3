//! Writing to Iceberg tables: data and equality-delete files, and the row-delta commit iceberg-rust 0.10.1 lacks.
pub mod deletes;
pub mod files;
pub mod rowdelta;

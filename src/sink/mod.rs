//! The write side. `iceberg`: files and merge-on-read commits on a target Iceberg table.
pub mod iceberg;

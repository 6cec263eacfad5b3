//! Iceberg-spec helpers that both the read side (`source`) and the write side (`sink`) use: projecting Arrow data
//! by Iceberg field id, and encoding any Iceberg type for row comparison.
pub mod projection;
pub mod rowenc;

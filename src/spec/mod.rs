//! Iceberg-spec helpers that both the read side (`source`) and the write side (`sink`) use: lineage of a table's main
//! branch, the deletion-vector codec, projecting Arrow data by Iceberg field id, and encoding any Iceberg type for
//! row comparison. Neither side imports the other; both import this.
pub mod dv;
pub mod lineage;
pub mod projection;
pub mod rowenc;

/// Reserved field ids of position-delete files (Iceberg spec): `file_path` and `pos`.
pub const POS_DELETE_FILE_PATH_ID: i32 = 2147483546;
pub const POS_DELETE_POS_ID: i32 = 2147483545;

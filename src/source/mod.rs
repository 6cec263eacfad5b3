//! The read side: catalog lineage, per-snapshot file planning, reading data/delete files, and the changelog scan that
//! turns a snapshot range into net change rows.
pub mod changelog;
pub mod dv;
pub mod files;
pub mod lineage;
pub mod net;
pub mod reader;

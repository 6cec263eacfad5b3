//! The read side: catalog lineage, per-snapshot file planning, reading data/delete files, and the changelog scan that
//! turns a snapshot range into net change rows.
pub mod carry;
pub mod changelog;
pub mod files;
pub(crate) mod fingerprint;
pub(crate) mod format;
mod live;
pub(crate) mod matcher;
pub mod net;
pub mod reader;
pub(crate) mod slim;

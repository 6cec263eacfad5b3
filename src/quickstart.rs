//! `cdc quickstart`: the embedded default end to end.
use std::path::Path;

use crate::error::Result;

pub async fn run(_dir: &Path) -> Result<()> {
    Err(crate::Error::Internal("quickstart: not yet".into()))
}

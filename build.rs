//! Build script: the commit the binary is built from, for `cdc --version` (`CDC_COMMIT`). From the environment when
//! set (a container build without `.git`: `--build-arg CDC_COMMIT=$(git rev-parse --short=12 HEAD)`), else from git;
//! `unknown` when neither can tell. Rebuilt when HEAD moves (a commit, a checkout), not on every edit.
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=CDC_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    if let Ok(head) = std::fs::read_to_string(".git/HEAD") {
        println!("cargo:rerun-if-changed=.git/HEAD");
        if let Some(r) = head.trim().strip_prefix("ref: ").filter(|r| std::path::Path::new(".git").join(r).exists()) {
            println!("cargo:rerun-if-changed=.git/{r}");
        }
    }
    let commit = std::env::var("CDC_COMMIT").ok().filter(|c| !c.is_empty()).or_else(|| {
        let out = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().ok().filter(|o| o.status.success())?;
        Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
    });
    println!("cargo:rustc-env=CDC_COMMIT={}", commit.unwrap_or_else(|| "unknown".into()));
}

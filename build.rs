//! Build script: the commit the binary is built from, for `cdc --version` (`CDC_COMMIT`). From the environment when
//! set (a container build without `.git`: `--build-arg CDC_COMMIT=$(git rev-parse --short=12 HEAD)`), else from git;
//! `unknown` when neither can tell. Rebuilt when HEAD moves (a commit, a checkout), not on every edit. Git is asked
//! where HEAD and its branch live: in a `git worktree` `.git` is a file, and a build there that watched nothing would
//! leave the label of that build to every later one sharing the target directory.
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok().filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-env-changed=CDC_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        // a packed ref moves in packed-refs
        watched.push(git(&["rev-parse", "--git-path", &branch]));
        watched.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    }
    for path in watched.into_iter().flatten().filter(|p| std::path::Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={path}");
    }
    let commit = std::env::var("CDC_COMMIT").ok().filter(|c| !c.is_empty()).or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    println!("cargo:rustc-env=CDC_COMMIT={}", commit.unwrap_or_else(|| "unknown".into()));
}

//! `/metrics`, `/healthz`, `/readyz`, `/status` (JSON, what `cdc status` reads) and the status page at `/` (HTML that
//! shows `/status`, refreshing itself; `status.html`, no external asset) on a thread of their own (with a
//! single-threaded runtime), so they answer while the pipelines keep the main runtime's workers busy with a large
//! snapshot.
//!
//! A deliberately small HTTP/1.1 responder: GET only, one request per connection, bounded request size and time.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::{Error, Result};
use crate::service::telemetry::Telemetry;

const MAX_REQUEST: usize = 8 * 1024;
/// The status page served at `/`.
const STATUS_PAGE: &str = include_str!("status.html");

/// Binds `addr` (failing now, not later, when it is taken) and serves on a background thread.
pub fn serve(addr: SocketAddr, telemetry: Arc<Telemetry>, stall: Duration, instance: String) -> Result<()> {
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| Error::Io { path: format!("metrics address {addr}"), message: e.to_string(), retryable: false, cause: None }.with_cause(e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::Io { path: format!("metrics address {addr}"), message: e.to_string(), retryable: false, cause: None }.with_cause(e))?;
    std::thread::Builder::new()
        .name("cdc-http".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("http runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    let Ok((mut sock, _)) = listener.accept().await else { continue };
                    let (t, instance) = (telemetry.clone(), instance.clone());
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(Duration::from_secs(5), answer(&mut sock, &t, stall, &instance)).await;
                    });
                }
            });
        })
        .map_err(|e| Error::Internal(format!("cannot start the metrics thread: {e}")))?;
    tracing::info!(%addr, "serving / (status page), /metrics, /healthz, /readyz, /status");
    Ok(())
}

async fn answer(sock: &mut tokio::net::TcpStream, t: &Telemetry, stall: Duration, instance: &str) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < MAX_REQUEST {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&buf);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, content_type, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", t.encode()),
        ("GET", "/healthz") => {
            // liveness: every loop runs on schedule (a failing poll is still a loop that runs)
            let overdue: Vec<String> = t.overdue(stall).into_iter().map(|(l, why)| format!("{} ({}): {why}", l.pipeline, l.sink)).collect();
            if overdue.is_empty() {
                ("200 OK", "text/plain", "ok\n".to_string())
            } else {
                ("503 Service Unavailable", "text/plain", overdue.join("\n") + "\n")
            }
        }
        ("GET", "/readyz") => {
            // readiness: every loop runs on schedule and its last poll succeeded
            let statuses = t.statuses();
            let now = std::time::Instant::now();
            let failing: Vec<String> = statuses
                .iter()
                .filter_map(|(l, s)| {
                    let why = match s.overdue(now, stall) {
                        Some(late) => late,
                        None if s.healthy => return None,
                        None if !s.started => "not started".to_string(),
                        None => s.last_error.clone().unwrap_or_else(|| "no successful poll yet".to_string()),
                    };
                    Some(format!("{} ({}): {why}", l.pipeline, l.sink))
                })
                .collect();
            if statuses.is_empty() {
                ("503 Service Unavailable", "text/plain", "no pipelines\n".to_string())
            } else if failing.is_empty() {
                ("200 OK", "text/plain", "ready\n".to_string())
            } else {
                ("503 Service Unavailable", "text/plain", failing.join("\n") + "\n")
            }
        }
        ("GET", "/status") => ("200 OK", "application/json", status_json(t, stall, instance)),
        ("GET", "/") => ("200 OK", "text/html; charset=utf-8", STATUS_PAGE.to_string()),
        ("GET", _) => ("404 Not Found", "text/plain", "try / (the status page), /metrics, /healthz, /readyz or /status\n".to_string()),
        _ => ("405 Method Not Allowed", "text/plain", "GET only\n".to_string()),
    };
    let head = format!("HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(body.as_bytes()).await?;
    sock.shutdown().await
}

/// One pipeline loop as `/status` shows it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub(crate) struct LoopStatus {
    /// The pipeline's name.
    pub(crate) pipeline: String,
    /// The sink's label (`iceberg:<table>`, `kafka:<topic>`).
    pub(crate) sink: String,
    /// `ok`, `failing`, `stopped` (a permanent error), `not started`, or `overdue: <why>`.
    pub(crate) state: String,
    /// The last poll's error, if it failed.
    pub(crate) last_error: Option<String>,
    /// Seconds since the oldest source snapshot not yet applied was committed (0: caught up).
    pub(crate) lag_seconds: f64,
    /// Source snapshots not yet applied.
    pub(crate) lag_snapshots: u64,
}

/// What `/status` answers: the instance and every loop it runs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct InstanceStatus {
    /// How the instance names itself (host and telemetry address).
    pub(crate) instance: String,
    /// Its loops.
    pub(crate) pipelines: Vec<LoopStatus>,
    /// Its last configuration reload (SIGHUP), taken or refused.
    #[serde(default)]
    pub(crate) last_reload: Option<crate::service::telemetry::ReloadStatus>,
}

fn status_json(t: &Telemetry, stall: Duration, instance: &str) -> String {
    let now = std::time::Instant::now();
    let pipelines = t
        .statuses()
        .into_iter()
        .map(|(l, s)| {
            let state = match s.overdue(now, stall) {
                _ if s.stopped => "stopped".to_string(),
                Some(why) => format!("overdue: {why}"),
                None if !s.started => "not started".to_string(),
                None if s.healthy => "ok".to_string(),
                None => "failing".to_string(),
            };
            LoopStatus {
                pipeline: l.pipeline,
                sink: l.sink,
                state,
                last_error: s.last_error,
                lag_seconds: s.lag_seconds,
                lag_snapshots: s.lag_snapshots,
            }
        })
        .collect();
    serde_json::to_string(&InstanceStatus { instance: instance.to_string(), pipelines, last_reload: t.last_reload() }).unwrap_or_default()
}

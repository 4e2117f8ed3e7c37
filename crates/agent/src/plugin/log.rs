//! The plugin side of the plugin log socket (`spec/cni.md` §5.6): the CNI plugin runs as a
//! short-lived child of the container runtime, whose logs nobody reads, so it also POSTs its
//! log lines to the agent ([`crate::daemon::plugin_log`] is the server).
//!
//! Wire format (upstream's): HTTP/1.1 over `<run_dir>/log.sock`, `POST /log`, body a JSON
//! array of strings, each string one JSON log line (`{"level":"info","msg":"…",…}`).
//! [`log_line`] builds a line, [`post_lines`] sends a batch best-effort (short timeout; the
//! caller ignores failures, logging must never fail a CNI ADD).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value, json};

/// Socket file name inside the agent's run dir.
pub const LOG_SOCKET: &str = "log.sock";
/// How long the plugin waits for the agent to take its logs.
pub const POST_TIMEOUT: Duration = Duration::from_secs(1);

/// Failures posting plugin log lines.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// Posting lines failed.
    #[error("posting plugin logs to {path}: {source}")]
    Post {
        /// Socket path.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// The agent refused the lines.
    #[error("agent answered {0} to plugin logs")]
    Status(u16),
}

/// Severity of a plugin line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// debug (and anything finer).
    Debug,
    /// info (and unknown levels).
    Info,
    /// warn / warning.
    Warn,
    /// error and worse.
    Error,
}

impl Level {
    /// The level named by a line's `level` field (unknown names are info).
    pub fn parse(s: &str) -> Self {
        match s.to_ascii_lowercase().as_str() {
            "debug" | "trace" => Self::Debug,
            "warn" | "warning" => Self::Warn,
            "error" | "fatal" | "panic" | "dpanic" => Self::Error,
            _ => Self::Info,
        }
    }

    /// The name written into a line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
        }
    }
}

/// One JSON log line.
pub fn log_line(level: Level, msg: &str, fields: &[(&str, &str)]) -> String {
    let mut obj = Map::new();
    obj.insert("level".into(), json!(level.as_str()));
    obj.insert("msg".into(), json!(msg));
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        obj.insert("ts".into(), json!(t.as_secs_f64()));
    }
    for (k, v) in fields {
        obj.insert((*k).into(), json!(v));
    }
    Value::Object(obj).to_string()
}

/// POSTs `lines` to `<run_dir>/log.sock` (blocking, [`POST_TIMEOUT`]).
pub fn post_lines(run_dir: &Path, lines: &[String]) -> Result<(), PostError> {
    let path = run_dir.join(LOG_SOCKET);
    let body = serde_json::to_vec(lines).unwrap_or_default();
    let (status, _) =
        crate::plugin::client::post(&path, "/log", &body, POST_TIMEOUT).map_err(|source| {
            PostError::Post {
                path: path.clone(),
                source,
            }
        })?;
    if status == 200 {
        Ok(())
    } else {
        Err(PostError::Status(status))
    }
}

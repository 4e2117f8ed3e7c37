//! The agent side of the plugin log socket (`spec/cni.md` §5.6): [`LogServer`] takes the
//! lines the CNI plugin POSTs ([`crate::plugin::log`] is the sender) and re-emits them under
//! the tracing target `cni-plugin`.
//!
//! Lines that are not JSON objects are re-emitted verbatim at info level: a log channel must
//! not drop what it cannot parse. Bodies are capped at [`MAX_BODY`].

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ambit_http::{Body, Limits};
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::Value;
use tokio::net::UnixListener;
use tokio::sync::watch;

pub use crate::plugin::log::{LOG_SOCKET, Level};

/// Tracing target the agent re-emits plugin lines under.
pub const LOG_TARGET: &str = "cni-plugin";
/// Largest accepted request body.
pub const MAX_BODY: usize = 1 << 20;

/// Failures of the log socket.
#[derive(Debug, thiserror::Error)]
pub enum PluginLogError {
    /// Binding the socket failed.
    #[error("binding plugin log socket {path}: {source}")]
    Bind {
        /// Socket path.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
}

/// One plugin log line, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginLogLine {
    /// `level`.
    pub level: Level,
    /// `msg`.
    pub msg: String,
    /// Every other field, values rendered as JSON (strings unquoted).
    pub fields: BTreeMap<String, String>,
}

/// Parses one line; never fails (non-JSON text becomes the message).
pub fn parse_line(raw: &str) -> PluginLogLine {
    let Ok(Value::Object(mut obj)) = serde_json::from_str::<Value>(raw) else {
        return PluginLogLine {
            level: Level::Info,
            msg: raw.to_owned(),
            fields: BTreeMap::new(),
        };
    };
    let text = |v: Value| match v {
        Value::String(s) => s,
        other => other.to_string(),
    };
    let level = obj
        .remove("level")
        .map_or(Level::Info, |v| Level::parse(&text(v)));
    let msg = obj.remove("msg").map(text).unwrap_or_default();
    PluginLogLine {
        level,
        msg,
        fields: obj.into_iter().map(|(k, v)| (k, text(v))).collect(),
    }
}

/// Re-emits a line through `tracing` under [`LOG_TARGET`].
pub fn emit(line: &PluginLogLine) {
    // Field names of tracing events are static, so the plugin's fields travel as one.
    let fields = line
        .fields
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    let msg = &line.msg;
    match line.level {
        Level::Debug => tracing::debug!(target: LOG_TARGET, %fields, "{msg}"),
        Level::Info => tracing::info!(target: LOG_TARGET, %fields, "{msg}"),
        Level::Warn => tracing::warn!(target: LOG_TARGET, %fields, "{msg}"),
        Level::Error => tracing::error!(target: LOG_TARGET, %fields, "{msg}"),
    }
}

/// Where received lines go (default: [`emit`]).
pub type Sink = Arc<dyn Fn(PluginLogLine) + Send + Sync>;

/// The agent side: a bound log socket.
pub struct LogServer {
    listener: UnixListener,
    sink: Sink,
    limits: Limits,
    /// The socket path.
    pub path: PathBuf,
}

impl std::fmt::Debug for LogServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogServer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl LogServer {
    /// Binds `<run_dir>/log.sock` (stale file removed, dir created 0750, socket 0666 so the
    /// plugin can write whatever user the runtime runs it as). Must be called inside a
    /// tokio runtime.
    pub fn bind(run_dir: &Path) -> Result<Self, PluginLogError> {
        let path = run_dir.join(LOG_SOCKET);
        let err = |source| PluginLogError::Bind {
            path: path.clone(),
            source,
        };
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(run_dir)
                .map_err(err)?;
        }
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(err(e)),
            _ => {}
        }
        let listener = UnixListener::bind(&path).map_err(err)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).map_err(err)?;
        Ok(Self {
            listener,
            sink: Arc::new(|l| emit(&l)),
            limits: Limits {
                max_body: MAX_BODY,
                ..Limits::default()
            },
            path,
        })
    }

    /// Serves with these bounds instead of the default ones (the body limit stays
    /// [`MAX_BODY`] unless set lower).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = Limits {
            max_body: limits.max_body.min(MAX_BODY),
            ..limits
        };
        self
    }

    /// Sends lines to `sink` instead of `tracing` (tests, other log pipelines).
    pub fn with_sink(mut self, sink: Sink) -> Self {
        self.sink = sink;
        self
    }

    /// Serves until `stop` turns true; open connections are then dropped.
    pub async fn serve(self, stop: watch::Receiver<bool>) {
        let stopped = async move {
            let mut stop = stop;
            let _ = stop.wait_for(|s| *s).await;
        };
        let (sink, max_body) = (self.sink, self.limits.max_body);
        let handler = move |req| {
            let sink = sink.clone();
            async move { handle(&sink, req, max_body).await }
        };
        ambit_http::serve(
            "plugin log",
            self.listener,
            self.limits,
            stopped,
            std::future::ready(()),
            handler,
        )
        .await;
    }
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Body::new(body.into()));
    *r.status_mut() = status;
    r
}

async fn handle(sink: &Sink, req: Request<Incoming>, max_body: usize) -> Response<Body> {
    if req.method() != Method::POST || req.uri().path() != "/log" {
        return reply(StatusCode::NOT_FOUND, "not found");
    }
    let body = match ambit_http::read_body(req.into_body(), max_body).await {
        Ok(b) => b,
        Err(e) => return e.response(),
    };
    let lines: Vec<String> = match serde_json::from_slice(&body) {
        Ok(l) => l,
        Err(e) => return reply(StatusCode::BAD_REQUEST, format!("decoding body: {e}")),
    };
    for l in &lines {
        sink(parse_line(l));
    }
    reply(StatusCode::OK, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::plugin::log::log_line;

    #[test]
    fn parse() {
        let f = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        let cases = [
            (
                r#"{"level":"info","time":"2024-01-01T00:00:00Z","msg":"added pod","pod":"demo/p1"}"#,
                Level::Info,
                "added pod",
                f(&[("pod", "demo/p1"), ("time", "2024-01-01T00:00:00Z")]),
            ),
            (
                r#"{"level":"error","msg":"agent unreachable","attempt":3}"#,
                Level::Error,
                "agent unreachable",
                f(&[("attempt", "3")]),
            ),
            (r#"{"level":"WARNING","msg":"x"}"#, Level::Warn, "x", f(&[])),
            (r#"{"level":"debug"}"#, Level::Debug, "", f(&[])),
            (r#"{"msg":"no level"}"#, Level::Info, "no level", f(&[])),
            ("plain text", Level::Info, "plain text", f(&[])),
            (
                r#"["not","an","object"]"#,
                Level::Info,
                r#"["not","an","object"]"#,
                f(&[]),
            ),
        ];
        for (raw, level, msg, fields) in cases {
            let got = parse_line(raw);
            assert_eq!(
                got,
                PluginLogLine {
                    level,
                    msg: msg.into(),
                    fields
                },
                "{raw}"
            );
        }
        // The plugin's own lines round-trip.
        let line = log_line(Level::Warn, "hello", &[("pod", "a/b")]);
        let got = parse_line(&line);
        assert_eq!((got.level, got.msg.as_str()), (Level::Warn, "hello"));
        assert_eq!(got.fields.get("pod").map(String::as_str), Some("a/b"));
    }
}

//! The orchestrator's request socket: how `ambit apply` and `ambit delete` reach the running
//! `ambit up` (which owns the namespaces and processes).
//!
//! `RUN/api.sock` (mode 0600: root's, as the rest of the run directory) takes one request per
//! connection: a JSON line `{"op": "apply"|"delete", "file": NAME, "text": YAML}` and answers
//! with one JSON line `{"ok": bool, "lines": [...], "error": "..."}`. Requests are handled one
//! at a time on the orchestrator's loop; requests are bounded ([`MAX_REQUEST`]) and a client
//! that does not send one within [`IO_TIMEOUT`] is dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::state::{Role, RunDir};
use crate::up::Mesh;

/// Largest request accepted (manifests are text; this is generous).
pub const MAX_REQUEST: u64 = 4 << 20;
/// How long a client may take to send its request.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client waits for the answer (pod creation and enrolment take seconds).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(180);

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Apply,
    Delete,
    /// Replace a node's ztunnel with an overlap (`node` names it).
    #[serde(rename = "restart-ztunnel")]
    RestartZtunnel,
    /// Restart a node's agent (`node` names it): stop, start, wait until ready.
    #[serde(rename = "restart-agent")]
    RestartAgent,
    /// Re-create a pod's sandbox (`pod` names it): a new network namespace, CNI DEL and ADD.
    #[serde(rename = "restart-pod")]
    RestartPod,
    /// Stop a component (`component`, with `node` for an agent or ztunnel) for `seconds`;
    /// the supervisor starts it again after.
    Stop,
}

/// One request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    pub op: Op,
    /// Name used in error messages (the user's file name).
    #[serde(default)]
    pub file: String,
    #[serde(default)]
    pub text: String,
    /// The node, for `restart-ztunnel`, `restart-agent` and `stop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The pod (`NAME` or `NAMESPACE/NAME`), for `restart-pod`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// `control`, `agent` or `ztunnel`, for `stop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<String>,
    /// How long, for `stop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<u64>,
}

impl Request {
    /// A request for `op` with every argument empty.
    pub fn new(op: Op) -> Self {
        Self {
            op,
            file: String::new(),
            text: String::new(),
            node: None,
            pod: None,
            component: None,
            seconds: None,
        }
    }
}

/// The answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    /// One line per object (`Pod demo/client configured`), then progress.
    #[serde(default)]
    pub lines: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Why a client request failed to get an answer.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(
        "no running `ambit up` answers on {path} ({source}); apply and delete need the orchestrator"
    )]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to the orchestrator on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the orchestrator's answer is not valid: {0}")]
    Answer(String),
    #[error("binding {path}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The listening side, polled from the orchestrator's loop.
#[derive(Debug)]
pub struct ApiServer {
    listener: UnixListener,
    path: PathBuf,
}

impl ApiServer {
    /// Binds `RUN/api.sock` (replacing a stale file), mode 0600, non-blocking.
    pub fn bind(run: &RunDir) -> Result<Self, ApiError> {
        let path = run.api_socket();
        let err = |source| ApiError::Bind {
            path: path.clone(),
            source,
        };
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(err(e)),
            _ => {}
        }
        let listener = UnixListener::bind(&path).map_err(err)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
        listener.set_nonblocking(true).map_err(err)?;
        Ok(Self { listener, path })
    }

    /// Serves every pending connection, one after the other.
    pub fn poll(&self, mesh: &mut Mesh) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if let Err(e) = serve(stream, mesh) {
                        tracing::warn!(error = %e, "api request");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!(error = %e, "api accept");
                    return;
                }
            }
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(stream: UnixStream, mesh: &mut Mesh) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_REQUEST + 1)).read_line(&mut line)?;
    let response = if line.len() as u64 > MAX_REQUEST {
        Response {
            error: Some(format!("request larger than {MAX_REQUEST} bytes")),
            ..Response::default()
        }
    } else {
        match serde_json::from_str::<Request>(&line) {
            Err(e) => Response {
                error: Some(format!("bad request: {e}")),
                ..Response::default()
            },
            Ok(req) => handle(mesh, &req),
        }
    };
    let mut out = serde_json::to_vec(&response).map_err(std::io::Error::other)?;
    out.push(b'\n');
    (&stream).write_all(&out)
}

fn handle(mesh: &mut Mesh, req: &Request) -> Response {
    let progress = std::cell::RefCell::new(Vec::new());
    let say = |l: &str| progress.borrow_mut().push(l.to_owned());
    let result = match req.op {
        Op::Apply => mesh
            .apply(&req.file, &req.text, &say)
            .map_err(|e| e.to_string()),
        Op::Delete => mesh
            .delete(&req.file, &req.text, &say)
            .map_err(|e| e.to_string()),
        Op::RestartZtunnel => mesh
            .restart_ztunnel(req.node.as_deref().unwrap_or_default())
            .map(|r| {
                vec![format!(
                    "{} restarted: pid {} -> {} (overlapping hand-off)",
                    r.role,
                    r.old_pid.map_or("-".into(), |p| p.to_string()),
                    r.new_pid
                )]
            })
            .map_err(|e| e.to_string()),
        Op::RestartAgent => mesh
            .restart_agent(req.node.as_deref().unwrap_or_default())
            .map(|r| {
                vec![format!(
                    "{} restarted: pid {} -> {} (ready)",
                    r.role,
                    r.old_pid.map_or("-".into(), |p| p.to_string()),
                    r.new_pid
                )]
            })
            .map_err(|e| e.to_string()),
        Op::RestartPod => mesh
            .recreate_sandbox(req.pod.as_deref().unwrap_or_default(), &say)
            .map(|line| vec![line])
            .map_err(|e| e.to_string()),
        Op::Stop => stop(mesh, req),
    };
    let progress = progress.into_inner();
    match result {
        Ok(mut lines) => {
            tracing::info!(op = ?req.op, file = %req.file, "applied");
            lines.extend(progress);
            Response {
                ok: true,
                lines,
                error: None,
            }
        }
        Err(e) => Response {
            ok: false,
            lines: progress,
            error: Some(e),
        },
    }
}

/// `stop`: which role, then [`Mesh::hold`].
fn stop(mesh: &mut Mesh, req: &Request) -> Result<Vec<String>, String> {
    let node = || {
        req.node
            .clone()
            .ok_or_else(|| "stopping an agent or ztunnel needs its node".to_string())
    };
    let role = match req.component.as_deref() {
        Some("control") => Role::Control,
        Some("agent") => Role::Agent { node: node()? },
        Some("ztunnel") => Role::Ztunnel { node: node()? },
        other => return Err(format!("cannot stop {other:?}: control, agent or ztunnel")),
    };
    let down_for = hold_duration(req.seconds)?;
    let seconds = down_for.as_secs();
    let pid = mesh.hold(&role, down_for).map_err(|e| e.to_string())?;
    Ok(vec![format!(
        "{role} stopped (pid {pid}); the supervisor starts it again in {seconds}s"
    )])
}

/// The longest `stop` (a day): an outage rehearsal, not a way to turn a component off.
pub const MAX_HOLD: Duration = Duration::from_secs(86_400);

/// `stop`'s duration, checked: present and at most [`MAX_HOLD`].
fn hold_duration(seconds: Option<u64>) -> Result<Duration, String> {
    let seconds = seconds.ok_or("stop needs a duration")?;
    let d = Duration::from_secs(seconds);
    if d > MAX_HOLD {
        return Err(format!(
            "cannot stop for {seconds}s: at most {}s",
            MAX_HOLD.as_secs()
        ));
    }
    Ok(d)
}

/// Sends `req` to the orchestrator of `run` and waits for its answer.
pub fn request(run: &RunDir, req: &Request) -> Result<Response, ApiError> {
    let path = run.api_socket();
    let stream = UnixStream::connect(&path).map_err(|source| ApiError::Connect {
        path: path.clone(),
        source,
    })?;
    let io = |source| ApiError::Io {
        path: path.clone(),
        source,
    };
    stream.set_read_timeout(Some(ANSWER_TIMEOUT)).map_err(io)?;
    let mut body = serde_json::to_vec(req).map_err(|e| ApiError::Answer(e.to_string()))?;
    body.push(b'\n');
    (&stream).write_all(&body).map_err(io)?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_REQUEST))
        .read_line(&mut line)
        .map_err(io)?;
    serde_json::from_str(&line).map_err(|e| ApiError::Answer(format!("{e}: {line:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_durations() {
        let cases = [
            (None, Err(())),
            (Some(0), Ok(0)),
            (Some(30), Ok(30)),
            (Some(86_400), Ok(86_400)),
            (Some(86_401), Err(())),
            // Added to `Instant::now()` this would overflow (a panic in `ambit up`).
            (Some(u64::MAX), Err(())),
        ];
        for (seconds, want) in cases {
            let got = hold_duration(seconds).map(|d| d.as_secs()).map_err(|_| ());
            assert_eq!(got, want, "{seconds:?}");
        }
    }

    #[test]
    fn requests_without_the_newer_fields_parse() {
        let req: Request = serde_json::from_str(r#"{"op":"apply","file":"a.yaml","text":"x"}"#)
            .expect("an apply request");
        assert_eq!(req.op, Op::Apply);
        assert_eq!((req.pod, req.component, req.seconds), (None, None, None));
        let mut stop = Request::new(Op::Stop);
        stop.component = Some("control".into());
        stop.seconds = Some(30);
        let back: Request =
            serde_json::from_str(&serde_json::to_string(&stop).expect("json")).expect("parse");
        assert_eq!(back.op, Op::Stop);
        assert_eq!(back.component.as_deref(), Some("control"));
        assert_eq!(back.seconds, Some(30));
    }
}

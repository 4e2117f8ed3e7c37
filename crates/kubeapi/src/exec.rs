//! kubeconfig `exec` credential plugins (`client.authentication.k8s.io`): what EKS
//! (`aws eks get-token`), GKE (`gke-gcloud-auth-plugin`) and AKS (`kubelogin`) kubeconfigs use.
//!
//! ambit runs the plugin itself ([`ExecConfig::run`]) rather than through kube-rs, which
//! runs it with no deadline, on the thread building the client and three times per client
//! (docs/upstream-differences.md). Here a run is bounded: `KUBERNETES_EXEC_INFO` with
//! `spec.interactive: false`, no stdin, stdout and stderr read up to a size limit, and a
//! deadline after which the plugin's whole process group is killed (a wrapper script's
//! children too). The answer is an [`ExecCredential`]: a bearer token, a client
//! certificate, or both, with an optional expiry; [`crate::Client`] caches it until then.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::config::ClientIdentity;

/// Largest answer (stdout) a plugin may write.
const MAX_STDOUT: usize = 1 << 20;
/// Most of a failed plugin's stderr kept for its error.
const MAX_STDERR: usize = 4 << 10;

/// The kubeconfig `user.exec` block.
#[derive(Clone, PartialEq, Eq)]
pub struct ExecConfig {
    /// The program: a bare name is looked up in `PATH`; a relative path is relative to the
    /// kubeconfig's directory, as kubectl does.
    pub command: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// `client.authentication.k8s.io/v1` or `/v1beta1`.
    pub api_version: String,
    /// The kubeconfig user the block belongs to, and the file it came from (for errors).
    pub user: String,
    pub kubeconfig: String,
}

impl std::fmt::Debug for ExecConfig {
    // The env may hold secrets; show only names.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecConfig")
            .field("command", &self.command)
            .field("args", &self.args.len())
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("api_version", &self.api_version)
            .field("user", &self.user)
            .field("kubeconfig", &self.kubeconfig)
            .finish()
    }
}

/// The supported API versions of the credential protocol.
pub const API_VERSIONS: [&str; 2] = [
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
];

/// What a plugin run answered (`ExecCredential.status`).
#[derive(Clone, PartialEq, Eq)]
pub struct ExecCredential {
    pub token: Option<String>,
    pub identity: Option<ClientIdentity>,
    /// `status.expirationTimestamp`: run the plugin again before then; `None` keeps the
    /// credential until the server refuses it (401).
    pub expires: Option<Timestamp>,
}

impl std::fmt::Debug for ExecCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecCredential")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("identity", &self.identity)
            .field("expires", &self.expires)
            .finish()
    }
}

/// A plugin run failed; names the plugin, its kubeconfig user and file.
#[derive(Debug, thiserror::Error)]
#[error("credential plugin {command} of user {user:?} in kubeconfig {kubeconfig}", command = .command.display())]
pub struct ExecError {
    pub command: PathBuf,
    pub user: String,
    pub kubeconfig: String,
    #[source]
    pub failure: ExecFailure,
}

/// How a plugin run failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecFailure {
    #[error("could not be started")]
    Start(#[source] std::io::Error),
    #[error("reading its output")]
    Read(#[source] std::io::Error),
    #[error("did not finish within {0:?} (killed with its process group)")]
    Timeout(Duration),
    #[error("wrote more than {0} bytes")]
    TooLarge(usize),
    #[error("exited with {status}: {stderr}")]
    Exit { status: String, stderr: String },
    #[error("answered with something that is not an ExecCredential")]
    Parse(#[source] serde_norway::Error),
    #[error("answered apiVersion {got:?}, configured {want:?}")]
    ApiVersion { got: String, want: String },
    #[error("answered an invalid status.expirationTimestamp {value:?}")]
    Expiry {
        value: String,
        #[source]
        source: k8s_openapi::jiff::Error,
    },
    #[error("answered neither status.token nor status.clientCertificateData + clientKeyData")]
    NoCredential,
    #[error("answered a token that cannot be sent as an HTTP header")]
    InvalidToken,
    #[error("answered a client certificate that cannot be used")]
    Identity(#[source] kube::Error),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    status: Option<AnswerStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AnswerStatus {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    expiration_timestamp: Option<String>,
    #[serde(default)]
    client_certificate_data: Option<String>,
    #[serde(default)]
    client_key_data: Option<String>,
}

impl ExecConfig {
    /// The error for `failure` of this plugin.
    pub(crate) fn error(&self, failure: ExecFailure) -> ExecError {
        ExecError {
            command: self.command.clone(),
            user: self.user.clone(),
            kubeconfig: self.kubeconfig.clone(),
            failure,
        }
    }

    /// Runs the plugin once, killing it (and every process of its group) if it has not
    /// answered within `deadline` or the caller gives up first.
    pub async fn run(&self, deadline: Duration) -> Result<ExecCredential, ExecError> {
        let stdout = tokio::time::timeout(deadline, self.output())
            .await
            .map_err(|_| self.error(ExecFailure::Timeout(deadline)))??;
        self.parse(&stdout).map_err(|f| self.error(f))
    }

    async fn output(&self) -> Result<Vec<u8>, ExecError> {
        let info = serde_json::json!({
            "apiVersion": self.api_version,
            "kind": "ExecCredential",
            "spec": {"interactive": false},
        });
        let mut command = tokio::process::Command::new(&self.command);
        command
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("KUBERNETES_EXEC_INFO", info.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        #[cfg(unix)]
        command.process_group(0);
        let mut child = command
            .spawn()
            .map_err(|e| self.error(ExecFailure::Start(e)))?;
        // Declared after `child`, so dropped (the group killed) before it.
        let mut group = ProcessGroup::of(&child);
        let (out, err) = (child.stdout.take(), child.stderr.take());
        let (out, err, status) = tokio::join!(
            read_bounded(out, MAX_STDOUT, true),
            read_bounded(err, MAX_STDERR, false),
            child.wait()
        );
        let status = status.map_err(|e| self.error(ExecFailure::Read(e)))?;
        let out = out.map_err(|f| self.error(f))?;
        let err = err.map_err(|f| self.error(f))?;
        if !status.success() {
            return Err(self.error(ExecFailure::Exit {
                status: status.to_string(),
                stderr: String::from_utf8_lossy(&err).trim().to_string(),
            }));
        }
        group.finished();
        Ok(out)
    }

    fn parse(&self, stdout: &[u8]) -> Result<ExecCredential, ExecFailure> {
        // JSON is what the protocol says; client-go's decoder also takes YAML, and so does
        // this one (YAML is a superset of JSON).
        let answer: Answer = serde_norway::from_slice(stdout).map_err(ExecFailure::Parse)?;
        if let Some(got) = answer.api_version
            && got != self.api_version
        {
            return Err(ExecFailure::ApiVersion {
                got,
                want: self.api_version.clone(),
            });
        }
        let status = answer.status.ok_or(ExecFailure::NoCredential)?;
        let expires = status
            .expiration_timestamp
            .filter(|t| !t.is_empty())
            .map(|value| {
                value
                    .parse::<Timestamp>()
                    .map_err(|source| ExecFailure::Expiry { value, source })
            })
            .transpose()?;
        let token = status.token.filter(|t| !t.is_empty());
        let identity = match (status.client_certificate_data, status.client_key_data) {
            (Some(cert_pem), Some(key_pem)) if !cert_pem.is_empty() && !key_pem.is_empty() => {
                Some(ClientIdentity { cert_pem, key_pem })
            }
            _ => None,
        };
        if token.is_none() && identity.is_none() {
            return Err(ExecFailure::NoCredential);
        }
        Ok(ExecCredential {
            token,
            identity,
            expires,
        })
    }
}

/// Reads `from` to its end, at most `limit` bytes: more is an error when `strict`, else
/// dropped (stderr).
async fn read_bounded(
    from: Option<impl AsyncRead + Unpin>,
    limit: usize,
    strict: bool,
) -> Result<Vec<u8>, ExecFailure> {
    let mut out = Vec::new();
    let Some(mut from) = from else {
        return Ok(out);
    };
    let mut buf = [0u8; 8192];
    loop {
        let n = from.read(&mut buf).await.map_err(ExecFailure::Read)?;
        if n == 0 {
            return Ok(out);
        }
        let room = limit - out.len();
        if n > room && strict {
            return Err(ExecFailure::TooLarge(limit));
        }
        out.extend_from_slice(&buf[..n.min(room)]);
    }
}

/// The plugin's process group (it leads its own): killed on drop unless the plugin
/// finished, so a timed-out or abandoned run leaves none of its processes behind.
struct ProcessGroup {
    #[cfg_attr(not(unix), allow(dead_code))]
    leader: Option<u32>,
}

impl ProcessGroup {
    fn of(child: &tokio::process::Child) -> Self {
        Self { leader: child.id() }
    }

    fn finished(&mut self) {
        self.leader = None;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(pid) = self.leader.and_then(|p| i32::try_from(p).ok()) {
            // The leader is not reaped yet (the child is dropped after this), so the group
            // id is still its own.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Resolves a kubeconfig `exec.command` against the kubeconfig's directory.
pub fn resolve_command(command: &str, dir: &Path) -> PathBuf {
    let p = Path::new(command);
    if p.is_absolute() || !command.contains('/') {
        p.to_path_buf()
    } else {
        dir.join(p)
    }
}

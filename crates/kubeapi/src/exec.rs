//! kubeconfig `exec` credential plugins (`client.authentication.k8s.io`): what EKS
//! (`aws eks get-token`), GKE (`gke-gcloud-auth-plugin`) and AKS (`kubelogin`) kubeconfigs use.
//!
//! The plugin runs with the kubeconfig's args and env plus `KUBERNETES_EXEC_INFO` (an
//! `ExecCredential` with `spec.interactive: false`), no standard input, a deadline
//! ([`EXEC_TIMEOUT`]) and a bound on what it prints ([`MAX_OUTPUT`]). Its `status.token` is
//! the bearer token until `status.expirationTimestamp` (RFC 3339); the client runs it again
//! after that, or when the API server answers 401. A plugin that returns a client
//! certificate instead of a token is refused ([`ExecError::ClientCertificate`]): client
//! certificates are supported from the kubeconfig itself, which is what kind, k3d and
//! minikube write.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use tokio::io::AsyncReadExt;

/// How long a plugin may run.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes read from a plugin's standard output.
pub const MAX_OUTPUT: usize = 1 << 20;

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
}

impl std::fmt::Debug for ExecConfig {
    // The env may hold secrets; show only names.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecConfig")
            .field("command", &self.command)
            .field("args", &self.args.len())
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("api_version", &self.api_version)
            .finish()
    }
}

/// The supported API versions of the credential protocol.
pub const API_VERSIONS: [&str; 2] = [
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
];

/// A credential from a plugin.
#[derive(Clone, PartialEq, Eq)]
pub struct ExecCredential {
    pub token: String,
    /// When the token stops being valid (`None`: until the server refuses it).
    pub expires: Option<SystemTime>,
}

impl std::fmt::Debug for ExecCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecCredential")
            .field("token", &"<redacted>")
            .field("expires", &self.expires)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("starting the credential plugin {command}")]
    Spawn {
        command: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the credential plugin {command} did not finish within {after:?}")]
    Timeout { command: PathBuf, after: Duration },
    #[error("the credential plugin {command} exited with {status}: {stderr}")]
    Failed {
        command: PathBuf,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("the credential plugin {command} printed more than {limit} bytes")]
    TooLarge { command: PathBuf, limit: usize },
    #[error("the credential plugin {command} printed an invalid ExecCredential: {reason}")]
    Invalid { command: PathBuf, reason: String },
    #[error(
        "the credential plugin {command} returned a client certificate; only tokens are \
         supported from plugins"
    )]
    ClientCertificate { command: PathBuf },
    #[error("reading the credential plugin's output")]
    Io(#[source] std::io::Error),
}

impl ExecConfig {
    /// Runs the plugin once.
    pub async fn run(&self) -> Result<ExecCredential, ExecError> {
        let info = format!(
            r#"{{"apiVersion":"{}","kind":"ExecCredential","spec":{{"interactive":false}}}}"#,
            self.api_version
        );
        let mut child = tokio::process::Command::new(&self.command)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("KUBERNETES_EXEC_INFO", info)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| ExecError::Spawn {
                command: self.command.clone(),
                source,
            })?;
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        // Both pipes are read at once, so a plugin filling one cannot block on the other.
        let collect = async {
            let read_out = async {
                let mut out = Vec::new();
                if let Some(s) = stdout.as_mut() {
                    s.take(MAX_OUTPUT as u64 + 1)
                        .read_to_end(&mut out)
                        .await
                        .map_err(ExecError::Io)?;
                }
                Ok::<_, ExecError>(out)
            };
            let read_err = async {
                let mut err = Vec::new();
                if let Some(s) = stderr.as_mut() {
                    s.take(64 << 10)
                        .read_to_end(&mut err)
                        .await
                        .map_err(ExecError::Io)?;
                }
                Ok::<_, ExecError>(err)
            };
            let (out, err) = tokio::try_join!(read_out, read_err)?;
            let status = child.wait().await.map_err(ExecError::Io)?;
            Ok::<_, ExecError>((status, out, err))
        };
        let (status, out, err) =
            tokio::time::timeout(EXEC_TIMEOUT, collect)
                .await
                .map_err(|_| ExecError::Timeout {
                    command: self.command.clone(),
                    after: EXEC_TIMEOUT,
                })??;
        if !status.success() {
            return Err(ExecError::Failed {
                command: self.command.clone(),
                status,
                stderr: String::from_utf8_lossy(&err).trim().to_string(),
            });
        }
        if out.len() > MAX_OUTPUT {
            return Err(ExecError::TooLarge {
                command: self.command.clone(),
                limit: MAX_OUTPUT,
            });
        }
        parse_credential(&self.command, &out)
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

fn parse_credential(command: &Path, out: &[u8]) -> Result<ExecCredential, ExecError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Status {
        #[serde(default)]
        token: Option<String>,
        #[serde(default)]
        expiration_timestamp: Option<String>,
        #[serde(default)]
        client_certificate_data: Option<String>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Credential {
        api_version: String,
        kind: String,
        status: Option<Status>,
    }
    let invalid = |reason: String| ExecError::Invalid {
        command: command.to_path_buf(),
        reason,
    };
    let cred: Credential = serde_json::from_slice(out).map_err(|e| invalid(e.to_string()))?;
    if cred.kind != "ExecCredential" || !API_VERSIONS.contains(&cred.api_version.as_str()) {
        return Err(invalid(format!(
            "kind {:?} apiVersion {:?}",
            cred.kind, cred.api_version
        )));
    }
    let status = cred.status.ok_or_else(|| invalid("no status".into()))?;
    let token = match (status.token, status.client_certificate_data) {
        (Some(t), _) if !t.is_empty() => t,
        (_, Some(_)) => {
            return Err(ExecError::ClientCertificate {
                command: command.to_path_buf(),
            });
        }
        _ => return Err(invalid("no status.token".into())),
    };
    let expires = match status.expiration_timestamp.as_deref() {
        None | Some("") => None,
        Some(ts) => Some(
            parse_rfc3339(ts)
                .ok_or_else(|| invalid(format!("expirationTimestamp {ts:?} is not RFC 3339")))?,
        ),
    };
    Ok(ExecCredential { token, expires })
}

/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` → time; `None` when malformed.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        if !t.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let t = rest.get(1..)?;
            let (h, m) = t.split_once(':')?;
            if h.len() != 2 || m.len() != 2 {
                return None;
            }
            let (h, m): (i64, i64) = (h.parse().ok()?, m.parse().ok()?);
            sign * (h * 3600 + m * 60)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + min * 60 + sec - offset;
    let secs = u64::try_from(secs).ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        let cases = [
            ("1970-01-01T00:00:00Z", Some(0)),
            ("2024-02-29T12:30:45Z", Some(1_709_209_845)),
            ("2024-02-29T12:30:45.123456789Z", Some(1_709_209_845)),
            ("2024-02-29T14:30:45+02:00", Some(1_709_209_845)),
            ("2024-02-29 12:30:45Z", Some(1_709_209_845)),
            ("2024-13-01T00:00:00Z", None),
            ("2024-02-29T12:30:45", None),
            ("yesterday", None),
            ("2024-02-29T12:30:45.Z", None),
        ];
        for (text, want) in cases {
            let got = parse_rfc3339(text).map(|t| {
                t.duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or_default()
            });
            assert_eq!(got, want, "{text}");
        }
    }

    #[test]
    fn credentials() {
        let cmd = Path::new("plugin");
        let ok = br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",
            "status":{"token":"t0k","expirationTimestamp":"2030-01-01T00:00:00Z"}}"#;
        let c = parse_credential(cmd, ok).expect("valid");
        assert_eq!(c.token, "t0k");
        assert!(c.expires.is_some());
        let bad: [(&[u8], &str); 4] = [
            (b"not json", "invalid ExecCredential"),
            (
                br#"{"apiVersion":"v1","kind":"Pod","status":{"token":"x"}}"#,
                "apiVersion",
            ),
            (
                br#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential",
                    "status":{"clientCertificateData":"x","clientKeyData":"y"}}"#,
                "client certificate",
            ),
            (
                br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",
                    "status":{"token":"x","expirationTimestamp":"soon"}}"#,
                "RFC 3339",
            ),
        ];
        for (out, needle) in bad {
            let err = parse_credential(cmd, out).expect_err("refused").to_string();
            assert!(err.contains(needle), "{err}");
        }
        assert_eq!(
            resolve_command("./bin/p", Path::new("/k")),
            PathBuf::from("/k/./bin/p")
        );
        assert_eq!(
            resolve_command("aws", Path::new("/k")),
            PathBuf::from("aws")
        );
    }
}

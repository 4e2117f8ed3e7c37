//! Where the API server is and how to authenticate to it: the in-cluster service account or a
//! kubeconfig file. This module never reads the environment itself; the caller passes a
//! variable lookup (see [`KubeConfig::in_cluster`]), as every ambit library does.
//!
//! Supported: `https://` (CA from `certificate-authority-data` or `certificate-authority`,
//! optional `tls-server-name`) and plain `http://` (e.g. `kubectl proxy`); client
//! certificates (`client-certificate[-data]` + `client-key[-data]`: kind, k3d, minikube);
//! bearer tokens (`token`, `tokenFile`, the service-account token file, which is re-read as
//! the kubelet rotates it); `exec` credential plugins (EKS, GKE, AKS; see [`crate::exec`]);
//! or no credentials. The result is handed to kube-rs ([`crate::Client::new`]). `auth-provider` plugins, basic auth, impersonation and
//! `insecure-skip-tls-verify` are reported as [`ConfigError::Unsupported`] instead of being
//! silently ignored.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::exec::{API_VERSIONS, ExecConfig, resolve_command};

/// The service-account directory mounted into every pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Why no usable configuration could be built.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} is not set (not running in a pod?)")]
    MissingVar(&'static str),
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("kubeconfig {file}: {reason}")]
    Kubeconfig { file: String, reason: String },
    #[error("kubeconfig {file}: {what} is not supported by ambit's Kubernetes client")]
    Unsupported { file: String, what: String },
    #[error("invalid API server URL {url:?}: {reason}")]
    Url { url: String, reason: &'static str },
    #[error("https server {url} needs a certificate authority (certificate-authority[-data])")]
    NoCa { url: String },
    #[error("the certificate authority for {url} holds no readable PEM certificate")]
    Ca { url: String },
    /// kube-rs refused the configuration (an unusable client certificate or key, roots).
    #[error("building the Kubernetes client for {server}")]
    Client {
        server: String,
        #[source]
        source: kube::Error,
    },
    /// `KUBECONFIG` is set, but none of its files exists (checked before any fallback).
    #[error("KUBECONFIG={list:?} names no existing file")]
    NoKubeconfigFile { list: String },
    #[error(
        "no Kubernetes API configuration: KUBECONFIG is not set, KUBERNETES_SERVICE_HOST is \
         not set (not in a pod) and {home_config} does not exist"
    )]
    NoConfig { home_config: String },
}

/// `http` or `https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// A parsed API server URL: `scheme://host[:port][/base-path]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerUrl {
    pub scheme: Scheme,
    /// Host name or IP literal, without IPv6 brackets.
    pub host: String,
    pub port: u16,
    /// Path prefix before `/api` (usually empty), without a trailing `/`.
    pub base_path: String,
}

impl ServerUrl {
    pub fn parse(url: &str) -> Result<Self, ConfigError> {
        let bad = |reason| ConfigError::Url {
            url: url.to_string(),
            reason,
        };
        let (scheme, rest) = if let Some(rest) = url.strip_prefix("https://") {
            (Scheme::Https, rest)
        } else if let Some(rest) = url.strip_prefix("http://") {
            (Scheme::Http, rest)
        } else {
            return Err(bad("the scheme must be http:// or https://"));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(bad("user info in the URL is not supported"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let end = v6
                .find(']')
                .ok_or_else(|| bad("unclosed '[' in the host"))?;
            let port = match &v6[end + 1..] {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| bad("junk after ']'"))?),
            };
            (&v6[..end], port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad("missing host"));
        }
        let port = match port {
            Some(p) => p.parse().map_err(|_| bad("the port is not a number"))?,
            None if scheme == Scheme::Https => 443,
            None => 80,
        };
        if path.contains(['?', '#']) {
            return Err(bad("a query or fragment is not allowed"));
        }
        Ok(Self {
            scheme,
            host: host.to_string(),
            port,
            base_path: path.trim_end_matches('/').to_string(),
        })
    }

    /// `host:port` as it goes in a `Host` header or an absolute URI.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for ServerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        write!(f, "{scheme}://{}{}", self.authority(), self.base_path)
    }
}

/// How requests authenticate.
#[derive(Clone, PartialEq, Eq)]
pub enum Auth {
    /// No credentials (a `kubectl proxy`, tests).
    None,
    /// A fixed bearer token.
    Token(String),
    /// A bearer token read from a file, re-read periodically (projected service-account
    /// tokens are rotated by the kubelet).
    TokenFile(PathBuf),
    /// A bearer token from a credential plugin, run again when it expires.
    Exec(ExecConfig),
}

impl fmt::Debug for Auth {
    // Never print the token itself.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::None => f.write_str("None"),
            Auth::Token(_) => f.write_str("Token(<redacted>)"),
            Auth::TokenFile(p) => f.debug_tuple("TokenFile").field(p).finish(),
            Auth::Exec(e) => f.debug_tuple("Exec").field(e).finish(),
        }
    }
}

/// A TLS client certificate and its key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientIdentity(<redacted>)")
    }
}

/// Everything the client needs to reach the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeConfig {
    pub server: ServerUrl,
    /// PEM roots for `https`.
    pub ca_pem: Option<String>,
    /// Name to verify the server certificate against instead of the URL's host.
    pub tls_server_name: Option<String>,
    /// Presented when the server asks for a client certificate.
    pub client_identity: Option<ClientIdentity>,
    pub auth: Auth,
}

impl KubeConfig {
    /// A config for `url` with no CA and no credentials (plain HTTP servers, tests).
    pub fn for_url(url: &str) -> Result<Self, ConfigError> {
        Ok(Self {
            server: ServerUrl::parse(url)?,
            ca_pem: None,
            tls_server_name: None,
            client_identity: None,
            auth: Auth::None,
        })
    }

    /// The in-cluster config: `KUBERNETES_SERVICE_HOST` / `KUBERNETES_SERVICE_PORT` from
    /// `var`, the CA `ca.crt` and token file `token` from `sa_dir` (normally
    /// [`SERVICE_ACCOUNT_DIR`]). The token file is re-read by the client, not here.
    pub fn in_cluster(
        var: impl Fn(&str) -> Option<String>,
        sa_dir: &Path,
    ) -> Result<Self, ConfigError> {
        let get = |name: &'static str| {
            var(name)
                .filter(|v| !v.is_empty())
                .ok_or(ConfigError::MissingVar(name))
        };
        let host = get("KUBERNETES_SERVICE_HOST")?;
        let port = get("KUBERNETES_SERVICE_PORT")?;
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host
        };
        let server = ServerUrl::parse(&format!("https://{host}:{port}"))?;
        let ca_path = sa_dir.join("ca.crt");
        let ca_pem = std::fs::read_to_string(&ca_path).map_err(|source| ConfigError::Read {
            path: ca_path,
            source,
        })?;
        Ok(Self {
            server,
            ca_pem: Some(ca_pem),
            tls_server_name: None,
            client_identity: None,
            auth: Auth::TokenFile(sa_dir.join("token")),
        })
    }

    /// The configuration a client in this environment should use, in client-go's order. This
    /// is the one rule of every ambit role (agent, control plane, `ztunnel-config`):
    ///
    /// 1. `KUBECONFIG` when set: its files (`:`-separated, `;` on Windows, as client-go's
    ///    `filepath.SplitList`) merged as kubectl merges them
    ///    ([`KubeConfig::from_kubeconfig_files`]); files of the list that do not exist are
    ///    skipped, but a list naming no existing file is an error, not a fallback, so a typo
    ///    is not silently replaced by other credentials.
    /// 2. In-cluster ([`KubeConfig::in_cluster`]) when `KUBERNETES_SERVICE_HOST` is set.
    /// 3. `$HOME/.kube/config` when it exists.
    ///
    /// `var` looks variables up (the library never reads the environment itself).
    pub fn from_environment(
        var: impl Fn(&str) -> Option<String>,
        sa_dir: &Path,
    ) -> Result<Self, ConfigError> {
        let set = |name: &str| var(name).filter(|v| !v.is_empty());
        if let Some(list) = set("KUBECONFIG") {
            // The platform's path-list separator: `;` on Windows, where `:` is in `C:\...`.
            let files: Vec<PathBuf> = std::env::split_paths(&list)
                .filter(|f| !f.as_os_str().is_empty())
                .collect();
            let existing: Vec<&Path> = files
                .iter()
                .map(PathBuf::as_path)
                .filter(|f| f.exists())
                .collect();
            if existing.is_empty() {
                return Err(ConfigError::NoKubeconfigFile { list });
            }
            return Self::from_kubeconfig_files(&existing);
        }
        if set("KUBERNETES_SERVICE_HOST").is_some() {
            return Self::in_cluster(var, sa_dir);
        }
        let home_config = set("HOME").map(|h| Path::new(&h).join(".kube").join("config"));
        match home_config {
            Some(path) if path.exists() => Self::from_kubeconfig_file(&path),
            other => Err(ConfigError::NoConfig {
                home_config: other.map_or_else(
                    || "$HOME/.kube/config (HOME unset)".to_string(),
                    |p| p.display().to_string(),
                ),
            }),
        }
    }

    /// Reads a kubeconfig file and uses its `current-context`.
    pub fn from_kubeconfig_file(path: &Path) -> Result<Self, ConfigError> {
        Self::from_kubeconfig_files(&[path])
    }

    /// Reads kubeconfig files and merges them as kubectl does: the first file to set
    /// `current-context` wins, and a cluster, context or user is taken whole from the first
    /// file that defines its name (entries are never merged field by field). Relative paths
    /// are resolved against the directory of the file that holds them. Every file must be
    /// readable and valid.
    pub fn from_kubeconfig_files(paths: &[&Path]) -> Result<Self, ConfigError> {
        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            files.push((path.display().to_string(), text, dir));
        }
        let files: Vec<(&str, &str, &Path)> = files
            .iter()
            .map(|(f, t, d)| (f.as_str(), t.as_str(), d.as_path()))
            .collect();
        Self::from_kubeconfigs(&files)
    }

    /// Parses kubeconfig `text` (named `file` in errors); relative file references are
    /// resolved against `dir`, as kubectl does.
    pub fn from_kubeconfig(file: &str, text: &str, dir: &Path) -> Result<Self, ConfigError> {
        Self::from_kubeconfigs(&[(file, text, dir)])
    }

    /// Parses and merges kubeconfig texts, each `(file name for errors, text, directory for
    /// relative paths)`, by [`KubeConfig::from_kubeconfig_files`]'s rule.
    pub fn from_kubeconfigs(files: &[(&str, &str, &Path)]) -> Result<Self, ConfigError> {
        let mut merged = Merged::default();
        for (i, (file, text, _)) in files.iter().enumerate() {
            let kc: Kubeconfig = serde_norway::from_str(text).map_err(|e| {
                Origin {
                    file,
                    dir: Path::new("."),
                }
                .err(e.to_string())
            })?;
            merged.add(i, kc);
        }
        let origin = |i: usize| Origin {
            file: files[i].0,
            dir: files[i].2,
        };
        let all_files = || {
            files
                .iter()
                .map(|(f, _, _)| *f)
                .collect::<Vec<_>>()
                .join(":")
        };
        let context_name = merged
            .current_context
            .ok_or_else(|| ConfigError::Kubeconfig {
                file: all_files(),
                reason: "no current-context".into(),
            })?;
        let (context, at) = merged
            .contexts
            .iter()
            .find(|(c, _)| c.name == context_name)
            .map(|(c, i)| (&c.context, origin(*i)))
            .ok_or_else(|| ConfigError::Kubeconfig {
                file: all_files(),
                reason: format!("context {context_name:?} not found"),
            })?;
        let (cluster, o) = merged
            .clusters
            .iter()
            .find(|(c, _)| c.name == context.cluster)
            .map(|(c, i)| (&c.cluster, origin(*i)))
            .ok_or_else(|| at.err(format!("cluster {:?} not found", context.cluster)))?;
        let server = ServerUrl::parse(&cluster.server)?;
        if cluster.insecure_skip_tls_verify {
            return Err(o.unsupported("insecure-skip-tls-verify"));
        }
        if cluster.proxy_url.is_some() {
            return Err(o.unsupported("proxy-url"));
        }
        let ca_pem = o.read_pem(
            &cluster.certificate_authority_data,
            &cluster.certificate_authority,
            "certificate-authority",
        )?;
        let (auth, client_identity) = match context.user.as_deref().filter(|u| !u.is_empty()) {
            None => (Auth::None, None),
            Some(user_name) => {
                let (user, o) = merged
                    .users
                    .iter()
                    .find(|(u, _)| u.name == user_name)
                    .map(|(u, i)| (&u.user, origin(*i)))
                    .ok_or_else(|| at.err(format!("user {user_name:?} not found")))?;
                let others = [
                    ("auth-provider plugins", user.auth_provider.is_some()),
                    ("basic auth (username/password)", user.username.is_some()),
                    ("impersonation (as)", user.impersonate.is_some()),
                ];
                if let Some((what, _)) = others.iter().find(|(_, present)| *present) {
                    return Err(o.unsupported(what));
                }
                let cert = o.read_pem(
                    &user.client_certificate_data,
                    &user.client_certificate,
                    "client-certificate",
                )?;
                let key = o.read_pem(&user.client_key_data, &user.client_key, "client-key")?;
                let identity = match (cert, key) {
                    (Some(cert_pem), Some(key_pem)) => Some(ClientIdentity { cert_pem, key_pem }),
                    (None, None) => None,
                    _ => {
                        return Err(o.err(format!(
                            "user {user_name:?}: a client certificate needs both the \
                             certificate and the key"
                        )));
                    }
                };
                let auth = match (&user.token, &user.token_file, &user.exec) {
                    (Some(t), _, _) if !t.is_empty() => Auth::Token(t.clone()),
                    (_, Some(f), _) if !f.is_empty() => Auth::TokenFile(o.resolve(f)),
                    (_, _, Some(exec)) => {
                        Auth::Exec(exec_config(exec, &o, user_name).map_err(|r| o.err(r))?)
                    }
                    _ => Auth::None,
                };
                (auth, identity)
            }
        };
        Ok(Self {
            server,
            ca_pem,
            tls_server_name: cluster.tls_server_name.clone().filter(|n| !n.is_empty()),
            client_identity,
            auth,
        })
    }
}

/// The file an entry of a merged kubeconfig came from: named in its errors, and the base of
/// its relative paths.
struct Origin<'a> {
    file: &'a str,
    dir: &'a Path,
}

impl Origin<'_> {
    fn err(&self, reason: String) -> ConfigError {
        ConfigError::Kubeconfig {
            file: self.file.to_string(),
            reason,
        }
    }

    fn unsupported(&self, what: &str) -> ConfigError {
        ConfigError::Unsupported {
            file: self.file.to_string(),
            what: what.to_string(),
        }
    }

    fn resolve(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.dir.join(p)
        }
    }

    /// PEM text from `WHAT-data` (base64) or the file `WHAT` names; `data` wins.
    fn read_pem(
        &self,
        data: &Option<String>,
        path: &Option<String>,
        what: &str,
    ) -> Result<Option<String>, ConfigError> {
        match (data, path) {
            (Some(d), _) => {
                let bytes = base64_decode(d)
                    .ok_or_else(|| self.err(format!("{what}-data is not base64")))?;
                String::from_utf8(bytes)
                    .map(Some)
                    .map_err(|_| self.err(format!("{what}-data is not PEM text")))
            }
            (None, Some(p)) => {
                let path = self.resolve(p);
                std::fs::read_to_string(&path)
                    .map(Some)
                    .map_err(|source| ConfigError::Read { path, source })
            }
            (None, None) => Ok(None),
        }
    }
}

/// Kubeconfig files merged by kubectl's rule, each entry with the index of its file.
#[derive(Default)]
struct Merged {
    current_context: Option<String>,
    clusters: Vec<(Named<ClusterEntry>, usize)>,
    contexts: Vec<(NamedContext, usize)>,
    users: Vec<(NamedUser, usize)>,
}

impl Merged {
    fn add(&mut self, file: usize, kc: Kubeconfig) {
        if self.current_context.is_none() {
            self.current_context = kc.current_context.filter(|c| !c.is_empty());
        }
        for c in kc.clusters {
            if !self.clusters.iter().any(|(m, _)| m.name == c.name) {
                self.clusters.push((c, file));
            }
        }
        for c in kc.contexts {
            if !self.contexts.iter().any(|(m, _)| m.name == c.name) {
                self.contexts.push((c, file));
            }
        }
        for u in kc.users {
            if !self.users.iter().any(|(m, _)| m.name == u.name) {
                self.users.push((u, file));
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Kubeconfig {
    #[serde(default)]
    current_context: Option<String>,
    #[serde(default)]
    clusters: Vec<Named<ClusterEntry>>,
    #[serde(default)]
    contexts: Vec<NamedContext>,
    #[serde(default)]
    users: Vec<NamedUser>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    cluster: T,
}

#[derive(Deserialize)]
struct NamedContext {
    name: String,
    context: ContextEntry,
}

#[derive(Deserialize)]
struct NamedUser {
    name: String,
    #[serde(default)]
    user: UserEntry,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ClusterEntry {
    server: String,
    #[serde(default)]
    certificate_authority_data: Option<String>,
    #[serde(default)]
    certificate_authority: Option<String>,
    #[serde(default)]
    tls_server_name: Option<String>,
    #[serde(default)]
    insecure_skip_tls_verify: bool,
    #[serde(default)]
    proxy_url: Option<String>,
}

#[derive(Deserialize)]
struct ContextEntry {
    cluster: String,
    #[serde(default)]
    user: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct UserEntry {
    #[serde(default)]
    token: Option<String>,
    #[serde(default, rename = "tokenFile")]
    token_file: Option<String>,
    #[serde(default)]
    client_certificate_data: Option<String>,
    #[serde(default)]
    client_certificate: Option<String>,
    #[serde(default)]
    client_key_data: Option<String>,
    #[serde(default)]
    client_key: Option<String>,
    #[serde(default)]
    exec: Option<ExecEntry>,
    #[serde(default)]
    auth_provider: Option<serde_norway::Value>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default, rename = "as")]
    impersonate: Option<String>,
}

/// `user.exec` of a kubeconfig.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecEntry {
    command: String,
    #[serde(default)]
    args: Option<Vec<String>>,
    #[serde(default)]
    env: Option<Vec<ExecEnv>>,
    #[serde(default)]
    api_version: Option<String>,
    /// `Never`, `IfAvailable`, `Always`: ambit never runs plugins interactively, so `Always`
    /// is refused.
    #[serde(default)]
    interactive_mode: Option<String>,
}

#[derive(Deserialize)]
struct ExecEnv {
    name: String,
    value: String,
}

fn exec_config(e: &ExecEntry, o: &Origin<'_>, user: &str) -> Result<ExecConfig, String> {
    let api_version = e
        .api_version
        .clone()
        .unwrap_or_else(|| API_VERSIONS[0].to_string());
    if !API_VERSIONS.contains(&api_version.as_str()) {
        return Err(format!(
            "exec apiVersion {api_version:?} (supported: {})",
            API_VERSIONS.join(", ")
        ));
    }
    if e.interactive_mode.as_deref() == Some("Always") {
        return Err("exec interactiveMode Always: ambit cannot run a plugin interactively".into());
    }
    if e.command.is_empty() {
        return Err("exec command is empty".into());
    }
    Ok(ExecConfig {
        command: resolve_command(&e.command, o.dir),
        args: e.args.clone().unwrap_or_default(),
        env: e
            .env
            .iter()
            .flatten()
            .map(|v| (v.name.clone(), v.value.clone()))
            .collect(),
        api_version,
        user: user.to_string(),
        kubeconfig: o.file.to_string(),
    })
}

/// Standard base64, as lenient as kubectl's readers: padding optional, whitespace ignored,
/// non-zero trailing bits allowed; `None` on any other character.
pub(crate) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    );
    let digits: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    LENIENT.decode(digits).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let cases = [
            ("https://10.96.0.1:443", Scheme::Https, "10.96.0.1", 443, ""),
            ("https://api.example", Scheme::Https, "api.example", 443, ""),
            (
                "http://127.0.0.1:8001/",
                Scheme::Http,
                "127.0.0.1",
                8001,
                "",
            ),
            (
                "https://[fd00::1]:6443/k8s/",
                Scheme::Https,
                "fd00::1",
                6443,
                "/k8s",
            ),
        ];
        for (url, scheme, host, port, base) in cases {
            let u = ServerUrl::parse(url).unwrap();
            assert_eq!(
                (u.scheme, u.host.as_str(), u.port, u.base_path.as_str()),
                (scheme, host, port, base),
                "{url}"
            );
        }
        for bad in [
            "ftp://x",
            "https://",
            "https://h:port",
            "https://[::1",
            "https://h/?q",
        ] {
            assert!(ServerUrl::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            ServerUrl::parse("https://[fd00::1]:6443")
                .unwrap()
                .to_string(),
            "https://[fd00::1]:6443"
        );
    }

    #[test]
    fn base64() {
        for (text, bytes) in [
            ("", &b""[..]),
            ("Zg==", b"f"),
            ("Zm8=", b"fo"),
            ("Zm9v", b"foo"),
            ("Zm9v\nYmE=", b"fooba"),
        ] {
            assert_eq!(base64_decode(text).as_deref(), Some(bytes), "{text}");
        }
        for bad in ["Z", "Zg=a", "Z!==", "Zg==="] {
            assert_eq!(base64_decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn in_cluster() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), "PEM").unwrap();
        let vars = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("fd00::1".to_string()),
            "KUBERNETES_SERVICE_PORT" => Some("443".to_string()),
            _ => None,
        };
        let c = KubeConfig::in_cluster(vars, dir.path()).unwrap();
        assert_eq!(c.server.to_string(), "https://[fd00::1]:443");
        assert_eq!(c.ca_pem.as_deref(), Some("PEM"));
        assert_eq!(c.auth, Auth::TokenFile(dir.path().join("token")));
        let err = KubeConfig::in_cluster(|_| None, dir.path()).unwrap_err();
        assert!(matches!(
            err,
            ConfigError::MissingVar("KUBERNETES_SERVICE_HOST")
        ));
    }

    /// The one rule: `KUBECONFIG` (a list, merged like kubectl), else in-cluster, else
    /// `~/.kube/config`.
    #[test]
    fn environment_rule() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let sa = root.join("sa");
        std::fs::create_dir(&sa).unwrap();
        std::fs::write(sa.join("ca.crt"), "PEM").unwrap();
        let write = |name: &str, text: &str| {
            let d = root.join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("config"), text).unwrap();
            d.join("config").display().to_string()
        };
        // a: complete, token user.
        let a = write(
            "a",
            "current-context: ctx\n\
             clusters: [{name: c, cluster: {server: 'https://a:1'}}]\n\
             contexts: [{name: ctx, context: {cluster: c, user: u}}]\n\
             users: [{name: u, user: {token: ta}}]\n",
        );
        // b: complete, another current-context, the same names with other values.
        let b = write(
            "b",
            "current-context: other\n\
             clusters: [{name: c, cluster: {server: 'https://b:2'}}]\n\
             contexts: [{name: ctx, context: {cluster: c, user: u}}, \
                        {name: other, context: {cluster: c, user: u}}]\n\
             users: [{name: u, user: {tokenFile: tok}}]\n",
        );
        // c: only a current-context; d: a context and a user (relative token file), no cluster.
        let c = write("c", "current-context: ctx\n");
        let d = write(
            "d",
            "contexts: [{name: ctx, context: {cluster: c, user: ud}}]\n\
             users: [{name: ud, user: {tokenFile: tok}}]\n",
        );
        let bad = write("bad", "clusters: {not: a list}\n");
        let home = root.join("home");
        std::fs::create_dir_all(home.join(".kube")).unwrap();
        std::fs::write(
            home.join(".kube/config"),
            std::fs::read_to_string(&a)
                .unwrap()
                .replace("a:1", "home:3"),
        )
        .unwrap();
        let missing = root.join("missing").display().to_string();
        let home_s = home.display().to_string();
        let root_s = root.display().to_string();
        let list = |files: &[&str]| std::env::join_paths(files).unwrap().into_string().unwrap();
        let token_file = |d: &str| {
            format!(
                "{:?}",
                Auth::TokenFile(root.join(d).join("tok")) // relative to its own file
            )
        };
        let (host, port) = (
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
        );
        enum Want {
            /// `server auth`
            Ok(String),
            /// a piece of the error's message
            Err(String),
        }
        let ok = |server: &str, auth: String| Want::Ok(format!("{server} {auth}"));
        let token = || "Token(<redacted>)".to_string();
        let err = |needle: &str| Want::Err(needle.to_string());
        type Case<'a> = (&'a str, Vec<(&'a str, String)>, Want);
        let cases: Vec<Case> = vec![
            (
                "one file",
                vec![("KUBECONFIG", a.clone())],
                ok("https://a:1", token()),
            ),
            (
                "the first file to set a name or current-context wins",
                vec![("KUBECONFIG", list(&[&a, &b]))],
                ok("https://a:1", token()),
            ),
            (
                "the other order",
                vec![("KUBECONFIG", list(&[&b, &a]))],
                ok("https://b:2", token_file("b")),
            ),
            (
                "current-context, context, cluster and user from three files",
                vec![("KUBECONFIG", list(&[&c, &d, &a]))],
                ok("https://a:1", token_file("d")),
            ),
            (
                "an earlier file's context shadows a later one",
                vec![("KUBECONFIG", list(&[&c, &a, &d]))],
                ok("https://a:1", token()),
            ),
            (
                "missing files are skipped",
                vec![("KUBECONFIG", list(&[&missing, &b]))],
                ok("https://b:2", token_file("b")),
            ),
            (
                "KUBECONFIG over in-cluster and home",
                vec![
                    ("KUBECONFIG", a.clone()),
                    (host.0, host.1.into()),
                    (port.0, port.1.into()),
                    ("HOME", home_s.clone()),
                ],
                ok("https://a:1", token()),
            ),
            (
                "no existing file is an error, not a fallback",
                vec![("KUBECONFIG", missing.clone()), ("HOME", home_s.clone())],
                err("names no existing file"),
            ),
            (
                "an invalid file is named",
                vec![("KUBECONFIG", list(&[&a, &bad]))],
                err(&format!("kubeconfig {bad}:")),
            ),
            (
                "no current-context in any file",
                vec![("KUBECONFIG", d.clone())],
                err("no current-context"),
            ),
            (
                "a context's cluster defined nowhere",
                vec![("KUBECONFIG", list(&[&c, &d]))],
                err("cluster \"c\" not found"),
            ),
            (
                "an empty list",
                vec![("KUBECONFIG", ":".into())],
                err("KUBECONFIG=\":\" names no existing file"),
            ),
            (
                "in-cluster over home",
                vec![
                    ("KUBECONFIG", String::new()),
                    (host.0, host.1.into()),
                    (port.0, port.1.into()),
                    ("HOME", home_s.clone()),
                ],
                ok(
                    "https://10.96.0.1:443",
                    format!("{:?}", Auth::TokenFile(sa.join("token"))),
                ),
            ),
            (
                "in-cluster without a port",
                vec![(host.0, host.1.into()), ("HOME", home_s.clone())],
                err("KUBERNETES_SERVICE_PORT is not set"),
            ),
            (
                "home",
                vec![("HOME", home_s.clone())],
                ok("https://home:3", token()),
            ),
            (
                "nothing",
                vec![("HOME", root_s.clone())],
                err("no Kubernetes API configuration"),
            ),
            ("nothing, HOME unset", vec![], err("HOME unset")),
        ];
        for (name, vars, want) in cases {
            let lookup = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
            match (KubeConfig::from_environment(lookup, &sa), want) {
                (Ok(c), Want::Ok(w)) => {
                    assert_eq!(format!("{} {:?}", c.server, c.auth), w, "{name}")
                }
                (Err(e), Want::Err(needle)) => {
                    let msg = e.to_string();
                    assert!(msg.contains(&needle), "{name}: {msg:?} lacks {needle:?}");
                }
                (Ok(c), Want::Err(needle)) => panic!("{name}: got {c:?}, want {needle:?}"),
                (Err(e), Want::Ok(w)) => panic!("{name}: got {e:?}, want {w}"),
            }
        }
    }

    const KUBECONFIG: &str = r#"
apiVersion: v1
kind: Config
current-context: main
clusters:
- name: c1
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: UEVN
    tls-server-name: kubernetes
contexts:
- name: main
  context: {cluster: c1, user: u1, namespace: default}
users:
- name: u1
  user: {token: secret}
"#;

    #[test]
    fn kubeconfig_token() {
        let c = KubeConfig::from_kubeconfig("kc", KUBECONFIG, Path::new("/etc")).unwrap();
        assert_eq!(c.server.to_string(), "https://127.0.0.1:6443");
        assert_eq!(c.ca_pem.as_deref(), Some("PEM"));
        assert_eq!(c.tls_server_name.as_deref(), Some("kubernetes"));
        assert_eq!(c.auth, Auth::Token("secret".into()));
        assert_eq!(format!("{:?}", c.auth), "Token(<redacted>)");
    }

    #[test]
    fn kubeconfig_users() {
        enum Want {
            Unsupported(&'static str),
            Invalid(&'static str),
            Auth(Auth, bool),
        }
        let exec = |cmd: &str, args: &[&str], env: &[(&str, &str)]| {
            Auth::Exec(ExecConfig {
                command: PathBuf::from(cmd),
                args: args.iter().map(|a| a.to_string()).collect(),
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                api_version: "client.authentication.k8s.io/v1beta1".into(),
                user: "u1".into(),
                kubeconfig: "kc".into(),
            })
        };
        let cases = [
            (
                "user: {token: secret}",
                "user: {client-certificate-data: QQ==, client-key-data: QQ==}",
                Want::Auth(Auth::None, true),
            ),
            (
                "user: {token: secret}",
                "user: {client-certificate-data: QQ==}",
                Want::Invalid("both the certificate and the key"),
            ),
            (
                "user: {token: secret}",
                "user: {exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: aws, \
                 args: [eks, get-token], env: [{name: AWS_PROFILE, value: p}]}}",
                Want::Auth(
                    exec("aws", &["eks", "get-token"], &[("AWS_PROFILE", "p")]),
                    false,
                ),
            ),
            (
                "user: {token: secret}",
                "user: {exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: ./bin/p}}",
                Want::Auth(exec("/etc/./bin/p", &[], &[]), false),
            ),
            (
                "user: {token: secret}",
                "user: {exec: {apiVersion: client.authentication.k8s.io/v1alpha1, command: x}}",
                Want::Invalid("v1alpha1"),
            ),
            (
                "user: {token: secret}",
                "user: {exec: {command: x, interactiveMode: Always}}",
                Want::Invalid("interactiveMode"),
            ),
            (
                "user: {token: secret}",
                "user: {auth-provider: {name: gcp}}",
                Want::Unsupported("auth-provider plugins"),
            ),
            (
                "user: {token: secret}",
                "user: {tokenFile: tok}",
                Want::Auth(Auth::TokenFile(PathBuf::from("/etc/tok")), false),
            ),
            (
                "tls-server-name: kubernetes",
                "insecure-skip-tls-verify: true",
                Want::Unsupported("insecure-skip-tls-verify"),
            ),
        ];
        for (from, to, want) in cases {
            let text = KUBECONFIG.replace(from, to);
            let result = KubeConfig::from_kubeconfig("kc", &text, Path::new("/etc"));
            match (result, want) {
                (Err(ConfigError::Unsupported { what: w, .. }), Want::Unsupported(what)) => {
                    assert_eq!(w, what)
                }
                (Err(ConfigError::Kubeconfig { reason, .. }), Want::Invalid(needle)) => {
                    assert!(reason.contains(needle), "{to}: {reason}")
                }
                (Ok(c), Want::Auth(auth, identity)) => {
                    assert_eq!(c.auth, auth, "{to}");
                    assert_eq!(c.client_identity.is_some(), identity, "{to}");
                }
                (got, _) => panic!("{to}: unexpected {got:?}"),
            }
        }
        let missing = KUBECONFIG.replace("current-context: main", "current-context: other");
        assert!(matches!(
            KubeConfig::from_kubeconfig("kc", &missing, Path::new("/")),
            Err(ConfigError::Kubeconfig { .. })
        ));
    }
}

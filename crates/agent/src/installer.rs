//! The CNI installer (`spec/cni.md` §1.3 step 9, §5.5, §6.2): puts the `istio-cni` plugin
//! on the node and keeps it there.
//!
//! Three steps, each skipped when it has nothing configured to write to:
//!
//! 1. **Binary**: the running executable (`/proc/self/exe`; `ambit` acts as the plugin when
//!    called as `istio-cni`) is copied to `<bin dir>/istio-cni` atomically (temp file in the
//!    same directory, synced, renamed); our stale temp files are removed first. The bin dir
//!    is `AMBIT_CNI_BIN_DIR`, else `<AMBIT_HOST_PREFIX>/opt/cni/bin` (upstream's
//!    `/host/opt/cni/bin`); with neither the step is skipped: the installer never writes to
//!    a host path nobody configured.
//! 2. **Kubeconfig** for the plugin: `<CNI_AGENT_RUN_DIR>/istio-cni-kubeconfig` (mode
//!    `KUBECONFIG_MODE`, default 0600), built like upstream from `KUBERNETES_SERVICE_*`, the
//!    service-account token and CA (`KUBE_CA_FILE`, or insecure with `SKIP_TLS_VERIFY`),
//!    rewritten when the token rotates. ambit's plugin talks only to the agent socket and
//!    never reads it; outside a pod (no `KUBERNETES_SERVICE_HOST`) the step is skipped,
//!    where upstream fails.
//! 3. **CNI config** in `MOUNTED_CNI_NET_DIR` (default `<AMBIT_HOST_PREFIX>/etc/cni/net.d`,
//!    skipped with neither): chained, Istio-owned or standalone ([`ConfMode`]). Chained and
//!    Istio-owned wait for a primary config to appear.
//!
//! [`Installer::reconcile`] checks every step and repairs only what drifted (nothing is
//! rewritten when all is in place, so other agents watching the directory see no churn).
//! The agent runs it at start and then every `AMBIT_INSTALL_CHECK_INTERVAL` (default 1 s;
//! upstream reacts to inotify events): a primary CNI that rewrites its config (dropping our
//! entry), a new primary config that sorts first, a replaced or deleted binary, a rotated
//! token are all repaired within one interval. Readiness (`/readyz`,
//! `istio_cni_install_ready`) is true only after a pass found or left everything in place,
//! and flips false as soon as a pass sees drift, until the repair succeeds.

pub mod conflist;

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::enrol::{EnablementSelector, LabelSelector};
use conflist::{
    ConfMode, ISTIO_CNI_TYPE, InstallError, first_valid, plan_conf, uninstall_conf,
    write_bytes_atomic,
};

/// Name of the plugin binary in the bin dir (and the plugin `type`).
pub const PLUGIN_BINARY: &str = "istio-cni";

/// Name of the plugin kubeconfig in `CNI_AGENT_RUN_DIR` (upstream `CNIPluginKubeconfName`).
pub const KUBECONFIG_NAME: &str = "istio-cni-kubeconfig";

/// Where Kubernetes mounts the pod's service-account token and CA.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Default pause between two installer passes.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The API server the plugin kubeconfig points at (`KUBERNETES_SERVICE_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeApi {
    /// `KUBERNETES_SERVICE_PROTOCOL` (default `https`).
    pub protocol: String,
    /// `KUBERNETES_SERVICE_HOST`.
    pub host: String,
    /// `KUBERNETES_SERVICE_PORT`.
    pub port: String,
    /// Token and `ca.crt` (default [`SERVICE_ACCOUNT_DIR`]).
    pub service_account_dir: PathBuf,
    /// `KUBE_CA_FILE` (default `<service_account_dir>/ca.crt`).
    pub ca_file: Option<PathBuf>,
    /// `SKIP_TLS_VERIFY`.
    pub skip_tls_verify: bool,
}

/// What the installer writes and where (all from `spec/cni.md` §6.4 names, see
/// [`crate::config`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallConfig {
    /// `MOUNTED_CNI_NET_DIR`; `None`: the CNI config step is skipped.
    pub conf_dir: Option<PathBuf>,
    /// `CNI_CONF_NAME`.
    pub conf_name: Option<String>,
    /// `CHAINED_CNI_PLUGIN` / `ISTIO_OWNED_CNI_CONFIG*` / `CNI_CONF_GROUP_READ`.
    pub mode: ConfMode,
    /// Target bin dir; `None`: the binary step is skipped.
    pub bin_dir: Option<PathBuf>,
    /// What to copy (default `/proc/self/exe`).
    pub binary_source: PathBuf,
    /// `CNI_AGENT_RUN_DIR`: where the kubeconfig goes.
    pub run_dir: PathBuf,
    /// `None` outside a pod: the kubeconfig step is skipped.
    pub kube_api: Option<KubeApi>,
    /// `KUBECONFIG_MODE` (default 0600).
    pub kubeconfig_mode: u32,
    /// `AMBIENT_ENABLED` for the plugin entry.
    pub ambient_enabled: bool,
    /// `LOG_LEVEL`: the entry's `plugin_log_level` (default `warn`).
    pub plugin_log_level: String,
    /// `ENABLE_AMBIENT_DETECTION_RETRY` for the plugin entry.
    pub ambient_detection_retry: bool,
    /// `AMBIT_INSTALL_CHECK_INTERVAL`.
    pub check_interval: Duration,
}

impl Default for InstallConfig {
    /// Nothing to install: every step skipped.
    fn default() -> Self {
        Self {
            conf_dir: None,
            conf_name: None,
            mode: ConfMode::Chained,
            bin_dir: None,
            binary_source: PathBuf::from("/proc/self/exe"),
            run_dir: PathBuf::from("/var/run/istio-cni"),
            kube_api: None,
            kubeconfig_mode: 0o600,
            ambient_enabled: true,
            plugin_log_level: "warn".into(),
            ambient_detection_retry: false,
            check_interval: DEFAULT_CHECK_INTERVAL,
        }
    }
}

impl InstallConfig {
    /// `<bin dir>/istio-cni`, when a bin dir is configured.
    pub fn binary_path(&self) -> Option<PathBuf> {
        self.bin_dir.as_ref().map(|d| d.join(PLUGIN_BINARY))
    }

    /// `<run dir>/istio-cni-kubeconfig`.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.run_dir.join(KUBECONFIG_NAME)
    }
}

/// A failed installer step. The agent retries every check interval; readiness stays false.
#[derive(Debug, thiserror::Error)]
pub enum InstallerError {
    /// Copying the plugin binary failed (upstream result `COPY_BINARIES_FAILURE`).
    #[error("copying plugin binary {from} to {to}: {source}")]
    CopyBinary {
        /// The running executable.
        from: PathBuf,
        /// The target.
        to: PathBuf,
        /// OS error.
        source: io::Error,
    },
    /// Building or writing the kubeconfig failed (`CREATE_KUBECONFIG_FAILURE`).
    #[error("writing plugin kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// What went wrong.
        source: KubeconfigError,
    },
    /// Writing the CNI config failed (`CREATE_CNI_CONFIG_FAILURE`);
    /// [`InstallError::NoPrimary`] means waiting for the primary CNI.
    #[error("CNI config: {0}")]
    CniConfig(#[from] InstallError),
}

/// Why the plugin kubeconfig could not be built, written or removed.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// The service account token is unreadable.
    #[error("reading service account token {path}: {source} (is the agent running in a pod?)")]
    Token {
        /// The token file.
        path: PathBuf,
        /// OS error.
        source: io::Error,
    },
    /// The API server's CA is unreadable.
    #[error("reading CA {path}: {source}")]
    Ca {
        /// The CA file.
        path: PathBuf,
        /// OS error.
        source: io::Error,
    },
    /// Serialising the document failed.
    #[error("rendering: {0}")]
    Render(#[from] serde_norway::Error),
    /// Writing the file failed.
    #[error("{0}")]
    Write(InstallError),
    /// Removing the file failed (uninstall).
    #[error("removing: {0}")]
    Remove(io::Error),
}

impl InstallerError {
    /// Whether this is the normal wait for the primary CNI's config (not a failure).
    pub fn is_waiting(&self) -> bool {
        matches!(self, Self::CniConfig(InstallError::NoPrimary(_)))
    }
}

/// Identity of an installed binary: changes when anyone replaces or rewrites the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
}

impl FileId {
    fn of(path: &Path) -> Option<Self> {
        let m = fs::symlink_metadata(path).ok()?;
        m.is_file().then(|| Self {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
        })
    }
}

/// The installer: configuration, the plugin entry, and what it installed last.
#[derive(Debug)]
pub struct Installer {
    cfg: InstallConfig,
    entry: Value,
    binary: Option<FileId>,
    conf_file: Option<PathBuf>,
    warned_owned_not_first: bool,
}

/// What one [`Installer::reconcile`] pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    /// The steps that had to be (re)done: `binary`, `kubeconfig`, `cni config`.
    pub repaired: Vec<&'static str>,
}

impl Installer {
    /// An installer writing `entry` (see [`plugin_entry`]).
    pub fn new(cfg: InstallConfig, entry: Value) -> Self {
        Self {
            cfg,
            entry,
            binary: None,
            conf_file: None,
            warned_owned_not_first: false,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &InstallConfig {
        &self.cfg
    }

    /// The CNI config file holding our entry after the last successful pass.
    pub fn conf_file(&self) -> Option<&Path> {
        self.conf_file.as_deref()
    }

    /// Checks every configured step and repairs what drifted. `on_drift` is called before
    /// the first repair of the pass (the agent drops readiness there). Blocking.
    pub fn reconcile(&mut self, on_drift: &mut dyn FnMut()) -> Result<Pass, InstallerError> {
        let mut pass = Pass::default();
        let mut drifted = |pass: &mut Pass, step: &'static str| {
            if pass.repaired.is_empty() {
                on_drift();
            }
            pass.repaired.push(step);
        };
        if let Some(target) = self.cfg.binary_path()
            && (self.binary.is_none() || FileId::of(&target) != self.binary)
        {
            drifted(&mut pass, "binary");
            self.binary = None;
            self.binary = Some(copy_binary(&self.cfg.binary_source, &target)?);
        }
        if let Some(api) = &self.cfg.kube_api {
            let path = self.cfg.kubeconfig_path();
            let err = |source: KubeconfigError| InstallerError::Kubeconfig {
                path: path.clone(),
                source,
            };
            let want = render_kubeconfig(api).map_err(err)?;
            let current_mode = fs::metadata(&path).map(|m| m.permissions().mode() & 0o7777);
            if fs::read(&path).ok().as_deref() != Some(want.as_bytes())
                || current_mode.ok() != Some(self.cfg.kubeconfig_mode & 0o7777)
            {
                drifted(&mut pass, "kubeconfig");
                write_bytes_atomic(&path, want.as_bytes(), self.cfg.kubeconfig_mode)
                    .map_err(|e| err(KubeconfigError::Write(e)))?;
            }
        }
        if let Some(dir) = &self.cfg.conf_dir {
            let plan = plan_conf(
                dir,
                self.cfg.conf_name.as_deref(),
                &self.cfg.mode,
                &self.entry,
            )
            .inspect_err(|_| self.conf_file = None)?;
            if !plan.is_current() {
                drifted(&mut pass, "cni config");
                plan.apply()?;
            }
            if let ConfMode::IstioOwned { .. } = &self.cfg.mode {
                let first = first_valid(dir);
                let first_is_ours = first.as_deref() == Some(plan.path.as_path());
                if !first_is_ours && !self.warned_owned_not_first {
                    tracing::warn!(
                        owned = %plan.path.display(),
                        first = ?first,
                        "Istio-owned CNI config does not sort first: the runtime will not use it"
                    );
                }
                self.warned_owned_not_first = !first_is_ours;
            }
            self.conf_file = Some(plan.path);
        }
        Ok(pass)
    }
}

/// Copies `from` to `to` atomically with mode 0755; returns the new file's identity.
fn copy_binary(from: &Path, to: &Path) -> Result<FileId, InstallerError> {
    let err = |source| InstallerError::CopyBinary {
        from: from.to_owned(),
        to: to.to_owned(),
        source,
    };
    let dir = to.parent().unwrap_or(Path::new("."));
    let name = to
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Temp files of an earlier agent that died mid-copy (ours only: the directory is
    // shared with other plugins).
    let prefix = format!(".{name}.tmp.");
    for e in fs::read_dir(dir).map_err(err)?.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = fs::remove_file(e.path());
        }
    }
    let tmp = dir.join(format!("{prefix}{}", std::process::id()));
    let result = (|| {
        fs::copy(from, &tmp)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
        fs::File::open(&tmp)?.sync_all()?;
        fs::rename(&tmp, to)
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(err(e));
    }
    FileId::of(to).ok_or_else(|| err(io::Error::other("installed binary vanished")))
}

/// Undoes the install (uninstall shutdown, §1.10): the CNI config entry first (so the
/// runtime stops calling a plugin whose agent is leaving), then the kubeconfig and the
/// binary. Every step is tried; returns what was removed and every failure.
pub fn uninstall(cfg: &InstallConfig) -> (Vec<PathBuf>, Vec<InstallerError>) {
    let mut removed = Vec::new();
    let mut errors = Vec::new();
    if let Some(dir) = &cfg.conf_dir {
        match uninstall_conf(dir, cfg.conf_name.as_deref(), &cfg.mode) {
            Ok(files) => removed.extend(files),
            Err(e) => errors.push(e.into()),
        }
    }
    let remove = |path: PathBuf| match fs::remove_file(&path) {
        Ok(()) => Ok(Some(path)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err((path, e)),
    };
    match remove(cfg.kubeconfig_path()) {
        Ok(p) => removed.extend(p),
        Err((path, e)) => errors.push(InstallerError::Kubeconfig {
            path,
            source: KubeconfigError::Remove(e),
        }),
    }
    if let Some(bin) = cfg.binary_path() {
        match remove(bin.clone()) {
            Ok(p) => removed.extend(p),
            Err((_, source)) => errors.push(InstallerError::CopyBinary {
                from: cfg.binary_source.clone(),
                to: bin,
                source,
            }),
        }
    }
    (removed, errors)
}

/// Inputs of the plugin entry that live outside [`InstallConfig`].
#[derive(Debug, Clone, Copy)]
pub struct EntryInputs<'a> {
    /// Enablement selectors.
    pub selectors: &'a [EnablementSelector],
    /// `EXCLUDE_NAMESPACES`.
    pub exclude_namespaces: &'a [String],
    /// `POD_NAMESPACE`.
    pub pod_namespace: &'a str,
    /// `NATIVE_NFTABLES`.
    pub native_nftables: bool,
}

/// The `istio-cni` config entry (§5.2) the plugin reads, as upstream writes it
/// (standalone form, with `cniVersion` 0.3.1; chained insertion drops it).
pub fn plugin_entry(cfg: &InstallConfig, inputs: EntryInputs<'_>) -> Value {
    json!({
        "cniVersion": "0.3.1",
        "name": ISTIO_CNI_TYPE,
        "type": ISTIO_CNI_TYPE,
        "plugin_log_level": cfg.plugin_log_level,
        "cni_agent_run_dir": cfg.run_dir,
        "ambient_enabled": cfg.ambient_enabled,
        "enablement_selectors": inputs
            .selectors
            .iter()
            .map(selector_json)
            .collect::<Vec<_>>(),
        "exclude_namespaces": inputs.exclude_namespaces,
        "pod_namespace": inputs.pod_namespace,
        "native_nftables": inputs.native_nftables,
        "enable_ambient_detection_retry": cfg.ambient_detection_retry,
        "ipam": {},
        "dns": {},
    })
}

/// A selector pair in the Go JSON shape (`omitempty` everywhere).
fn selector_json(s: &EnablementSelector) -> Value {
    json!({
        "podSelector": label_selector_json(&s.pod_selector),
        "namespaceSelector": label_selector_json(&s.namespace_selector),
    })
}

fn label_selector_json(s: &LabelSelector) -> Value {
    let mut out = Map::new();
    if !s.match_labels.is_empty() {
        out.insert("matchLabels".into(), json!(s.match_labels));
    }
    if !s.match_expressions.is_empty() {
        let exprs: Vec<Value> = s
            .match_expressions
            .iter()
            .map(|r| {
                let mut e = Map::new();
                e.insert("key".into(), Value::from(r.key.clone()));
                e.insert("operator".into(), Value::from(format!("{:?}", r.operator)));
                if !r.values.is_empty() {
                    e.insert("values".into(), json!(r.values));
                }
                Value::Object(e)
            })
            .collect();
        out.insert("matchExpressions".into(), Value::Array(exprs));
    }
    Value::Object(out)
}

/// The plugin kubeconfig (client-go v1 `Config` shape, as upstream writes it).
pub fn render_kubeconfig(api: &KubeApi) -> Result<String, KubeconfigError> {
    let token_path = api.service_account_dir.join("token");
    let token = fs::read_to_string(&token_path).map_err(|source| KubeconfigError::Token {
        path: token_path.clone(),
        source,
    })?;
    let host = if api.host.contains(':') && !api.host.starts_with('[') {
        format!("[{}]", api.host)
    } else {
        api.host.clone()
    };
    let mut cluster = Map::new();
    cluster.insert(
        "server".into(),
        Value::from(format!("{}://{host}:{}", api.protocol, api.port)),
    );
    if api.skip_tls_verify {
        cluster.insert("insecure-skip-tls-verify".into(), Value::Bool(true));
    } else {
        let ca = api
            .ca_file
            .clone()
            .unwrap_or_else(|| api.service_account_dir.join("ca.crt"));
        let data = fs::read(&ca).map_err(|source| KubeconfigError::Ca {
            path: ca.clone(),
            source,
        })?;
        cluster.insert(
            "certificate-authority-data".into(),
            Value::from(base64::engine::general_purpose::STANDARD.encode(&data)),
        );
    }
    let cfg = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "contexts": [{"name": "istio-cni-context",
                      "context": {"cluster": "local", "user": "istio-cni"}}],
        "current-context": "istio-cni-context",
        "preferences": {},
        "users": [{"name": "istio-cni", "user": {"token": token.trim()}}],
    });
    Ok(serde_norway::to_string(&cfg)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_has_upstream_keys_and_selector_shape() {
        let selectors = crate::enrol::default_selectors();
        let e = plugin_entry(
            &InstallConfig::default(),
            EntryInputs {
                selectors: &selectors,
                exclude_namespaces: &["kube-system".to_owned()],
                pod_namespace: "istio-system",
                native_nftables: false,
            },
        );
        let want = json!({
            "cniVersion": "0.3.1", "name": "istio-cni", "type": "istio-cni",
            "plugin_log_level": "warn", "cni_agent_run_dir": "/var/run/istio-cni",
            "ambient_enabled": true,
            "enablement_selectors": [
                {"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}},
                 "namespaceSelector": {}},
                {"podSelector": {"matchExpressions": [{"key": "istio.io/dataplane-mode",
                    "operator": "NotIn", "values": ["none"]}]},
                 "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}],
            "exclude_namespaces": ["kube-system"], "pod_namespace": "istio-system",
            "native_nftables": false, "enable_ambient_detection_retry": false,
            "ipam": {}, "dns": {},
        });
        assert_eq!(e, want);
        // The plugin parses what the agent writes.
        let conf = serde_json::from_value::<crate::plugin::PluginConf>(e);
        assert!(conf.is_ok_and(|c| c.ambient_enabled && c.exclude_namespaces.len() == 1));
    }
}

//! kubeconfig `exec` credential plugins (`client.authentication.k8s.io`): what EKS
//! (`aws eks get-token`), GKE (`gke-gcloud-auth-plugin`) and AKS (`kubelogin`) kubeconfigs use.
//!
//! This module only holds what the kubeconfig says ([`ExecConfig`]); kube-rs runs the
//! plugin (with `KUBERNETES_EXEC_INFO`, `spec.interactive: false`), caches its token until
//! `status.expirationTimestamp` and accepts a returned token or client certificate.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

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

impl ExecConfig {
    /// The same block in kube-rs's terms (never interactive).
    pub(crate) fn to_kube(&self) -> kube::config::ExecConfig {
        let env = self
            .env
            .iter()
            .map(|(name, value)| {
                HashMap::from([
                    ("name".to_string(), name.clone()),
                    ("value".to_string(), value.clone()),
                ])
            })
            .collect();
        kube::config::ExecConfig {
            api_version: Some(self.api_version.clone()),
            command: Some(self.command.to_string_lossy().into_owned()),
            args: Some(self.args.clone()),
            env: Some(env),
            drop_env: None,
            install_hint: None,
            interactive_mode: Some(kube::config::ExecInteractiveMode::Never),
            provide_cluster_info: false,
            cluster: None,
            other: Default::default(),
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

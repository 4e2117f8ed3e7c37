//! Linux: a pod's namespace is a netns descriptor that rides along with `AddWorkload`.

use std::os::fd::AsFd;
use std::sync::Arc;

use ambit_contract::zds::WorkloadInfo;
use ambit_netns::NetnsFd;
use ambit_netns::zds::Attach;

/// A pod's network namespace: its open netns descriptor (kept while the pod is enrolled).
pub type PodNamespace = Arc<NetnsFd>;

/// What `AddWorkload` for a pod in `ns` carries beside the message; `info` is unchanged.
pub fn attach<'a>(ns: &'a PodNamespace, _info: &mut WorkloadInfo) -> Option<Attach<'a>> {
    Some(ns.as_fd())
}

/// Creates the socket's directory (mode 0700) when missing.
pub fn prepare_listen_path(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir),
        None => Ok(()),
    }
}

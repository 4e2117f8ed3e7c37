//! Windows: a pod's namespace is an HNS namespace, named inside `AddWorkload`.

use ambit_contract::zds::{WindowsNamespace, WorkloadInfo};
use ambit_netns::zds::Attach;

/// A pod's HNS namespace (defined beside the other Windows parts, which Linux builds too).
pub use crate::windows::HnsPodNamespace as PodNamespace;

/// Nothing rides along on the pipe: the namespace goes into `info.windows_namespace`.
pub fn attach<'a>(ns: &'a PodNamespace, info: &mut WorkloadInfo) -> Option<Attach<'a>> {
    info.windows_namespace = Some(WindowsNamespace {
        id: ns.compartment,
        guid: ns.guid.to_string(),
    });
    None
}

/// A pipe name needs no directory.
pub fn prepare_listen_path(_path: &std::path::Path) -> std::io::Result<()> {
    Ok(())
}

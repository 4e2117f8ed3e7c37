//! Windows: a pod's namespace is an HNS namespace, named inside `AddWorkload`.

use ambit_contract::zds::{WindowsNamespace, WorkloadInfo};
use ambit_netns::guid::Guid;
use ambit_netns::zds::Attach;

/// A pod's HNS namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodNamespace {
    /// The namespace ID.
    pub guid: Guid,
    /// Its compartment as last read from HNS; 0 while it has none.
    pub compartment: u32,
}

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

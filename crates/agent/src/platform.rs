//! The agent's platform switch: what a pod's network namespace is and how ZDS carries it.
//! On Linux a pod's namespace is an open netns descriptor, sent beside `AddWorkload` as
//! `SCM_RIGHTS`; on Windows it is an HNS namespace (GUID and compartment), sent inside the
//! message as `WorkloadInfo.windows_namespace` (`spec/windows.md` §2.2). The ZDS server
//! ([`crate::zds`]) is written once against these names.

#[cfg(unix)]
#[path = "platform/unix.rs"]
mod imp;
#[cfg(windows)]
#[path = "platform/windows.rs"]
mod imp;

pub use imp::{PodNamespace, attach, prepare_listen_path};

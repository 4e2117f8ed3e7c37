//! The in-pod platform switch: what a pod's namespace is as ZDS names it, how a received
//! request is checked, and how a pod's sockets are made. On Linux the namespace is the netns
//! descriptor riding along with `AddWorkload` and sockets come from a factory that enters it;
//! on Windows it is the HNS namespace named in `WorkloadInfo.windows_namespace` and sockets
//! come from the pod's network compartment, once HNS has one (`spec/windows.md` §1.5, §2).
//! The rest of the in-pod code is the same on both.

#[cfg(unix)]
#[path = "platform/linux.rs"]
mod imp;
#[cfg(windows)]
#[path = "platform/windows.rs"]
mod imp;

pub(super) use imp::socket_factory;
pub use imp::{NamespaceError, PodNetns, SetupError, decode_request};

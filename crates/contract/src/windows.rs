//! The node contract on Windows nodes (`spec/windows.md`): what the agent's redirection
//! policies, its ZDS pipe and ztunnel must agree on there. Plain values, valid on every
//! platform, so the policy renderer and the codec are tested on Linux too.

/// ZDS on Windows: the named pipe the agent serves and ztunnel opens (`INPOD_UDS`;
/// upstream's sample DaemonSet value).
pub const ZDS_PIPE: &str = r"\\.\pipe\istio-zds";

/// In and out buffer of each ZDS pipe instance, and the size both ends read into: far
/// larger than any valid message ([`crate::zds::MAX_MESSAGE`]), so a valid message is always
/// read whole and a larger one is detected, never split (upstream's 1 KiB buffers break on
/// the first message over 1 KiB, `spec/windows.md` §2.1).
pub const ZDS_PIPE_BUFFER: usize = 64 * 1024;

/// `NT AUTHORITY\SYSTEM` (LocalSystem). The in-pod policies exempt connections of processes
/// running as this SID, which is how ztunnel's own sockets stay out of the redirection loop
/// (the Linux `SO_MARK` bypass): ztunnel must run as this user (HostProcess
/// `runAsUserName: "NT AUTHORITY\\SYSTEM"`).
pub const LOCAL_SYSTEM_SID: &str = "S-1-5-18";

/// The host's network compartment; a HostProcess container (the agent, ztunnel) lives in it.
pub const HOST_COMPARTMENT: u32 = 1;

/// HNS reports compartment 0 while no container runs in a namespace yet.
pub const NO_COMPARTMENT: u32 = 0;

/// containerd's CRI endpoint on Windows, where the agent finds running pods' namespaces.
pub const CRI_PIPE: &str = r"\\.\pipe\containerd-containerd";

//! In-process reads of a network namespace's kernel state, for verification without a
//! process per pod: policy-routing rules and routes (rtnetlink), nf_tables tables, chains
//! and rules (nfnetlink), and sysctls (`/proc/sys`).
//!
//! Every function here reads the namespace of the *calling thread*: netlink sockets belong
//! to the namespace they are created in, and `/proc/sys/net` shows the namespace of the
//! thread that opens it. Callers run them on a thread inside the pod's namespace
//! ([`read_in`] does that).
//!
//! The kernel is a peer like any other here: every receive has a deadline, every dump a
//! bound on its size, and a message that does not parse is an error, never a panic. An
//! error makes the caller fall back to the rule tools, so it can cost time, never
//! strictness.

pub(crate) mod conntrack;
pub mod guard;
pub(crate) mod nft;
pub(crate) mod rtnl;
pub(crate) mod sock_diag;
pub(crate) mod socket;
pub mod watch;

use ambit_netns::{NetnsError, NetnsFd, run_in_netns_thread};

/// Failure reading kernel state in-process.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A netlink socket could not be opened, bound, written or read.
    #[error("netlink {what}: {source}")]
    Io {
        /// Which step.
        what: &'static str,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The kernel sent something that does not parse as the expected message.
    #[error("netlink {what}: undecodable reply: {detail}")]
    Decode {
        /// Which request.
        what: &'static str,
        /// The decoder's message.
        detail: String,
    },
    /// The kernel refused the request.
    #[error("netlink {what}: kernel error {code}")]
    Refused {
        /// Which request.
        what: &'static str,
        /// The (negative) errno.
        code: i32,
    },
    /// The object changed while it was being dumped (`NLM_F_DUMP_INTR`).
    #[error("netlink {what}: dump interrupted by a concurrent change")]
    Interrupted {
        /// Which request.
        what: &'static str,
    },
    /// A dump was larger than any state we write can explain.
    #[error("netlink {what}: more than {limit} messages")]
    TooLarge {
        /// Which request.
        what: &'static str,
        /// The bound.
        limit: usize,
    },
    /// Entering the namespace failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
}

/// Reads `/proc/sys/<path>` (e.g. `net/ipv6/conf/lo/disable_ipv6`) in the calling thread's
/// namespace; `None` when the file does not exist or cannot be read (the same answer
/// `cat` failing gives the process-based check).
pub fn sysctl(path: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/sys/{path}")).ok()
}

/// Runs `f` on a thread inside `netns` (see the module docs for why a thread).
pub fn read_in<R: Send>(
    netns: &NetnsFd,
    f: impl FnOnce() -> Result<R, KernelError> + Send,
) -> Result<R, KernelError> {
    run_in_netns_thread(netns, f)?
}

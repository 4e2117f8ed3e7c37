//! Network namespaces for ambit: namespace file descriptors, running code inside a
//! namespace, spawning commands inside one, and a socket factory that creates sockets
//! inside a namespace.
//!
//! This crate (with `topology`, `redirect` and `agent`) is the only place that calls
//! `setns(2)`. Everything else receives a [`NetnsFd`] or a [`SocketFactory`] and stays
//! namespace-agnostic.
//!
//! # Model
//!
//! - [`NetnsFd`] is an open, validated network-namespace file descriptor. Holding it keeps
//!   the namespace alive even after its `/var/run/netns` name is removed.
//! - [`in_netns`] switches the *current thread* into a namespace for the duration of a
//!   closure and always switches back (also on panic; if switching back fails the process
//!   aborts, see [`in_netns`]).
//! - [`run_in_netns_thread`] runs a closure on a fresh OS thread that enters the namespace
//!   and then exits, for blocking or long-running work.
//! - [`SocketFactory`] creates sockets. A socket belongs to the namespace it was created
//!   in for its whole life, so [`NetnsSocketFactory`] only needs to be inside the
//!   namespace for the `socket(2)` call; bind, listen and connect can happen anywhere,
//!   including on a tokio worker thread.
//! - [`set_command_netns`] makes a [`std::process::Command`] start inside a namespace.
//! - [`sandbox`] (Linux): a process started inside joined or new namespaces with its own
//!   mounts, root, credentials and capabilities (a minimal container runtime for tests).
//! - [`SeqPacket`] / [`SeqPacketListener`]: `AF_UNIX` `SOCK_SEQPACKET` sockets that carry
//!   one namespace descriptor per datagram (`SCM_RIGHTS`): the one ZDS transport, used by
//!   the agent's server, ztunnel's client and the test peers of both.
//!
//! # Platforms
//!
//! One switch, two halves. On Unix a namespace is held by descriptor (`fd`, `enter`,
//! `command`, `seqpacket`, gathered in `unix.rs`; the Linux system calls behind `imp`, other
//! Unixes get [`NetnsError::Unsupported`]). On Windows a pod's namespace is an HNS namespace
//! whose network compartment a thread can enter (`windows.rs` and `windows/`: compartments, the
//! HCN calls, the named-pipe ZDS transport). What both share is platform-neutral and tested on Linux:
//! the [`SocketFactory`] trait, [`zds`] (the transport interface ZDS code is written
//! against), [`guid`], [`hns`] (reading HNS's JSON) and [`compartment`] (the enter/restore
//! guard and the dedicated compartment thread, over a [`compartment::CompartmentOps`] that
//! Windows implements with `SetCurrentThreadCompartmentId` and tests with a fake).

#[cfg(target_os = "linux")]
#[path = "linux.rs"]
mod imp;
#[cfg(windows)]
#[path = "windows.rs"]
mod imp;
#[cfg(not(any(target_os = "linux", windows)))]
#[path = "unsupported.rs"]
mod imp;

#[cfg(unix)]
#[path = "unix.rs"]
mod platform;
#[cfg(windows)]
mod platform {
    pub use crate::imp::{
        CompartmentSocketFactory, SystemCompartments, hcn,
        pipe::{PipeConn, PipeListener},
    };
}

pub mod compartment;
pub mod guid;
pub mod hns;
mod id;
#[cfg(target_os = "linux")]
pub mod sandbox;
mod socket;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod zds;

pub use id::NetnsId;
pub use platform::*;
pub use socket::{
    DefaultSocketFactory, Keepalive, SocketError, SocketFactory, SocketOptions, Transparent,
    connect_tcp, is_transparent, original_dst,
};

use std::{io, path::PathBuf};

/// Errors from opening, validating and entering network namespaces.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The namespace file could not be opened.
    #[error("opening network namespace {path}: {source}")]
    Open {
        /// The path that was opened.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The file descriptor refers to something that is not a network namespace.
    #[error("{what} is not a network namespace")]
    NotNetns {
        /// Where the descriptor came from (a path or "file descriptor N").
        what: String,
    },
    /// `fstat`, `ioctl` or `fstatfs` on a namespace descriptor failed.
    #[error("inspecting network namespace {what}: {source}")]
    Inspect {
        /// Where the descriptor came from.
        what: String,
        /// The underlying error.
        source: io::Error,
    },
    /// `setns(2)` into the target namespace failed.
    #[error("entering network namespace {target}: {source}")]
    Enter {
        /// The namespace we tried to enter.
        target: NetnsId,
        /// The underlying error.
        source: io::Error,
    },
    /// Creating a new namespace (`unshare`) failed.
    #[error("creating a network namespace: {0}")]
    Create(io::Error),
    /// Spawning the helper thread failed.
    #[error("spawning a network namespace thread: {0}")]
    Spawn(io::Error),
    /// Duplicating a descriptor failed.
    #[error("duplicating a network namespace descriptor: {0}")]
    Clone(io::Error),
    /// Network namespaces do not exist on this platform.
    #[error("network namespaces are not supported on this platform")]
    Unsupported,
}

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
//! Linux-only system calls live behind the single `imp` module switch; on other platforms
//! every operation returns [`NetnsError::Unsupported`].

#[cfg(target_os = "linux")]
#[path = "linux.rs"]
mod imp;
#[cfg(not(target_os = "linux"))]
#[path = "unsupported.rs"]
mod imp;

mod command;
mod enter;
mod fd;
#[cfg(target_os = "linux")]
pub mod sandbox;
mod seqpacket;
mod socket;
pub mod testing;

pub use command::{kill_with_parent, set_command_netns};
pub use enter::{in_netns, run_in_netns_thread, spawn_in_netns_thread};
pub use fd::{NetnsFd, NetnsId};
pub use seqpacket::{SeqPacket, SeqPacketError, SeqPacketListener, register_async};
pub use socket::{
    DefaultSocketFactory, Keepalive, NetnsSocketFactory, SocketError, SocketFactory, SocketOptions,
    Transparent, connect_tcp, is_transparent, original_dst,
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

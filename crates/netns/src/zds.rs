//! The ZDS transport, one interface on every platform (`spec/cni.md` §4.1,
//! `spec/windows.md` §2.1): a message-preserving connection where each message is read whole
//! into a caller-sized buffer (a larger one is an error, never cut silently) and, on Linux, at
//! most one namespace descriptor rides along. ZDS code (the agent's server, ztunnel's client
//! and their test peers) is written against these names only, so it reads the same on both
//! platforms:
//!
//! | name | Linux | Windows |
//! |---|---|---|
//! | [`Conn`] | [`SeqPacket`](crate::SeqPacket): `AF_UNIX` `SOCK_SEQPACKET` | `PipeConn`: a message-mode named pipe |
//! | [`Listener`] | [`SeqPacketListener`](crate::SeqPacketListener) | `PipeListener`: SYSTEM and Administrators only, local clients only |
//! | [`Error`] | [`SeqPacketError`](crate::SeqPacketError) | `PipeError` |
//! | [`Attached`] (received beside a message) | an `OwnedFd` (`SCM_RIGHTS`) | nothing can be ([`NoAttachment`]); the namespace is in the payload |
//! | [`Attach`] (sent beside a message) | a `BorrowedFd` | [`NoAttachment`] |
//!
//! Every type has `connect(path)` / `bind(path)` / `accept()`, `send(data)`,
//! `send_with_fds(data, &[Attach])`, `recv_with_fd(buf)` (length 0: the peer closed) and
//! `Error::is_disconnect()`. The framing is `ambit_contract::zds`.

#[cfg(unix)]
mod imp {
    pub use crate::{SeqPacket as Conn, SeqPacketError as Error, SeqPacketListener as Listener};
    /// A descriptor received with a message.
    pub type Attached = std::os::fd::OwnedFd;
    /// A descriptor sent with a message.
    pub type Attach<'a> = std::os::fd::BorrowedFd<'a>;
}

#[cfg(windows)]
mod imp {
    pub use crate::{PipeConn as Conn, PipeError as Error, PipeListener as Listener};
    /// Nothing rides along on a named pipe.
    pub type Attached = super::NoAttachment;
    /// Nothing rides along on a named pipe.
    pub type Attach<'a> = super::NoAttachment;
}

pub use imp::*;

/// What rides beside a message where nothing can (a named pipe): a type without values, so
/// "a descriptor arrived" cannot even be written down there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoAttachment {}

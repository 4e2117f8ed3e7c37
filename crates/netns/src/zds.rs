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
//! | [`Attached`] (received beside a message) | an `OwnedFd` (`SCM_RIGHTS`) | nothing can be ([`NoAttachment`]); the namespace is in the payload |
//! | [`Attach`] (sent beside a message) | a `BorrowedFd` | [`NoAttachment`] |
//!
//! Every type has `connect(path)` / `bind(path)` / `accept()`, `send(data)`,
//! `send_with_fds(data, &[Attach])`, `recv_with_fd(buf)` (length 0: the peer closed) and
//! [`TransportError::is_disconnect`]. Both platforms fail with the one [`TransportError`]:
//! each variant says which step failed, and the few that only one platform can produce
//! say so. The framing is `ambit_contract::zds`.

#[cfg(unix)]
mod imp {
    pub use crate::{SeqPacket as Conn, SeqPacketListener as Listener};
    /// A descriptor received with a message.
    pub type Attached = std::os::fd::OwnedFd;
    /// A descriptor sent with a message.
    pub type Attach<'a> = std::os::fd::BorrowedFd<'a>;
}

#[cfg(windows)]
mod imp {
    pub use crate::{PipeConn as Conn, PipeListener as Listener};
    /// Nothing rides along on a named pipe.
    pub type Attached = super::NoAttachment;
    /// Nothing rides along on a named pipe.
    pub type Attach<'a> = super::NoAttachment;
}

pub use imp::*;

use std::{io, path::PathBuf};

/// Errors of the ZDS transport on either platform; each says which step failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Creating the socket or registering it with the runtime failed (Linux).
    #[error("creating a SEQPACKET socket: {0}")]
    Create(io::Error),
    /// Building the pipe's security descriptor failed (Windows).
    #[error("building the pipe security descriptor {sddl}: {source}")]
    Security {
        /// The SDDL.
        sddl: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// Connecting failed (no listener; on Windows also all instances busy, access denied).
    #[error("connecting to {path}: {source}")]
    Connect {
        /// The socket path or pipe name.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Binding or listening failed (on Windows, for the first instance: the name is taken).
    #[error("listening on {path}: {source}")]
    Listen {
        /// The socket path or pipe name.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Accepting a connection failed.
    #[error("accepting a connection: {0}")]
    Accept(io::Error),
    /// Sending failed.
    #[error("sending: {0}")]
    Send(io::Error),
    /// Only part of the message was sent.
    #[error("short send: {sent} of {len} bytes")]
    ShortSend {
        /// Bytes sent.
        sent: usize,
        /// Bytes requested.
        len: usize,
    },
    /// Receiving failed.
    #[error("receiving: {0}")]
    Recv(io::Error),
    /// The message did not fit the receive buffer: never cut silently. On Windows the
    /// connection is unusable afterwards ([`TransportError::Desynchronised`]).
    #[error("message truncated: larger than {0} bytes")]
    Truncated(usize),
    /// The ancillary data did not fit (`MSG_CTRUNC`); received descriptors were closed (Linux).
    #[error("control message truncated")]
    ControlTruncated,
    /// More than one descriptor came with a message; all of them were closed (Linux).
    #[error("{0} file descriptors in one message, at most one is allowed")]
    TooManyFds(usize),
    /// A message was truncated earlier on this connection (Windows: its remainder would read
    /// as another message).
    #[error("connection unusable after a truncated message")]
    Desynchronised,
}

impl TransportError {
    /// Whether the error means the peer is gone (the connection is over, not broken by
    /// what was said on it).
    pub fn is_disconnect(&self) -> bool {
        let io = match self {
            Self::Send(e) | Self::Recv(e) => e,
            _ => return false,
        };
        matches!(
            io.kind(),
            io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::NotConnected
                | io::ErrorKind::UnexpectedEof
        )
    }

    /// Whether the peer broke the transport's rules with one message (oversized, several
    /// descriptors) rather than the connection failing: the answer is a NACK, as ztunnel's.
    pub fn is_bad_message(&self) -> bool {
        matches!(
            self,
            Self::Truncated(_) | Self::ControlTruncated | Self::TooManyFds(_)
        )
    }
}

/// What rides beside a message where nothing can (a named pipe): a type without values, so
/// "a descriptor arrived" cannot even be written down there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoAttachment {}

#[cfg(test)]
mod tests {
    use std::io::{Error, ErrorKind};

    use super::TransportError as E;

    #[test]
    fn only_a_gone_peer_is_a_disconnect_and_only_rule_breaking_messages_are_bad() {
        let io = |k: ErrorKind| Error::from(k);
        // (error, is_disconnect, is_bad_message)
        let cases: Vec<(E, bool, bool)> = vec![
            (E::Send(io(ErrorKind::BrokenPipe)), true, false),
            (E::Recv(io(ErrorKind::ConnectionReset)), true, false),
            (E::Recv(io(ErrorKind::NotConnected)), true, false),
            (E::Recv(io(ErrorKind::UnexpectedEof)), true, false),
            (E::Recv(io(ErrorKind::PermissionDenied)), false, false),
            (E::Accept(io(ErrorKind::BrokenPipe)), false, false),
            (
                E::Connect {
                    path: "/x".into(),
                    source: io(ErrorKind::ConnectionReset),
                },
                false,
                false,
            ),
            (E::Truncated(1024), false, true),
            (E::ControlTruncated, false, true),
            (E::TooManyFds(2), false, true),
            (E::Desynchronised, false, false),
            (E::ShortSend { sent: 1, len: 2 }, false, false),
        ];
        for (e, disconnect, bad) in cases {
            assert_eq!(e.is_disconnect(), disconnect, "{e:?}");
            assert_eq!(e.is_bad_message(), bad, "{e:?}");
        }
    }
}

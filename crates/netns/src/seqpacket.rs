//! `AF_UNIX` `SOCK_SEQPACKET` sockets, the one transport of ZDS (the CNI agent ↔ ztunnel
//! protocol; its framing is `ambit_contract::zds`): one message per datagram, read into a
//! caller-sized buffer (a larger datagram is an error, never cut silently), and at most one
//! file descriptor (`SCM_RIGHTS`) riding along, received close-on-exec.
//!
//! tokio has no SEQPACKET type, so this wraps the raw socket in an [`AsyncFd`]. The raw
//! system calls live behind the crate's `imp` switch. [`SeqPacket::connect`] is the client
//! (ztunnel); [`SeqPacketListener`] is the server side (the agent, and tests).

use std::{
    io,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::Path,
};

use tokio::io::{Interest, unix::AsyncFd};

use crate::{imp, zds::TransportError};

fn register(fd: OwnedFd) -> Result<AsyncFd<OwnedFd>, TransportError> {
    register_async(fd).map_err(TransportError::Create)
}

/// Registers a descriptor with tokio's reactor, for readiness (the caller reads and writes
/// through whatever owns the same open file, e.g. the socket `fd` was duplicated from).
/// Must run inside a tokio runtime.
pub fn register_async(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is a valid open descriptor that stays open and unchanged until
    // the `AsyncFd` owning it drops it, which is what `register` requires.
    unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)
}

/// A connected SEQPACKET socket. Must be created and used inside a tokio runtime.
#[derive(Debug)]
pub struct SeqPacket {
    fd: AsyncFd<OwnedFd>,
}

impl SeqPacket {
    /// Connects to the listener at `path`. Unix-socket connects never block (a full
    /// backlog fails with `EAGAIN`; retry later).
    ///
    /// The socket is registered with the runtime only once connected: an unconnected
    /// SEQPACKET socket polls as hung up, and tokio keeps "closed" readiness sticky, so
    /// registering first could leave the connection looking closed forever (a busy loop of
    /// `EAGAIN` reads).
    pub async fn connect(path: &Path) -> Result<Self, TransportError> {
        let fd = imp::seqpacket_socket().map_err(TransportError::Create)?;
        imp::seqpacket_connect(fd.as_fd(), path).map_err(|source| TransportError::Connect {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self { fd: register(fd)? })
    }

    /// Sends one datagram without descriptors.
    pub async fn send(&self, data: &[u8]) -> Result<(), TransportError> {
        self.send_with_fds(data, &[]).await
    }

    /// Sends one datagram with `fds` attached as `SCM_RIGHTS` (the sender keeps its copies).
    pub async fn send_with_fds(
        &self,
        data: &[u8],
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), TransportError> {
        let sent = self
            .fd
            .async_io(Interest::WRITABLE, |sock| {
                imp::seqpacket_send(sock.as_fd(), data, fds)
            })
            .await
            .map_err(TransportError::Send)?;
        if sent != data.len() {
            return Err(TransportError::ShortSend {
                sent,
                len: data.len(),
            });
        }
        Ok(())
    }

    /// Receives one datagram into `buf`: its length (0 when the peer closed) and the one
    /// descriptor that came with it, if any. Truncated data or control messages and more
    /// than one descriptor are errors; any descriptors received with such a datagram are
    /// closed. Cancel-safe: nothing is consumed unless the future completes.
    pub async fn recv_with_fd(
        &self,
        buf: &mut [u8],
    ) -> Result<(usize, Option<OwnedFd>), TransportError> {
        let size = buf.len();
        let got = self
            .fd
            .async_io(Interest::READABLE, |sock| {
                imp::seqpacket_recv(sock.as_fd(), buf)
            })
            .await
            .map_err(TransportError::Recv)?;
        if got.truncated {
            return Err(TransportError::Truncated(size));
        }
        if got.control_truncated {
            return Err(TransportError::ControlTruncated);
        }
        let mut fds = got.fds;
        if fds.len() > 1 {
            return Err(TransportError::TooManyFds(fds.len()));
        }
        Ok((got.len, fds.pop()))
    }
}

/// A listening SEQPACKET socket (the ZDS server side).
#[derive(Debug)]
pub struct SeqPacketListener {
    fd: AsyncFd<OwnedFd>,
}

impl SeqPacketListener {
    /// Binds `path` and listens. A stale socket file at `path` is removed first. Must be
    /// called inside a tokio runtime.
    pub fn bind(path: &Path) -> Result<Self, TransportError> {
        let listen_err = |source| TransportError::Listen {
            path: path.to_owned(),
            source,
        };
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(listen_err(e)),
        }
        let fd = imp::seqpacket_socket().map_err(TransportError::Create)?;
        imp::seqpacket_listen(fd.as_fd(), path).map_err(listen_err)?;
        Ok(Self { fd: register(fd)? })
    }

    /// Waits for the next connection.
    pub async fn accept(&self) -> Result<SeqPacket, TransportError> {
        let fd = self
            .fd
            .async_io(Interest::READABLE, |sock| {
                imp::seqpacket_accept(sock.as_fd())
            })
            .await
            .map_err(TransportError::Accept)?;
        Ok(SeqPacket { fd: register(fd)? })
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test]
    async fn datagrams_fds_and_limits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("zds.sock");
        let listener = SeqPacketListener::bind(&path).unwrap();
        let (client, server) = tokio::join!(SeqPacket::connect(&path), listener.accept());
        let (client, server) = (client.unwrap(), server.unwrap());
        const SIZE: usize = 1024;
        let mut buf = [0u8; SIZE];

        // Boundaries are kept; no descriptor.
        client.send(&[8, 1]).await.unwrap();
        client.send(&[1, 2, 3]).await.unwrap();
        let (n, fd) = server.recv_with_fd(&mut buf).await.unwrap();
        assert_eq!((&buf[..n], fd.is_none()), (&[8u8, 1][..], true));
        let (n, _) = server.recv_with_fd(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], &[1, 2, 3]);

        // One descriptor arrives and refers to the same file.
        let file = std::fs::File::open("/proc/self/ns/net").unwrap();
        server.send_with_fds(b"x", &[file.as_fd()]).await.unwrap();
        let (n, fd) = client.recv_with_fd(&mut buf).await.unwrap();
        assert_eq!(n, 1);
        let fd = fd.unwrap();
        let same = |a: BorrowedFd<'_>, b: BorrowedFd<'_>| {
            let (a, b) = (
                nix::sys::stat::fstat(a).unwrap(),
                nix::sys::stat::fstat(b).unwrap(),
            );
            (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev)
        };
        assert!(same(fd.as_fd(), file.as_fd()));

        // Two descriptors: rejected.
        server
            .send_with_fds(b"y", &[file.as_fd(), file.as_fd()])
            .await
            .unwrap();
        let err = client.recv_with_fd(&mut buf).await.unwrap_err();
        assert!(matches!(err, TransportError::TooManyFds(2)), "{err}");

        // Oversized datagram: rejected, and the next one still reads fine.
        server.send(&[0u8; SIZE + 1]).await.unwrap();
        server.send(&[7]).await.unwrap();
        let err = client.recv_with_fd(&mut buf).await.unwrap_err();
        assert!(matches!(err, TransportError::Truncated(SIZE)), "{err}");
        let (n, _) = client.recv_with_fd(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], &[7]);

        // Peer closed: length 0.
        drop(server);
        let (n, fd) = client.recv_with_fd(&mut buf).await.unwrap();
        assert_eq!((n, fd.is_none()), (0, true));
    }

    #[tokio::test]
    async fn connect_to_nothing_fails() {
        let dir = tempfile::tempdir().unwrap();
        let err = SeqPacket::connect(&dir.path().join("absent.sock"))
            .await
            .unwrap_err();
        assert!(matches!(err, TransportError::Connect { .. }), "{err}");
    }
}

//! The ZDS transport: an `AF_UNIX` `SOCK_SEQPACKET` listener and connections driven by
//! tokio's [`AsyncFd`], one protobuf message per datagram, the pod netns fd as a single
//! `SCM_RIGHTS` descriptor (`spec/cni.md` §4.1).
//!
//! tokio has no SEQPACKET type, so this module owns the few raw system calls (through
//! `nix`). Everything above it sees whole messages.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::cmsg_space;
use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    UnixAddr, accept4, bind, listen, recvmsg, sendmsg, socket,
};
use tokio::io::unix::AsyncFd;

/// Both peers read into buffers of this size and reject truncation, so every message we
/// send must be strictly smaller.
pub const MAX_MESSAGE: usize = 1024;

/// A listening SEQPACKET socket.
#[derive(Debug)]
pub struct SeqpacketListener {
    fd: AsyncFd<OwnedFd>,
}

impl SeqpacketListener {
    /// Binds `path` (a stale socket file is removed first, as upstream does) and listens.
    /// Must be called inside a tokio runtime.
    pub fn bind(path: &Path) -> io::Result<Self> {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        let addr = UnixAddr::new(path)?;
        bind(fd.as_raw_fd(), &addr)?;
        listen(&fd, Backlog::new(16).map_err(io::Error::from)?)?;
        Ok(Self { fd: register(fd)? })
    }

    /// Waits for the next connection.
    pub async fn accept(&self) -> io::Result<SeqpacketConn> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| {
                accept4(
                    fd.as_raw_fd(),
                    SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                )
                .map_err(io::Error::from)
            }) {
                Ok(Ok(raw)) => {
                    // SAFETY: accept4 just returned this descriptor to us; nothing else owns it.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    return SeqpacketConn::new(owned);
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}

/// One received datagram.
#[derive(Debug)]
pub struct Received {
    /// The payload (empty with `eof` set when the peer closed).
    pub data: Vec<u8>,
    /// Descriptors that came with it (ZDS peers never send any; reported so the caller can
    /// treat them as a protocol error).
    pub fds: Vec<OwnedFd>,
    /// The peer closed the connection.
    pub eof: bool,
}

/// A connected SEQPACKET socket.
#[derive(Debug)]
pub struct SeqpacketConn {
    fd: AsyncFd<OwnedFd>,
}

impl SeqpacketConn {
    fn new(fd: OwnedFd) -> io::Result<Self> {
        Ok(Self { fd: register(fd)? })
    }

    /// Sends one datagram, with `fd` attached as the only `SCM_RIGHTS` descriptor.
    pub async fn send(&self, data: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        if data.len() >= MAX_MESSAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "message of {} bytes does not fit the peer's buffer",
                    data.len()
                ),
            ));
        }
        let raw: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
        loop {
            let mut guard = self.fd.writable().await?;
            let res = guard.try_io(|sock| {
                let iov = [IoSlice::new(data)];
                let cmsg: Vec<ControlMessage<'_>> = if raw.is_empty() {
                    Vec::new()
                } else {
                    vec![ControlMessage::ScmRights(&raw)]
                };
                sendmsg::<UnixAddr>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)
                    .map_err(io::Error::from)
            });
            match res {
                Ok(Ok(n)) if n == data.len() => return Ok(()),
                Ok(Ok(n)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("short datagram write: {n} of {} bytes", data.len()),
                    ));
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Receives one datagram into a [`MAX_MESSAGE`] buffer; truncated data or control
    /// messages are an error (a peer speaking another protocol).
    pub async fn recv(&self) -> io::Result<Received> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|sock| recv_now(sock.as_fd())) {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    /// Waits for readiness and tries one receive: `None` when the readiness was stale
    /// (nothing to read after all). Cancel-safe, for use in `select!`.
    pub async fn recv_if_ready(&self) -> io::Result<Option<Received>> {
        let mut guard = self.fd.readable().await?;
        match guard.try_io(|sock| recv_now(sock.as_fd())) {
            Ok(r) => r.map(Some),
            Err(_would_block) => Ok(None),
        }
    }
}

fn recv_now(sock: BorrowedFd<'_>) -> io::Result<Received> {
    let mut buf = [0u8; MAX_MESSAGE];
    let mut cmsg = cmsg_space!([RawFd; 1]);
    let (len, flags, fds) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<UnixAddr>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(io::Error::from)?;
        let mut fds = Vec::new();
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(received) = c {
                    for raw in received {
                        // SAFETY: the kernel installed these descriptors in our table for
                        // this message; we are their only owner.
                        fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
                    }
                }
            }
        }
        (msg.bytes, msg.flags, fds)
    };
    if flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "datagram or its control data was truncated",
        ));
    }
    Ok(Received {
        data: buf[..len].to_vec(),
        fds,
        eof: len == 0,
    })
}

/// Whether an error means the peer is gone (the connection must be dropped).
pub fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error().map(Errno::from_raw),
        Some(Errno::EPIPE | Errno::ECONNRESET | Errno::ENOTCONN)
    ) || e.kind() == io::ErrorKind::UnexpectedEof
}

fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is a valid open descriptor that stays open and unchanged until
    // the `AsyncFd` that owns it drops it.
    unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)
}

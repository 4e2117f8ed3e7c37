//! Stub behind the crate's `imp` switch for platforms without network namespaces: every
//! namespace operation reports [`NetnsError::Unsupported`]; plain sockets still work.

use std::{
    os::fd::{BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    process::Command,
};

use socket2::Socket;

use crate::{
    NetnsError, NetnsId,
    socket::{SocketError, SocketOptions},
};

/// What a socket handle is here: a descriptor.
pub(crate) use std::os::fd::AsFd as AsSocket;

pub(crate) fn current_thread_path() -> PathBuf {
    PathBuf::from("/proc/thread-self/ns/net")
}

pub(crate) fn open(_path: &Path) -> Result<OwnedFd, NetnsError> {
    Err(NetnsError::Unsupported)
}

pub(crate) fn inspect(_fd: BorrowedFd<'_>, _what: &str) -> Result<NetnsId, NetnsError> {
    Err(NetnsError::Unsupported)
}

pub(crate) fn enter(_fd: BorrowedFd<'_>, _target: NetnsId) -> Result<(), NetnsError> {
    Err(NetnsError::Unsupported)
}

pub(crate) fn create_anonymous() -> Result<OwnedFd, NetnsError> {
    Err(NetnsError::Unsupported)
}

pub(crate) fn set_pre_exec(_cmd: &mut Command, _fd: OwnedFd) -> Result<(), NetnsError> {
    Err(NetnsError::Unsupported)
}

pub(crate) fn set_sequential_port_search(_sock: &Socket) -> std::io::Result<bool> {
    Ok(false)
}

pub(crate) fn set_bind_address_no_port(_sock: &Socket) -> std::io::Result<()> {
    Ok(())
}

pub(crate) fn apply_options(
    _sock: &Socket,
    _ipv6: bool,
    opts: &SocketOptions,
    mark: Option<u32>,
) -> Result<(), SocketError> {
    crate::socket::refuse_linux_options(opts, mark)
}

pub(crate) fn original_dst(_sock: &socket2::SockRef<'_>) -> std::io::Result<std::net::SocketAddr> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

pub(crate) fn is_transparent(_sock: &socket2::SockRef<'_>, _ipv6: bool) -> std::io::Result<bool> {
    Ok(false)
}

fn seqpacket_unsupported<T>() -> std::io::Result<T> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

pub(crate) fn seqpacket_socket() -> std::io::Result<OwnedFd> {
    seqpacket_unsupported()
}

pub(crate) fn seqpacket_connect(_fd: BorrowedFd<'_>, _path: &Path) -> std::io::Result<()> {
    seqpacket_unsupported()
}

pub(crate) fn seqpacket_listen(_fd: BorrowedFd<'_>, _path: &Path) -> std::io::Result<()> {
    seqpacket_unsupported()
}

pub(crate) fn seqpacket_accept(_fd: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    seqpacket_unsupported()
}

pub(crate) fn seqpacket_send(
    _fd: BorrowedFd<'_>,
    _data: &[u8],
    _fds: &[BorrowedFd<'_>],
) -> std::io::Result<usize> {
    seqpacket_unsupported()
}

/// See the Linux twin.
#[derive(Debug)]
pub(crate) struct SeqpacketRecv {
    pub(crate) len: usize,
    pub(crate) fds: Vec<OwnedFd>,
    pub(crate) truncated: bool,
    pub(crate) control_truncated: bool,
}

pub(crate) fn seqpacket_recv(
    _fd: BorrowedFd<'_>,
    _buf: &mut [u8],
) -> std::io::Result<SeqpacketRecv> {
    seqpacket_unsupported()
}

pub(crate) fn set_pdeathsig(_cmd: &mut Command) {}

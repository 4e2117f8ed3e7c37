//! Linux system calls behind the crate's `imp` switch: opening and validating nsfs
//! descriptors, `setns(2)`, `unshare(2)`, the `pre_exec` hook and Linux-only socket options.

use std::{
    fs::File,
    io,
    os::{
        fd::{AsRawFd, BorrowedFd, OwnedFd},
        unix::process::CommandExt,
    },
    path::{Path, PathBuf},
    process::Command,
};

use nix::{
    errno::Errno,
    sched::CloneFlags,
    sys::{stat::fstat, statfs},
};
use socket2::Socket;

use crate::{
    NetnsError, NetnsId,
    socket::{SocketError, SocketOptions, Transparent},
};

/// What a socket handle is here: a descriptor.
pub(crate) use std::os::fd::AsFd as AsSocket;

// NS_GET_NSTYPE = _IO(0xb7, 0x3) from <linux/nsfs.h>; the libc crate does not export it.
nix::ioctl_none!(ns_get_nstype, 0xb7, 0x3);

/// The calling thread's own namespace. `/proc/self/ns/net` would name the thread-group
/// leader's namespace, which differs from ours after a `setns` on this thread.
pub(crate) fn current_thread_path() -> PathBuf {
    PathBuf::from(format!("/proc/self/task/{}/ns/net", nix::unistd::gettid()))
}

pub(crate) fn open(path: &Path) -> Result<OwnedFd, NetnsError> {
    // std opens with O_CLOEXEC, so namespace descriptors never leak into children.
    File::open(path)
        .map(OwnedFd::from)
        .map_err(|source| NetnsError::Open {
            path: path.to_owned(),
            source,
        })
}

/// Checks that `fd` is a network namespace and returns its identity.
pub(crate) fn inspect(fd: BorrowedFd<'_>, what: &str) -> Result<NetnsId, NetnsError> {
    let inspect_err = |e: Errno| NetnsError::Inspect {
        what: what.to_owned(),
        source: e.into(),
    };
    // SAFETY: NS_GET_NSTYPE takes no argument and only inspects the descriptor, which is
    // valid for the duration of the call because we hold a BorrowedFd.
    let is_net = match unsafe { ns_get_nstype(fd.as_raw_fd()) } {
        Ok(nstype) => nstype == libc::CLONE_NEWNET,
        // ENOTTY: not an nsfs file, or a kernel before 4.11 without the ioctl. Fall back to
        // the filesystem magic, which at least proves it is *a* namespace; setns with
        // CLONE_NEWNET still rejects a namespace of another type later.
        Err(Errno::ENOTTY) | Err(Errno::EINVAL) => {
            let fs = statfs::fstatfs(fd).map_err(inspect_err)?;
            fs.filesystem_type() == statfs::NSFS_MAGIC
        }
        Err(e) => return Err(inspect_err(e)),
    };
    if !is_net {
        return Err(NetnsError::NotNetns {
            what: what.to_owned(),
        });
    }
    let st = fstat(fd).map_err(inspect_err)?;
    // The casts only widen: st_ino and st_dev are u64 on every Linux target we build for,
    // narrower on none.
    #[allow(clippy::unnecessary_cast)]
    Ok(NetnsId {
        ino: st.st_ino as u64,
        dev: st.st_dev as u64,
    })
}

/// Moves the calling thread into the namespace behind `fd`.
pub(crate) fn enter(fd: BorrowedFd<'_>, target: NetnsId) -> Result<(), NetnsError> {
    nix::sched::setns(fd, CloneFlags::CLONE_NEWNET).map_err(|e| NetnsError::Enter {
        target,
        source: e.into(),
    })
}

/// Creates a new, unnamed network namespace and returns a descriptor to it.
///
/// `unshare(CLONE_NEWNET)` only affects the calling thread, so it runs on a throwaway
/// thread; the namespace then lives exactly as long as the returned descriptor.
pub(crate) fn create_anonymous() -> Result<OwnedFd, NetnsError> {
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new()
            .name("netns-create".into())
            .spawn_scoped(s, || {
                nix::sched::unshare(CloneFlags::CLONE_NEWNET)
                    .map_err(|e| NetnsError::Create(e.into()))?;
                open(&current_thread_path())
            })
            .map_err(NetnsError::Spawn)?;
        handle
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Makes `cmd` call `setns` into `fd` in the child, between fork and exec.
pub(crate) fn set_pre_exec(cmd: &mut Command, fd: OwnedFd) -> Result<(), NetnsError> {
    // SAFETY: the hook runs in the forked child before exec. It only calls setns(2), which
    // is async-signal-safe, and builds an io::Error from a raw errno, which does not
    // allocate. The closure owns `fd`, so the descriptor is open in the child.
    unsafe {
        cmd.pre_exec(move || {
            nix::sched::setns(&fd, CloneFlags::CLONE_NEWNET)
                .map_err(|e| io::Error::from_raw_os_error(e as i32))
        });
    }
    Ok(())
}

/// Makes `cmd`'s child ask for SIGKILL on its parent's death, between fork and exec.
pub(crate) fn set_pdeathsig(cmd: &mut Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: the hook runs in the forked child before exec. prctl(2) and getppid(2) are
    // async-signal-safe, and building an io::Error from an errno does not allocate.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
            // The parent died between fork and prctl: the signal will never come.
            if nix::unistd::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Applies the options that only Linux has (or that we only support on Linux).
pub(crate) fn apply_options(
    sock: &Socket,
    ipv6: bool,
    opts: &SocketOptions,
    mark: Option<u32>,
) -> Result<(), SocketError> {
    let opt_err = |option: &'static str| move |source| SocketError::Option { option, source };
    if let Some(mark) = mark {
        sock.set_mark(mark).map_err(opt_err("SO_MARK"))?;
    }
    if opts.reuse_port {
        sock.set_reuse_port(true).map_err(opt_err("SO_REUSEPORT"))?;
    }
    if opts.transparent != Transparent::Off {
        // On an AF_INET6 socket IPV6_TRANSPARENT sets the same flag that also covers
        // IPv4-mapped traffic, so one option per family is enough.
        let res = if ipv6 {
            sock.set_ip_transparent_v6(true)
        } else {
            sock.set_ip_transparent_v4(true)
        };
        match (res, opts.transparent) {
            (Ok(()), _) => {}
            // Best effort: without CAP_NET_ADMIN the socket still works, only the
            // source-address spoofing it would allow is lost; the caller asked us to go on.
            (Err(_), Transparent::BestEffort) => {}
            (Err(source), _) => {
                return Err(SocketError::Option {
                    option: "IP_TRANSPARENT",
                    source,
                });
            }
        }
    }
    if opts.freebind {
        let res = if ipv6 {
            sock.set_freebind_v6(true)
        } else {
            sock.set_freebind_v4(true)
        };
        res.map_err(opt_err("IP_FREEBIND"))?;
    }
    Ok(())
}

/// `SO_ORIGINAL_DST` / `IP6T_SO_ORIGINAL_DST`: where a REDIRECTed connection was headed.
/// IPv4 first: on a dual-stack listener an IPv4 connection is tracked by the IPv4 conntrack.
/// `IP_BIND_ADDRESS_NO_PORT`: a socket bound to an address with port 0 gets its port at
/// `connect(2)`, where the kernel only needs the 4-tuple to be unique. Bound at `bind(2)`
/// (the default), the port must be free for every destination, so a proxy that binds
/// connections to clients' addresses runs out of ports under a high connection rate.
pub(crate) fn set_bind_address_no_port(sock: &Socket) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: a valid open socket fd and a pointer to a c_int of the given size.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(sock),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            std::ptr::from_ref(&one).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `IP_LOCAL_PORT_RANGE` (Linux 6.3; not in `libc` yet): a per-socket ephemeral port range.
const IP_LOCAL_PORT_RANGE: libc::c_int = 51;

/// Sets a per-socket port range that does not narrow the namespace's (low 0, high 65535:
/// the kernel keeps each bound that lies outside the namespace's range). A socket with a
/// range of its own is given its port at `connect(2)` by a search from where the last one
/// to the same destination ended, over both port parities. Without one the kernel first
/// searches only the even ports (the odd ones are `bind(2)`'s), so once TIME-WAIT sockets
/// to one destination hold every even port (~14,000 in a pod's default range 32768–60999,
/// i.e. above ~235 connections/s from one client address to one app port) each connect
/// walks all of them before it tries an odd one: milliseconds of CPU per connection
/// (BENCHMARKS.md, "Kernel-default pod sysctls"). `Ok(false)` on a kernel without the
/// option, which then searches as before.
pub(crate) fn set_sequential_port_search(sock: &Socket) -> io::Result<bool> {
    let range: u32 = 0xffff << 16;
    // SAFETY: a valid open socket fd and a pointer to a u32 of the given size.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(sock),
            libc::IPPROTO_IP,
            IP_LOCAL_PORT_RANGE,
            std::ptr::from_ref(&range).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENOPROTOOPT) {
        Ok(false)
    } else {
        Err(e)
    }
}

pub(crate) fn original_dst(sock: &socket2::SockRef<'_>) -> io::Result<std::net::SocketAddr> {
    let v4 = sock.original_dst_v4();
    let addr = match v4 {
        Ok(a) => a,
        Err(_) => sock.original_dst_v6()?,
    };
    addr.as_socket()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "original dst is not IP"))
}

/// Whether IP_TRANSPARENT (or its IPv6 twin) is set on the socket.
pub(crate) fn is_transparent(sock: &socket2::SockRef<'_>, ipv6: bool) -> io::Result<bool> {
    if ipv6 {
        sock.ip_transparent_v6()
    } else {
        sock.ip_transparent_v4()
    }
}

// ---- AF_UNIX SOCK_SEQPACKET (seqpacket.rs) ---------------------------------------------

/// A non-blocking, close-on-exec `AF_UNIX` `SOCK_SEQPACKET` socket.
pub(crate) fn seqpacket_socket() -> io::Result<OwnedFd> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)
}

/// Connects `fd` to `path`. A Unix-socket connect completes (or fails) at once, even on a
/// non-blocking socket: a full listen backlog is `EAGAIN`, never `EINPROGRESS`.
pub(crate) fn seqpacket_connect(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    use nix::sys::socket::{UnixAddr, connect};
    let addr = UnixAddr::new(path)?;
    connect(fd.as_raw_fd(), &addr)?;
    Ok(())
}

/// Binds `fd` to `path` and listens.
pub(crate) fn seqpacket_listen(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    use nix::sys::socket::{Backlog, UnixAddr, bind, listen};
    let addr = UnixAddr::new(path)?;
    bind(fd.as_raw_fd(), &addr)?;
    listen(&fd, Backlog::new(16).map_err(io::Error::from)?)?;
    Ok(())
}

/// Accepts one connection (non-blocking, close-on-exec).
pub(crate) fn seqpacket_accept(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    use nix::sys::socket::{SockFlag, accept4};
    use std::os::fd::FromRawFd;
    let raw = accept4(
        fd.as_raw_fd(),
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
    )?;
    // SAFETY: accept4 just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Sends one datagram with `fds` as `SCM_RIGHTS` (none when empty). Returns bytes sent.
pub(crate) fn seqpacket_send(
    fd: BorrowedFd<'_>,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    use nix::sys::socket::{ControlMessage, MsgFlags, UnixAddr, sendmsg};
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let iov = [io::IoSlice::new(data)];
    let cmsg: Vec<ControlMessage<'_>> = if raw.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(&raw)]
    };
    sendmsg::<UnixAddr>(fd.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)
        .map_err(io::Error::from)
}

/// One `recvmsg` result; the caller decides what truncation and extra descriptors mean.
#[derive(Debug)]
pub(crate) struct SeqpacketRecv {
    pub(crate) len: usize,
    /// Every descriptor the kernel installed (closed on drop).
    pub(crate) fds: Vec<OwnedFd>,
    pub(crate) truncated: bool,
    pub(crate) control_truncated: bool,
}

/// Receives one datagram into `buf`, with room for a few descriptors so that a peer
/// sending more than one is detected (and all of them closed) rather than silently cut.
pub(crate) fn seqpacket_recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<SeqpacketRecv> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, UnixAddr, recvmsg};
    use std::os::fd::{FromRawFd, RawFd};
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = recvmsg::<UnixAddr>(
        fd.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::ScmRights(received) = c {
                for raw in received {
                    // SAFETY: the kernel installed these descriptors in our table for this
                    // message; we are their only owner.
                    fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
                }
            }
        }
    }
    Ok(SeqpacketRecv {
        len: msg.bytes,
        fds,
        truncated: msg.flags.contains(MsgFlags::MSG_TRUNC),
        control_truncated: msg.flags.contains(MsgFlags::MSG_CTRUNC),
    })
}

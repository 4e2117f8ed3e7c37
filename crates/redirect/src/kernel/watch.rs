//! Notifications of nf_tables ruleset changes in one network namespace.
//!
//! Every nf_tables commit (iptables-nft, `nft`, or anything else speaking nfnetlink)
//! multicasts the objects it added or removed to `NFNLGRP_NFTABLES` listeners of the
//! namespace it ran in. A [`RulesetWatch`] is a non-blocking `NETLINK_NETFILTER` socket
//! created inside a pod's namespace and joined to that group; it tells its owner *that*
//! something changed, never *what*: the owner re-verifies the pod's rules against the plan
//! (the notification content is not trusted, and not parsed).
//!
//! iptables-legacy tables are not nf_tables objects and send no notification: there the
//! periodic verification pass is the only detector.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use ambit_netns::{NetnsFd, in_netns};
use netlink_sys::Socket;
use netlink_sys::protocols::NETLINK_NETFILTER;

use super::KernelError;

/// `ENOBUFS` on Linux: the socket's queue overflowed (reported once, then cleared).
const ENOBUFS: i32 = 105;

/// `NFNLGRP_NFTABLES` (`linux/netfilter/nfnetlink.h`).
const NFNLGRP_NFTABLES: u32 = 7;

/// Receive buffer asked of the kernel for queued notifications. A pod's whole ruleset
/// flushed is a few dozen messages of a few hundred bytes; past this the kernel drops
/// notifications and reports `ENOBUFS`, which [`Drained::lost`] passes on.
const RCVBUF: usize = 256 * 1024;

/// One datagram; nf_tables notifications are far smaller than a page each, and netlink
/// never splits a message across datagrams (a longer one is truncated, which only costs
/// us its content: we do not read it).
const DATAGRAM: usize = 16 * 1024;

/// What one [`RulesetWatch::drain`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Drained {
    /// Datagrams read (each holds one or more notifications).
    pub datagrams: usize,
    /// The kernel dropped notifications (`ENOBUFS`): something changed that was not seen.
    pub lost: bool,
    /// The bound was reached with datagrams still queued.
    pub more: bool,
}

impl Drained {
    /// Whether the ruleset may have changed since the last drain.
    pub fn changed(&self) -> bool {
        self.datagrams > 0 || self.lost
    }
}

/// A subscription to one namespace's nf_tables changes (see the module docs).
#[derive(Debug)]
pub struct RulesetWatch {
    sock: Socket,
    buf: Vec<u8>,
}

impl RulesetWatch {
    /// Opens the socket inside `netns` (the socket stays in that namespace whichever thread
    /// reads it later) and joins the nf_tables group. Non-blocking.
    pub fn open(netns: &NetnsFd) -> Result<Self, KernelError> {
        let io = |what| move |source| KernelError::Io { what, source };
        let mut sock = in_netns(netns, || Socket::new(NETLINK_NETFILTER))?.map_err(io("socket"))?;
        sock.bind_auto().map_err(io("bind"))?;
        sock.add_membership(NFNLGRP_NFTABLES)
            .map_err(io("NETLINK_ADD_MEMBERSHIP"))?;
        // A larger queue makes a lost notification rarer; the kernel caps it at rmem_max,
        // and a smaller one still works (loss is reported).
        let _ = socket2::SockRef::from(&sock).set_recv_buffer_size(RCVBUF);
        sock.set_non_blocking(true).map_err(io("O_NONBLOCK"))?;
        Ok(Self {
            sock,
            buf: Vec::with_capacity(DATAGRAM),
        })
    }

    /// Reads and discards at most `max` queued datagrams without blocking. An error other
    /// than "nothing queued" or `ENOBUFS` is returned (the caller treats the pod as changed
    /// and falls back to the periodic pass for it).
    pub fn drain(&mut self, max: usize) -> Result<Drained, KernelError> {
        let mut out = Drained::default();
        for _ in 0..max {
            self.buf.clear();
            match self.sock.recv(&mut self.buf, 0) {
                Ok(_) => out.datagrams += 1,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(out),
                Err(e) if e.raw_os_error() == Some(ENOBUFS) => out.lost = true,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(KernelError::Io {
                        what: "recv",
                        source,
                    });
                }
            }
        }
        out.more = true;
        Ok(out)
    }
}

impl AsFd for RulesetWatch {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl AsRawFd for RulesetWatch {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

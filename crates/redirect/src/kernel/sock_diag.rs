//! The TCP sockets of the calling thread's namespace and their socket marks (`sock_diag`,
//! `NETLINK_SOCK_DIAG`), so the conntrack cleanup can tell ztunnel's own flows (its sockets
//! carry [`ambit_contract::marks::INPOD_MARK`]) from the app's: conntrack does not record
//! socket marks. And the listening TCP ports, for the agent's check that ztunnel listens in
//! a pod: a dump of listeners only walks the kernel's listening hash, where reading
//! `/proc/net/tcp` in a namespace walks every bucket of the host-wide established hash (a
//! cost that grows with the host, paid per pod per pass).
//!
//! A dump of listeners still visits every bucket of that hash, which is host-wide (every
//! namespace's listeners, ~3 per enrolled pod): at 1,000 pods it was a fifth of the
//! agent's samples. [`tcp_listener_at`] asks for one port at one address instead, and the
//! kernel answers with the same listener lookup an arriving SYN gets (one hash bucket).
//!
//! The request and reply are fixed C structs (`struct inet_diag_req_v2`,
//! `struct inet_diag_msg` in `linux/inet_diag.h`) followed, in the reply, by attributes; the
//! kernel adds `INET_DIAG_MARK` for a caller with `CAP_NET_ADMIN` in the namespace. No crate
//! of the rust-netlink family the workspace uses encodes `sock_diag`, so the two structs are
//! written here (about forty lines), on top of the same bounded [`Netlink`] dump.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{NetlinkDeserializable, NetlinkHeader, NetlinkSerializable};
use netlink_sys::protocols::NETLINK_SOCK_DIAG;

use super::KernelError;
use super::socket::Netlink;

/// `SOCK_DIAG_BY_FAMILY`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `AF_INET`, `AF_INET6`, `IPPROTO_TCP`.
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const IPPROTO_TCP: u8 = 6;
/// Every TCP state but `TCP_LISTEN` (10): a listener is no flow.
const FLOWS: u32 = 0xfff & !LISTEN;
/// `TCP_LISTEN` alone.
const LISTEN: u32 = 1 << 10;
/// `INET_DIAG_MARK`.
const INET_DIAG_MARK: u16 = 15;
/// `sizeof(struct inet_diag_req_v2)`, `sizeof(struct inet_diag_msg)`.
const REQ_LEN: usize = 56;
const MSG_LEN: usize = 72;
/// Sockets one namespace's dump may hold (as many as conntrack entries the cleanup reads;
/// listeners: one per port, and then some for `SO_REUSEPORT` groups).
const MAX_SOCKETS: usize = 1 << 16;

/// One TCP socket: its local and remote ends and its mark (`None`: not reported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TcpSocket {
    pub(crate) local: (IpAddr, u16),
    pub(crate) remote: (IpAddr, u16),
    pub(crate) mark: Option<u32>,
}

/// One `sock_diag` message: the request (`struct inet_diag_req_v2` for the TCP sockets of
/// one family in the `states` bitmap) or a decoded reply (`struct inet_diag_msg` and its
/// mark attribute).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Diag {
    Request {
        family: u8,
        states: u32,
    },
    /// The socket a connection to `addr:port` would reach (`inet_diag_find_one_icsk`).
    Lookup {
        addr: IpAddr,
        port: u16,
    },
    Reply(Option<TcpSocket>),
}

impl NetlinkSerializable for Diag {
    fn message_type(&self) -> u16 {
        SOCK_DIAG_BY_FAMILY
    }
    fn buffer_len(&self) -> usize {
        match self {
            Self::Request { .. } | Self::Lookup { .. } => REQ_LEN,
            Self::Reply(_) => 0,
        }
    }
    fn serialize(&self, buf: &mut [u8]) {
        match self {
            Self::Request { family, states } => {
                buf.fill(0);
                buf[0] = *family;
                buf[1] = IPPROTO_TCP;
                buf[4..8].copy_from_slice(&states.to_ne_bytes());
            }
            Self::Lookup { addr, port } => {
                buf.fill(0);
                buf[1] = IPPROTO_TCP;
                buf[4..8].copy_from_slice(&LISTEN.to_ne_bytes());
                // sockid: sport (the listener's port), dport 0, src (its address), dst
                // any, no interface, no cookie (INET_DIAG_NOCOOKIE twice).
                buf[8..10].copy_from_slice(&port.to_be_bytes());
                match addr {
                    IpAddr::V4(a) => {
                        buf[0] = AF_INET;
                        buf[12..16].copy_from_slice(&a.octets());
                    }
                    IpAddr::V6(a) => {
                        buf[0] = AF_INET6;
                        buf[12..28].copy_from_slice(&a.octets());
                    }
                }
                buf[48..56].fill(0xff);
            }
            Self::Reply(_) => {}
        }
    }
}

/// A reply that does not parse as `struct inet_diag_msg`.
#[derive(Debug, thiserror::Error)]
#[error("sock_diag reply of {0} bytes is not an inet_diag_msg")]
pub(crate) struct Malformed(usize);

fn address(family: u8, b: &[u8]) -> Option<IpAddr> {
    match family {
        AF_INET => Some(IpAddr::V4(Ipv4Addr::from(
            <[u8; 4]>::try_from(&b[..4]).ok()?,
        ))),
        AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?))),
        _ => None,
    }
}

impl NetlinkDeserializable for Diag {
    type Error = Malformed;
    fn deserialize(header: &NetlinkHeader, p: &[u8]) -> Result<Self, Malformed> {
        if header.message_type != SOCK_DIAG_BY_FAMILY {
            return Ok(Diag::Reply(None));
        }
        if p.len() < MSG_LEN {
            return Err(Malformed(p.len()));
        }
        // family, state, timer, retrans; then sockid: sport, dport (big-endian), src, dst.
        let family = p[0];
        let port = |at: usize| u16::from_be_bytes([p[at], p[at + 1]]);
        let (Some(src), Some(dst)) = (address(family, &p[8..24]), address(family, &p[24..40]))
        else {
            return Ok(Diag::Reply(None));
        };
        let mut mark = None;
        let mut at = MSG_LEN;
        while at + 4 <= p.len() {
            let len = usize::from(u16::from_ne_bytes([p[at], p[at + 1]]));
            let kind = u16::from_ne_bytes([p[at + 2], p[at + 3]]) & 0x3fff;
            if len < 4 || at + len > p.len() {
                return Err(Malformed(p.len()));
            }
            if kind == INET_DIAG_MARK && len >= 8 {
                mark = Some(u32::from_ne_bytes([
                    p[at + 4],
                    p[at + 5],
                    p[at + 6],
                    p[at + 7],
                ]));
            }
            at += len.next_multiple_of(4);
        }
        Ok(Diag::Reply(Some(TcpSocket {
            local: (src.to_canonical(), port(4)),
            remote: (dst.to_canonical(), port(6)),
            mark,
        })))
    }
}

/// Every TCP socket (both families, listeners left out) of the calling thread's namespace.
pub(crate) fn tcp_sockets() -> Result<Vec<TcpSocket>, KernelError> {
    dump(FLOWS, "sock_diag dump")
}

/// The local ports of the listening TCP sockets (both families) of the calling thread's
/// namespace.
pub fn listening_tcp_ports() -> Result<HashSet<u16>, KernelError> {
    Ok(dump(LISTEN, "sock_diag listener dump")?
        .into_iter()
        .map(|s| s.local.1)
        .collect())
}

/// `-ENOENT`, as netlink reports it: no socket matches a lookup.
const ENOENT: i32 = -2;

/// Whether, for each of `ports`, a TCP listener of the calling thread's namespace takes
/// connections to that port at one of `addrs` (tried in order; the first that answers
/// wins): the kernel's own lookup, one request per address tried, where a dump walks the
/// host's whole listening hash (module docs). A wildcard listener answers for every
/// address of its family (a dual-stack `[::]` one for IPv4 too), so `127.0.0.1` first
/// settles most ports at once.
pub fn tcp_listeners_at(ports: &[u16], addrs: &[IpAddr]) -> Result<bool, KernelError> {
    let mut nl = Netlink::open(NETLINK_SOCK_DIAG)?;
    for &port in ports {
        let mut found = false;
        for &addr in addrs {
            if tcp_listener_at(&mut nl, addr, port)? {
                found = true;
                break;
            }
        }
        if !found {
            return Ok(false);
        }
    }
    Ok(true)
}

/// One lookup of [`tcp_listeners_at`]: only a listener (no peer port) on `port` counts.
fn tcp_listener_at(nl: &mut Netlink, addr: IpAddr, port: u16) -> Result<bool, KernelError> {
    match nl.get("sock_diag listener lookup", Diag::Lookup { addr, port }) {
        Ok(replies) => Ok(replies
            .iter()
            .any(|r| matches!(r, Diag::Reply(Some(s)) if s.local.1 == port && s.remote.1 == 0))),
        Err(KernelError::Refused { code: ENOENT, .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

fn dump(states: u32, what: &'static str) -> Result<Vec<TcpSocket>, KernelError> {
    let mut nl = Netlink::open(NETLINK_SOCK_DIAG)?;
    let mut out = Vec::new();
    for family in [AF_INET, AF_INET6] {
        let replies = nl.dump_max(what, Diag::Request { family, states }, MAX_SOCKETS)?;
        out.extend(replies.into_iter().filter_map(|m| match m {
            Diag::Reply(s) => s,
            Diag::Request { .. } | Diag::Lookup { .. } => None,
        }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(family: u8, attrs: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; MSG_LEN];
        p[0] = family;
        p[4..6].copy_from_slice(&40000u16.to_be_bytes());
        p[6..8].copy_from_slice(&8443u16.to_be_bytes());
        p[8..12].copy_from_slice(&[10, 0, 0, 5]);
        p[24..28].copy_from_slice(&[10, 0, 1, 9]);
        p.extend_from_slice(attrs);
        p
    }

    fn header() -> NetlinkHeader {
        let mut h = NetlinkHeader::default();
        h.message_type = SOCK_DIAG_BY_FAMILY;
        h
    }

    #[test]
    fn decodes_ends_and_mark_and_refuses_short_or_overlong() {
        let mark = [8, 0, 15, 0, 0x39, 0x05, 0, 0];
        let got = Diag::deserialize(&header(), &reply(AF_INET, &mark)).unwrap();
        assert_eq!(
            got,
            Diag::Reply(Some(TcpSocket {
                local: ("10.0.0.5".parse().unwrap(), 40000),
                remote: ("10.0.1.9".parse().unwrap(), 8443),
                mark: Some(u32::from_ne_bytes([0x39, 0x05, 0, 0])),
            }))
        );
        let unmarked = Diag::deserialize(&header(), &reply(AF_INET, &[])).unwrap();
        assert!(matches!(
            unmarked,
            Diag::Reply(Some(TcpSocket { mark: None, .. }))
        ));
        assert!(Diag::deserialize(&header(), &[0; 10]).is_err());
        // An attribute claiming more than the message holds.
        assert!(
            Diag::deserialize(&header(), &reply(AF_INET, &[40, 0, 15, 0, 0, 0, 0, 0])).is_err()
        );
        // An unknown family is skipped, not an error.
        assert_eq!(
            Diag::deserialize(&header(), &reply(1, &[])).unwrap(),
            Diag::Reply(None)
        );
    }
}

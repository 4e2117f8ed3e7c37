//! The conntrack entries of a pod's namespace that bypassed the in-pod rules (ctnetlink).
//!
//! nat is consulted only for a connection's first packet: an entry made while the pod's
//! rules were missing keeps its tuple unredirected after the rules are back (an open
//! plaintext connection continues, and a later connection reusing the tuple skips the nat
//! rules until the entry expires). After a repair the agent deletes them; the next packet
//! of such a flow makes a new entry, which the restored rules redirect (a mid-stream packet
//! sent to ztunnel's listener is answered with a reset: the bypassing connection ends).
//!
//! Which entries are kept (everything the rules leave unredirected by design):
//! - NATed entries (`IPS_DST_NAT`): the rules redirected them to ztunnel.
//! - Entries with connmark [`marks::INPOD_CONN_MARK`]: ztunnel's delivery to the app.
//! - Entries in a non-default zone: ztunnel's own DNS upstream flows (the raw rules).
//! - HBONE (either port 15008), loopback, a pod talking to itself, and kubelet probes
//!   (from or to the probe SNAT address).
//! - Protocols the rules never capture: everything but TCP, and UDP other than DNS.
//!
//! - ztunnel's own TCP that is not HBONE (passthrough to a destination outside the mesh,
//!   TCP DNS upstream): it carries the socket mark but no connmark, and conntrack does not
//!   record socket marks, so those entries are told apart by their sockets: after the
//!   conntrack dump, the namespace's TCP sockets are read with their marks
//!   (`super::sock_diag`), and an entry whose ends are a socket marked
//!   [`marks::INPOD_MARK`] is kept. Read in that order, a ztunnel flow in the dump whose
//!   socket still exists is always found; one whose socket closed meanwhile is deleted,
//!   which costs nothing. When the sockets cannot be read, every candidate is deleted (the
//!   stricter answer: ztunnel's next packet re-creates its entry unredirected, its mark
//!   skips nat; only when the peer's packet comes first is that connection reset).

use std::net::IpAddr;

use ambit_contract::{marks, ports};
use netlink_packet_core::{DefaultNla, Nla};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Status, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::protocols::NETLINK_NETFILTER;

use super::KernelError;
use super::sock_diag::{self, TcpSocket};
use super::socket::Netlink;

/// Entries one pod's dump may hold; a larger table is refused (the caller logs it) rather
/// than held in memory without bound.
const MAX_ENTRIES: usize = 1 << 16;

/// `CTA_ZONE`: present only for a zone other than the default one.
const CTA_ZONE: u16 = 18;

/// ENOENT: the entry expired between the dump and the delete.
const ENOENT: i32 = -2;

/// One conntrack entry, as far as the cleanup needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The original tuple as the kernel sent it (sent back verbatim to delete the entry).
    orig: Vec<Tuple>,
    /// The zone attribute as the kernel sent it, when not the default zone.
    zone: Option<DefaultNla>,
    /// IP protocol number.
    pub(crate) proto: u8,
    /// Original direction: source, destination.
    pub(crate) src: Option<IpAddr>,
    pub(crate) dst: Option<IpAddr>,
    pub(crate) sport: Option<u16>,
    pub(crate) dport: Option<u16>,
    /// `CTA_STATUS` bits.
    pub(crate) status: u32,
    /// `CTA_MARK` (0 when absent).
    pub(crate) mark: u32,
}

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

impl Entry {
    /// Whether this entry belongs to a flow that went around the in-pod rules (see the
    /// module docs for what is kept). `probe_snat`: the addresses kubelet probes come from.
    pub(crate) fn bypassed(&self, probe_snat: &[IpAddr]) -> bool {
        let (Some(src), Some(dst)) = (self.src, self.dst) else {
            return false;
        };
        let captured = match self.proto {
            IPPROTO_TCP => true,
            IPPROTO_UDP => self.dport == Some(ports::DNS),
            _ => false,
        };
        let hbone =
            self.sport == Some(ports::INBOUND_HBONE) || self.dport == Some(ports::INBOUND_HBONE);
        captured
            && self.status & Status::DstNat.bits() == 0
            && self.mark & marks::INPOD_MASK != marks::INPOD_CONN_MARK
            && self.zone.is_none()
            && !hbone
            && !src.is_loopback()
            && !dst.is_loopback()
            && src != dst
            && !probe_snat.contains(&src)
            && !probe_snat.contains(&dst)
    }

    fn parse(attrs: Vec<ConntrackAttribute>) -> Option<Self> {
        let mut e = Entry {
            orig: Vec::new(),
            zone: None,
            proto: 0,
            src: None,
            dst: None,
            sport: None,
            dport: None,
            status: 0,
            mark: 0,
        };
        for a in attrs {
            match a {
                ConntrackAttribute::CtaTupleOrig(t) => e.orig = t,
                ConntrackAttribute::CtaStatus(s) => e.status = s.bits(),
                ConntrackAttribute::CtaMark(m) => e.mark = m,
                ConntrackAttribute::Other(nla) if nla.kind() == CTA_ZONE => e.zone = Some(nla),
                _ => {}
            }
        }
        for t in &e.orig {
            match t {
                Tuple::Ip(ips) => {
                    for ip in ips {
                        match ip {
                            IPTuple::SourceAddress(a) => e.src = Some(*a),
                            IPTuple::DestinationAddress(a) => e.dst = Some(*a),
                            _ => {}
                        }
                    }
                }
                Tuple::Proto(ps) => {
                    for p in ps {
                        match p {
                            ProtoTuple::Protocol(p) => e.proto = u8::from(*p),
                            ProtoTuple::SourcePort(p) => e.sport = Some(*p),
                            ProtoTuple::DestinationPort(p) => e.dport = Some(*p),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        (!e.orig.is_empty()).then_some(e)
    }
}

fn message(family: NetfilterProtoFamily, m: ConntrackMessage) -> NetfilterMessage {
    NetfilterMessage::new(NetfilterHeader::new(family, 0, 0), m)
}

/// Every conntrack entry of the calling thread's namespace (both families).
pub(crate) fn entries(nl: &mut Netlink) -> Result<Vec<Entry>, KernelError> {
    let req = message(
        NetfilterProtoFamily::Unspec,
        ConntrackMessage::Get(Vec::new()),
    );
    let replies = nl.dump_max("conntrack dump", req, MAX_ENTRIES)?;
    Ok(replies
        .into_iter()
        .filter_map(|m| match m.inner {
            NetfilterMessageInner::Conntrack(ConntrackMessage::New(a)) => Entry::parse(a),
            _ => None,
        })
        .collect())
}

/// Deletes one entry by its original tuple (and zone); an entry already gone is not an error.
pub(crate) fn delete(nl: &mut Netlink, e: &Entry) -> Result<(), KernelError> {
    let family = match e.src {
        Some(IpAddr::V6(_)) => NetfilterProtoFamily::IPv6,
        _ => NetfilterProtoFamily::IPv4,
    };
    let mut attrs = vec![ConntrackAttribute::CtaTupleOrig(e.orig.clone())];
    if let Some(zone) = &e.zone {
        attrs.push(ConntrackAttribute::Other(zone.clone()));
    }
    match nl.get(
        "conntrack delete",
        message(family, ConntrackMessage::Delete(attrs)),
    ) {
        Ok(_) => Ok(()),
        Err(KernelError::Refused { code: ENOENT, .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

impl Entry {
    /// Whether one of `ztunnel`'s sockets is an end of this entry's flow.
    fn owned_by(&self, ztunnel: &[TcpSocket]) -> bool {
        let (Some(src), Some(dst), Some(sport), Some(dport)) =
            (self.src, self.dst, self.sport, self.dport)
        else {
            return false;
        };
        let (a, b) = ((src.to_canonical(), sport), (dst.to_canonical(), dport));
        self.proto == IPPROTO_TCP
            && ztunnel
                .iter()
                .any(|s| (s.local, s.remote) == (a, b) || (s.local, s.remote) == (b, a))
    }
}

/// The sockets carrying ztunnel's mark.
fn ztunnel_sockets(all: Vec<TcpSocket>) -> Vec<TcpSocket> {
    all.into_iter()
        .filter(|s| {
            s.mark
                .is_some_and(|m| m & marks::INPOD_MASK == marks::INPOD_MARK)
        })
        .collect()
}

/// Deletes, in the calling thread's namespace, every entry that [`Entry::bypassed`] and is
/// not ztunnel's own flow (module docs); the number deleted.
pub(crate) fn flush_bypassed(probe_snat: &[IpAddr]) -> Result<usize, KernelError> {
    let mut nl = Netlink::open(NETLINK_NETFILTER)?;
    let candidates: Vec<Entry> = entries(&mut nl)?
        .into_iter()
        .filter(|e| e.bypassed(probe_snat))
        .collect();
    if candidates.is_empty() {
        return Ok(0);
    }
    let ztunnel = match sock_diag::tcp_sockets() {
        Ok(all) => ztunnel_sockets(all),
        Err(e) => {
            tracing::debug!(error = %e, "sockets unreadable: ztunnel's own flows are not told apart");
            Vec::new()
        }
    };
    let mut n = 0;
    for e in candidates.iter().filter(|e| !e.owned_by(&ztunnel)) {
        delete(&mut nl, e)?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_netfilter::conntrack::Protocol;

    fn entry(proto: u8, src: &str, dst: &str, sport: u16, dport: u16) -> Entry {
        let (src, dst): (IpAddr, IpAddr) = (src.parse().unwrap(), dst.parse().unwrap());
        Entry::parse(vec![ConntrackAttribute::CtaTupleOrig(vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress(src),
                IPTuple::DestinationAddress(dst),
            ]),
            Tuple::Proto(vec![
                ProtoTuple::Protocol(Protocol::from(proto)),
                ProtoTuple::SourcePort(sport),
                ProtoTuple::DestinationPort(dport),
            ]),
        ])])
        .unwrap()
    }

    #[test]
    fn which_entries_bypassed() {
        let snat: IpAddr = "169.254.7.127".parse().unwrap();
        let plain = || entry(IPPROTO_TCP, "10.0.0.5", "10.0.1.9", 40000, 8080);
        let with = |f: fn(&mut Entry)| {
            let mut e = plain();
            f(&mut e);
            e
        };
        let cases = [
            ("plaintext TCP out", plain(), true),
            (
                "plaintext TCP in",
                entry(IPPROTO_TCP, "10.0.1.9", "10.0.0.5", 40000, 8080),
                true,
            ),
            (
                "IPv6 TCP",
                entry(IPPROTO_TCP, "fd00::5", "fd00::9", 40000, 80),
                true,
            ),
            (
                "DNS over UDP",
                entry(IPPROTO_UDP, "10.0.0.5", "10.96.0.10", 40000, 53),
                true,
            ),
            (
                "redirected",
                with(|e| e.status = Status::DstNat.bits() | Status::Confirmed.bits()),
                false,
            ),
            (
                "ztunnel delivery (connmark)",
                with(|e| e.mark = 0x111),
                false,
            ),
            (
                "connmark under other bits",
                with(|e| e.mark = 0x7111),
                false,
            ),
            ("other mark", with(|e| e.mark = 0x539), true),
            (
                "DNS zone",
                with(|e| e.zone = Some(DefaultNla::new(CTA_ZONE, vec![0, 1]))),
                false,
            ),
            (
                "HBONE out",
                entry(IPPROTO_TCP, "10.0.0.5", "10.0.1.9", 40000, 15008),
                false,
            ),
            (
                "HBONE in",
                entry(IPPROTO_TCP, "10.0.1.9", "10.0.0.5", 15008, 40000),
                false,
            ),
            (
                "loopback",
                entry(IPPROTO_TCP, "127.0.0.1", "127.0.0.1", 40000, 15000),
                false,
            ),
            (
                "to itself",
                entry(IPPROTO_TCP, "10.0.0.5", "10.0.0.5", 40000, 8080),
                false,
            ),
            (
                "probe",
                entry(IPPROTO_TCP, "169.254.7.127", "10.0.0.5", 40000, 8080),
                false,
            ),
            (
                "UDP not DNS",
                entry(IPPROTO_UDP, "10.0.0.5", "10.0.1.9", 40000, 8125),
                false,
            ),
            ("ICMP", entry(1, "10.0.0.5", "10.0.1.9", 0, 0), false),
        ];
        for (name, e, want) in cases {
            assert_eq!(e.bypassed(&[snat]), want, "{name}: {e:?}");
        }
    }

    #[test]
    fn ztunnels_marked_sockets_own_their_flows() {
        let sock = |mark: Option<u32>, local: &str, remote: &str| TcpSocket {
            local: (local.parse().unwrap(), 40000),
            remote: (remote.parse().unwrap(), 8443),
            mark,
        };
        let out = entry(IPPROTO_TCP, "10.0.0.5", "10.0.1.9", 40000, 8443);
        let cases = [
            (
                "marked, same direction",
                sock(Some(0x539), "10.0.0.5", "10.0.1.9"),
                true,
            ),
            (
                "marked under other bits",
                sock(Some(0xa539), "10.0.0.5", "10.0.1.9"),
                true,
            ),
            ("unmarked", sock(Some(0), "10.0.0.5", "10.0.1.9"), false),
            (
                "mark not reported",
                sock(None, "10.0.0.5", "10.0.1.9"),
                false,
            ),
            (
                "other flow",
                sock(Some(0x539), "10.0.0.6", "10.0.1.9"),
                false,
            ),
        ];
        for (name, s, want) in cases {
            assert_eq!(out.owned_by(&ztunnel_sockets(vec![s])), want, "{name}");
        }
        // The socket seen from the other end of the entry (an accepted connection).
        let inbound = entry(IPPROTO_TCP, "10.0.1.9", "10.0.0.5", 8443, 40000);
        let s = sock(Some(0x539), "10.0.0.5", "10.0.1.9");
        assert!(inbound.owned_by(&ztunnel_sockets(vec![s])));
        // UDP is never a TCP socket's flow.
        let udp = entry(IPPROTO_UDP, "10.0.0.5", "10.0.1.9", 40000, 8443);
        assert!(!udp.owned_by(&ztunnel_sockets(vec![s])));
    }
}

//! The fail-closed guard: an nf_tables table in a pod's namespace that the agent's own
//! netlink socket owns, dropping what would leave the pod around ztunnel when the
//! redirection rules are gone.
//!
//! The redirection rules (nat, mangle, raw) live in tables anything root in the pod can
//! flush, and for the moments until the agent repairs them the pod's TCP leaves in
//! plaintext: a client's SYNs and bytes to other pods (nat flushed), a server's answers to
//! the connections ztunnel delivered with the client's address (mangle flushed), or both
//! (`nft flush ruleset`). The guard closes that window fail-closed: its one chain, on the
//! postrouting hook (priority filter), drops every TCP packet leaving by an interface other
//! than `lo` that is not
//!
//! - ztunnel's (socket mark [`marks::INPOD_MARK`] under [`marks::INPOD_MASK`]: HBONE,
//!   passthrough, answers of its listeners), or
//! - to a kubelet probe address (the probe SNAT addresses: answers to the kubelet).
//!
//! With the rules in place nothing else leaves that way (the app's TCP is redirected to
//! ztunnel's listeners on the pod's own address, its answers to ztunnel's deliveries are
//! routed back through `lo`), so the guard changes nothing then. Ingress mode leaves inbound
//! traffic unredirected by design (the app answers its peers directly) and virtual
//! interfaces forward a VM's traffic along paths not modelled here: no guard for either.
//!
//! Two tables carry the same chain, created together in one nfnetlink batch:
//!
//! - `inet ambit-guard`, created with `NFT_TABLE_F_OWNER`: only the creating socket may
//!   change or delete it, `nft flush ruleset` (or any other process) leaves it in place,
//!   and the kernel removes it when the socket closes: when the [`Guard`] is dropped or the
//!   agent exits, crashes or is replaced.
//! - `inet ambit-guard-standby`, an ordinary table: it outlives the agent, so a pod whose
//!   rules are flushed while no agent runs (crash, upgrade) still fails closed. Anything
//!   root in the pod can delete it (`nft flush ruleset` does: while no agent runs, that
//!   flush still opens the pod), so the agent checks it against the owned table on every
//!   verification ([`Guard::standby_intact`]) and re-creates it when it differs. It
//!   is replaced (deleted and re-created in the same batch, so the pod never sees a gap)
//!   whenever a guard is installed: a restarted agent adopts the one its predecessor left.
//!   It is removed explicitly when the pod leaves the mesh ([`Guard::remove_standby`],
//!   [`Guard::remove_standby_in`]) and on uninstall; a deleted pod's namespace takes it along.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ambit_contract::marks;
use ambit_netns::{NetnsFd, in_netns};
use netlink_packet_netfilter::nftables::{
    Bitwise, ChainAttribute, Cmp, DataAttribute, Expressions, Hook, Immediate, InetHookNumber,
    Meta, MetaKey, NfTablesMessage, Operator, Payload, Register, RuleAttribute, RuleMessage,
    TableAttribute, TableFlags, TableMessage, Verdict, VerdictAttribute,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};
use netlink_sys::protocols::NETLINK_NETFILTER;

use super::KernelError;
use super::nft::{NftFamily, Ruleset};
use super::socket::Netlink;
use crate::consts::{NFT_GUARD_STANDBY_TABLE, NFT_GUARD_TABLE};

/// `NFNL_SUBSYS_NFTABLES`: the subsystem a batch is addressed to.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NLM_F_CREATE`, `NLM_F_APPEND` (`linux/netlink.h`).
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
/// `NF_DROP`, `NF_ACCEPT` as nf_tables verdict codes.
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
/// `IPPROTO_TCP`; `NFPROTO_IPV4`, `NFPROTO_IPV6`.
const TCP: u8 = 6;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
/// `NFT_PAYLOAD_NETWORK_HEADER`, and where the destination address sits in each header.
const NETWORK_HEADER: u32 = 1;
const IPV4_DADDR: (u32, u32) = (16, 4);
const IPV6_DADDR: (u32, u32) = (24, 16);
/// `lo` is interface 1 in every network namespace.
const LO_IFINDEX: u32 = 1;
/// The guard's base chain. Postrouting, not output: the output hook's device is the one
/// routed to *before* the hook's chains ran, so a connection the nat chain redirected to
/// ztunnel's listener (now bound for `lo`), or an answer the mangle route chain re-routed
/// to `lo`, would still show the pod's interface there. Postrouting sees the final route.
const CHAIN: &str = "postrouting";
const PRIORITY: i32 = 0;

/// What the guard lets out besides ztunnel's own packets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GuardPlan {
    /// Where kubelet probes come from (the pod answers them directly).
    pub(crate) probe_snat: Vec<IpAddr>,
}

/// A pod's guard tables: the owned one alive as long as this value, the standby one until
/// removed (see the module docs).
#[derive(Debug)]
pub struct Guard {
    /// The owning socket, in the pod's namespace: closing it makes the kernel delete the
    /// owned table. It also carries every later request about the standby table.
    owner: Netlink,
    plan: GuardPlan,
}

fn message(inner: NfTablesMessage) -> NetfilterMessage {
    NetfilterMessage::new(
        NetfilterHeader::new(NetfilterProtoFamily::Inet, 0, 0),
        inner,
    )
}

fn control(m: ControlMessage) -> NetfilterMessage {
    NetfilterMessage::new(
        NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, NFNL_SUBSYS_NFTABLES),
        m,
    )
}

/// `meta <key>` into register 1.
fn meta(key: MetaKey) -> Expressions {
    Expressions::Meta(vec![
        Meta::DestinationRegister(Register::Reg1),
        Meta::Key(key),
    ])
}

/// Register 1 compared with `data`.
fn cmp(op: Operator, data: Vec<u8>) -> Expressions {
    Expressions::Cmp(vec![
        Cmp::SourceRegister(Register::Reg1),
        Cmp::Op(op),
        Cmp::Data(DataAttribute::Value(data)),
    ])
}

fn verdict(code: u32) -> Expressions {
    Expressions::Immediate(vec![
        Immediate::DestinationRegister(Register::Verdict),
        Immediate::Data(DataAttribute::Verdict(vec![VerdictAttribute::Code(
            Verdict::Other(code),
        )])),
    ])
}

/// `meta nfproto <family> <family> daddr <addr> accept`.
fn to_address(addr: IpAddr) -> Vec<Expressions> {
    let (nfproto, (offset, len), octets) = match addr {
        IpAddr::V4(a) => (NFPROTO_IPV4, IPV4_DADDR, a.octets().to_vec()),
        IpAddr::V6(a) => (NFPROTO_IPV6, IPV6_DADDR, a.octets().to_vec()),
    };
    vec![
        meta(MetaKey::Nfproto),
        cmp(Operator::Equal, vec![nfproto]),
        Expressions::Payload(vec![
            Payload::DestinationRegister(Register::Reg1),
            Payload::Base(NETWORK_HEADER),
            Payload::Offset(offset),
            Payload::Len(len),
        ]),
        cmp(Operator::Equal, octets),
        verdict(NF_ACCEPT),
    ]
}

impl GuardPlan {
    /// The chain's rules, in order (each a list of expressions).
    pub(crate) fn rules(&self) -> Vec<Vec<Expressions>> {
        let mark = |v: u32| v.to_ne_bytes().to_vec();
        let mut rules = vec![
            // oif lo accept (the final route: see CHAIN)
            vec![
                meta(MetaKey::Oif),
                cmp(Operator::Equal, LO_IFINDEX.to_ne_bytes().to_vec()),
                verdict(NF_ACCEPT),
            ],
            // meta mark & INPOD_MASK == ZTUNNEL_MARK accept
            vec![
                meta(MetaKey::Mark),
                Expressions::Bitwise(vec![
                    Bitwise::SourceRegister(Register::Reg1),
                    Bitwise::DestinationRegister(Register::Reg1),
                    Bitwise::Length(4),
                    Bitwise::Mask(DataAttribute::Value(mark(marks::INPOD_MASK))),
                    Bitwise::Xor(DataAttribute::Value(mark(0))),
                ]),
                cmp(Operator::Equal, mark(marks::INPOD_MARK)),
                verdict(NF_ACCEPT),
            ],
            // meta l4proto != tcp accept
            vec![
                meta(MetaKey::L4Proto),
                cmp(Operator::NotEqual, vec![TCP]),
                verdict(NF_ACCEPT),
            ],
        ];
        rules.extend(self.probe_snat.iter().map(|a| to_address(*a)));
        // everything else: drop
        rules.push(vec![verdict(NF_DROP)]);
        rules
    }

    /// The messages that create the table `name` (owned or not), its chain and rules.
    fn table(&self, name: &str, owned: bool) -> Vec<(NetfilterMessage, u16)> {
        let mut attributes = vec![TableAttribute::Name(name.into())];
        if owned {
            attributes.push(TableAttribute::Flags(TableFlags::Owner));
        }
        let mut msgs = vec![
            (
                message(NfTablesMessage::NewTable(TableMessage { attributes })),
                NLM_F_CREATE,
            ),
            (
                message(NfTablesMessage::NewChain(
                    netlink_packet_netfilter::nftables::ChainMessage {
                        attributes: vec![
                            ChainAttribute::Table(name.into()),
                            ChainAttribute::Name(CHAIN.into()),
                            ChainAttribute::Policy(NF_ACCEPT),
                            ChainAttribute::Type("filter".into()),
                            ChainAttribute::Hook(vec![
                                Hook::Number(InetHookNumber::PostRouting.into()),
                                Hook::Priority(PRIORITY as u32),
                            ]),
                        ],
                    },
                )),
                NLM_F_CREATE,
            ),
        ];
        for exprs in self.rules() {
            msgs.push((
                message(NfTablesMessage::NewRule(RuleMessage {
                    attributes: vec![
                        RuleAttribute::Table(name.into()),
                        RuleAttribute::Chain(CHAIN.into()),
                        RuleAttribute::Expressions(exprs.into_iter().map(Into::into).collect()),
                    ],
                })),
                NLM_F_CREATE | NLM_F_APPEND,
            ));
        }
        msgs
    }

    /// The standby table replaced by a fresh one (whatever state it was in, or none).
    fn standby_batch(&self) -> Vec<(NetfilterMessage, u16)> {
        let mut msgs = standby_removal();
        msgs.extend(self.table(NFT_GUARD_STANDBY_TABLE, false));
        msgs
    }

    /// The batch a [`Guard::install`] sends: the owned table and a fresh standby table.
    fn batch(&self) -> Vec<(NetfilterMessage, u16)> {
        let mut msgs = self.table(NFT_GUARD_TABLE, true);
        msgs.extend(self.standby_batch());
        msgs
    }
}

/// Removes the standby table whether or not it exists: create (a no-op if present), then
/// delete, in one batch.
fn standby_removal() -> Vec<(NetfilterMessage, u16)> {
    let table = || TableMessage {
        attributes: vec![TableAttribute::Name(NFT_GUARD_STANDBY_TABLE.into())],
    };
    vec![
        (message(NfTablesMessage::NewTable(table())), NLM_F_CREATE),
        (message(NfTablesMessage::DeleteTable(table())), 0),
    ]
}

/// Sends `msgs` as one nf_tables batch on `nl`.
fn commit(
    nl: &mut Netlink,
    what: &'static str,
    msgs: Vec<(NetfilterMessage, u16)>,
) -> Result<(), KernelError> {
    nl.batch(
        what,
        control(ControlMessage::BatchBegin),
        msgs,
        control(ControlMessage::BatchEnd),
    )
}

impl Guard {
    /// Creates the owned guard table in `netns` through a socket of its own, kept open by
    /// the returned value, and replaces the standby table, in one batch. Fails when the
    /// kernel refuses it (no nf_tables, a kernel before 5.12 without owned tables, or a
    /// guard table another socket owns); then neither table changed.
    pub(crate) fn install(netns: &NetnsFd, plan: &GuardPlan) -> Result<Self, KernelError> {
        let mut owner = in_netns(netns, || Netlink::open(NETLINK_NETFILTER))??;
        commit(&mut owner, "nft guard", plan.batch())?;
        Ok(Self {
            owner,
            plan: plan.clone(),
        })
    }

    /// Whether the standby table holds the owned table's chain and rules, in order. Reads
    /// over the guard's own socket: no thread enters the namespace.
    pub fn standby_intact(&mut self) -> Result<bool, KernelError> {
        let now = Ruleset::read_on(&mut self.owner, NftFamily::Inet)?;
        Ok(
            match (
                now.table(NFT_GUARD_TABLE),
                now.table(NFT_GUARD_STANDBY_TABLE),
            ) {
                (Some(owned), Some(standby)) => standby.same_chains(owned),
                _ => false,
            },
        )
    }

    /// Replaces the standby table by a fresh one (deleted and re-created in one batch).
    pub fn replace_standby(&mut self) -> Result<(), KernelError> {
        commit(
            &mut self.owner,
            "nft guard standby",
            self.plan.standby_batch(),
        )
    }

    /// [`Self::replace_standby`] when not [`Self::standby_intact`] (deleted, flushed or
    /// edited in the pod); `true` when it was replaced.
    pub fn repair_standby(&mut self) -> Result<bool, KernelError> {
        if self.standby_intact()? {
            return Ok(false);
        }
        self.replace_standby()?;
        Ok(true)
    }

    /// Removes the standby guard table from `netns` (absent is not an error): for a pod
    /// that leaves the mesh or is no longer guarded, when no [`Guard`] is held for it.
    pub fn remove_standby_in(netns: &NetnsFd) -> Result<(), KernelError> {
        let mut nl = in_netns(netns, || Netlink::open(NETLINK_NETFILTER))??;
        commit(&mut nl, "nft guard standby removal", standby_removal())
    }

    /// Removes the standby table (the pod leaves the mesh, or the agent is uninstalled);
    /// the owned table goes when this value is dropped.
    pub fn remove_standby(&mut self) -> Result<(), KernelError> {
        commit(
            &mut self.owner,
            "nft guard standby removal",
            standby_removal(),
        )
    }
}

/// The probe SNAT addresses as the plan wants them.
pub(crate) fn probe_addresses(v4: Ipv4Addr, v6: Ipv6Addr) -> Vec<IpAddr> {
    vec![IpAddr::V4(v4), IpAddr::V6(v6)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_rule_drops_and_every_other_accepts() {
        let plan = GuardPlan {
            probe_snat: probe_addresses(
                "169.254.7.127".parse().unwrap(),
                "fd16:9254:7127:1337:ffff:ffff:ffff:ffff".parse().unwrap(),
            ),
        };
        let rules = plan.rules();
        // lo, mark, not TCP, two probe addresses, drop.
        assert_eq!(rules.len(), 6);
        let last_is = |r: &Vec<Expressions>, code: u32| r.last() == Some(&verdict(code));
        assert!(last_is(rules.last().unwrap(), NF_DROP));
        assert!(rules[..5].iter().all(|r| last_is(r, NF_ACCEPT)));
        // The batch: owned table, chain, one message per rule; then the standby table
        // removed (create, delete) and created the same way.
        assert_eq!(plan.batch().len(), 2 + rules.len() + 2 + 2 + rules.len());
        assert_eq!(standby_removal().len(), 2);
    }
}

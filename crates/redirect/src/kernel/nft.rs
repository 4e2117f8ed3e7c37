//! nf_tables state of the calling thread's namespace, over nfnetlink: the tables, chains
//! and rules of one family, plus the ruleset generation.
//!
//! Two uses. For the nftables backend the listing replaces `nft list table`: which chains
//! exist, their hooks and rule counts ([`Ruleset::listed`]). For the iptables backend
//! (the nf_tables variant of iptables stores its rules here), a [`Ruleset`] compared with
//! the one read around the last full check proves that nothing changed since
//! ([`Ruleset::same_state`]); what cannot change the verdict is left out of it: object
//! handles, rule positions and packet counters.

use netlink_packet_core::Emitable;
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, ExpressionAttribute, GenAttribute, GenMessage, Hook,
    ListAttribute, NfTablesMessage, RuleAttribute, RuleMessage, TableAttribute, TableMessage,
};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};
use netlink_sys::protocols::NETLINK_NETFILTER;

use super::KernelError;
use super::socket::Netlink;
use crate::nft::list::{ListedChain, ListedTable};

/// Which nf_tables family to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NftFamily {
    /// `inet` (the nftables backend's tables).
    Inet,
    /// `ip` (iptables-nft, IPv4).
    Ip,
    /// `ip6` (ip6tables-nft).
    Ip6,
}

impl NftFamily {
    fn proto(self) -> NetfilterProtoFamily {
        match self {
            Self::Inet => NetfilterProtoFamily::Inet,
            Self::Ip => NetfilterProtoFamily::IPv4,
            Self::Ip6 => NetfilterProtoFamily::IPv6,
        }
    }
}

/// A chain: its name, hook (base chains) and rules, each rule reduced to what decides
/// what it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chain {
    pub(crate) name: String,
    pub(crate) hook: Option<u32>,
    attrs: Vec<ChainAttribute>,
    rules: Vec<Vec<RuleAttribute>>,
}

/// A table and its chains, in the kernel's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Table {
    pub(crate) name: String,
    attrs: Vec<TableAttribute>,
    pub(crate) chains: Vec<Chain>,
}

/// One family's tables, read after the ruleset generation they belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ruleset {
    /// The generation the kernel reported just before the dumps.
    generation: u32,
    pub(crate) tables: Vec<Table>,
    /// A hash of `tables` (see [`fingerprint`]): rulesets that differ almost always differ
    /// here, so a search among many compares little more than this.
    fingerprint: u64,
}

fn message(family: NftFamily, inner: NfTablesMessage) -> NetfilterMessage {
    NetfilterMessage::new(NetfilterHeader::new(family.proto(), 0, 0), inner)
}

fn unexpected(what: &'static str) -> KernelError {
    KernelError::Decode {
        what,
        detail: "reply is not an nf_tables message of the requested kind".into(),
    }
}

fn nft(m: NetfilterMessage, what: &'static str) -> Result<NfTablesMessage, KernelError> {
    match m.inner {
        netlink_packet_netfilter::NetfilterMessageInner::NfTables(n) => Ok(n),
        _ => Err(unexpected(what)),
    }
}

/// The name of a hook number, as `nft list` prints it.
pub(crate) fn hook_name(hook: u32) -> &'static str {
    match hook {
        0 => "prerouting",
        1 => "input",
        2 => "forward",
        3 => "output",
        4 => "postrouting",
        5 => "ingress",
        _ => "unknown",
    }
}

impl Ruleset {
    /// Reads the generation, then every table, chain and rule of `family`.
    pub(crate) fn read(family: NftFamily) -> Result<Self, KernelError> {
        Self::read_on(&mut Netlink::open(NETLINK_NETFILTER)?, family)
    }

    /// [`Self::read`] over an open nfnetlink socket (it reads the socket's namespace).
    pub(crate) fn read_on(nl: &mut Netlink, family: NftFamily) -> Result<Self, KernelError> {
        let generation = read_generation(nl)?;
        let mut tables = Vec::new();
        let table_req = message(
            family,
            NfTablesMessage::GetTable(TableMessage { attributes: vec![] }),
        );
        for m in nl.dump("nft table dump", table_req)? {
            let NfTablesMessage::NewTable(t) = nft(m, "nft table dump")? else {
                return Err(unexpected("nft table dump"));
            };
            let mut name = None;
            let attrs = t
                .attributes
                .into_iter()
                .filter(|a| match a {
                    TableAttribute::Name(n) => {
                        name = Some(n.clone());
                        true
                    }
                    TableAttribute::Handle(_) => false,
                    _ => true,
                })
                .collect();
            let name = name.ok_or_else(|| unexpected("nft table dump"))?;
            tables.push(Table {
                name,
                attrs,
                chains: Vec::new(),
            });
        }
        let chain_req = message(
            family,
            NfTablesMessage::GetChain(ChainMessage { attributes: vec![] }),
        );
        for m in nl.dump("nft chain dump", chain_req)? {
            let NfTablesMessage::NewChain(c) = nft(m, "nft chain dump")? else {
                return Err(unexpected("nft chain dump"));
            };
            let (mut table, mut name, mut hook) = (None, None, None);
            let mut attrs = Vec::new();
            for a in c.attributes {
                match &a {
                    ChainAttribute::Table(t) => table = Some(t.clone()),
                    ChainAttribute::Name(n) => name = Some(n.clone()),
                    ChainAttribute::Hook(h) => {
                        hook = h.iter().find_map(|h| match h {
                            Hook::Number(n) => Some(u32::from(*n)),
                            _ => None,
                        })
                    }
                    // Identity and packet counters: not part of what the chain does.
                    ChainAttribute::Handle(_) | ChainAttribute::Counter(_) => continue,
                    _ => {}
                }
                attrs.push(a);
            }
            let (Some(table), Some(name)) = (table, name) else {
                return Err(unexpected("nft chain dump"));
            };
            let t =
                tables
                    .iter_mut()
                    .find(|t| t.name == table)
                    .ok_or(KernelError::Interrupted {
                        what: "nft chain dump",
                    })?;
            t.chains.push(Chain {
                name,
                hook,
                attrs,
                rules: Vec::new(),
            });
        }
        let rule_req = message(
            family,
            NfTablesMessage::GetRule(RuleMessage { attributes: vec![] }),
        );
        for m in nl.dump("nft rule dump", rule_req)? {
            let NfTablesMessage::NewRule(r) = nft(m, "nft rule dump")? else {
                return Err(unexpected("nft rule dump"));
            };
            let (mut table, mut chain) = (None, None);
            let mut attrs = Vec::new();
            for a in r.attributes {
                match a {
                    RuleAttribute::Table(ref t) => table = Some(t.clone()),
                    RuleAttribute::Chain(ref c) => chain = Some(c.clone()),
                    RuleAttribute::Handle(_) | RuleAttribute::Position(_) => continue,
                    RuleAttribute::Expressions(e) => {
                        attrs.push(RuleAttribute::Expressions(without_counters(e)));
                        continue;
                    }
                    _ => {}
                }
                attrs.push(a);
            }
            let (Some(table), Some(chain)) = (table, chain) else {
                return Err(unexpected("nft rule dump"));
            };
            let c = tables
                .iter_mut()
                .find(|t| t.name == table)
                .and_then(|t| t.chains.iter_mut().find(|c| c.name == chain))
                .ok_or(KernelError::Interrupted {
                    what: "nft rule dump",
                })?;
            c.rules.push(attrs);
        }
        // A change between the dumps shows as a new generation; the dumps then may not
        // belong together.
        if read_generation(nl)? != generation {
            return Err(KernelError::Interrupted {
                what: "nft ruleset read",
            });
        }
        let fingerprint = fingerprint(&tables);
        Ok(Self {
            generation,
            tables,
            fingerprint,
        })
    }

    /// The generation the ruleset was read at.
    pub(crate) fn generation(&self) -> u32 {
        self.generation
    }

    /// Whether `self` and `other` describe the same rules, read at the same generation (no
    /// commit happened in between, so not even a change and its undo).
    pub(crate) fn same_state(&self, other: &Ruleset) -> bool {
        self == other
    }

    /// Whether `self` and `other` hold the same tables, chains and rules (handles, rule
    /// positions and packet counters aside), wherever and whenever each was read.
    pub(crate) fn same_rules(&self, other: &Ruleset) -> bool {
        self.fingerprint == other.fingerprint && self.tables == other.tables
    }

    /// The table named `name`, if present.
    pub(crate) fn table(&self, name: &str) -> Option<&Table> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// One table in the form the `nft list table` parser produces; `None` when absent.
    pub(crate) fn listed(&self, name: &str) -> Option<ListedTable> {
        let t = self.tables.iter().find(|t| t.name == name)?;
        Some(ListedTable {
            chains: t
                .chains
                .iter()
                .map(|c| ListedChain {
                    name: c.name.clone(),
                    hook: c.hook.map(|h| hook_name(h).to_owned()),
                    rules: c.rules.len(),
                })
                .collect(),
            // Sets are not read: in-pod verification never looks at them.
            sets: Vec::new(),
        })
    }
}

impl Table {
    /// Whether `self` holds the same chains and rules as `other`, in the same order,
    /// whatever the two tables are called (and whatever their own flags are).
    pub(crate) fn same_chains(&self, other: &Table) -> bool {
        fn chain(
            c: &Chain,
        ) -> (
            &str,
            Option<u32>,
            Vec<&ChainAttribute>,
            Vec<Vec<&RuleAttribute>>,
        ) {
            (
                &c.name,
                c.hook,
                c.attrs
                    .iter()
                    .filter(|a| !matches!(a, ChainAttribute::Table(_)))
                    .collect(),
                c.rules
                    .iter()
                    .map(|r| {
                        r.iter()
                            .filter(|a| !matches!(a, RuleAttribute::Table(_)))
                            .collect()
                    })
                    .collect(),
            )
        }
        self.chains.len() == other.chains.len()
            && self
                .chains
                .iter()
                .zip(&other.chains)
                .all(|(a, b)| chain(a) == chain(b))
    }
}

/// A hash of every table, chain and rule as kept (names, hooks, and each attribute in the
/// kernel's own encoding). Only ever compared within one process.
fn fingerprint(tables: &[Table]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut buf = Vec::new();
    let mut attr = |h: &mut std::collections::hash_map::DefaultHasher, a: &dyn NlaBytes| {
        buf.clear();
        buf.resize(a.len(), 0);
        a.put(&mut buf);
        buf.hash(h);
    };
    tables.len().hash(&mut h);
    for t in tables {
        t.name.hash(&mut h);
        t.attrs.len().hash(&mut h);
        for a in &t.attrs {
            attr(&mut h, a);
        }
        t.chains.len().hash(&mut h);
        for c in &t.chains {
            c.name.hash(&mut h);
            c.hook.hash(&mut h);
            c.attrs.len().hash(&mut h);
            for a in &c.attrs {
                attr(&mut h, a);
            }
            c.rules.len().hash(&mut h);
            for r in &c.rules {
                r.len().hash(&mut h);
                for a in r {
                    attr(&mut h, a);
                }
            }
        }
    }
    h.finish()
}

/// An attribute's netlink encoding, for [`fingerprint`].
trait NlaBytes {
    fn len(&self) -> usize;
    fn put(&self, buf: &mut [u8]);
}

impl<T: Emitable> NlaBytes for T {
    fn len(&self) -> usize {
        self.buffer_len()
    }
    fn put(&self, buf: &mut [u8]) {
        self.emit(buf)
    }
}

/// The ruleset generation of the socket's namespace: the kernel moves it on every
/// nf_tables commit there.
pub(crate) fn read_generation(nl: &mut Netlink) -> Result<u32, KernelError> {
    let req = NetfilterMessage::new(
        NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, 0),
        NfTablesMessage::GetGen(GenMessage { attributes: vec![] }),
    );
    for m in nl.get("nft generation", req)? {
        if let NfTablesMessage::NewGen(g) = nft(m, "nft generation")? {
            for a in g.attributes {
                if let GenAttribute::Id(id) = a {
                    return Ok(id);
                }
            }
        }
    }
    Err(unexpected("nft generation"))
}

/// The rule's expressions with the state of `counter` expressions (packets, bytes)
/// removed; everything else stays, byte for byte as the kernel reported it.
fn without_counters(
    exprs: Vec<ListAttribute<ExpressionAttribute>>,
) -> Vec<ListAttribute<ExpressionAttribute>> {
    exprs
        .into_iter()
        .map(|e| match e {
            ListAttribute::Element(attrs) => {
                let is_counter = attrs
                    .iter()
                    .any(|a| matches!(a, ExpressionAttribute::Name(n) if n == "counter"));
                ListAttribute::Element(if is_counter {
                    attrs
                        .into_iter()
                        .filter(|a| !matches!(a, ExpressionAttribute::Data(_)))
                        .collect()
                } else {
                    attrs
                })
            }
            other => other,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use netlink_packet_netfilter::nftables::Expressions;

    use super::*;

    #[test]
    fn counters_lose_their_state_and_nothing_else_does() {
        let expr = |name: &str, data: Expressions| {
            ListAttribute::Element(vec![
                ExpressionAttribute::Name(name.into()),
                ExpressionAttribute::Data(data),
            ])
        };
        let other = |name: &str, bytes: &[u8]| Expressions::Other {
            expression_type: name.into(),
            attributes: vec![netlink_packet_core::DefaultNla::new(1, bytes.to_vec())],
        };
        let rule = vec![
            expr("counter", other("counter", &[0, 0, 0, 9])),
            expr("target", other("target", b"REDIRECT")),
        ];
        let stripped = without_counters(rule);
        assert_eq!(
            stripped,
            vec![
                ListAttribute::Element(vec![ExpressionAttribute::Name("counter".into())]),
                expr("target", other("target", b"REDIRECT")),
            ]
        );
    }

    #[test]
    fn hook_names_are_nfts() {
        let names: Vec<&str> = (0..7).map(hook_name).collect();
        assert_eq!(
            names,
            [
                "prerouting",
                "input",
                "forward",
                "output",
                "postrouting",
                "ingress",
                "unknown"
            ]
        );
    }
}

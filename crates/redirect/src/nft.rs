//! The nftables rule model and its renderer (`spec/cni.md` §3.7, §3.9).
//!
//! Tables, chains and rules are typed values rendered to one `nft -f -` transaction. Rule
//! expressions keep upstream's exact spelling (several equivalent spellings of the mark
//! match, even a doubled space) because the transaction is golden-tested byte-for-byte against
//! upstream's `nftables/testdata`; `nft` parses all of them identically.

mod host;
pub mod list;
mod pod;

use std::fmt::{self, Write as _};
use std::net::IpAddr;

pub use host::{host_flush_transaction, host_table, host_transaction, probe_sets_transaction};
pub use pod::{pod_delete_transaction, pod_tables, pod_transaction};

use crate::config::Family;
use crate::iptables::{AddrSpec, Proto};

/// Comparison operator of a match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cmp {
    /// Equality (implicit for addresses, ports, interfaces; `==` for marks).
    Eq,
    /// `!=`
    Ne,
}

impl Cmp {
    fn implicit(self) -> &'static str {
        match self {
            Self::Eq => "",
            Self::Ne => "!= ",
        }
    }
    fn explicit(self) -> &'static str {
        match self {
            Self::Eq => "==",
            Self::Ne => "!=",
        }
    }
}

/// Source or destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    /// `saddr` / `sport`
    Src,
    /// `daddr` / `dport`
    Dst,
}

/// Spelling of a packet-mark match. All four parse to the same expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarkSyntax {
    /// `mark and M != V`
    Bare,
    /// `mark and M  != V` (upstream's doubled space in one rule).
    BareWide,
    /// `meta mark and M == V`
    MetaAnd,
    /// `meta mark & M == V`
    MetaAmp,
}

/// A match expression.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    /// `meta l4proto tcp`
    L4Proto(Proto),
    /// `ip saddr X`, `ip6 daddr != X/128`
    Addr(Family, Dir, Cmp, AddrSpec),
    /// `ip daddr @set`
    AddrInSet(Family, Dir, &'static str),
    /// `tcp dport != 15008`
    Port(Proto, Dir, Cmp, u16),
    /// Packet mark under a mask.
    Mark {
        /// Spelling.
        syntax: MarkSyntax,
        /// Mask.
        mask: u32,
        /// Operator.
        cmp: Cmp,
        /// Value.
        value: u32,
    },
    /// `ct mark and M == V`
    CtMark(u32, Cmp, u32),
    /// `iifname X`
    Iifname(Cmp, String),
    /// `oifname != lo`
    Oifname(Cmp, String),
    /// `skuid N`
    SkUid(u32),
    /// `meta nfproto ipv6`: the packet's family, in an `inet` table.
    NfProto(Family),
}

fn family_kw(f: Family) -> &'static str {
    match f {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

fn dir_kw(d: Dir, addr: bool) -> &'static str {
    match (d, addr) {
        (Dir::Src, true) => "saddr",
        (Dir::Dst, true) => "daddr",
        (Dir::Src, false) => "sport",
        (Dir::Dst, false) => "dport",
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::L4Proto(p) => write!(f, "meta l4proto {}", p.name()),
            Self::Addr(fam, d, c, a) => write!(
                f,
                "{} {} {}{a}",
                family_kw(*fam),
                dir_kw(*d, true),
                c.implicit()
            ),
            Self::AddrInSet(fam, d, set) => {
                write!(f, "{} {} @{set}", family_kw(*fam), dir_kw(*d, true))
            }
            Self::Port(p, d, c, port) => {
                write!(
                    f,
                    "{} {} {}{port}",
                    p.name(),
                    dir_kw(*d, false),
                    c.implicit()
                )
            }
            Self::Mark {
                syntax,
                mask,
                cmp,
                value,
            } => {
                let (head, op, gap) = match syntax {
                    MarkSyntax::Bare => ("mark", "and", " "),
                    MarkSyntax::BareWide => ("mark", "and", "  "),
                    MarkSyntax::MetaAnd => ("meta mark", "and", " "),
                    MarkSyntax::MetaAmp => ("meta mark", "&", " "),
                };
                write!(f, "{head} {op} {mask:#x}{gap}{} {value:#x}", cmp.explicit())
            }
            Self::CtMark(mask, cmp, value) => {
                write!(f, "ct mark and {mask:#x} {} {value:#x}", cmp.explicit())
            }
            Self::Iifname(c, n) => write!(f, "iifname {}{n}", c.implicit()),
            Self::Oifname(c, n) => write!(f, "oifname {}{n}", c.implicit()),
            Self::SkUid(u) => write!(f, "skuid {u}"),
            Self::NfProto(fam) => write!(
                f,
                "meta nfproto {}",
                match fam {
                    Family::V4 => "ipv4",
                    Family::V6 => "ipv6",
                }
            ),
        }
    }
}

/// The terminal statement of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Stmt {
    /// `accept`
    Accept,
    /// `drop`
    Drop,
    /// `return`
    Return,
    /// `jump CHAIN`
    Jump(String),
    /// `redirect to :PORT`
    Redirect(u16),
    /// `snat to ADDR`
    Snat(IpAddr),
    /// `meta mark set ct mark`
    MetaMarkSetCtMark,
    /// `ct mark set ct mark & KEEP |  VALUE` — set the masked bits, keep the others.
    CtMarkSet {
        /// Bits to clear (the complement is kept).
        mask: u32,
        /// Value to set.
        value: u32,
    },
    /// `ct zone set N`
    CtZoneSet(u16),
}

impl fmt::Display for Stmt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Accept => f.write_str("accept"),
            Self::Drop => f.write_str("drop"),
            Self::Return => f.write_str("return"),
            Self::Jump(c) => write!(f, "jump {c}"),
            Self::Redirect(p) => write!(f, "redirect to :{p}"),
            Self::Snat(a) => write!(f, "snat to {a}"),
            Self::MetaMarkSetCtMark => f.write_str("meta mark set ct mark"),
            // Upstream's spelling, doubled space included.
            Self::CtMarkSet { mask, value } => {
                write!(f, "ct mark set ct mark & {:#x} |  {value:#x}", !mask)
            }
            Self::CtZoneSet(z) => write!(f, "ct zone set {z}"),
        }
    }
}

/// One rule: matches, an optional `counter`, a statement.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// Matches, in order.
    pub exprs: Vec<Expr>,
    /// Emit `counter` before the statement.
    pub counter: bool,
    /// Statement.
    pub stmt: Stmt,
}

impl Rule {
    /// A counted rule (all upstream rules except jumps).
    pub fn counted(exprs: Vec<Expr>, stmt: Stmt) -> Self {
        Self {
            exprs,
            counter: true,
            stmt,
        }
    }

    /// An uncounted `jump CHAIN`.
    pub fn jump(chain: &str) -> Self {
        Self {
            exprs: vec![],
            counter: false,
            stmt: Stmt::Jump(chain.to_owned()),
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.exprs {
            write!(f, "{e} ")?;
        }
        if self.counter {
            f.write_str("counter ")?;
        }
        write!(f, "{}", self.stmt)
    }
}

/// A base chain's hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hook {
    /// `filter`, `nat` or `route`.
    pub kind: &'static str,
    /// `prerouting`, `output`, `postrouting`.
    pub hook: &'static str,
    /// Numeric priority.
    pub priority: i32,
}

/// A chain declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainDecl {
    /// Name.
    pub name: &'static str,
    /// `Some` for base chains.
    pub hook: Option<Hook>,
}

/// A table of the `inet` family: chain declarations and rules in transaction order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// Table name.
    pub name: &'static str,
    /// Chains in declaration order.
    pub chains: Vec<ChainDecl>,
    /// (chain, rule) in transaction order.
    pub rules: Vec<(&'static str, Rule)>,
}

impl Table {
    /// The table as it is written: chains without rules are not created, and jumps into such
    /// chains are dropped (which may empty a base chain in turn).
    pub fn effective(&self) -> Table {
        let mut t = self.clone();
        loop {
            let used = |c: &str| t.rules.iter().any(|(rc, _)| *rc == c);
            let before = (t.chains.len(), t.rules.len());
            let kept: Vec<ChainDecl> = t.chains.iter().filter(|c| used(c.name)).cloned().collect();
            t.chains = kept;
            let names: Vec<&str> = t.chains.iter().map(|c| c.name).collect();
            t.rules
                .retain(|(_, r)| !matches!(&r.stmt, Stmt::Jump(j) if !names.contains(&j.as_str())));
            if (t.chains.len(), t.rules.len()) == before {
                return t;
            }
        }
    }

    /// Rule count per chain of the effective table.
    pub fn rule_counts(&self) -> Vec<(&'static str, usize)> {
        let t = self.effective();
        t.chains
            .iter()
            .map(|c| {
                (
                    c.name,
                    t.rules.iter().filter(|(rc, _)| *rc == c.name).count(),
                )
            })
            .collect()
    }

    /// Append `add table; flush table; add chain...; add rule...` for the effective table.
    /// Nothing is written for a table without rules.
    pub fn write_replace(&self, tx: &mut Transaction) {
        let t = self.effective();
        if t.rules.is_empty() {
            return;
        }
        tx.push(Op::AddTable(t.name));
        tx.push(Op::FlushTable(t.name));
        for c in &t.chains {
            tx.push(Op::AddChain(t.name, c.clone()));
        }
        for (c, r) in &t.rules {
            tx.push(Op::AddRule(t.name, c, r.clone()));
        }
    }
}

/// One line of an nft transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `add table inet T`
    AddTable(&'static str),
    /// `flush table inet T`
    FlushTable(&'static str),
    /// `delete table inet T`
    DeleteTable(&'static str),
    /// `add chain inet T C [{ type K hook H priority P ; }]`
    AddChain(&'static str, ChainDecl),
    /// `add rule inet T C RULE`
    AddRule(&'static str, &'static str, Rule),
    /// `add set inet T S { type ipv4_addr ; comment "..." ; }`
    AddSet(&'static str, &'static str, Family),
    /// `flush set inet T S`
    FlushSet(&'static str, &'static str),
    /// `add element inet T S { ADDR comment "UID" }`
    AddElement(&'static str, &'static str, IpAddr, String),
    /// `delete element inet T S { ADDR }`
    DeleteElement(&'static str, &'static str, IpAddr),
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AddTable(t) => write!(f, "add table inet {t}"),
            Self::FlushTable(t) => write!(f, "flush table inet {t}"),
            Self::DeleteTable(t) => write!(f, "delete table inet {t}"),
            Self::AddChain(t, c) => {
                write!(f, "add chain inet {t} {}", c.name)?;
                if let Some(h) = c.hook {
                    write!(
                        f,
                        " {{ type {} hook {} priority {} ; }}",
                        h.kind, h.hook, h.priority
                    )?;
                }
                Ok(())
            }
            Self::AddRule(t, c, r) => write!(f, "add rule inet {t} {c} {r}"),
            Self::AddSet(t, s, fam) => {
                let ty = match fam {
                    Family::V4 => "ipv4_addr",
                    Family::V6 => "ipv6_addr",
                };
                write!(
                    f,
                    "add set inet {t} {s} {{ type {ty} ; comment \"{}\" ; }}",
                    crate::consts::PROBE_SET_COMMENT
                )
            }
            Self::FlushSet(t, s) => write!(f, "flush set inet {t} {s}"),
            // The comment is a pod UID; quotes are stripped so it cannot end the string.
            Self::AddElement(t, s, a, c) => write!(
                f,
                "add element inet {t} {s} {{ {a} comment \"{}\" }}",
                c.replace(['"', '\\', '\n'], "")
            ),
            Self::DeleteElement(t, s, a) => write!(f, "delete element inet {t} {s} {{ {a} }}"),
        }
    }
}

/// An atomic nft transaction (`nft -f -` applies all lines or none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transaction {
    /// Lines in order.
    pub ops: Vec<Op>,
}

impl Transaction {
    /// Append one op.
    pub fn push(&mut self, op: Op) {
        self.ops.push(op);
    }

    /// The `nft -f -` input.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for op in &self.ops {
            let _ = writeln!(s, "{op}");
        }
        s
    }
}

//! The iptables rule model and its renderers.
//!
//! A [`Rule`] is a typed value (table, chain, ordered matches, target). It renders to the
//! tokens upstream feeds to `iptables-restore`, and the same tokens serve `-C` (check) and `-D`
//! (delete), so the text that is applied and the text that is verified can never drift apart.
//! Match order and spelling are data because `iptables-restore` input is golden-tested
//! byte-for-byte against upstream (`spec/cni.md` §3.2).

mod host;
mod pod;
pub mod save;

use std::fmt::{self, Write as _};
use std::net::IpAddr;

pub use host::{host_delete_commands, host_rules};
pub use pod::{guardrail_rules, ipv6_fence, pod_delete_commands, pod_rules};

use crate::config::Family;
use crate::runner::Cmd;

/// An xtables table. Ordering is alphabetical, the order restore input lists them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// `filter` (only guardrails).
    Filter,
    /// `mangle`.
    Mangle,
    /// `nat`.
    Nat,
    /// `raw`.
    Raw,
}

impl Table {
    /// The name iptables uses.
    pub fn name(self) -> &'static str {
        match self {
            Self::Filter => "filter",
            Self::Mangle => "mangle",
            Self::Nat => "nat",
            Self::Raw => "raw",
        }
    }

    /// Parse a table name as printed by `iptables-save`.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Filter, Self::Mangle, Self::Nat, Self::Raw]
            .into_iter()
            .find(|t| t.name() == name)
    }
}

/// A chain we write to: built-in hooks and our own `ISTIO_*` chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Chain {
    /// Built-in `PREROUTING`.
    Prerouting,
    /// Built-in `INPUT`.
    Input,
    /// Built-in `FORWARD`.
    Forward,
    /// Built-in `OUTPUT`.
    Output,
    /// Built-in `POSTROUTING`.
    Postrouting,
    /// Pod `ISTIO_PRERT`.
    IstioPrert,
    /// Pod `ISTIO_OUTPUT`.
    IstioOutput,
    /// Host `ISTIO_POSTRT`.
    IstioPostrt,
    /// VM inbound `ISTIO_VM_PRERT` ([`crate::vm`]).
    IstioVmPrert,
    /// VM outbound `ISTIO_VM_OUTPUT` ([`crate::vm`]).
    IstioVmOutput,
}

impl Chain {
    /// The name iptables uses.
    pub fn name(self) -> &'static str {
        match self {
            Self::Prerouting => "PREROUTING",
            Self::Input => "INPUT",
            Self::Forward => "FORWARD",
            Self::Output => "OUTPUT",
            Self::Postrouting => "POSTROUTING",
            Self::IstioPrert => "ISTIO_PRERT",
            Self::IstioOutput => "ISTIO_OUTPUT",
            Self::IstioPostrt => "ISTIO_POSTRT",
            Self::IstioVmPrert => "ISTIO_VM_PRERT",
            Self::IstioVmOutput => "ISTIO_VM_OUTPUT",
        }
    }

    /// Built-in chains exist already and are never created (`-N`) or deleted.
    pub fn is_builtin(self) -> bool {
        !matches!(
            self,
            Self::IstioPrert
                | Self::IstioOutput
                | Self::IstioPostrt
                | Self::IstioVmPrert
                | Self::IstioVmOutput
        )
    }
}

/// Transport protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Proto {
    /// The name iptables and nft use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }
}

/// An address operand, spelled as upstream spells it: a bare host (`-s 169.254.7.127`) or with
/// an explicit prefix (`! -d 127.0.0.1/32`). Both mean the same to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddrSpec {
    /// Rendered without a prefix length.
    Host(IpAddr),
    /// Rendered as `addr/len`.
    Net(IpAddr, u8),
}

impl AddrSpec {
    /// The loopback host route of a family, spelled with its prefix (`127.0.0.1/32`, `::1/128`).
    pub fn loopback(family: Family) -> Self {
        match family {
            Family::V4 => Self::Net(IpAddr::from([127, 0, 0, 1]), 32),
            Family::V6 => Self::Net(IpAddr::from(std::net::Ipv6Addr::LOCALHOST), 128),
        }
    }
}

impl fmt::Display for AddrSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Host(a) => write!(f, "{a}"),
            Self::Net(a, len) => write!(f, "{a}/{len}"),
        }
    }
}

/// Whether a match is negated (`! -d ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Neg {
    /// Plain match.
    Is,
    /// Negated match.
    Not,
}

/// One match, in the order it appears on the rule line.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    /// `[!] -s ADDR`
    Source(Neg, AddrSpec),
    /// `[!] -d ADDR`
    Dest(Neg, AddrSpec),
    /// `-p PROTO`
    Proto(Proto),
    /// `-m tcp` / `-m udp` (explicit protocol module; options may follow separately).
    ProtoModule(Proto),
    /// `[!] --dport N` (module implied by the preceding `-p` or `-m`).
    Dport(Neg, u16),
    /// `[!] --sport N`
    Sport(Neg, u16),
    /// `[!] -i IFACE`
    InIface(Neg, String),
    /// `[!] -o IFACE`
    OutIface(Neg, String),
    /// `-m mark [!] --mark V/M`
    Mark(Neg, u32, u32),
    /// `-m connmark --mark V/M`
    ConnMark(u32, u32),
    /// `-m owner --socket-exists`
    SocketExists,
    /// `-m set --match-set NAME dst`
    SetDst(&'static str),
}

/// How the REDIRECT port option is spelled; upstream uses both and iptables treats
/// `--to-port` as an abbreviation of `--to-ports`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortsSpelling {
    /// `--to-ports`
    Ports,
    /// `--to-port`
    Port,
}

/// What a rule does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// `-j CHAIN`
    Jump(Chain),
    /// `-j ACCEPT`
    Accept,
    /// `-j RETURN`
    Return,
    /// `-j DROP` (guardrails only)
    Drop,
    /// `-j REDIRECT --to-ports N`
    Redirect(u16, PortsSpelling),
    /// `-j CONNMARK --set-xmark V/M`
    ConnMarkSetXmark(u32, u32),
    /// `-j CONNMARK --restore-mark --nfmask M --ctmask M`
    ConnMarkRestore { nfmask: u32, ctmask: u32 },
    /// `-j CT --zone N`
    CtZone(u16),
    /// `-j SNAT --to-source ADDR`
    Snat(IpAddr),
}

/// Where the rule goes in its chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// `-A` (append).
    Append,
    /// `-I CHAIN N` (insert at 1-based position).
    Insert(u32),
}

/// One iptables rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// Table the rule lives in.
    pub table: Table,
    /// Chain the rule lives in.
    pub chain: Chain,
    /// Append or insert.
    pub position: Position,
    /// Matches, in rendering order.
    pub matches: Vec<Match>,
    /// Target.
    pub target: Target,
}

fn hex(v: u32) -> String {
    format!("{v:#x}")
}

impl Rule {
    /// An appended rule.
    pub fn append(table: Table, chain: Chain, matches: Vec<Match>, target: Target) -> Self {
        Self {
            table,
            chain,
            position: Position::Append,
            matches,
            target,
        }
    }

    /// The rule specification tokens (everything after the chain name).
    pub fn spec(&self) -> Vec<String> {
        let mut t: Vec<String> = Vec::new();
        let neg = |t: &mut Vec<String>, n: Neg| {
            if n == Neg::Not {
                t.push("!".into());
            }
        };
        for m in &self.matches {
            match m {
                Match::Source(n, a) => {
                    neg(&mut t, *n);
                    t.extend(["-s".into(), a.to_string()]);
                }
                Match::Dest(n, a) => {
                    neg(&mut t, *n);
                    t.extend(["-d".into(), a.to_string()]);
                }
                Match::Proto(p) => t.extend(["-p".into(), p.name().into()]),
                Match::ProtoModule(p) => t.extend(["-m".into(), p.name().into()]),
                Match::Dport(n, p) => {
                    neg(&mut t, *n);
                    t.extend(["--dport".into(), p.to_string()]);
                }
                Match::Sport(n, p) => {
                    neg(&mut t, *n);
                    t.extend(["--sport".into(), p.to_string()]);
                }
                Match::InIface(n, i) => {
                    neg(&mut t, *n);
                    t.extend(["-i".into(), i.clone()]);
                }
                Match::OutIface(n, i) => {
                    neg(&mut t, *n);
                    t.extend(["-o".into(), i.clone()]);
                }
                Match::Mark(n, v, m) => {
                    t.extend(["-m".into(), "mark".into()]);
                    neg(&mut t, *n);
                    t.extend(["--mark".into(), format!("{}/{}", hex(*v), hex(*m))]);
                }
                Match::ConnMark(v, m) => t.extend([
                    "-m".into(),
                    "connmark".into(),
                    "--mark".into(),
                    format!("{}/{}", hex(*v), hex(*m)),
                ]),
                Match::SocketExists => {
                    t.extend(["-m".into(), "owner".into(), "--socket-exists".into()])
                }
                Match::SetDst(name) => t.extend([
                    "-m".into(),
                    "set".into(),
                    "--match-set".into(),
                    (*name).into(),
                    "dst".into(),
                ]),
            }
        }
        t.push("-j".into());
        match &self.target {
            Target::Jump(c) => t.push(c.name().into()),
            Target::Accept => t.push("ACCEPT".into()),
            Target::Return => t.push("RETURN".into()),
            Target::Drop => t.push("DROP".into()),
            Target::Redirect(port, spelling) => t.extend([
                "REDIRECT".into(),
                match spelling {
                    PortsSpelling::Ports => "--to-ports",
                    PortsSpelling::Port => "--to-port",
                }
                .into(),
                port.to_string(),
            ]),
            Target::ConnMarkSetXmark(v, m) => t.extend([
                "CONNMARK".into(),
                "--set-xmark".into(),
                format!("{}/{}", hex(*v), hex(*m)),
            ]),
            Target::ConnMarkRestore { nfmask, ctmask } => t.extend([
                "CONNMARK".into(),
                "--restore-mark".into(),
                "--nfmask".into(),
                hex(*nfmask),
                "--ctmask".into(),
                hex(*ctmask),
            ]),
            Target::CtZone(z) => t.extend(["CT".into(), "--zone".into(), z.to_string()]),
            Target::Snat(a) => t.extend(["SNAT".into(), "--to-source".into(), a.to_string()]),
        }
        t
    }

    /// The line in `iptables-restore` input (`-A CHAIN ...` / `-I CHAIN N ...`).
    pub fn restore_line(&self) -> String {
        let head = match self.position {
            Position::Append => format!("-A {}", self.chain.name()),
            Position::Insert(n) => format!("-I {} {n}", self.chain.name()),
        };
        format!("{head} {}", self.spec().join(" "))
    }

    fn with_op(&self, op: &str) -> Vec<String> {
        let mut v = vec![
            "-t".to_owned(),
            self.table.name().into(),
            op.into(),
            self.chain.name().into(),
        ];
        v.extend(self.spec());
        v
    }

    /// Arguments for `iptables -t T -C CHAIN spec` (semantic presence check by the kernel).
    pub fn check_args(&self) -> Vec<String> {
        self.with_op("-C")
    }

    /// Arguments for `iptables -t T -D CHAIN spec`.
    pub fn delete_args(&self) -> Vec<String> {
        self.with_op("-D")
    }

    /// Arguments for `iptables -t T -I CHAIN 1 spec` / `-A`.
    pub fn add_args(&self) -> Vec<String> {
        let mut v = vec!["-t".to_owned(), self.table.name().into()];
        match self.position {
            Position::Append => v.extend(["-A".into(), self.chain.name().into()]),
            Position::Insert(n) => v.extend(["-I".into(), self.chain.name().into(), n.to_string()]),
        }
        v.extend(self.spec());
        v
    }
}

/// The binaries of one family.
pub fn binary(family: Family) -> &'static str {
    match family {
        Family::V4 => "iptables",
        Family::V6 => "ip6tables",
    }
}

/// `iptables-save` / `ip6tables-save`.
pub fn save_binary(family: Family) -> &'static str {
    match family {
        Family::V4 => "iptables-save",
        Family::V6 => "ip6tables-save",
    }
}

/// `iptables-restore` / `ip6tables-restore`.
pub fn restore_binary(family: Family) -> &'static str {
    match family {
        Family::V4 => "iptables-restore",
        Family::V6 => "ip6tables-restore",
    }
}

/// An `iptables`/`ip6tables` invocation as argv (no shell).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XtablesCmd {
    /// Which binary.
    pub family: Family,
    /// Arguments after the binary name.
    pub args: Vec<String>,
}

impl XtablesCmd {
    /// Build from string slices.
    pub fn new(family: Family, args: &[&str]) -> Self {
        Self {
            family,
            args: args.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// Full argv including the binary.
    pub fn argv(&self) -> Vec<String> {
        let mut v = vec![binary(self.family).to_owned()];
        v.extend(self.args.iter().cloned());
        v
    }

    /// As a runnable command.
    pub fn cmd(&self) -> Cmd {
        Cmd::new(self.argv())
    }
}

/// An ordered rule set for one family, rendered as one `iptables-restore --noflush` input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSet {
    /// Rules in rendering order (restore input keeps this order within a table).
    pub rules: Vec<Rule>,
}

impl RuleSet {
    /// Tables used, alphabetically.
    pub fn tables(&self) -> Vec<Table> {
        let mut t: Vec<Table> = self.rules.iter().map(|r| r.table).collect();
        t.sort();
        t.dedup();
        t
    }

    /// Custom chains of a table, in first-use order: chains that hold rules, in the order
    /// their first rule appears, then chains that are only jump targets (e.g. the empty nat
    /// `ISTIO_PRERT` in ingress mode). This reproduces upstream's `-N` ordering.
    pub fn chains(&self, table: Table) -> Vec<Chain> {
        let mut out: Vec<Chain> = Vec::new();
        let in_table = || self.rules.iter().filter(move |r| r.table == table);
        for r in in_table() {
            if !r.chain.is_builtin() && !out.contains(&r.chain) {
                out.push(r.chain);
            }
        }
        for r in in_table() {
            if let Target::Jump(c) = r.target
                && !c.is_builtin()
                && !out.contains(&c)
            {
                out.push(c);
            }
        }
        out
    }

    /// Rules of one table in order.
    pub fn rules_in(&self, table: Table) -> impl Iterator<Item = &Rule> {
        self.rules.iter().filter(move |r| r.table == table)
    }

    /// The `iptables-restore --noflush` input: tables alphabetically, empty tables omitted.
    pub fn render_restore(&self) -> String {
        let mut s = String::new();
        for table in self.tables() {
            let _ = writeln!(s, "* {}", table.name());
            for c in self.chains(table) {
                let _ = writeln!(s, "-N {}", c.name());
            }
            for r in self.rules_in(table) {
                let _ = writeln!(s, "{}", r.restore_line());
            }
            s.push_str("COMMIT\n");
        }
        s
    }
}

//! The VM's nftables tables ([`super`]).

use super::{
    InboundCapture, NFT_VM_NAT_TABLE, NFT_VM_RAW_TABLE, OutboundCapture, VmRedirectConfig,
};
use crate::consts::DNS_CT_ZONE;
use crate::iptables::{AddrSpec, Proto};
use crate::nft::{ChainDecl, Cmp, Dir, Expr, Hook, MarkSyntax, Op, Rule, Stmt, Table, Transaction};
use ambit_contract::{marks, ports};

const PRE: &str = "istio-prerouting";
const OUT: &str = "istio-output";

fn chains(kind: &'static str, priority: i32) -> Vec<ChainDecl> {
    let base = |hook| ChainDecl {
        name: hook,
        hook: Some(Hook {
            kind,
            hook,
            priority,
        }),
    };
    let user = |name| ChainDecl { name, hook: None };
    vec![base("prerouting"), base("output"), user(PRE), user(OUT)]
}

/// The nat and raw tables in transaction order, before pruning (see [`Table::effective`]).
pub fn vm_tables(cfg: &VmRedirectConfig) -> Vec<Table> {
    use Cmp::{Eq, Ne};
    use Dir::{Dst, Src};
    let fams = cfg.families();
    let lo = AddrSpec::loopback;
    let mark = |cmp| Expr::Mark {
        syntax: MarkSyntax::MetaAnd,
        mask: marks::INPOD_MASK,
        cmp,
        value: marks::INPOD_MARK,
    };
    let tcp = || Expr::L4Proto(Proto::Tcp);
    let port = |proto, p| Expr::Port(proto, Dst, Eq, p);

    let mut nat: Vec<(&'static str, Rule)> =
        vec![("prerouting", Rule::jump(PRE)), ("output", Rule::jump(OUT))];
    for iface in &cfg.exclude_interfaces {
        nat.push((
            PRE,
            Rule::counted(vec![Expr::Iifname(Eq, iface.to_string())], Stmt::Return),
        ));
    }
    nat.push((
        PRE,
        Rule::counted(vec![port(Proto::Tcp, ports::INBOUND_HBONE)], Stmt::Return),
    ));
    let to_inbound = |f, p: Option<u16>| {
        // `tcp dport` implies TCP; without a port, TCP is matched on its own.
        let mut e = vec![Expr::Addr(f, Dst, Ne, lo(f))];
        e.push(p.map_or_else(tcp, |p| port(Proto::Tcp, p)));
        e.push(mark(Ne));
        Rule::counted(e, Stmt::Redirect(ports::INBOUND_PLAINTEXT))
    };
    match &cfg.inbound {
        InboundCapture::All { except } => {
            for p in except {
                nat.push((PRE, Rule::counted(vec![port(Proto::Tcp, *p)], Stmt::Return)));
            }
            nat.extend(fams.iter().map(|f| (PRE, to_inbound(*f, None))));
        }
        InboundCapture::Ports(list) => {
            for p in list {
                nat.extend(fams.iter().map(|f| (PRE, to_inbound(*f, Some(*p)))));
            }
        }
        InboundCapture::None => {}
    }

    for iface in &cfg.exclude_interfaces {
        nat.push((
            OUT,
            Rule::counted(vec![Expr::Oifname(Eq, iface.to_string())], Stmt::Return),
        ));
    }
    nat.push((OUT, Rule::counted(vec![mark(Eq)], Stmt::Return)));
    if cfg.dns_capture {
        nat.push((
            OUT,
            Rule::counted(
                vec![Expr::Oifname(Ne, "lo".into()), port(Proto::Udp, ports::DNS)],
                Stmt::Redirect(ports::DNS_PROXY),
            ),
        ));
        for f in fams {
            nat.push((
                OUT,
                Rule::counted(
                    vec![
                        Expr::Addr(*f, Dst, Ne, lo(*f)),
                        port(Proto::Tcp, ports::DNS),
                    ],
                    Stmt::Redirect(ports::DNS_PROXY),
                ),
            ));
        }
    }
    nat.push((
        OUT,
        Rule::counted(vec![Expr::Oifname(Eq, "lo".into())], Stmt::Return),
    ));
    for c in &cfg.outbound_exclude_cidrs {
        nat.push((
            OUT,
            Rule::counted(
                vec![Expr::Addr(c.family(), Dst, Eq, c.spec())],
                Stmt::Return,
            ),
        ));
    }
    for p in &cfg.outbound_exclude_ports {
        nat.push((OUT, Rule::counted(vec![port(Proto::Tcp, *p)], Stmt::Return)));
    }
    match &cfg.outbound {
        OutboundCapture::All => nat.push((
            OUT,
            Rule::counted(vec![tcp()], Stmt::Redirect(ports::OUTBOUND)),
        )),
        OutboundCapture::Cidrs(list) => {
            for c in list.iter().filter(|c| fams.contains(&c.family())) {
                nat.push((
                    OUT,
                    Rule::counted(
                        vec![Expr::Addr(c.family(), Dst, Eq, c.spec()), tcp()],
                        Stmt::Redirect(ports::OUTBOUND),
                    ),
                ));
            }
        }
        OutboundCapture::None => {}
    }

    let mut raw = Vec::new();
    if cfg.dns_capture {
        let zone = |dir, cmp| {
            Rule::counted(
                vec![Expr::Port(Proto::Udp, dir, Eq, ports::DNS), mark(cmp)],
                Stmt::CtZoneSet(DNS_CT_ZONE),
            )
        };
        raw = vec![
            ("prerouting", Rule::jump(PRE)),
            ("output", Rule::jump(OUT)),
            (OUT, zone(Dst, Eq)),
            (PRE, zone(Src, Ne)),
        ];
    }
    vec![
        Table {
            name: NFT_VM_NAT_TABLE,
            chains: chains("nat", -100),
            rules: nat,
        },
        Table {
            name: NFT_VM_RAW_TABLE,
            chains: chains("filter", -300),
            rules: raw,
        },
    ]
}

/// The one atomic transaction that (re)writes the VM tables (add + flush first).
pub fn vm_transaction(cfg: &VmRedirectConfig) -> Transaction {
    let mut tx = Transaction::default();
    for t in vm_tables(cfg) {
        t.write_replace(&mut tx);
    }
    tx
}

/// Deletes both VM tables; `add table` first makes `delete` succeed when absent.
pub fn vm_delete_transaction() -> Transaction {
    let mut tx = Transaction::default();
    for t in [NFT_VM_NAT_TABLE, NFT_VM_RAW_TABLE] {
        tx.push(Op::AddTable(t));
        tx.push(Op::DeleteTable(t));
    }
    tx
}

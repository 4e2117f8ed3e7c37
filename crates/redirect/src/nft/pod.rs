//! In-pod nftables tables (`spec/cni.md` §3.7).

use super::{ChainDecl, Cmp, Dir, Expr, Hook, MarkSyntax, Op, Rule, Stmt, Table, Transaction};
use crate::config::{Family, PodRedirectConfig};
use crate::consts::{DNS_CT_ZONE, NFT_MANGLE_TABLE, NFT_NAT_TABLE, NFT_RAW_TABLE};
use crate::iptables::{AddrSpec, Proto};
use ambit_contract::{marks, ports};

const PRE: &str = "istio-prerouting";
const OUT: &str = "istio-output";

fn chains(kind_pre: &'static str, kind_out: &'static str, priority: i32) -> Vec<ChainDecl> {
    let base = |kind, hook| ChainDecl {
        name: hook,
        hook: Some(Hook {
            kind,
            hook,
            priority,
        }),
    };
    vec![
        base(kind_pre, "prerouting"),
        base(kind_out, "output"),
        ChainDecl {
            name: PRE,
            hook: None,
        },
        ChainDecl {
            name: OUT,
            hook: None,
        },
    ]
}

/// The three in-pod tables (nat, mangle, raw) in transaction order, before pruning of empty
/// chains (see [`Table::effective`]).
pub fn pod_tables(cfg: &PodRedirectConfig) -> Vec<Table> {
    use Cmp::{Eq, Ne};
    use Dir::{Dst, Src};
    let fams: &[Family] = cfg.families();
    let snat = |f: Family| match f {
        Family::V4 => AddrSpec::Host(cfg.probe_snat_v4.into()),
        Family::V6 => AddrSpec::Host(cfg.probe_snat_v6.into()),
    };
    let lo = AddrSpec::loopback;
    let not_ztunnel = |syntax| Expr::Mark {
        syntax,
        mask: marks::INPOD_MASK,
        cmp: Ne,
        value: marks::INPOD_MARK,
    };
    let tcp = || Expr::L4Proto(Proto::Tcp);

    // nat
    let mut nat: Vec<(&'static str, Rule)> =
        vec![("output", Rule::jump(OUT)), ("prerouting", Rule::jump(PRE))];
    for iface in &cfg.virtual_interfaces {
        for stmt in [Stmt::Redirect(ports::OUTBOUND), Stmt::Return] {
            nat.push((
                PRE,
                Rule::counted(vec![Expr::Iifname(Eq, iface.to_string()), tcp()], stmt),
            ));
        }
    }
    let probe_accept =
        |dir, f| Rule::counted(vec![tcp(), Expr::Addr(f, dir, Eq, snat(f))], Stmt::Accept);
    if !cfg.ingress_mode {
        nat.extend(fams.iter().map(|f| (PRE, probe_accept(Src, *f))));
    }
    nat.extend(fams.iter().map(|f| (OUT, probe_accept(Dst, *f))));
    if !cfg.ingress_mode {
        for f in fams {
            // Upstream's v4 rule has a doubled space; kept for byte-identical goldens.
            let syntax = match f {
                Family::V4 => MarkSyntax::BareWide,
                Family::V6 => MarkSyntax::Bare,
            };
            nat.push((
                PRE,
                Rule::counted(
                    vec![
                        Expr::Addr(*f, Dst, Ne, lo(*f)),
                        Expr::Port(Proto::Tcp, Dst, Ne, ports::INBOUND_HBONE),
                        not_ztunnel(syntax),
                    ],
                    Stmt::Redirect(ports::INBOUND_PLAINTEXT),
                ),
            ));
        }
    }
    if cfg.dns_capture {
        nat.push((
            OUT,
            Rule::counted(
                vec![
                    Expr::Oifname(Ne, "lo".into()),
                    not_ztunnel(MarkSyntax::Bare),
                    Expr::Port(Proto::Udp, Dst, Eq, ports::DNS),
                ],
                Stmt::Redirect(ports::DNS_PROXY),
            ),
        ));
        for f in fams {
            nat.push((
                OUT,
                Rule::counted(
                    vec![
                        Expr::Addr(*f, Dst, Ne, lo(*f)),
                        Expr::Port(Proto::Tcp, Dst, Eq, ports::DNS),
                        not_ztunnel(MarkSyntax::Bare),
                    ],
                    Stmt::Redirect(ports::DNS_PROXY),
                ),
            ));
        }
    }
    nat.push((
        OUT,
        Rule::counted(
            vec![
                tcp(),
                Expr::Mark {
                    syntax: MarkSyntax::Bare,
                    mask: marks::INPOD_MASK,
                    cmp: Eq,
                    value: marks::INPOD_CONN_MARK,
                },
            ],
            Stmt::Accept,
        ),
    ));
    for f in fams {
        nat.push((
            OUT,
            Rule::counted(
                vec![
                    Expr::Oifname(Eq, "lo".into()),
                    Expr::Addr(*f, Dst, Ne, lo(*f)),
                ],
                Stmt::Accept,
            ),
        ));
    }
    for f in fams {
        nat.push((
            OUT,
            Rule::counted(
                vec![
                    tcp(),
                    Expr::Addr(*f, Dst, Ne, lo(*f)),
                    not_ztunnel(MarkSyntax::Bare),
                ],
                Stmt::Redirect(ports::OUTBOUND),
            ),
        ));
    }

    // mangle
    let mut mangle = vec![("prerouting", Rule::jump(PRE)), ("output", Rule::jump(OUT))];
    if !cfg.ipv6 {
        // IPv4-only enrolment: nothing captures IPv6, so it must not flow at all (it would
        // go around ztunnel). Loopback stays.
        let v6 = || Expr::NfProto(Family::V6);
        mangle.push((
            PRE,
            Rule::counted(vec![v6(), Expr::Iifname(Ne, "lo".into())], Stmt::Drop),
        ));
        mangle.push((
            OUT,
            Rule::counted(vec![v6(), Expr::Oifname(Ne, "lo".into())], Stmt::Drop),
        ));
    }
    mangle.extend([
        (
            PRE,
            Rule::counted(
                vec![Expr::Mark {
                    syntax: MarkSyntax::MetaAmp,
                    mask: marks::INPOD_MASK,
                    cmp: Eq,
                    value: marks::INPOD_MARK,
                }],
                Stmt::CtMarkSet {
                    mask: marks::INPOD_MASK,
                    value: marks::INPOD_CONN_MARK,
                },
            ),
        ),
        (
            OUT,
            Rule::counted(
                vec![Expr::CtMark(marks::INPOD_MASK, Eq, marks::INPOD_CONN_MARK)],
                Stmt::MetaMarkSetCtMark,
            ),
        ),
    ]);

    // raw
    let mut raw = Vec::new();
    if cfg.dns_capture {
        let zone = |dir, cmp| {
            Rule::counted(
                vec![
                    Expr::Port(Proto::Udp, dir, Eq, ports::DNS),
                    Expr::Mark {
                        syntax: MarkSyntax::MetaAnd,
                        mask: marks::INPOD_MASK,
                        cmp,
                        value: marks::INPOD_MARK,
                    },
                ],
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
            name: NFT_NAT_TABLE,
            chains: chains("nat", "nat", -100),
            rules: nat,
        },
        Table {
            name: NFT_MANGLE_TABLE,
            // `type route` on output: re-route after the mark is restored (§3.7).
            chains: chains("filter", "route", -150),
            rules: mangle,
        },
        Table {
            name: NFT_RAW_TABLE,
            chains: chains("filter", "filter", -300),
            rules: raw,
        },
    ]
}

/// The one atomic transaction that (re)writes the in-pod tables. Each table is added and
/// flushed first, so re-applying replaces everything (idempotent).
pub fn pod_transaction(cfg: &PodRedirectConfig) -> Transaction {
    let mut tx = Transaction::default();
    for t in pod_tables(cfg) {
        t.write_replace(&mut tx);
    }
    tx
}

/// Delete all three in-pod tables; `add table` first makes `delete` succeed when absent.
pub fn pod_delete_transaction() -> Transaction {
    let mut tx = Transaction::default();
    for t in [NFT_NAT_TABLE, NFT_MANGLE_TABLE, NFT_RAW_TABLE] {
        tx.push(Op::AddTable(t));
        tx.push(Op::DeleteTable(t));
    }
    tx
}

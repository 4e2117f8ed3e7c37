//! In-pod nftables tables (`spec/cni.md` §3.7).

use super::{ChainDecl, Cmp, Dir, Expr, Hook, MarkSyntax, Op, Rule, Stmt, Table, Transaction};
use crate::config::{Family, PodRedirectConfig};
use crate::consts::{
    DNS_CAPTURE_PORT, DNS_CT_ZONE, DNS_PORT, INPOD_CONN_MARK, INPOD_MARK, INPOD_MASK,
    NFT_MANGLE_TABLE, NFT_NAT_TABLE, NFT_RAW_TABLE, ZTUNNEL_INBOUND_HBONE_PORT,
    ZTUNNEL_INBOUND_PORT, ZTUNNEL_OUTBOUND_PORT,
};
use crate::iptables::{AddrSpec, Proto};

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
        mask: INPOD_MASK,
        cmp: Ne,
        value: INPOD_MARK,
    };
    let tcp = || Expr::L4Proto(Proto::Tcp);

    // nat
    let mut nat: Vec<(&'static str, Rule)> =
        vec![("output", Rule::jump(OUT)), ("prerouting", Rule::jump(PRE))];
    for iface in &cfg.virtual_interfaces {
        for stmt in [Stmt::Redirect(ZTUNNEL_OUTBOUND_PORT), Stmt::Return] {
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
                        Expr::Port(Proto::Tcp, Dst, Ne, ZTUNNEL_INBOUND_HBONE_PORT),
                        not_ztunnel(syntax),
                    ],
                    Stmt::Redirect(ZTUNNEL_INBOUND_PORT),
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
                    Expr::Port(Proto::Udp, Dst, Eq, DNS_PORT),
                ],
                Stmt::Redirect(DNS_CAPTURE_PORT),
            ),
        ));
        for f in fams {
            nat.push((
                OUT,
                Rule::counted(
                    vec![
                        Expr::Addr(*f, Dst, Ne, lo(*f)),
                        Expr::Port(Proto::Tcp, Dst, Eq, DNS_PORT),
                        not_ztunnel(MarkSyntax::Bare),
                    ],
                    Stmt::Redirect(DNS_CAPTURE_PORT),
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
                    mask: INPOD_MASK,
                    cmp: Eq,
                    value: INPOD_CONN_MARK,
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
                Stmt::Redirect(ZTUNNEL_OUTBOUND_PORT),
            ),
        ));
    }

    // mangle
    let mangle = vec![
        ("prerouting", Rule::jump(PRE)),
        ("output", Rule::jump(OUT)),
        (
            PRE,
            Rule::counted(
                vec![Expr::Mark {
                    syntax: MarkSyntax::MetaAmp,
                    mask: INPOD_MASK,
                    cmp: Eq,
                    value: INPOD_MARK,
                }],
                Stmt::CtMarkSet {
                    mask: INPOD_MASK,
                    value: INPOD_CONN_MARK,
                },
            ),
        ),
        (
            OUT,
            Rule::counted(
                vec![Expr::CtMark(INPOD_MASK, Eq, INPOD_CONN_MARK)],
                Stmt::MetaMarkSetCtMark,
            ),
        ),
    ];

    // raw
    let mut raw = Vec::new();
    if cfg.dns_capture {
        let zone = |dir, cmp| {
            Rule::counted(
                vec![
                    Expr::Port(Proto::Udp, dir, Eq, DNS_PORT),
                    Expr::Mark {
                        syntax: MarkSyntax::MetaAnd,
                        mask: INPOD_MASK,
                        cmp,
                        value: INPOD_MARK,
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

//! In-pod iptables rules (`spec/cni.md` §3.2, §3.3, §3.6).

use std::net::IpAddr;

use super::{
    AddrSpec, Chain, Match, Neg, PortsSpelling, Position, Proto, Rule, RuleSet, Table, Target,
    XtablesCmd,
};
use crate::config::{Family, PodRedirectConfig};
use crate::consts::{DNS_CT_ZONE, RESTORE_MASK};
use ambit_contract::{marks, ports};

/// The in-pod rules for one family, in upstream's restore order. IPv6 on an IPv4-only
/// configuration is [`ipv6_fence`].
pub fn pod_rules(cfg: &PodRedirectConfig, family: Family) -> RuleSet {
    use Chain::{IstioOutput as IOut, IstioPrert as IPre, Output, Prerouting};
    use Match as M;
    use Neg::{Is, Not};
    use Table::{Mangle, Nat, Raw};

    if family == Family::V6 && !cfg.ipv6 {
        return ipv6_fence();
    }

    let snat: IpAddr = match family {
        Family::V4 => cfg.probe_snat_v4.into(),
        Family::V6 => cfg.probe_snat_v6.into(),
    };
    let lo = AddrSpec::loopback(family);
    let not_ztunnel = || M::Mark(Not, marks::INPOD_MARK, marks::INPOD_MASK);
    let redirect = |port| Target::Redirect(port, PortsSpelling::Ports);
    let mut r = Vec::new();
    let mut add = |t, c, m, tg| r.push(Rule::append(t, c, m, tg));

    // mangle: remember that a connection came from ztunnel (mark 0x539 → connmark 0x111) and
    // restore it as fwmark on the app's replies so they route back to ztunnel (§3.5).
    add(Mangle, Prerouting, vec![], Target::Jump(IPre));
    add(Mangle, Output, vec![], Target::Jump(IOut));
    add(
        Mangle,
        IPre,
        vec![M::Mark(Is, marks::INPOD_MARK, marks::INPOD_MASK)],
        Target::ConnMarkSetXmark(marks::INPOD_CONN_MARK, marks::INPOD_MASK),
    );
    add(
        Mangle,
        IOut,
        vec![M::ConnMark(marks::INPOD_CONN_MARK, marks::INPOD_MASK)],
        Target::ConnMarkRestore {
            nfmask: RESTORE_MASK,
            ctmask: RESTORE_MASK,
        },
    );

    // nat: the capture itself.
    add(Nat, Output, vec![], Target::Jump(IOut));
    add(Nat, Prerouting, vec![], Target::Jump(IPre));
    for iface in &cfg.virtual_interfaces {
        let on_iface = || {
            vec![
                M::InIface(Is, iface.as_str().to_owned()),
                M::Proto(Proto::Tcp),
            ]
        };
        add(Nat, IPre, on_iface(), redirect(ports::OUTBOUND));
        add(Nat, IPre, on_iface(), Target::Return);
    }
    let tcp = || [M::Proto(Proto::Tcp), M::ProtoModule(Proto::Tcp)];
    if !cfg.ingress_mode {
        let mut m = vec![M::Source(Is, AddrSpec::Host(snat))];
        m.extend(tcp());
        add(Nat, IPre, m, Target::Accept);
    }
    let mut m = vec![M::Dest(Is, AddrSpec::Host(snat))];
    m.extend(tcp());
    add(Nat, IOut, m, Target::Accept);
    if !cfg.ingress_mode {
        add(
            Nat,
            IPre,
            vec![
                M::Dest(Not, lo),
                M::Proto(Proto::Tcp),
                M::Dport(Not, ports::INBOUND_HBONE),
                not_ztunnel(),
            ],
            redirect(ports::INBOUND_PLAINTEXT),
        );
    }
    if cfg.dns_capture {
        add(
            Nat,
            IOut,
            vec![
                M::OutIface(Not, "lo".into()),
                M::Proto(Proto::Udp),
                not_ztunnel(),
                M::ProtoModule(Proto::Udp),
                M::Dport(Is, ports::DNS),
            ],
            // Upstream spells this one `--to-port`; kept for byte-identical restore input.
            Target::Redirect(ports::DNS_PROXY, PortsSpelling::Port),
        );
        add(
            Nat,
            IOut,
            vec![
                M::Dest(Not, lo),
                M::Proto(Proto::Tcp),
                M::Dport(Is, ports::DNS),
                not_ztunnel(),
            ],
            redirect(ports::DNS_PROXY),
        );
    }
    add(
        Nat,
        IOut,
        vec![
            M::Proto(Proto::Tcp),
            M::Mark(Is, marks::INPOD_CONN_MARK, marks::INPOD_MASK),
        ],
        Target::Accept,
    );
    add(
        Nat,
        IOut,
        vec![M::Dest(Not, lo), M::OutIface(Is, "lo".into())],
        Target::Accept,
    );
    add(
        Nat,
        IOut,
        vec![M::Dest(Not, lo), M::Proto(Proto::Tcp), not_ztunnel()],
        redirect(ports::OUTBOUND),
    );

    // raw: ztunnel's own DNS upstream flows get their own conntrack zone so they do not clash
    // with the app's redirected DNS flow on the same tuple.
    if cfg.dns_capture {
        add(Raw, Prerouting, vec![], Target::Jump(IPre));
        add(Raw, Output, vec![], Target::Jump(IOut));
        add(
            Raw,
            IOut,
            vec![
                M::Proto(Proto::Udp),
                M::Mark(Is, marks::INPOD_MARK, marks::INPOD_MASK),
                M::ProtoModule(Proto::Udp),
                M::Dport(Is, ports::DNS),
            ],
            Target::CtZone(DNS_CT_ZONE),
        );
        add(
            Raw,
            IPre,
            vec![
                M::Proto(Proto::Udp),
                not_ztunnel(),
                M::ProtoModule(Proto::Udp),
                M::Sport(Is, ports::DNS),
            ],
            Target::CtZone(DNS_CT_ZONE),
        );
    }
    RuleSet { rules: r }
}

/// The `ip6tables` rules of an IPv4-only configuration (`AMBIENT_IPV6=false`): nothing
/// captures IPv6, so every IPv6 packet not on loopback is dropped (it would go around
/// ztunnel). In mangle (nat may not drop), in the usual ISTIO chains, so the usual delete
/// list removes it.
pub fn ipv6_fence() -> RuleSet {
    use Chain::{IstioOutput, IstioPrert, Output, Prerouting};
    let lo = || "lo".to_owned();
    let rules = vec![
        Rule::append(Table::Mangle, Prerouting, vec![], Target::Jump(IstioPrert)),
        Rule::append(Table::Mangle, Output, vec![], Target::Jump(IstioOutput)),
        Rule::append(
            Table::Mangle,
            IstioPrert,
            vec![Match::InIface(Neg::Not, lo())],
            Target::Drop,
        ),
        Rule::append(
            Table::Mangle,
            IstioOutput,
            vec![Match::OutIface(Neg::Not, lo())],
            Target::Drop,
        ),
    ];
    RuleSet { rules }
}

/// Upstream's un-enrol delete list for one family (§3.6), in order. Every command may fail
/// (the rule or chain may be absent); callers ignore non-zero exits.
pub fn pod_delete_commands(family: Family) -> Vec<XtablesCmd> {
    let mut v: Vec<XtablesCmd> = [
        ("mangle", "PREROUTING", "ISTIO_PRERT"),
        ("mangle", "OUTPUT", "ISTIO_OUTPUT"),
        ("nat", "OUTPUT", "ISTIO_OUTPUT"),
        ("raw", "PREROUTING", "ISTIO_PRERT"),
        ("raw", "OUTPUT", "ISTIO_OUTPUT"),
        ("nat", "PREROUTING", "ISTIO_PRERT"),
    ]
    .into_iter()
    .map(|(t, c, j)| XtablesCmd::new(family, &["-t", t, "-D", c, "-j", j]))
    .collect();
    for op in ["-F", "-X"] {
        for table in ["mangle", "nat", "raw"] {
            for chain in ["ISTIO_PRERT", "ISTIO_OUTPUT"] {
                v.push(XtablesCmd::new(family, &["-t", table, op, chain]));
            }
        }
    }
    v
}

/// Reconcile guardrails (§3.6): drop all TCP/UDP while rules are rebuilt, so the pod fails
/// closed instead of leaking uncaptured traffic during the gap.
pub fn guardrail_rules() -> Vec<Rule> {
    let mut v = Vec::new();
    for chain in [Chain::Input, Chain::Forward, Chain::Output] {
        for proto in [Proto::Tcp, Proto::Udp] {
            v.push(Rule {
                table: Table::Filter,
                chain,
                position: Position::Insert(1),
                matches: vec![Match::Proto(proto)],
                target: Target::Drop,
            });
        }
    }
    v
}

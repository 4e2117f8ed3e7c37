//! The VM's iptables rules ([`super`]).

use super::{InboundCapture, OutboundCapture, VmRedirectConfig};
use crate::config::Family;
use crate::consts::DNS_CT_ZONE;
use crate::iptables::{
    AddrSpec, Chain, Match, Neg, PortsSpelling, Proto, Rule, RuleSet, Table, Target, XtablesCmd,
};
use ambit_contract::{marks, ports};

/// The VM rules for one family, in restore order.
pub fn vm_rules(cfg: &VmRedirectConfig, family: Family) -> RuleSet {
    use Chain::{IstioVmOutput as Out, IstioVmPrert as Pre, Output, Prerouting};
    use Match as M;
    use Neg::{Is, Not};
    use Table::{Nat, Raw};

    let lo = AddrSpec::loopback(family);
    let ztunnel = |n| M::Mark(n, marks::INPOD_MARK, marks::INPOD_MASK);
    let redirect = |port| Target::Redirect(port, PortsSpelling::Ports);
    let tcp_port = |p| [M::Proto(Proto::Tcp), M::Dport(Is, p)];
    let mut r = Vec::new();
    let mut add = |t, c, m: Vec<Match>, tg| r.push(Rule::append(t, c, m, tg));

    // Inbound: HBONE is delivered to ztunnel's 15008 listener as is; the rest of TCP to 15006.
    add(Nat, Prerouting, vec![], Target::Jump(Pre));
    for iface in &cfg.exclude_interfaces {
        add(
            Nat,
            Pre,
            vec![M::InIface(Is, iface.to_string())],
            Target::Return,
        );
    }
    add(
        Nat,
        Pre,
        tcp_port(ports::INBOUND_HBONE).to_vec(),
        Target::Return,
    );
    let to_inbound = |port: Option<u16>| {
        let mut m = vec![M::Dest(Not, lo), M::Proto(Proto::Tcp)];
        m.extend(port.map(|p| M::Dport(Is, p)));
        m.push(ztunnel(Not));
        m
    };
    match &cfg.inbound {
        InboundCapture::All { except } => {
            for p in except {
                add(Nat, Pre, tcp_port(*p).to_vec(), Target::Return);
            }
            add(
                Nat,
                Pre,
                to_inbound(None),
                redirect(ports::INBOUND_PLAINTEXT),
            );
        }
        InboundCapture::Ports(list) => {
            for p in list {
                add(
                    Nat,
                    Pre,
                    to_inbound(Some(*p)),
                    redirect(ports::INBOUND_PLAINTEXT),
                );
            }
        }
        InboundCapture::None => {}
    }

    // Outbound: ztunnel's own sockets first, then DNS, then what stays local or excluded.
    add(Nat, Output, vec![], Target::Jump(Out));
    for iface in &cfg.exclude_interfaces {
        add(
            Nat,
            Out,
            vec![M::OutIface(Is, iface.to_string())],
            Target::Return,
        );
    }
    add(Nat, Out, vec![ztunnel(Is)], Target::Return);
    if cfg.dns_capture {
        add(
            Nat,
            Out,
            vec![
                M::OutIface(Not, "lo".into()),
                M::Proto(Proto::Udp),
                M::ProtoModule(Proto::Udp),
                M::Dport(Is, ports::DNS),
            ],
            redirect(ports::DNS_PROXY),
        );
        add(
            Nat,
            Out,
            vec![
                M::Dest(Not, lo),
                M::Proto(Proto::Tcp),
                M::Dport(Is, ports::DNS),
            ],
            redirect(ports::DNS_PROXY),
        );
    }
    add(Nat, Out, vec![M::OutIface(Is, "lo".into())], Target::Return);
    for c in cfg
        .outbound_exclude_cidrs
        .iter()
        .filter(|c| c.family() == family)
    {
        add(Nat, Out, vec![M::Dest(Is, c.spec())], Target::Return);
    }
    for p in &cfg.outbound_exclude_ports {
        add(Nat, Out, tcp_port(*p).to_vec(), Target::Return);
    }
    match &cfg.outbound {
        OutboundCapture::All => {
            add(
                Nat,
                Out,
                vec![M::Proto(Proto::Tcp)],
                redirect(ports::OUTBOUND),
            );
        }
        OutboundCapture::Cidrs(list) => {
            for c in list.iter().filter(|c| c.family() == family) {
                add(
                    Nat,
                    Out,
                    vec![M::Dest(Is, c.spec()), M::Proto(Proto::Tcp)],
                    redirect(ports::OUTBOUND),
                );
            }
        }
        OutboundCapture::None => {}
    }

    // raw: ztunnel's DNS upstream flows in their own conntrack zone, as in the pod rules.
    if cfg.dns_capture {
        add(Raw, Prerouting, vec![], Target::Jump(Pre));
        add(Raw, Output, vec![], Target::Jump(Out));
        add(
            Raw,
            Out,
            vec![
                M::Proto(Proto::Udp),
                ztunnel(Is),
                M::ProtoModule(Proto::Udp),
                M::Dport(Is, ports::DNS),
            ],
            Target::CtZone(DNS_CT_ZONE),
        );
        add(
            Raw,
            Pre,
            vec![
                M::Proto(Proto::Udp),
                ztunnel(Not),
                M::ProtoModule(Proto::Udp),
                M::Sport(Is, ports::DNS),
            ],
            Target::CtZone(DNS_CT_ZONE),
        );
    }
    RuleSet { rules: r }
}

/// The jumps into the VM chains, then flush and delete of the chains, for one family. Every
/// command may fail (the object may be absent).
pub fn vm_delete_commands(family: Family) -> Vec<XtablesCmd> {
    let mut v: Vec<XtablesCmd> = [
        ("nat", "PREROUTING", "ISTIO_VM_PRERT"),
        ("nat", "OUTPUT", "ISTIO_VM_OUTPUT"),
        ("raw", "PREROUTING", "ISTIO_VM_PRERT"),
        ("raw", "OUTPUT", "ISTIO_VM_OUTPUT"),
    ]
    .into_iter()
    .map(|(t, c, j)| XtablesCmd::new(family, &["-t", t, "-D", c, "-j", j]))
    .collect();
    for op in ["-F", "-X"] {
        for table in ["nat", "raw"] {
            for chain in ["ISTIO_VM_PRERT", "ISTIO_VM_OUTPUT"] {
                v.push(XtablesCmd::new(family, &["-t", table, op, chain]));
            }
        }
    }
    v
}

//! Host-netns iptables rules: SNAT of kubelet probes to enrolled pods (`spec/cni.md` §3.8).

use std::net::IpAddr;

use super::{Chain, Match, Position, Proto, Rule, RuleSet, Table, Target, XtablesCmd};
use crate::config::{Family, HostRulesConfig};
use crate::consts::{PROBE_SET_V4, PROBE_SET_V6};

/// The host rules for one family.
pub fn host_rules(cfg: &HostRulesConfig, family: Family) -> RuleSet {
    let (set, snat): (&'static str, IpAddr) = match family {
        Family::V4 => (PROBE_SET_V4, cfg.probe_snat_v4.into()),
        Family::V6 => (PROBE_SET_V6, cfg.probe_snat_v6.into()),
    };
    RuleSet {
        rules: vec![
            // Inserted first so no other POSTROUTING rule (e.g. a CNI masquerade) sees the
            // probe before it is SNATed.
            Rule {
                table: Table::Nat,
                chain: Chain::Postrouting,
                position: Position::Insert(1),
                matches: vec![],
                target: Target::Jump(Chain::IstioPostrt),
            },
            Rule::append(
                Table::Nat,
                Chain::IstioPostrt,
                vec![
                    Match::SocketExists,
                    Match::Proto(Proto::Tcp),
                    Match::SetDst(set),
                ],
                Target::Snat(snat),
            ),
        ],
    }
}

/// Host rule deletion for one family: `-D POSTROUTING -j ISTIO_POSTRT`, `-F`, `-X`.
pub fn host_delete_commands(family: Family) -> Vec<XtablesCmd> {
    [
        &["-t", "nat", "-D", "POSTROUTING", "-j", "ISTIO_POSTRT"][..],
        &["-t", "nat", "-F", "ISTIO_POSTRT"],
        &["-t", "nat", "-X", "ISTIO_POSTRT"],
    ]
    .into_iter()
    .map(|a| XtablesCmd::new(family, a))
    .collect()
}

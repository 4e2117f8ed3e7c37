//! Host-netns nftables rules and probe sets (`spec/cni.md` §3.9).

use super::{ChainDecl, Dir, Expr, Hook, Op, Rule, Stmt, Table, Transaction};
use crate::config::{Family, HostRulesConfig};
use crate::consts::{NFT_NAT_TABLE, PROBE_SET_V4, PROBE_SET_V6};
use crate::iptables::Proto;

/// The host SNAT table. Unlike iptables (any local socket), only the kubelet's UID matches.
pub fn host_table(cfg: &HostRulesConfig) -> Table {
    let rules = cfg
        .families()
        .iter()
        .map(|f| {
            let (set, snat) = match f {
                Family::V4 => (PROBE_SET_V4, cfg.probe_snat_v4.into()),
                Family::V6 => (PROBE_SET_V6, cfg.probe_snat_v6.into()),
            };
            (
                "postrouting",
                Rule::counted(
                    vec![
                        Expr::L4Proto(Proto::Tcp),
                        Expr::SkUid(cfg.kubelet_uid),
                        Expr::AddrInSet(*f, Dir::Dst, set),
                    ],
                    Stmt::Snat(snat),
                ),
            )
        })
        .collect();
    Table {
        name: NFT_NAT_TABLE,
        chains: vec![ChainDecl {
            name: "postrouting",
            hook: Some(Hook {
                kind: "nat",
                hook: "postrouting",
                priority: 100,
            }),
        }],
        rules,
    }
}

/// The host rule transaction: add + flush the table (sets and their elements survive a
/// `flush table`), then the chain and rules.
pub fn host_transaction(cfg: &HostRulesConfig) -> Transaction {
    let mut tx = Transaction::default();
    host_table(cfg).write_replace(&mut tx);
    tx
}

/// Host rule removal at shutdown: flush the table's chains, keep the probe sets.
pub fn host_flush_transaction() -> Transaction {
    Transaction {
        ops: vec![Op::AddTable(NFT_NAT_TABLE), Op::FlushTable(NFT_NAT_TABLE)],
    }
}

/// The set manager's startup transaction: the table and the probe sets.
pub fn probe_sets_transaction(ipv6: bool) -> Transaction {
    let mut tx = Transaction {
        ops: vec![
            Op::AddTable(NFT_NAT_TABLE),
            Op::AddSet(NFT_NAT_TABLE, PROBE_SET_V4, Family::V4),
        ],
    };
    if ipv6 {
        tx.push(Op::AddSet(NFT_NAT_TABLE, PROBE_SET_V6, Family::V6));
    }
    tx
}

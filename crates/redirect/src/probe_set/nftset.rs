//! nft-backed probe sets in `inet istio-ambient-nat`.

use std::net::IpAddr;

use super::{ProbeSetError, step};
use crate::consts::NFT_NAT_TABLE;
use crate::nft::list::ListedTable;
use crate::nft::{Op, Transaction, probe_sets_transaction};
use crate::runner::{Cmd, NetnsRunner};

fn run_tx(r: &dyn NetnsRunner, tx: &Transaction, what: &'static str) -> Result<(), ProbeSetError> {
    r.run_ok(&Cmd::new(["nft", "-f", "-"]).with_stdin(tx.render()))
        .map_err(step(what))?;
    Ok(())
}

pub(super) fn ensure(r: &dyn NetnsRunner, ipv6: bool) -> Result<(), ProbeSetError> {
    run_tx(r, &probe_sets_transaction(ipv6), "create")
}

pub(super) fn flush(r: &dyn NetnsRunner, set: &'static str) -> Result<(), ProbeSetError> {
    run_tx(
        r,
        &Transaction {
            ops: vec![Op::FlushSet(NFT_NAT_TABLE, set)],
        },
        "flush",
    )
}

pub(super) fn upsert(
    r: &dyn NetnsRunner,
    set: &'static str,
    ip: IpAddr,
    uid: &str,
    current: Option<&str>,
) -> Result<(), ProbeSetError> {
    let mut tx = Transaction::default();
    match current {
        Some(owner) if owner == uid => return Ok(()),
        // nft keeps the old comment on `add element` of an existing element; replace it by
        // delete + add in one atomic transaction (no window without the entry).
        Some(_) => tx.push(Op::DeleteElement(NFT_NAT_TABLE, set, ip)),
        None => {}
    }
    tx.push(Op::AddElement(NFT_NAT_TABLE, set, ip, uid.to_owned()));
    run_tx(r, &tx, "add element")
}

pub(super) fn delete(
    r: &dyn NetnsRunner,
    set: &'static str,
    ip: IpAddr,
) -> Result<(), ProbeSetError> {
    run_tx(
        r,
        &Transaction {
            ops: vec![Op::DeleteElement(NFT_NAT_TABLE, set, ip)],
        },
        "delete element",
    )
}

pub(super) fn list(r: &dyn NetnsRunner, set: &str) -> Result<Vec<(IpAddr, String)>, ProbeSetError> {
    let out = r
        .run_ok(&Cmd::new([
            "nft",
            "list",
            "set",
            "inet",
            NFT_NAT_TABLE,
            set,
        ]))
        .map_err(step("list"))?;
    let t = ListedTable::parse(&out.stdout);
    Ok(t.set(set)
        .unwrap_or_default()
        .iter()
        .map(|e| (e.addr, e.comment.clone().unwrap_or_default()))
        .collect())
}

pub(super) fn destroy(r: &dyn NetnsRunner) -> Result<(), ProbeSetError> {
    run_tx(
        r,
        &Transaction {
            ops: vec![Op::AddTable(NFT_NAT_TABLE), Op::DeleteTable(NFT_NAT_TABLE)],
        },
        "destroy",
    )
}

//! Beyond upstream — no silent bypass: the verification pass checks every enrolled pod
//! (its rules against the plan, and that ztunnel listens on 15001/15006/15008 in its
//! netns), repairs what is missing (re-apply rules; `Del`+`Add` to ztunnel so it really
//! restarts the pod's proxies — a plain re-`Add` of the same netns is a no-op in ztunnel)
//! and exports how many pods stayed unprotected.
//!
//! A pass over an unchanged pod starts no process: the rules are checked with
//! [`InPod::verify_in`] (in-process kernel reads, rule tools only for rules unlike any
//! they already judged) and the listeners from a `sock_diag` dump on a thread in the pod's
//! netns.

use std::collections::HashSet;
use std::sync::Arc;

use ambit_netns::{NetnsFd, run_in_netns_thread};
use ambit_redirect::{InPod, VerifyMemo};

use ambit_redirect::FdRunner;

/// Ports ztunnel must listen on inside an enrolled pod's netns.
pub const REQUIRED_PORTS: [u16; 3] = ambit_contract::ports::INPOD_LISTENERS;

/// TCP ports in LISTEN state in `netns`, from a `sock_diag` dump of its listeners on a
/// thread inside it; where that cannot be had (no `tcp_diag` in the kernel), from
/// `/proc/thread-self/net/tcp{,6}` (`/proc/net` would show the main thread's namespace),
/// which costs a walk of the host's whole established-connection hash per read.
pub fn listening_ports(netns: &NetnsFd) -> std::io::Result<HashSet<u16>> {
    run_in_netns_thread(netns, || match ambit_redirect::listening_tcp_ports() {
        Ok(ports) => Ok(ports),
        Err(e) => {
            tracing::debug!(error = %e, "sock_diag listener dump failed; reading /proc");
            proc_listening_ports()
        }
    })
    .map_err(std::io::Error::other)?
}

/// [`listening_ports`] from `/proc`, on a thread already in the namespace.
fn proc_listening_ports() -> std::io::Result<HashSet<u16>> {
    let mut ports = HashSet::new();
    for file in ["/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"] {
        let text = match std::fs::read_to_string(file) {
            Ok(t) => t,
            // tcp6 is absent when IPv6 is disabled.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        ports.extend(parse_listeners(&text));
    }
    Ok(ports)
}

/// Local ports of LISTEN (`0A`) sockets in a `/proc/net/tcp` table.
pub fn parse_listeners(text: &str) -> impl Iterator<Item = u16> + '_ {
    text.lines().skip(1).filter_map(|line| {
        let mut cols = line.split_whitespace();
        let local = cols.nth(1)?;
        let state = cols.nth(1)?;
        if state != "0A" {
            return None;
        }
        let port = local.rsplit_once(':')?.1;
        u16::from_str_radix(port, 16).ok()
    })
}

/// Whether ztunnel's ports are all listening.
pub fn ztunnel_listening(netns: &NetnsFd) -> bool {
    listening_ports(netns).is_ok_and(|p| REQUIRED_PORTS.iter().all(|r| p.contains(r)))
}

/// Runs `InPod::verify_in` (in-process reads; rule tools only for rules that read unlike
/// every ruleset `verdicts` holds their verdict on); `true` when nothing planned is
/// missing.
pub async fn rules_present(
    inpod: &InPod,
    netns: &Arc<NetnsFd>,
    verdicts: &Arc<VerifyMemo>,
) -> bool {
    let (inpod, netns, verdicts) = (inpod.clone(), netns.clone(), verdicts.clone());
    tokio::task::spawn_blocking(move || {
        let runner = FdRunner {
            netns: netns.clone(),
        };
        inpod.verify_in(&netns, &runner, &verdicts)
    })
    .await
    .ok()
    .and_then(Result::ok)
    .is_some_and(|r| r.missing().next().is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_tcp() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 00000000:3A99 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n   1: 0100007F:3A9E 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2\n   2: 0500000A:3AA0 0600000A:1F90 01 00000000:00000000 00:00000000 00000000     0        0 3\n";
        let ports: Vec<u16> = parse_listeners(text).collect();
        assert_eq!(ports, vec![15001, 15006]);
    }
}

//! Beyond upstream — no silent bypass: the verification pass checks every enrolled pod
//! (its rules against the plan, and that ztunnel listens on 15001/15006/15008 in its
//! netns), repairs what is missing (re-apply rules; `Del`+`Add` to ztunnel so it really
//! restarts the pod's proxies — a plain re-`Add` of the same netns is a no-op in ztunnel)
//! and exports how many pods stayed unprotected.
//!
//! A pass over an unchanged pod starts no process and no thread: one blocking task visits
//! every pod ([`check_pod`]), entering each pod's netns once for all its reads: the rules
//! with [`InPod::verify_here`] (in-process kernel reads, not even those when the pod's
//! nf_tables generation has not moved since its last clean visit, rule tools only for rules
//! unlike any they already judged), the standby guard table over the guard's socket, and
//! the listeners by `sock_diag` lookups of ztunnel's ports at loopback and the pod's
//! addresses (one hash bucket each, where a dump walks the host-wide listening hash).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ambit_netns::{NetnsFd, in_netns, run_in_netns_thread};
use ambit_redirect::{InPod, RulesMark, VerifyMemo};

use super::SharedGuard;

use ambit_redirect::FdRunner;

/// Ports ztunnel must listen on inside an enrolled pod's netns.
pub const REQUIRED_PORTS: [u16; 3] = ambit_contract::ports::INPOD_LISTENERS;

/// TCP ports in LISTEN state in `netns`, from a `sock_diag` dump of its listeners on a
/// thread inside it; where that cannot be had (no `tcp_diag` in the kernel), from
/// `/proc/thread-self/net/tcp{,6}` (`/proc/net` would show the main thread's namespace),
/// which costs a walk of the host's whole established-connection hash per read.
pub fn listening_ports(netns: &NetnsFd) -> std::io::Result<HashSet<u16>> {
    run_in_netns_thread(netns, listening_ports_here).map_err(std::io::Error::other)?
}

/// [`listening_ports`] of the calling thread's namespace.
fn listening_ports_here() -> std::io::Result<HashSet<u16>> {
    match ambit_redirect::listening_tcp_ports() {
        Ok(ports) => Ok(ports),
        Err(e) => {
            tracing::debug!(error = %e, "sock_diag listener dump failed; reading /proc");
            proc_listening_ports()
        }
    }
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
    listening_ports(netns).is_ok_and(|p| all_required(&p))
}

fn all_required(ports: &HashSet<u16>) -> bool {
    REQUIRED_PORTS.iter().all(|r| ports.contains(r))
}

/// What one visit to an enrolled pod found; the pod needs a repair unless all hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodCheck {
    /// Its standby guard table matches the owned one (or it has no guard).
    pub standby_ok: bool,
    /// Nothing planned is missing from its rules and routing.
    pub rules_ok: bool,
    /// ztunnel listens on its ports in the pod (or was never acked for it).
    pub listening: bool,
    /// Its nf_tables state was the one of its last clean check: rules not read again.
    pub unchanged: bool,
}

impl PodCheck {
    /// Whether the pod is protected as planned.
    pub fn ok(&self) -> bool {
        self.standby_ok && self.rules_ok && self.listening
    }
}

/// Whether ztunnel's ports are all listening in the calling thread's namespace, for a
/// connection to loopback or to one of the pod's `ips` (what the redirection sends there):
/// by the kernel's listener lookup, else (a kernel whose `sock_diag` cannot look up) from a
/// dump.
fn listening_here(ips: &[IpAddr]) -> bool {
    let mut addrs = vec![
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ];
    addrs.extend(ips);
    match ambit_redirect::tcp_listeners_at(&REQUIRED_PORTS, &addrs) {
        Ok(all) => all,
        Err(e) => {
            tracing::debug!(error = %e, "sock_diag listener lookup failed; dumping");
            listening_ports_here().is_ok_and(|p| all_required(&p))
        }
    }
}

/// One enrolled pod to check: what the pass copied out of its slot.
#[derive(Debug, Clone)]
pub struct Enrolled {
    pub netns: Arc<NetnsFd>,
    /// Its addresses.
    pub ips: Vec<IpAddr>,
    pub inpod: InPod,
    /// ztunnel acked its last `Add` (so it must listen there).
    pub acked: bool,
    pub guard: Option<SharedGuard>,
    pub mark: Arc<RulesMark>,
}

/// Checks one enrolled pod, on the calling thread, which is moved into the pod's netns
/// for all of the pod's reads and back (a blocking-pool thread: nothing async runs on it
/// meanwhile). Entering the namespace failing counts as everything missing: the repair
/// path looks again.
pub fn check_pod(uid: &str, pod: &Enrolled, verdicts: &VerifyMemo) -> PodCheck {
    let runner = FdRunner {
        netns: pod.netns.clone(),
    };
    let visit = in_netns(&pod.netns, || {
        let rules = inpod_rules(uid, pod, &runner, verdicts);
        let standby_ok = match (&pod.guard, rules) {
            // Its tables are in the unchanged nf_tables state the mark was set at, when
            // the standby table was found intact (else the mark was cleared).
            (None, _) | (Some(_), Rules::Unchanged) => true,
            (Some(guard), _) => standby_here(uid, guard, &pod.mark),
        };
        PodCheck {
            standby_ok,
            rules_ok: rules != Rules::Missing,
            listening: !pod.acked || listening_here(&pod.ips),
            unchanged: rules == Rules::Unchanged,
        }
    });
    visit.unwrap_or_else(|e| {
        tracing::warn!(uid, error = %e, "cannot enter an enrolled pod's netns to verify it");
        PodCheck {
            standby_ok: false,
            rules_ok: false,
            listening: false,
            unchanged: false,
        }
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rules {
    Complete,
    /// Complete, and not read again: the nf_tables state is the marked one.
    Unchanged,
    Missing,
}

fn inpod_rules(uid: &str, pod: &Enrolled, runner: &FdRunner, verdicts: &VerifyMemo) -> Rules {
    match pod.inpod.verify_here(runner, verdicts, &pod.mark) {
        Ok(v) if v.report.missing().next().is_some() => Rules::Missing,
        Ok(v) if v.unchanged => Rules::Unchanged,
        Ok(_) => Rules::Complete,
        Err(e) => {
            tracing::debug!(uid, error = %e, "verifying a pod's rules failed");
            Rules::Missing
        }
    }
}

/// Whether the standby guard table still matches the owned one; a read that fails counts
/// as intact (the owned table guards; the next pass reads again, the mark is cleared for
/// that): logged.
fn standby_here(uid: &str, guard: &SharedGuard, mark: &RulesMark) -> bool {
    let read = guard
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .standby_intact();
    match read {
        Ok(true) => true,
        Ok(false) => {
            mark.clear();
            false
        }
        Err(e) => {
            mark.clear();
            tracing::warn!(uid, error = %e, "cannot read the standby guard table");
            true
        }
    }
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

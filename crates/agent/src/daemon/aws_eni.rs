//! AWS VPC CNI branch-ENI pods (`spec/cni.md` §3.11, `AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`).
//!
//! With Security Groups for Pods, aws-vpc-cni gives a pod a branch ENI: its /32 (/128)
//! host route lives in a per-pod table instead of `main`, and an `iif <veth> lookup <table>`
//! rule sends everything the pod sends out through the VPC fabric. Kubelet probes, which
//! the host rules SNAT to the link-local probe address, would then be answered into the
//! VPC and lost. For such a pod the agent adds, on the host:
//!
//! - `to <podIP>/32 lookup <table> pref 512`: host-originated traffic to the pod takes the
//!   veth (512 is the preference aws-vpc-cni uses for regular pods' `to` rules);
//! - `iif <veth> lookup 255 pref <iif pref - 1>`: replies from the pod are delivered
//!   locally before aws-vpc-cni's `iif` rule can route them away.
//!
//! Only when the host has `net.ipv4.tcp_early_demux=0`, which AWS requires on every node
//! running Security Groups for Pods (the kernel default is 1): anywhere else this module
//! does nothing, not even a rule listing. Detection looks for a non-main table holding a
//! host route to the pod whose device is the `iif` of a rule pointing at that table.
//!
//! The rules added are remembered by pod IP in an in-memory cache (per host netns) and
//! removed on un-enrolment and pod deletion ([`on_remove`]) and on an uninstall
//! ([`remove_all`]), as upstream does; after an agent restart the cache is empty, so rules
//! of pods enrolled before are left (upstream too).
//! Everything runs through `ip` in the host netns; errors are logged by the caller and
//! never fail an enrolment (probes are a liveness aid, not a security boundary).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard, OnceLock};

use ambit_netns::NetnsId;
use ambit_redirect::{Cmd, NetnsRunner};

use ambit_redirect::HostRunner;
use serde::Deserialize;

/// Preference of the forward (`to <podIP>`) rule.
pub const FORWARD_PREF: u32 = 512;
/// The `local` routing table.
const LOCAL_TABLE: u32 = 255;

/// What detection found for one pod IP: aws-vpc-cni's table, veth and `iif` rule
/// preference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchEniRoute {
    /// The pod IP.
    pub ip: IpAddr,
    /// The pod's routing table.
    pub table: u32,
    /// The host-side veth (the route's device and the `iif` rule's interface).
    pub veth: String,
    /// Preference of aws-vpc-cni's `iif <veth> lookup <table>` rule.
    pub iif_pref: u32,
}

impl BranchEniRoute {
    /// Preference of our return (`iif <veth> lookup local`) rule: just before aws-vpc-cni's.
    pub fn return_pref(&self) -> u32 {
        self.iif_pref.saturating_sub(1)
    }
}

/// A failed `ip` invocation or unreadable output.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {reason}")]
pub struct EniError {
    /// What was attempted.
    pub what: String,
    /// Why it failed.
    pub reason: String,
}

fn family(ip: &IpAddr) -> &'static str {
    if ip.is_ipv4() { "-4" } else { "-6" }
}

fn host_prefix(ip: &IpAddr) -> String {
    let bits = if ip.is_ipv4() { 32 } else { 128 };
    format!("{ip}/{bits}")
}

fn run<R: NetnsRunner + ?Sized>(runner: &R, argv: &[&str]) -> Result<String, EniError> {
    let cmd = Cmd::new(argv.iter().copied());
    let out = runner.run(&cmd).map_err(|e| EniError {
        what: argv.join(" "),
        reason: e.to_string(),
    })?;
    if out.success() {
        Ok(out.stdout)
    } else {
        Err(EniError {
            what: argv.join(" "),
            reason: format!("exit {:?}: {}", out.code, out.stderr.trim()),
        })
    }
}

/// Whether the runner's netns has `net.ipv4.tcp_early_demux=0` (the gate). Unreadable
/// counts as the kernel default (enabled), as upstream does.
pub fn early_demux_disabled<R: NetnsRunner + ?Sized>(runner: &R) -> bool {
    // /proc/sys/net shows the namespace of the process reading it: the child runs in the
    // runner's netns.
    match run(runner, &["cat", "/proc/sys/net/ipv4/tcp_early_demux"]) {
        Ok(v) => v.trim() == "0",
        Err(e) => {
            tracing::debug!(error = %e, "cannot read tcp_early_demux; assuming enabled");
            false
        }
    }
}

#[derive(Debug, Deserialize)]
struct RuleJson {
    #[serde(default)]
    priority: Option<u32>,
    #[serde(default)]
    iif: Option<String>,
    #[serde(default)]
    table: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RouteJson {
    #[serde(default)]
    dst: Option<String>,
    #[serde(default)]
    dev: Option<String>,
}

fn parse_json<T: for<'de> Deserialize<'de>>(what: &str, text: &str) -> Result<Vec<T>, EniError> {
    // `ip -j` prints nothing at all for an empty table on some versions.
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_str(text).map_err(|e| EniError {
        what: what.to_owned(),
        reason: format!("unexpected JSON: {e}"),
    })
}

/// `iif` rules pointing at non-main tables: (table, veth, preference).
fn iif_rules(rules_json: &str) -> Result<Vec<(u32, String, u32)>, EniError> {
    let rules: Vec<RuleJson> = parse_json("ip rule show", rules_json)?;
    Ok(rules
        .into_iter()
        .filter_map(|r| {
            let table: u32 = r.table?.parse().ok()?;
            let iif = r.iif.filter(|i| !i.is_empty())?;
            (table != 0 && !(253..=255).contains(&table)).then_some((table, iif, r.priority?))
        })
        .collect())
}

/// The device of a host route to `ip` in a route listing, if any.
fn host_route_dev(routes_json: &str, ip: &IpAddr) -> Result<Option<String>, EniError> {
    let routes: Vec<RouteJson> = parse_json("ip route show table", routes_json)?;
    let full = host_prefix(ip);
    Ok(routes.into_iter().find_map(|r| {
        let dst = r.dst?;
        // A host route prints without its prefix length; other prefixes never match.
        let is_host = dst.parse::<IpAddr>().is_ok_and(|d| d == *ip) || dst == full;
        is_host.then_some(r.dev).flatten()
    }))
}

/// Looks for aws-vpc-cni's branch-ENI setup for `ip` (no gate check: see
/// [`early_demux_disabled`]).
pub fn detect<R: NetnsRunner + ?Sized>(
    runner: &R,
    ip: IpAddr,
) -> Result<Option<BranchEniRoute>, EniError> {
    let rules = run(runner, &["ip", "-N", "-j", family(&ip), "rule", "show"])?;
    let rules = iif_rules(&rules)?;
    let mut tables: Vec<u32> = rules.iter().map(|(t, _, _)| *t).collect();
    tables.sort_unstable();
    tables.dedup();
    for table in tables {
        let t = table.to_string();
        let routes = run(
            runner,
            &["ip", "-j", family(&ip), "route", "show", "table", &t],
        )?;
        let Some(dev) = host_route_dev(&routes, &ip)? else {
            continue;
        };
        if let Some((_, veth, pref)) = rules.iter().find(|(rt, i, _)| *rt == table && *i == dev) {
            return Ok(Some(BranchEniRoute {
                ip,
                table,
                veth: veth.clone(),
                iif_pref: *pref,
            }));
        }
    }
    Ok(None)
}

fn exists(e: &EniError) -> bool {
    e.reason.contains("File exists")
}

/// Adds the two host rules for `route`; an existing identical rule is fine. When the
/// return rule fails, a forward rule added here is taken back.
pub fn add_rules<R: NetnsRunner + ?Sized>(
    runner: &R,
    route: &BranchEniRoute,
) -> Result<(), EniError> {
    let fam = family(&route.ip);
    let (to, table, pref) = (
        host_prefix(&route.ip),
        route.table.to_string(),
        FORWARD_PREF.to_string(),
    );
    let forward = [
        "ip", fam, "rule", "add", "to", &to, "lookup", &table, "pref", &pref,
    ];
    let added = match run(runner, &forward) {
        Ok(_) => true,
        Err(e) if exists(&e) => false,
        Err(e) => return Err(e),
    };
    let (local, ret_pref) = (LOCAL_TABLE.to_string(), route.return_pref().to_string());
    let ret = [
        "ip",
        fam,
        "rule",
        "add",
        "iif",
        &route.veth,
        "lookup",
        &local,
        "pref",
        &ret_pref,
    ];
    match run(runner, &ret) {
        Ok(_) => Ok(()),
        Err(e) if exists(&e) => Ok(()),
        Err(e) => {
            if added {
                let mut undo = forward;
                undo[3] = "del";
                if let Err(u) = run(runner, &undo) {
                    tracing::warn!(error = %u, "cannot take back the branch-ENI forward rule");
                }
            }
            Err(e)
        }
    }
}

/// Removes the two host rules for `route`; rules already gone are not an error. Both are
/// attempted; the first failure is returned.
pub fn del_rules<R: NetnsRunner + ?Sized>(
    runner: &R,
    route: &BranchEniRoute,
) -> Result<(), EniError> {
    let fam = family(&route.ip);
    let (to, table, pref) = (
        host_prefix(&route.ip),
        route.table.to_string(),
        FORWARD_PREF.to_string(),
    );
    let (local, ret_pref) = (LOCAL_TABLE.to_string(), route.return_pref().to_string());
    let forward = [
        "ip", fam, "rule", "del", "to", &to, "lookup", &table, "pref", &pref,
    ];
    let ret = [
        "ip",
        fam,
        "rule",
        "del",
        "iif",
        &route.veth,
        "lookup",
        &local,
        "pref",
        &ret_pref,
    ];
    let gone = |e: &EniError| {
        e.reason.contains("No such file or directory") || e.reason.contains("not found")
    };
    let mut first = None;
    for argv in [&forward[..], &ret[..]] {
        match run(runner, argv) {
            Err(e) if !gone(&e) => {
                first.get_or_insert(e);
            }
            _ => {}
        }
    }
    first.map_or(Ok(()), Err)
}

/// The host netns a runner acts in: `None` for the agent's own.
fn host_key(runner: &HostRunner) -> Option<NetnsId> {
    match runner {
        HostRunner::Current(_) => None,
        HostRunner::Fd(f) => Some(f.netns.identity()),
    }
}

/// Per host netns: the gate (read once, as upstream) and the rules added, by pod IP.
#[derive(Debug, Default)]
struct HostState {
    gate_open: Option<bool>,
    rules: HashMap<IpAddr, BranchEniRoute>,
}

/// The in-memory cache. Process-wide but keyed by host netns, so agents sharing a process
/// (tests, the embedded mesh) never see each other's rules.
fn cache() -> MutexGuard<'static, HashMap<Option<NetnsId>, HostState>> {
    static CACHE: OnceLock<Mutex<HashMap<Option<NetnsId>, HostState>>> = OnceLock::new();
    CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn gate_open(runner: &HostRunner) -> bool {
    let key = host_key(runner);
    if let Some(open) = cache().get(&key).and_then(|s| s.gate_open) {
        return open;
    }
    let open = early_demux_disabled(runner);
    if open {
        tracing::info!("net.ipv4.tcp_early_demux=0: AWS branch-ENI probe rules enabled");
    }
    cache().entry(key).or_default().gate_open = Some(open);
    open
}

/// Enrolment hook (blocking): when `enabled` and the host's gate is open, detects each of
/// `ips` and adds its rules, remembering them for [`on_remove`]. Failures are logged, never
/// returned: they must not fail an enrolment.
pub fn on_add(runner: &HostRunner, enabled: bool, pod: &str, ips: &[IpAddr]) {
    if !enabled || ips.is_empty() || !gate_open(runner) {
        return;
    }
    for ip in ips {
        match detect(runner, *ip) {
            Ok(None) => {}
            Ok(Some(route)) => match add_rules(runner, &route) {
                Ok(()) => {
                    tracing::info!(pod, ip = %route.ip, table = route.table, veth = %route.veth,
                        "AWS branch-ENI pod: added probe rules");
                    let old = cache()
                        .entry(host_key(runner))
                        .or_default()
                        .rules
                        .insert(*ip, route.clone());
                    // The pod's veth or table changed under the same IP: drop the old pair.
                    if let Some(old) = old.filter(|o| *o != route)
                        && let Err(e) = del_rules(runner, &old)
                    {
                        tracing::warn!(pod, %ip, error = %e, "cannot remove stale branch-ENI rules");
                    }
                }
                Err(e) => tracing::warn!(pod, %ip, error = %e, "cannot add branch-ENI rules"),
            },
            Err(e) => tracing::warn!(pod, %ip, error = %e, "branch-ENI detection failed"),
        }
    }
}

/// Removal hook (blocking): deletes the rules remembered for `ips`. Failures are logged.
pub fn on_remove(runner: &HostRunner, pod: &str, ips: &[IpAddr]) {
    let routes: Vec<BranchEniRoute> = {
        let mut c = cache();
        let Some(state) = c.get_mut(&host_key(runner)) else {
            return;
        };
        ips.iter().filter_map(|ip| state.rules.remove(ip)).collect()
    };
    for route in routes {
        if let Err(e) = del_rules(runner, &route) {
            tracing::warn!(pod, ip = %route.ip, error = %e, "cannot remove branch-ENI rules");
        }
    }
}

/// Shutdown hook for an uninstall (blocking): deletes every rule this process added in the
/// runner's host netns. Every pair is attempted; the failures are returned.
pub fn remove_all(runner: &HostRunner) -> Vec<EniError> {
    let routes: Vec<BranchEniRoute> = cache()
        .get_mut(&host_key(runner))
        .map(|s| s.rules.drain().map(|(_, r)| r).collect())
        .unwrap_or_default();
    routes
        .iter()
        .filter_map(|r| del_rules(runner, r).err())
        .collect()
}

/// The rules currently remembered for the runner's host netns (status, tests).
pub fn remembered(runner: &HostRunner) -> Vec<BranchEniRoute> {
    let mut out: Vec<BranchEniRoute> = cache()
        .get(&host_key(runner))
        .map(|s| s.rules.values().cloned().collect())
        .unwrap_or_default();
    out.sort_by_key(|r| r.ip);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_ip_json() {
        let rules = r#"[{"priority":0,"src":"all","table":"255"},
            {"priority":10,"iif":"eni1","table":"101"},
            {"priority":11,"iif":"eni2","table":"254"},
            {"priority":512,"dst":"10.0.0.5","table":"254"},
            {"priority":13,"iif":"eni3","table":"main"},
            {"priority":14,"iif":"","table":"102"},
            {"iif":"eni4","table":"103"}]"#;
        assert_eq!(
            iif_rules(rules).unwrap(),
            vec![(101, "eni1".to_owned(), 10)]
        );
        assert!(iif_rules("").unwrap().is_empty());
        assert!(iif_rules("not json").is_err());
        assert!(iif_rules(r#"{"priority": 1}"#).is_err());

        let ip: IpAddr = "10.0.0.5".parse().unwrap();
        let v6: IpAddr = "fd00::5".parse().unwrap();
        // (routes, ip, device)
        let cases = [
            (r#"[{"dst":"10.0.0.5","dev":"eni1"}]"#, ip, Some("eni1")),
            (r#"[{"dst":"10.0.0.5/32","dev":"eni1"}]"#, ip, Some("eni1")),
            (r#"[{"dst":"10.0.0.0/24","dev":"eni1"}]"#, ip, None),
            (r#"[{"dst":"default","dev":"eth0"}]"#, ip, None),
            (r#"[{"dst":"10.0.0.6","dev":"eni1"}]"#, ip, None),
            (r#"[{"dst":"10.0.0.5"}]"#, ip, None),
            (r#"[{"dst":"fd00::5","dev":"eni6"}]"#, v6, Some("eni6")),
            ("", ip, None),
        ];
        for (routes, ip, want) in cases {
            assert_eq!(
                host_route_dev(routes, &ip).unwrap().as_deref(),
                want,
                "{routes}"
            );
        }
        let route = BranchEniRoute {
            ip,
            table: 101,
            veth: "eni1".into(),
            iif_pref: 0,
        };
        assert_eq!(route.return_pref(), 0);
    }
}

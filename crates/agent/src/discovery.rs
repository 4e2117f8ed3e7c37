//! Restart discovery (`spec/cni.md` §1.8 step 3): finding the network namespaces of pods
//! that were enrolled before the agent (re)started, by scanning a procfs (`/host/proc`
//! upstream; `<AMBIT_HOST_PREFIX>/proc` here).
//!
//! For each process: skip non-numeric entries, skip the host netns (identity of
//! `<proc>/1/ns/net`) and namespaces already claimed by other pods, read the pod UID from
//! `/proc/<pid>/cgroup` ([`cgroup::owner`]), keep only wanted UIDs, then accept the
//! namespace only if one of its interfaces carries one of the pod's IPs (so a recycled
//! UID-looking cgroup in a foreign netns is never trusted). A CRI-O container whose cgroup
//! names no pod (`crio-<id>` outside a pod slice) belongs to the one wanted pod whose IP
//! its netns carries (none or several: skipped). If several processes of one pod qualify,
//! the oldest (lowest start time, then lowest pid) wins.
//!
//! Everything read here is controlled by other processes and may vanish mid-scan: per-process
//! failures are skipped (debug log), never fatal and never a panic. Only an unreadable proc
//! root is an error.
//!
//! The agent-side use (probe-set resync, cache slots, `Keep`) is in `daemon/restart.rs`.

pub mod cgroup;
mod procfs;

use cgroup::Owner;

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ambit_netns::{NetnsFd, NetnsId};

pub use procfs::{interface_ips, start_time};

/// Failure of a whole scan (per-process failures are skipped, not reported).
///
/// An unidentifiable host netns (`<proc>/1/ns/net`; e.g. no ptrace access to pid 1 in
/// some containers) is not an error: the scan goes on without that shortcut, since the
/// IP-ownership check alone already rejects the host namespace.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The proc root could not be listed.
    #[error("listing {path}: {source}")]
    ReadProc {
        /// The proc root.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
}

/// A pod netns found by the scan.
#[derive(Debug)]
pub struct Found {
    /// The process whose namespace was taken.
    pub pid: u32,
    /// Its start time (clock ticks since boot; `u64::MAX` when unreadable).
    pub start_time: u64,
    /// The namespace, held open.
    pub netns: NetnsFd,
}

/// Which process wins when several qualify: oldest start time, then lowest pid.
fn better(a: (u64, u32), b: (u64, u32)) -> bool {
    a < b
}

/// Scans `proc_root` for the namespaces of `wanted` pods (UID → pod IPs). Pods with no IPs
/// are deferred (never matched: the IP check is what makes a match trustworthy).
/// `claimed` namespaces (held by other pods already) are skipped.
pub fn find_pod_netns(
    proc_root: &Path,
    wanted: &HashMap<String, Vec<IpAddr>>,
    claimed: &HashSet<NetnsId>,
) -> Result<HashMap<String, Found>, DiscoveryError> {
    let host_path = proc_root.join("1/ns/net");
    let host = match procfs::netns_id_of_path(&host_path) {
        Ok(id) => Some(id),
        Err(e) => {
            tracing::warn!(path = %host_path.display(), error = %e, "cannot identify host netns");
            None
        }
    };
    let entries = std::fs::read_dir(proc_root).map_err(|source| DiscoveryError::ReadProc {
        path: proc_root.to_owned(),
        source,
    })?;
    // Interface addresses per namespace, read once per namespace.
    let mut addrs: HashMap<NetnsId, Vec<IpAddr>> = HashMap::new();
    let mut found: HashMap<String, Found> = HashMap::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = entry.path();
        let Ok(cgroup) = std::fs::read_to_string(dir.join("cgroup")) else {
            continue;
        };
        // `Some(uid)`: the cgroup names the pod. `None`: a CRI-O container outside any pod
        // slice, attributed below by the pod IPs in its netns alone.
        let named = match cgroup::owner(&cgroup) {
            Some(Owner::Pod(uid)) => {
                if wanted.get(&uid).is_none_or(Vec::is_empty) {
                    continue;
                }
                Some(uid)
            }
            Some(Owner::CrioContainer(_)) if wanted.values().any(|ips| !ips.is_empty()) => None,
            _ => continue,
        };
        let ns_path = dir.join("ns/net");
        // stat first: most processes are in the host netns, no need to open them.
        let Ok(id) = procfs::netns_id_of_path(&ns_path) else {
            continue;
        };
        if Some(id) == host || claimed.contains(&id) {
            continue;
        }
        let start = std::fs::read_to_string(dir.join("stat"))
            .ok()
            .and_then(|s| start_time(&s))
            .unwrap_or(u64::MAX);
        let loses = |uid: &str| {
            found
                .get(uid)
                .is_some_and(|cur| !better((start, pid), (cur.start_time, cur.pid)))
        };
        if named.as_deref().is_some_and(loses) {
            continue;
        }
        let netns = match NetnsFd::open(&ns_path) {
            // The process may have exited and its pid been reused between stat and open.
            Ok(n) if n.identity() == id => n,
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(pid, error = %e, "cannot open process netns");
                continue;
            }
        };
        let local = match addrs.get(&id) {
            Some(a) => a,
            None => match interface_ips(&netns) {
                Ok(a) => addrs.entry(id).or_insert(a),
                Err(e) => {
                    tracing::debug!(pid, error = %e, "cannot list netns addresses");
                    continue;
                }
            },
        };
        let owns = |ips: &Vec<IpAddr>| ips.iter().any(|ip| local.contains(&ip.to_canonical()));
        let uid = match named {
            Some(uid) => {
                if !wanted.get(&uid).is_some_and(owns) {
                    tracing::debug!(pid, %uid, netns = %id, "cgroup names the pod but no pod IP is in its netns");
                    continue;
                }
                uid
            }
            None => {
                let mut owners = wanted.iter().filter(|(_, ips)| owns(ips)).map(|(u, _)| u);
                match (owners.next(), owners.next()) {
                    (Some(uid), None) if !loses(uid) => uid.clone(),
                    (Some(a), Some(b)) => {
                        tracing::debug!(pid, netns = %id, pods = ?(a, b), "CRI-O container netns carries IPs of several pods; skipped");
                        continue;
                    }
                    _ => continue,
                }
            }
        };
        found.insert(
            uid,
            Found {
                pid,
                start_time: start,
                netns,
            },
        );
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_wins() {
        // (candidate, current, candidate replaces current)
        let cases = [
            ((10, 500), (20, 100), true),
            ((20, 100), (10, 500), false),
            ((10, 100), (10, 200), true),
            ((10, 200), (10, 100), false),
            ((u64::MAX, 1), (5, 9), false),
        ];
        for (cand, cur, want) in cases {
            assert_eq!(better(cand, cur), want, "{cand:?} vs {cur:?}");
        }
    }

    /// A fake proc tree in which every process is in the host netns (our own): nothing is
    /// found and nothing fails, whatever the cgroup files say.
    #[test]
    fn fake_tree_skips_host_and_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        let uid = "5c2ca1d1-58b4-4e48-a9a4-1cd3fdc6f8f4";
        let mk = |name: &str, cgroup: Option<&str>, ns: bool| {
            let p = proc_root.join(name);
            std::fs::create_dir_all(p.join("ns")).unwrap();
            if let Some(c) = cgroup {
                std::fs::write(p.join("cgroup"), c).unwrap();
            }
            if ns {
                std::os::unix::fs::symlink("/proc/self/ns/net", p.join("ns/net")).unwrap();
            }
        };
        mk("1", Some("0::/init.scope\n"), true);
        mk("self", Some("0::/kubepods/podx\n"), true);
        mk(
            "100",
            Some(&format!("0::/kubepods/besteffort/pod{uid}/abc\n")),
            true,
        );
        mk("101", Some("\u{0}\u{ff}garbage"), true);
        mk("102", None, false);
        mk(
            "103",
            Some(&format!("0::/kubepods/besteffort/pod{uid}/abc\n")),
            false,
        );
        let wanted = HashMap::from([(uid.to_string(), vec!["10.0.0.1".parse().unwrap()])]);
        let found = find_pod_netns(&proc_root, &wanted, &HashSet::new()).unwrap();
        assert!(found.is_empty());

        let err = find_pod_netns(&dir.path().join("nope"), &wanted, &HashSet::new());
        assert!(matches!(err, Err(DiscoveryError::ReadProc { .. })));
    }
}

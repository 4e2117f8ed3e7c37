//! Small procfs readers for discovery: a namespace's identity from its path, a process's
//! start time from `/proc/<pid>/stat`, and the addresses inside a network namespace.

use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use ambit_netns::{NetnsFd, NetnsId, run_in_netns_thread};

/// Identity of the namespace a `/proc/<pid>/ns/net` path (or a link to one) names, without
/// opening it. Same (inode, device) pair as [`NetnsFd::identity`].
pub(super) fn netns_id_of_path(path: &Path) -> std::io::Result<NetnsId> {
    let m = std::fs::metadata(path)?;
    Ok(NetnsId {
        ino: m.ino(),
        dev: m.dev(),
    })
}

/// Field 22 (`starttime`, clock ticks after boot) of a `/proc/<pid>/stat` line. The command
/// name (field 2) is parenthesised and may contain spaces and `)`, so fields are counted
/// from the last `)`.
pub fn start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ')' the first field is field 3 (state): field 22 is the 20th.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Every address configured on an interface inside `netns` (IPv4-mapped IPv6 unmapped).
/// Read with `getifaddrs` on a thread inside the namespace (netlink is per namespace).
pub fn interface_ips(netns: &NetnsFd) -> std::io::Result<Vec<IpAddr>> {
    run_in_netns_thread(netns, || {
        let addrs = nix::ifaddrs::getifaddrs().map_err(std::io::Error::from)?;
        Ok(addrs
            .filter_map(|a| {
                let s = a.address?;
                if let Some(v4) = s.as_sockaddr_in() {
                    Some(IpAddr::V4(v4.ip()))
                } else {
                    s.as_sockaddr_in6()
                        .map(|v6| IpAddr::V6(v6.ip()).to_canonical())
                }
            })
            .collect())
    })
    .map_err(std::io::Error::other)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_start_time() {
        let cases: &[(&str, Option<u64>)] = &[
            (
                "4242 (sleep) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 98765 5000 100 18446744073709551615",
                Some(98765),
            ),
            (
                "77 (a) b) (c) R 1 77 77 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 12 5000",
                Some(12),
            ),
            ("77 (short) R 1 2 3", None),
            ("no parens at all", None),
            (
                "77 (x) R 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 notanumber 1",
                None,
            ),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(start_time(text), *want, "{text}");
        }
    }

    #[test]
    fn own_netns_has_loopback() {
        let Ok(me) = NetnsFd::current_thread() else {
            return;
        };
        // Entering even our own namespace needs CAP_SYS_ADMIN.
        let Ok(ips) = interface_ips(&me) else {
            return;
        };
        assert!(ips.iter().any(IpAddr::is_loopback), "{ips:?}");
    }
}

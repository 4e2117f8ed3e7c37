//! How the machine's idle CPUs wait, read from sysfs: the cpuidle driver and governor, the
//! idle states CPU 0 may enter, and the guest halt-polling window of the `haltpoll` driver.
//!
//! The latency-bound figures depend on it more than on any proxy change: on a 2-vCPU
//! Firecracker guest with `guest_halt_poll_ns` 0 (an idle vCPU halts at once, and waking it
//! is a VM exit and an IPI) the baseline made 6,367 new connections/s with one client, and
//! 10,427 with the window at 200 µs (BENCHMARKS.md, "Idle vCPUs"). Runs are comparable only
//! with the same policy, so every report records it.

use std::path::Path;

/// One line describing the idle policy under `root` (`/` on a real machine), e.g.
/// `driver haltpoll, governor haltpoll, cpu0 states POLL | haltpoll idle, guest_halt_poll_ns 0`
/// (state names may hold spaces, hence the bars).
/// Parts that sysfs does not have are left out; `no cpuidle` when it has none of them.
pub fn policy(root: &Path) -> String {
    let read = |rel: &str| {
        std::fs::read_to_string(root.join(rel))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let mut parts = Vec::new();
    if let Some(d) = read("sys/devices/system/cpu/cpuidle/current_driver") {
        parts.push(format!("driver {d}"));
    }
    let governor = read("sys/devices/system/cpu/cpuidle/current_governor")
        .or_else(|| read("sys/devices/system/cpu/cpuidle/current_governor_ro"));
    if let Some(g) = governor {
        parts.push(format!("governor {g}"));
    }
    let states = cpu0_states(root);
    if !states.is_empty() {
        parts.push(format!("cpu0 states {}", states.join(" | ")));
    }
    if let Some(ns) = read("sys/module/haltpoll/parameters/guest_halt_poll_ns") {
        parts.push(format!("guest_halt_poll_ns {ns}"));
    }
    if parts.is_empty() {
        "no cpuidle".to_string()
    } else {
        parts.join(", ")
    }
}

/// Names of CPU 0's idle states in index order, a disabled one marked `(disabled)`.
fn cpu0_states(root: &Path) -> Vec<String> {
    let dir = root.join("sys/devices/system/cpu/cpu0/cpuidle");
    let mut indexed: Vec<(u32, String)> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let file = e.file_name();
            let index = file.to_str()?.strip_prefix("state")?.parse().ok()?;
            let name = std::fs::read_to_string(e.path().join("name")).ok()?;
            let disabled =
                std::fs::read_to_string(e.path().join("disable")).is_ok_and(|d| d.trim() == "1");
            let name = name.trim();
            Some((
                index,
                if disabled {
                    format!("{name}(disabled)")
                } else {
                    name.to_string()
                },
            ))
        })
        .collect();
    indexed.sort();
    indexed.into_iter().map(|(_, n)| n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files of a sysfs tree: (path under the root, content).
    type Files<'a> = &'a [(&'a str, &'a str)];

    fn tree(files: Files<'_>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (rel, content) in files {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        dir
    }

    #[test]
    fn describes_each_kind_of_machine() {
        let haltpoll = [
            (
                "sys/devices/system/cpu/cpuidle/current_driver",
                "haltpoll\n",
            ),
            (
                "sys/devices/system/cpu/cpuidle/current_governor",
                "haltpoll\n",
            ),
            ("sys/devices/system/cpu/cpu0/cpuidle/state0/name", "POLL\n"),
            ("sys/devices/system/cpu/cpu0/cpuidle/state0/disable", "0\n"),
            (
                "sys/devices/system/cpu/cpu0/cpuidle/state1/name",
                "haltpoll idle\n",
            ),
            ("sys/devices/system/cpu/cpu0/cpuidle/state1/disable", "0\n"),
            ("sys/module/haltpoll/parameters/guest_halt_poll_ns", "0\n"),
        ];
        // More than ten states sort by number, not by name; a disabled state is marked.
        let mut intel: Vec<(String, String)> = (0..11)
            .map(|i| {
                (
                    format!("sys/devices/system/cpu/cpu0/cpuidle/state{i}/name"),
                    format!("C{i}\n"),
                )
            })
            .collect();
        intel.push((
            "sys/devices/system/cpu/cpu0/cpuidle/state10/disable".into(),
            "1\n".into(),
        ));
        intel.push((
            "sys/devices/system/cpu/cpuidle/current_driver".into(),
            "intel_idle".into(),
        ));
        intel.push((
            "sys/devices/system/cpu/cpuidle/current_governor_ro".into(),
            "menu".into(),
        ));
        let intel: Vec<(&str, &str)> = intel
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let cases: [(&str, Files<'_>, &str); 3] = [
            (
                "haltpoll guest",
                &haltpoll,
                "driver haltpoll, governor haltpoll, cpu0 states POLL | haltpoll idle, guest_halt_poll_ns 0",
            ),
            (
                "intel_idle host",
                &intel,
                "driver intel_idle, governor menu, cpu0 states C0 | C1 | C2 | C3 | C4 | C5 | C6 | C7 | C8 | C9 | C10(disabled)",
            ),
            ("no cpuidle", &[], "no cpuidle"),
        ];
        for (what, files, want) in cases {
            let dir = tree(files);
            assert_eq!(policy(dir.path()), want, "{what}");
        }
    }
}

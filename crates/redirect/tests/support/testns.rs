//! A throwaway network namespace per test (`amr*`), deleted on drop (also on panic), and the
//! root check of the netns tests. Shared by the test binaries through `#[path]`.

#![allow(dead_code)] // each test binary uses part of it

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use ambit_redirect::{Cmd, IpNetnsExec, NetnsRunner};

/// `true` if the test may run; otherwise prints why it is skipped (or fails under CI).
pub fn root_or_skip(test: &str) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid_zero = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0");
    if euid_zero {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test} needs root (CI=true: not skipping)"
    );
    println!("skip {test}: needs root");
    false
}

/// A network namespace owned by one test; deleted on drop, also when the test panics.
pub struct TestNs {
    pub name: String,
}

impl TestNs {
    pub fn new() -> Self {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "amr{}x{}x{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed),
            nanos % 100_000
        );
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(ok.success(), "ip netns add {name}");
        let ns = TestNs { name };
        // Pods have lo up; the IPv6 local route needs it.
        ns.sh(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    pub fn runner(&self) -> IpNetnsExec {
        IpNetnsExec {
            name: self.name.clone(),
        }
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Run a command in the namespace, require success, return stdout.
    pub fn sh(&self, argv: &[&str]) -> String {
        self.runner()
            .run_ok(&Cmd::new(argv.iter().copied()))
            .unwrap_or_else(|e| panic!("{e}"))
            .stdout
    }
}

impl TestNs {
    /// Stdout of a listing that may fail when the object was never created (empty then).
    pub fn listing(&self, argv: &[&str]) -> String {
        let out = self.runner().run(&Cmd::new(argv.iter().copied())).unwrap();
        if out.success() {
            out.stdout
        } else {
            String::new()
        }
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

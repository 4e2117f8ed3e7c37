//! Root tests of `ambit vm up` / `vm down` ([`ambit_vm::up`]) in a throwaway VM namespace
//! with a peer namespace on a veth: SSH (port 22) answers in plaintext from the peer before,
//! during and after `vm up`, and after every failed start (bad bundle, unreachable control
//! plane, ztunnel exiting or never ready); a failed start and a stop leave no VM rule behind,
//! also a crashed run's; `vm down` removes every rule. ztunnel is stood in for by a small HTTP
//! server answering its readiness probe, so these tests check the orchestration, not the proxy.
//!
//! Without root these tests print "skip" and pass, unless `CI=true`, where they fail.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::print_stdout)]

#[path = "support/bundle_dir.rs"]
mod bundle_dir;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ambit_netns::{NetnsFd, in_netns};
use ambit_redirect::vm::{self, VmRedirectConfig};
use ambit_redirect::{Backend, CurrentNetns, IpNetnsExec, VmRules};
use ambit_testkit::eventually_blocking;
use ambit_vm::up::{self, Config, UpError};

const VM_IP: &str = "192.168.77.1";
const PEER_IP: &str = "192.168.77.2";
const PYTHON: &str = "/usr/bin/python3";

fn root_or_skip(test: &str) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0");
    let ci = std::env::var("CI").as_deref() == Ok("true");
    if root && Path::new(PYTHON).exists() {
        return true;
    }
    assert!(
        !ci,
        "{test} needs root and {PYTHON} (CI=true: not skipping)"
    );
    println!("skip {test}: needs root and {PYTHON}");
    false
}

/// A named namespace (`amv*`), deleted on drop (also on panic).
struct Ns {
    name: String,
}

impl Ns {
    fn new(tag: &str) -> Self {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "amv{tag}{}x{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        sh(&["ip", "netns", "add", &name]);
        let ns = Ns { name };
        sh(&["ip", "-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    fn fd(&self) -> NetnsFd {
        NetnsFd::open(format!("/run/netns/{}", self.name)).unwrap()
    }

    fn runner(&self) -> IpNetnsExec {
        IpNetnsExec {
            name: self.name.clone(),
        }
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn sh(argv: &[&str]) {
    let ok = Command::new(argv[0]).args(&argv[1..]).status().unwrap();
    assert!(ok.success(), "{argv:?}");
}

/// The VM and a peer on a veth; SSH (22) and an app port (8080) answer on the VM.
struct Vm {
    vm: Ns,
    peer: Ns,
    dir: tempfile::TempDir,
}

impl Vm {
    fn new() -> Self {
        let vm = Ns::new("v");
        let peer = Ns::new("p");
        let seq = &vm.name[3..];
        let (a, b) = (
            format!("va{}", &seq[..seq.len().min(10)]),
            format!("vb{}", &seq[..seq.len().min(10)]),
        );
        sh(&[
            "ip", "link", "add", &a, "netns", &vm.name, "type", "veth", "peer", "name", &b,
            "netns", &peer.name,
        ]);
        for (ns, dev, ip) in [(&vm, &a, VM_IP), (&peer, &b, PEER_IP)] {
            sh(&[
                "ip",
                "-n",
                &ns.name,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                dev,
            ]);
            sh(&["ip", "-n", &ns.name, "link", "set", dev, "up"]);
        }
        let fd = vm.fd();
        for port in [22u16, 8080] {
            let l = in_netns(&fd, || TcpListener::bind(("0.0.0.0", port)))
                .unwrap()
                .unwrap();
            std::thread::spawn(move || {
                for s in l.incoming().flatten() {
                    let mut s = s;
                    let mut buf = [0u8; 4];
                    if s.read_exact(&mut buf).is_ok() {
                        let _ = s.write_all(&buf);
                    }
                }
            });
        }
        Vm {
            vm,
            peer,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// An echo through `port` on the VM from the peer, in plaintext.
    fn answers(&self, port: u16) -> bool {
        let to: SocketAddr = format!("{VM_IP}:{port}").parse().unwrap();
        in_netns(&self.peer.fd(), || {
            let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(b"ping")?;
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf)?;
            Ok::<_, std::io::Error>(&buf == b"ping")
        })
        .unwrap()
        .unwrap_or(false)
    }

    fn rules_present(&self) -> bool {
        vm::any_present(&self.vm.runner()).unwrap()
    }

    fn config(&self, ztunnel: &[&str], ready_timeout: Duration) -> Config {
        Config {
            bundle_dir: self.dir.path().join("bundle"),
            ztunnel: ztunnel.iter().map(|s| (*s).to_owned()).collect(),
            backend: Backend::Iptables,
            ready_timeout,
            run_dir: self.dir.path().join("run"),
            extra_env: vec![],
        }
    }

    fn bundle(&self, ca: &str, extra: &str) {
        let d = self.dir.path().join("bundle");
        std::fs::create_dir_all(&d).unwrap();
        bundle_dir::write_bundle(&d, ca, extra);
    }

    /// Runs `vm up` in the VM namespace on its own thread.
    fn up(&self, cfg: Config) -> Running {
        let fd = self.vm.fd();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            in_netns(&fd, || up::run(&cfg, &CurrentNetns, &flag)).unwrap()
        });
        Running {
            stop,
            handle: Some(handle),
        }
    }

    /// A listener standing in for the control plane inside the VM namespace.
    fn fake_control_plane(&self) -> SocketAddr {
        let l = in_netns(&self.vm.fd(), || TcpListener::bind("127.0.0.1:0"))
            .unwrap()
            .unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || for _ in l.incoming() {});
        addr
    }
}

/// A running `vm up`; stopped and joined on drop, so a failing test leaves no child behind.
struct Running {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<Result<(), UpError>>>,
}

impl Running {
    /// Waits for `run` to return on its own (a failed start).
    fn join(mut self) -> Result<(), UpError> {
        self.handle.take().unwrap().join().unwrap()
    }

    /// Stops `run` and waits for it.
    fn stop(mut self) -> Result<(), UpError> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().unwrap().join().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// How long a VM start may take to write its rules and mark.
const UP: Duration = Duration::from_secs(20);

/// ztunnel's stand-in: answers `GET /healthz/ready` with 200 on 127.0.0.1:15021.
const READY_SERVER: &str = "import http.server as h\nclass R(h.BaseHTTPRequestHandler):\n  def do_GET(self):\n    self.send_response(200); self.end_headers()\n  def log_message(self, *a): pass\nh.HTTPServer(('127.0.0.1', 15021), R).serve_forever()\n";

/// Every failed start: the error says why, SSH answers throughout, no rule is left (a crashed
/// run's stale rules included).
#[test]
fn failed_starts_leave_ssh_and_no_rule() {
    if !root_or_skip("failed_starts_leave_ssh_and_no_rule") {
        return;
    }
    type Check = fn(&UpError) -> bool;
    type Case<'a> = (&'a str, Option<&'a str>, &'a str, &'a [&'a str], Check);
    // (case, CA address or None for a fake control plane, extra cluster.env, ztunnel, check)
    let cases: [Case<'_>; 5] = [
        (
            "bad bundle",
            None,
            "ISTIO_SVC_IP='nope'\n",
            &["false"],
            |e| {
                matches!(e, UpError::Bundle(b) if b.0.len() == 1)
                    && e.to_string().contains("ISTIO_SVC_IP")
            },
        ),
        ("unreachable CA", Some("127.0.0.1:1"), "", &["false"], |e| {
            matches!(e, UpError::Unreachable { .. }) && e.to_string().contains("CA_ADDR")
        }),
        (
            "unreachable CA by hosts name",
            Some("istiod.istio-system.svc:1"),
            "",
            &["false"],
            |e| matches!(e, UpError::Unreachable { resolved, .. } if resolved.port() == 1),
        ),
        ("ztunnel exits", None, "", &["false"], |e| {
            matches!(e, UpError::ExitedEarly(_))
        }),
        ("ztunnel never ready", None, "", &["sleep", "30"], |e| {
            matches!(e, UpError::NotReady(_))
        }),
    ];
    let mut failures = Vec::new();
    for (name, ca, extra, ztunnel, check) in cases {
        let v = Vm::new();
        // A crashed run's rules are in place.
        VmRules {
            backend: Backend::Iptables,
            config: VmRedirectConfig {
                ipv6: false,
                ..VmRedirectConfig::default()
            },
        }
        .apply(&v.vm.runner())
        .unwrap();
        assert!(v.answers(22), "{name}: SSH before");
        let ca = ca.map_or_else(|| v.fake_control_plane().to_string(), str::to_owned);
        v.bundle(&ca, extra);
        let started = Instant::now();
        let got = v.up(v.config(ztunnel, Duration::from_secs(1))).join();
        match &got {
            Err(e) if check(e) => {}
            other => failures.push(format!("{name}: {other:?}")),
        }
        if started.elapsed() > Duration::from_secs(15) {
            failures.push(format!("{name}: took {:?}", started.elapsed()));
        }
        if !v.answers(22) {
            failures.push(format!("{name}: SSH after the failed start"));
        }
        if v.rules_present() {
            failures.push(format!("{name}: rules left behind"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A start that succeeds: rules only once "ztunnel" is ready; SSH answers before, during and
/// after; the app port is captured while up; stopping removes every rule and the child.
#[test]
fn up_captures_once_ready_and_stop_removes_every_rule() {
    if !root_or_skip("up_captures_once_ready_and_stop_removes_every_rule") {
        return;
    }
    let v = Vm::new();
    let ca = v.fake_control_plane();
    v.bundle(&ca.to_string(), "");
    assert!(v.answers(22) && v.answers(8080), "before");
    let running = v.up(v.config(&[PYTHON, "-c", READY_SERVER], Duration::from_secs(20)));
    eventually_blocking("VM rules written", UP, || v.rules_present());
    assert!(v.answers(22), "SSH while up");
    // 8080 is captured to 15006, where the stand-in does not listen: no echo.
    assert!(!v.answers(8080), "8080 not captured while up");
    assert!(
        v.dir.path().join("run").join(up::PID_FILE).exists(),
        "pid file for vm down"
    );
    let ready = v.dir.path().join("run").join(up::READY_FILE);
    eventually_blocking("the ready mark", UP, || ready.exists());
    assert!(v.rules_present(), "ready marked before the rules");
    running.stop().unwrap();
    assert!(!ready.exists(), "ready mark left after stop");
    assert!(!v.rules_present(), "rules left after stop");
    assert!(v.answers(22) && v.answers(8080), "after");
    assert!(
        !v.dir.path().join("run").join(up::PID_FILE).exists(),
        "pid file left"
    );
    // The stand-in is gone: nothing answers readiness in the VM namespace any more.
    let gone = in_netns(&v.vm.fd(), || {
        TcpStream::connect_timeout(&"127.0.0.1:15021".parse().unwrap(), Duration::from_secs(1))
            .is_err()
    })
    .unwrap();
    assert!(gone, "ztunnel stand-in still running");
}

/// `vm down` removes every VM rule of both backends (a crashed `vm up`'s) and SSH answers.
#[test]
fn down_removes_every_rule() {
    if !root_or_skip("down_removes_every_rule") {
        return;
    }
    for backend in [Backend::Iptables, Backend::Nftables] {
        let v = Vm::new();
        VmRules {
            backend,
            config: VmRedirectConfig {
                ipv6: false,
                ..VmRedirectConfig::default()
            },
        }
        .apply(&v.vm.runner())
        .unwrap();
        assert!(v.rules_present(), "{backend:?}: applied");
        assert!(v.answers(22), "{backend:?}: SSH while captured");
        assert!(!v.answers(8080), "{backend:?}: 8080 captured");
        up::down(
            &v.dir.path().join("run"),
            &v.vm.runner(),
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(!v.rules_present(), "{backend:?}: rules left");
        assert!(v.answers(8080), "{backend:?}: 8080 after down");
    }
}

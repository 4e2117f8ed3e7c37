//! The bypass sentinel: packet captures (`tcpdump`) on the node-to-node link (the bridge
//! `br0`) and in every node namespace on all of its interfaces (`-i any`: the node's uplink
//! and the host end of every pod's veth, the other end of the pod's `eth0`, so every packet a
//! pod sends or receives, for pods created later too). The kernel filter keeps TCP and UDP
//! between pod addresses, or between a pod and a Service address, that is not on port 15008;
//! what passes it and runs between two enrolled pods (or an enrolled pod and a Service
//! address: a connection to a Service that left the pod without ztunnel) is a bypass: traffic
//! that did not go through a ztunnel as HBONE. (DNS to ztunnel stays on the pod's loopback and
//! never reaches a veth.) A packet seen at several points counts once per point.
//!
//! The capture is exact or the run fails: each `tcpdump` must report that the kernel dropped
//! nothing when it stops ([`Sentinel::finish`]).

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One captured packet.
#[derive(Debug, Clone)]
pub struct Packet {
    /// Capture time, seconds since the epoch.
    pub at: f64,
    /// Where it was seen (`br0`, `node1`, …).
    pub point: String,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// Payload bytes (`tcp N`, `UDP, length N`).
    pub payload: u64,
    /// tcpdump's line, for the report.
    pub line: String,
}

#[derive(Debug)]
struct Capture {
    point: String,
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
}

/// Running captures; stopped (and checked) by [`Sentinel::finish`], killed on drop.
#[derive(Debug)]
pub struct Sentinel {
    captures: Vec<Capture>,
    packets: Arc<Mutex<Vec<Packet>>>,
}

/// Where to capture: a label, the namespace name (`ip netns`), the interface.
#[derive(Debug)]
pub struct Point {
    pub label: String,
    pub netns: String,
    pub iface: String,
}

impl Sentinel {
    /// Starts one capture per point and waits until each is listening. `pod_net` is the
    /// pods' address range (`198.19.0.0/16`), `svc_net` the Services' (a connection to a
    /// Service address that leaves a pod unredirected is a bypass too).
    pub fn start(points: &[Point], pod_net: &str, svc_net: &str) -> Sentinel {
        let filter = format!(
            "(tcp or udp) and not port 15008 and ((src net {pod_net} and (dst net {pod_net} or dst net {svc_net})) or (src net {svc_net} and dst net {pod_net}))"
        );
        let packets = Arc::new(Mutex::new(Vec::new()));
        let mut captures = Vec::new();
        for p in points {
            let mut child = Command::new("ip")
                .args(["netns", "exec", &p.netns, "tcpdump", "-i", &p.iface])
                // Numeric, line-buffered, epoch timestamps, terse; a 16 MiB buffer.
                .args(["-n", "-l", "-tt", "-q", "-B", "16384", &filter])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("tcpdump in {}: {e}", p.netns));
            let stdout = child.stdout.take().expect("tcpdump stdout");
            let (label, sink) = (p.label.clone(), packets.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if let Some(pkt) = parse(&label, &line) {
                        sink.lock().expect("packets").push(pkt);
                    }
                }
            });
            let stderr = Arc::new(Mutex::new(Vec::new()));
            let errs = stderr.clone();
            let pipe = child.stderr.take().expect("tcpdump stderr");
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    errs.lock().expect("stderr").push(line);
                }
            });
            captures.push(Capture {
                point: p.label.clone(),
                child,
                stderr,
            });
        }
        let sentinel = Sentinel { captures, packets };
        for c in &sentinel.captures {
            let lines = || c.stderr.lock().expect("stderr").clone();
            ambit_testkit::eventually_blocking_explained(
                &format!("the capture on {} to start", c.point),
                Duration::from_secs(20),
                || format!("{:?}", lines()),
                || lines().iter().any(|l| l.starts_with("listening on")),
            );
        }
        sentinel
    }

    /// Packets seen in `[from, to]` (epoch seconds) between two addresses of `enrolled`, or
    /// between one of them and a Service address (`is_service`: the capture filter already
    /// keeps only those ranges).
    pub fn bypasses(
        &self,
        enrolled: &HashSet<Ipv4Addr>,
        is_service: impl Fn(Ipv4Addr) -> bool,
        from: f64,
        to: f64,
    ) -> Vec<Packet> {
        self.packets
            .lock()
            .expect("packets")
            .iter()
            .filter(|p| p.at >= from && p.at <= to)
            .filter(|p| {
                let (s, d) = (enrolled.contains(&p.src), enrolled.contains(&p.dst));
                (s && (d || is_service(p.dst))) || (d && is_service(p.src))
            })
            .cloned()
            .collect()
    }

    /// Stops every capture (SIGINT: tcpdump prints its counters) and checks that the kernel
    /// dropped no packet; the error names the capture that did or that did not report.
    pub fn finish(mut self) -> Result<(), String> {
        let mut problems = Vec::new();
        for c in &mut self.captures {
            let _ = Command::new("kill")
                .args(["-INT", &c.child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while c.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.child.kill();
            let _ = c.child.wait();
            // The reader thread may still be draining the pipe.
            let deadline = Instant::now() + Duration::from_secs(5);
            let dropped = loop {
                let lines = c.stderr.lock().expect("stderr").clone();
                if let Some(n) = lines.iter().find_map(|l| {
                    l.strip_suffix(" packets dropped by kernel")
                        .and_then(|n| n.trim().parse::<u64>().ok())
                }) {
                    break Ok(n);
                }
                if Instant::now() >= deadline {
                    break Err(lines);
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            match dropped {
                Ok(0) => {}
                Ok(n) => problems.push(format!("{}: kernel dropped {n} packets", c.point)),
                Err(lines) => problems.push(format!("{}: no counters: {lines:?}", c.point)),
            }
        }
        self.captures.clear();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        for c in &mut self.captures {
            let _ = c.child.kill();
            let _ = c.child.wait();
        }
    }
}

/// `1733085600.123456 [veth3 In  ]IP 198.19.1.2.40000 > 198.19.2.2.8080: tcp 0`.
fn parse(point: &str, line: &str) -> Option<Packet> {
    let mut words = line.split_whitespace();
    let at: f64 = words.next()?.parse().ok()?;
    let mut words = words.skip_while(|w| *w != "IP");
    words.next()?;
    let src = words.next()?;
    if words.next()? != ">" {
        return None;
    }
    let dst = words.next()?.trim_end_matches(':');
    let addr = |s: &str| s.rsplit_once('.').and_then(|(a, _)| a.parse().ok());
    let payload = words
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or_default();
    Some(Packet {
        at,
        point: point.to_owned(),
        src: addr(src)?,
        dst: addr(dst)?,
        payload,
        line: line.to_owned(),
    })
}

#[test]
fn tcpdump_lines() {
    let cases = [
        (
            "1733085600.123456 veth3 In  IP 198.19.1.2.40000 > 198.19.2.2.8080: tcp 0",
            Some(("198.19.1.2", "198.19.2.2", 0)),
        ),
        (
            "1733085600.5 IP 198.19.2.2.8080 > 198.19.1.3.51000: UDP, length 4",
            Some(("198.19.2.2", "198.19.1.3", 4)),
        ),
        (
            "1733085600.5 eth0  In  IP 198.19.1.3.5 > 198.19.2.2.8080: tcp 5",
            Some(("198.19.1.3", "198.19.2.2", 5)),
        ),
        ("1733085600.5 ARP, Request who-has 198.19.1.1", None),
        ("listening on any", None),
    ];
    for (line, want) in cases {
        let got = parse("x", line).map(|p| (p.src.to_string(), p.dst.to_string(), p.payload));
        assert_eq!(
            got,
            want.map(|(a, b, n)| (a.to_owned(), b.to_owned(), n)),
            "{line}"
        );
    }
}

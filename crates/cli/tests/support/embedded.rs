//! The embedded mesh driven as a user would, for the `ambit up` tests: `ambit up` as a
//! background child (removed on drop), the CLI, traffic through `ambit exec`, and what a
//! recorded mesh left behind.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const AMBIT: &str = env!("CARGO_BIN_EXE_ambit");
pub const UP_TIMEOUT: Duration = Duration::from_secs(120);

pub fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/basic")
}

pub fn ambit(run: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(AMBIT);
    cmd.args(args).arg("--run-dir").arg(run);
    cmd.output().expect("run ambit")
}

/// `ambit up` in the background; killed (and the mesh removed) on drop if the test fails.
pub struct Up {
    pub child: Child,
    pub run: PathBuf,
    pub lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
    /// Run `ambit down` on drop (off once another `up` owns the run directory).
    pub down_on_drop: bool,
}

impl Up {
    pub fn start(dir: &Path, run: &Path) -> Up {
        Self::start_with(dir, run, &[])
    }

    /// `ambit up DIR --run-dir RUN ARGS...`.
    pub fn start_with(dir: &Path, run: &Path, args: &[&std::ffi::OsStr]) -> Up {
        let mut child = Command::new(AMBIT)
            .arg("up")
            .arg(dir)
            .arg("--run-dir")
            .arg(run)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ambit up");
        let (tx, lines) = mpsc::channel();
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        Up {
            child,
            run: run.to_path_buf(),
            lines,
            seen: Vec::new(),
            down_on_drop: true,
        }
    }

    /// Waits for the `ready` line; fails with everything `up` printed and its logs.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + UP_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .lines
                .recv_timeout(left.min(Duration::from_millis(500)))
            {
                Ok(line) => {
                    let ready = line == "ready";
                    self.seen.push(line);
                    if ready {
                        return;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("ambit up exited early:\n{}", self.seen.join("\n"))
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // Drain what is left before failing.
                while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
                    self.seen.push(l);
                }
                panic!("ambit up exited ({status}):\n{}", self.seen.join("\n"));
            }
            assert!(
                Instant::now() < deadline,
                "ambit up not ready after {UP_TIMEOUT:?}:\n{}\n{}",
                self.seen.join("\n"),
                logs(&self.run)
            );
        }
    }

    pub fn state(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.run.join("state.json")).expect("state.json");
        serde_json::from_str(&text).expect("state json")
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.down_on_drop {
            let _ = ambit(&self.run, &["down"]);
        }
    }
}

pub fn logs(run: &Path) -> String {
    let mut out = String::new();
    if let Ok(dir) = std::fs::read_dir(run.join("logs")) {
        for e in dir.flatten() {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            out += &format!("--- {}\n", e.path().display());
            for l in tail.into_iter().rev() {
                out += l;
                out += "\n";
            }
        }
    }
    out
}

/// What a recorded mesh left behind: namespaces of its prefix, live processes, files.
pub fn leftovers(prefix: &str, pids: &[u32], run: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let l = ambit_topology::leftovers(prefix).expect("leftovers");
    if !l.is_empty() {
        out.push(format!("namespaces {l:?}"));
    }
    for pid in pids {
        if alive(*pid) {
            out.push(format!("process {pid} still runs"));
        }
    }
    for entry in walk(run) {
        let is_log = entry.starts_with(run.join("logs"));
        if !is_log {
            out.push(format!("file {}", entry.display()));
        }
    }
    out
}

pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            }
            out.push(p);
        }
    }
    out
}

pub fn recorded(state: &serde_json::Value) -> (String, Vec<u32>) {
    let prefix = state["prefix"].as_str().expect("prefix").to_owned();
    let pids = state["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter_map(|p| p["pid"].as_u64())
        .filter_map(|p| u32::try_from(p).ok())
        .collect();
    (prefix, pids)
}

/// An HTTP GET from a pod through `ambit exec`: "200" or an error text.
pub fn get(run: &Path, pod: &str, url: &str) -> String {
    let script = "import sys, urllib.request\ntry:\n    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)\nexcept Exception as e:\n    print('ERR', e)";
    let out = Command::new(AMBIT)
        .args(["exec", "--run-dir"])
        .arg(run)
        .args([pod, "--", "python3", "-c", script, url])
        .output()
        .expect("ambit exec");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

pub fn eventually_get(run: &Path, pod: &str, url: &str, want_ok: bool) -> String {
    ambit_testkit::eventually_blocking_every(
        &format!(
            "{pod} → {url} to answer {}",
            if want_ok { "200" } else { "an error" }
        ),
        Duration::from_secs(20),
        Duration::from_millis(200),
        || format!("last answer {:?}\n{}", get(run, pod, url), logs(run)),
        || {
            let got = get(run, pod, url);
            ((got == "200") == want_ok).then_some(got)
        },
    )
}

/// `ambit apply|delete -f -` with `text` on stdin.
pub fn apply(run: &Path, op: &str, text: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(AMBIT)
        .args([op, "-f", "-", "--run-dir"])
        .arg(run)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ambit apply");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("ambit apply output")
}

pub fn status_json(run: &Path) -> serde_json::Value {
    let out = ambit(run, &["status", "-o", "json"]);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("status json")
}

pub fn pod_status(run: &Path, name: &str) -> Option<serde_json::Value> {
    status_json(run)["pods"]
        .as_array()
        .expect("pods array")
        .iter()
        .find(|p| p["name"] == name)
        .cloned()
}

/// Whether `pid` runs (a zombie, exited but not yet reaped, does not).
pub fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, r)| r.split_whitespace().next())
        .unwrap_or("");
    !stat.is_empty() && state != "Z" && state != "X"
}

/// Waits up to `limit` for `child` to exit.
pub fn wait_exit(child: &mut Child, limit: Duration, what: &str) -> std::process::ExitStatus {
    ambit_testkit::eventually_blocking(what, limit, || child.try_wait().ok().flatten())
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Pids of a node's ztunnels recorded in `state.json`.
pub fn ztunnel_pids(run: &Path, node: &str) -> Vec<u32> {
    let text = std::fs::read_to_string(run.join("state.json")).expect("state.json");
    let state: serde_json::Value = serde_json::from_str(&text).expect("state json");
    state["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["role"] == "ztunnel" && p["node"] == node)
        .filter_map(|p| p["pid"].as_u64())
        .filter_map(|p| u32::try_from(p).ok())
        .collect()
}

/// Live processes whose command line or environment names `run` (every component of a mesh
/// does: its sockets, manifests and state live there): `(pid, command line)`. Finds a
/// component started after the last look at `state.json`, which [`leftovers`] cannot.
pub fn processes_mentioning(run: &Path) -> Vec<(u32, String)> {
    let needle = run.as_os_str().as_encoded_bytes();
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() || !alive(pid) {
            continue;
        }
        let read = |f: &str| std::fs::read(e.path().join(f)).unwrap_or_default();
        let (cmdline, environ) = (read("cmdline"), read("environ"));
        if [&cmdline, &environ]
            .iter()
            .any(|b| b.windows(needle.len()).any(|w| w == needle))
        {
            let cmd = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            out.push((pid, cmd));
        }
    }
    out
}

/// SIGKILL to `pid`.
pub fn kill9(pid: u32) {
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -KILL {pid}");
}

impl Up {
    /// Waits up to `limit` for a line of `up`'s output containing `needle`.
    pub fn wait_line(&mut self, needle: &str, limit: Duration) -> String {
        if let Some(l) = self.seen.iter().find(|l| l.contains(needle)) {
            return l.clone();
        }
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no line with {needle:?} from ambit up within {limit:?}:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }
}

/// Pid of the newest recorded process of `role` (`control`, `agent`, `ztunnel`) on
/// `node` (ignored for `control`).
pub fn component_pid(run: &Path, role: &str, node: &str) -> u32 {
    let text = std::fs::read_to_string(run.join("state.json")).expect("state.json");
    let state: serde_json::Value = serde_json::from_str(&text).expect("state json");
    state["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .rev()
        .find(|p| p["role"] == role && (role == "control" || p["node"] == node))
        .and_then(|p| p["pid"].as_u64())
        .and_then(|p| u32::try_from(p).ok())
        .unwrap_or_else(|| panic!("no {role} on {node} in {state}"))
}

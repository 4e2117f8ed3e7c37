//! `ambit wait-enrolled`, the init container that holds a new Windows pod until the node
//! agent has captured it (docs/windows.md, "New pods fail closed"), run as a process against
//! a downward-API annotations file the test rewrites the way kubelet does (a new file
//! renamed over the old). The hold's logic is platform-neutral, so it is checked here on
//! Linux: the process stays running through every state but `enabled` (no file yet, a
//! half-written or unparsable file, other annotations, `pending`, a differently cased
//! value) and exits 0 only once the file says `enabled`; with a timeout it fails (exit 1)
//! instead of releasing the pod. No root needed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const AMBIT: &str = env!("CARGO_BIN_EXE_ambit");
/// How long any one expected log line or exit may take.
const DEADLINE: Duration = Duration::from_secs(20);
const ENABLED: &str = "ambient.istio.io/redirection=\"enabled\"\n";

/// A running `ambit wait-enrolled` and its log lines.
struct Hold {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Hold {
    fn start(annotations: &Path, extra: &[&str]) -> Hold {
        let mut child = Command::new(AMBIT)
            .arg("wait-enrolled")
            .arg("--annotations")
            .arg(annotations)
            .args(["--poll", "20ms"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ambit wait-enrolled");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Hold {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a log line containing `text`; the process must still be holding then.
    fn holds_saying(&mut self, text: &str) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(text);
                    self.seen.push(line);
                    if hit {
                        break;
                    }
                }
                Err(_) => panic!("no log line with {text:?} in time; saw {:#?}", self.seen),
            }
        }
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "released the pod while it said {text:?}; log {:#?}",
            self.seen
        );
    }

    /// Waits for the exit code.
    fn exits(&mut self) -> i32 {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().expect("exited by a signal");
            }
            assert!(
                Instant::now() < deadline,
                "still holding after {DEADLINE:?}; log {:#?}",
                self.seen
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Replaces the annotations file at once, as kubelet's atomic writer does.
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn holds_through_every_state_but_enabled() {
    // (file contents, the state the hold must log while it keeps holding)
    let states: &[(Option<&str>, &str)] = &[
        (None, "cannot read"),
        (
            Some("ambient.istio.io/redirection=\"enab"),
            "value is not a quoted string",
        ),
        (Some("app=\"web\"\n"), "not enrolled yet"),
        (
            Some("ambient.istio.io/redirection=\"pending\"\napp=\"web\"\n"),
            "partially enrolled",
        ),
        (
            Some("ambient.istio.io/redirection=\"Enabled\"\n"),
            "not enrolled yet",
        ),
        (Some("no equals sign\n"), "no '='"),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("annotations");
    let mut hold = Hold::start(&path, &[]);
    for (text, says) in states {
        if let Some(text) = text {
            write(&path, text);
        }
        hold.holds_saying(says);
    }
    write(&path, &format!("app=\"web\"\n{ENABLED}"));
    assert_eq!(hold.exits(), 0, "log {:#?}", hold.seen);
    while let Ok(line) = hold.lines.recv_timeout(DEADLINE) {
        hold.seen.push(line);
    }
    assert!(
        hold.seen.iter().any(|l| l.contains("pod enrolled")),
        "{:#?}",
        hold.seen
    );
}

#[test]
fn releases_at_once_when_already_enrolled() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("annotations");
    write(&path, ENABLED);
    let mut hold = Hold::start(&path, &["--timeout", "30s"]);
    assert_eq!(hold.exits(), 0, "log {:#?}", hold.seen);
}

#[test]
fn a_timeout_fails_instead_of_releasing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("annotations");
    write(&path, "ambient.istio.io/redirection=\"pending\"\n");
    let mut hold = Hold::start(&path, &["--timeout", "2s"]);
    hold.holds_saying("partially enrolled");
    assert_eq!(hold.exits(), 1, "log {:#?}", hold.seen);
    while let Ok(line) = hold.lines.recv_timeout(DEADLINE) {
        hold.seen.push(line);
    }
    assert!(
        hold.seen.iter().any(|l| l.contains("not enrolled in time")),
        "{:#?}",
        hold.seen
    );
}

#[test]
fn bad_arguments_are_refused() {
    for (args, says) in [
        (&["--poll", "soon"][..], "--poll"),
        (&["--timeout", "-"][..], "--timeout"),
    ] {
        let out = Command::new(AMBIT)
            .arg("wait-enrolled")
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

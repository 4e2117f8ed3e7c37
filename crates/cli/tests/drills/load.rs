//! The drills' traffic, run as the pods' own processes (so the mesh supervises them and
//! `ambit down` stops them): echo servers, load clients opening one new connection after
//! another, and a holder keeping long-lived connections open. A client waits for a
//! `targets` file in its working directory (the harness writes it once it knows the
//! addresses), appends one line per attempt to `results`, and stops when `stop` appears.

use std::path::{Path, PathBuf};

/// Echo server on :8080: one `pong\n` for every line.
pub const SERVER: &str = r#"
import socket, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080))
s.listen(4096)
def serve(c):
    try:
        with c:
            for _ in c.makefile("rb"):
                c.sendall(b"pong\n")
    except OSError:
        pass
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// New connections back to back (at most one per 10 ms, none while a `pause` file exists),
/// round robin over the targets:
/// connect, `ping`, expect `pong`, close. `START END TARGET ok|fail[ REASON]` per attempt
/// (the reason: the exception and its errno, `ConnectionResetError(ECONNRESET)`).
pub const CLIENT: &str = r#"
import errno, os, socket, time
while not os.path.exists("targets"):
    time.sleep(0.1)
targets = open("targets").read().split()
out = open("results", "a", buffering=1)
i = 0
while not os.path.exists("stop"):
    if os.path.exists("pause"):
        time.sleep(0.05)
        continue
    host, port = targets[i % len(targets)].rsplit(":", 1)
    i += 1
    start = time.time()
    try:
        with socket.create_connection((host, int(port)), timeout=2) as c:
            c.settimeout(2)
            c.sendall(b"ping\n")
            got = b""
            while len(got) < 5:
                d = c.recv(5 - len(got))
                if not d:
                    break
                got += d
        res = "ok" if got == b"pong\n" else "fail reply=%r" % got
    except OSError as e:
        res = "fail %s(%s)" % (type(e).__name__, errno.errorcode.get(e.errno, e.errno))
    end = time.time()
    out.write("%.3f %.3f %s:%s %s\n" % (start, end, host, port, res))
    time.sleep(max(0.0, 0.01 - (end - start)))
"#;

/// Five long-lived connections to the target, a `ping` every 100 ms each; when one closes
/// it is opened again every 200 ms. `TIME SLOT open|closed|refused[ REASON]` per event.
pub const HOLDER: &str = r#"
import os, socket, threading, time
while not os.path.exists("targets"):
    time.sleep(0.1)
host, port = open("targets").read().split()[0].rsplit(":", 1)
out = open("results", "a", buffering=1)
lock = threading.Lock()
def log(slot, event):
    with lock:
        out.write("%.3f %d %s\n" % (time.time(), slot, event))
def hold(slot):
    while not os.path.exists("stop"):
        try:
            c = socket.create_connection((host, int(port)), timeout=2)
        except OSError as e:
            log(slot, "refused " + type(e).__name__)
            time.sleep(0.2)
            continue
        try:
            c.settimeout(1)
            c.sendall(b"ping\n")
            if c.recv(5) != b"pong\n":
                raise EOFError("no pong")
            log(slot, "open")
            while not os.path.exists("stop"):
                c.sendall(b"ping\n")
                if c.recv(5) != b"pong\n":
                    raise EOFError("closed")
                time.sleep(0.1)
        except (OSError, EOFError) as e:
            log(slot, "closed " + type(e).__name__)
        finally:
            c.close()
        time.sleep(0.2)
threads = [threading.Thread(target=hold, args=(i,)) for i in range(5)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"#;

/// One connection attempt of a load client.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub start: f64,
    pub end: f64,
    pub target: String,
    pub ok: bool,
    pub detail: String,
}

/// The attempts recorded in `workdir/results` (a client's working directory).
pub fn attempts(workdir: &Path) -> Vec<Attempt> {
    let text = std::fs::read_to_string(workdir.join("results")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut w = l.splitn(5, ' ');
            Some(Attempt {
                start: w.next()?.parse().ok()?,
                end: w.next()?.parse().ok()?,
                target: w.next()?.to_owned(),
                ok: w.next()? == "ok",
                detail: w.next().unwrap_or_default().to_owned(),
            })
        })
        .collect()
}

/// One event of the holder.
#[derive(Debug, Clone)]
pub struct HoldEvent {
    pub at: f64,
    pub slot: u32,
    /// `open`, `closed …`, `refused …`.
    pub event: String,
}

pub fn hold_events(workdir: &Path) -> Vec<HoldEvent> {
    let text = std::fs::read_to_string(workdir.join("results")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut w = l.splitn(3, ' ');
            Some(HoldEvent {
                at: w.next()?.parse().ok()?,
                slot: w.next()?.parse().ok()?,
                event: w.next()?.to_owned(),
            })
        })
        .collect()
}

/// Tells every client in `workdirs` its targets.
pub fn start(workdirs: &[PathBuf], targets: &[String]) {
    for w in workdirs {
        let tmp = w.join("targets.tmp");
        std::fs::write(&tmp, targets.join("\n")).expect("write targets");
        std::fs::rename(&tmp, w.join("targets")).expect("targets");
    }
}

/// Pauses (`true`) or resumes a client.
pub fn pause(workdir: &Path, paused: bool) {
    let path = workdir.join("pause");
    if paused {
        std::fs::write(path, b"").expect("pause");
    } else {
        let _ = std::fs::remove_file(path);
    }
}

/// Tells every client in `workdirs` to stop.
pub fn stop(workdirs: &[PathBuf]) {
    for w in workdirs {
        let _ = std::fs::write(w.join("stop"), b"");
    }
}

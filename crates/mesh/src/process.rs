//! Processes of a mesh: starting them in their own process group with a log file, telling
//! whether a recorded pid is still *our* process, and stopping them (TERM, a grace
//! period, then KILL) — also from another process after the orchestrator died.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use crate::state::{CommandSpec, ProcessRecord, Role};

/// Why a process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("opening log {path}: {source}")]
    Log {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("starting {role} ({program}): {source}")]
    Spawn {
        role: Role,
        program: String,
        #[source]
        source: std::io::Error,
    },
}

/// Starts `cmd` as `role` in a new process group (so a terminal's Ctrl-C reaches only the
/// orchestrator, which then stops everything in order), stdout and stderr appended to `log`.
pub fn spawn(
    mut cmd: Command,
    role: Role,
    log: &Path,
) -> Result<(Child, ProcessRecord), ProcessError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|source| ProcessError::Log {
            path: log.to_path_buf(),
            source,
        })?;
    let err = file.try_clone().map_err(|source| ProcessError::Log {
        path: log.to_path_buf(),
        source,
    })?;
    let spec = CommandSpec::of(&cmd);
    cmd.stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .process_group(0);
    let child = cmd.spawn().map_err(|source| ProcessError::Spawn {
        role: role.clone(),
        program: cmd.get_program().to_string_lossy().into_owned(),
        source,
    })?;
    let pid = child.id();
    let record = ProcessRecord {
        role,
        pid,
        start_time: start_time(pid).unwrap_or(0),
        group: true,
        log: Some(log.to_path_buf()),
        command: Some(spec),
    };
    Ok((child, record))
}

/// The record of the calling process (the orchestrator).
pub fn current(role: Role) -> ProcessRecord {
    let pid = std::process::id();
    ProcessRecord {
        role,
        pid,
        start_time: start_time(pid).unwrap_or(0),
        group: false,
        log: None,
        command: None,
    }
}

/// `(state, starttime)` of `/proc/PID/stat`.
fn stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: split after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is fields[0]; field 22 (starttime) is fields[19].
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

/// When `pid` started (clock ticks since boot).
pub fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|(_, t)| t)
}

/// Whether the recorded process still runs (same pid *and* start time, not a zombie).
pub fn is_alive(rec: &ProcessRecord) -> bool {
    match stat(rec.pid) {
        Some((state, start)) => start == rec.start_time && state != 'Z' && state != 'X',
        None => false,
    }
}

/// Sends `sig` to the recorded process (its whole group when it leads one), if it is still
/// the process we started.
pub fn signal(rec: &ProcessRecord, sig: Signal) {
    if !is_alive(rec) {
        return;
    }
    let Ok(raw) = i32::try_from(rec.pid) else {
        return;
    };
    let pid = Pid::from_raw(raw);
    // ESRCH (it exited meanwhile) is the only expected failure.
    let _ = if rec.group {
        killpg(pid, sig)
    } else {
        kill(pid, sig)
    };
}

/// Stops `records` (TERM, then KILL after `grace`) and waits until none is alive or
/// `grace * 2` passed. `reap` is called while waiting so the caller can reap its own
/// children (a zombie counts as stopped either way). Returns the ones still alive.
pub fn stop_all(
    records: &[ProcessRecord],
    grace: Duration,
    mut reap: impl FnMut(),
) -> Vec<ProcessRecord> {
    for r in records {
        signal(r, Signal::SIGTERM);
    }
    let wait = |until: Instant, reap: &mut dyn FnMut()| loop {
        reap();
        if !records.iter().any(is_alive) || Instant::now() >= until {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    wait(Instant::now() + grace, &mut reap);
    for r in records.iter().filter(|r| is_alive(r)) {
        signal(r, Signal::SIGKILL);
    }
    wait(Instant::now() + grace, &mut reap);
    records.iter().filter(|r| is_alive(r)).cloned().collect()
}

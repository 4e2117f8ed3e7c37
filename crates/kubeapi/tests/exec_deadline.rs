#![cfg(unix)]
//! `exec` credential plugins that hang are killed at a deadline, with an error naming the
//! plugin, its user and its kubeconfig, and leave no process behind: on the first run (what
//! starts an agent or a control plane) and on a later refresh of an expiring token.
//!
//! The plugin is a real process (a shell script) that starts a grandchild and waits for it,
//! as a wrapper script around a stuck CLI would. Each case runs on its own thread with its own
//! runtime under a harness deadline, so a client that blocks its thread fails the test
//! instead of hanging it.

#[path = "support/error_chain.rs"]
mod error_chain;
use error_chain::error_chain;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use ambit_kubeapi::testing::FakeApiServer;
use ambit_kubeapi::{Auth, Client, ExecConfig, Limits};

const PODS: &str = "/api/v1/pods";
const PLUGIN_DEADLINE: Duration = Duration::from_secs(2);
/// How long a case may take in all before the harness calls it hung.
const HARNESS: Duration = Duration::from_secs(30);

/// A plugin that counts its runs in `$RUNS`, answers runs before `hang_from` with an
/// already expired token (so every request needs a new run) and from then on starts
/// `sleep` in the background, writes "its pid, the sleep's pid" to `$PIDS` and waits.
fn hanging_plugin(dir: &Path, hang_from: u32) -> ExecConfig {
    let script = dir.join("hung-plugin.sh");
    let body = format!(
        "#!/bin/sh\n\
         n=$(( $(cat \"$RUNS\" 2>/dev/null || echo 0) + 1 )); echo $n > \"$RUNS\"\n\
         if [ $n -ge {hang_from} ]; then\n\
           sleep 3600 &\n\
           echo \"$$ $!\" > \"$PIDS.tmp\"; mv \"$PIDS.tmp\" \"$PIDS\"\n\
           wait\n\
         fi\n\
         printf '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\
         \"status\":{{\"token\":\"token-%s\",\"expirationTimestamp\":\"2001-01-01T00:00:00Z\"}}}}' $n\n"
    );
    std::fs::write(&script, body).expect("write plugin");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    ExecConfig {
        command: script,
        args: vec![],
        env: vec![
            ("RUNS".into(), dir.join("runs").display().to_string()),
            ("PIDS".into(), dir.join("pids").display().to_string()),
        ],
        api_version: "client.authentication.k8s.io/v1".into(),
        user: "hung-user".into(),
        kubeconfig: "/etc/hung/kubeconfig".into(),
    }
}

/// The pids the plugin wrote; empty until it hung.
fn plugin_pids(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Alive: present in /proc and not a zombie (a zombie has run to its end; reaping it is
/// its parent's job, which for the reparented grandchild is init's).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Kills whatever the plugin left, also when the test fails or panics.
struct KillLeftovers(std::path::PathBuf);

impl Drop for KillLeftovers {
    fn drop(&mut self) {
        for pid in plugin_pids(&self.0) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Runs `case` on its own thread and runtime; `None` if it did not finish within
/// [`HARNESS`].
fn with_harness<T: Send + 'static>(
    case: impl std::future::Future<Output = T> + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let _ = tx.send(rt.block_on(case));
        // A hung plugin may still hold a blocking thread; do not wait for it.
        rt.shutdown_background();
    });
    rx.recv_timeout(HARNESS).ok()
}

#[test]
fn hung_plugins_are_killed_at_their_deadline() {
    // (what hangs, the run that hangs, requests that succeed before it)
    let cases = [
        ("the first run (client start)", 1, 0),
        ("the refresh of an expiring token", 2, 1),
    ];
    for (what, hang_from, served) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let _leftovers = KillLeftovers(dir.path().to_path_buf());
        let plugin = hanging_plugin(dir.path(), hang_from);
        let case = async move {
            let server = FakeApiServer::start().await.expect("fake server");
            let mut config = server.config();
            config.auth = Auth::Exec(plugin);
            let limits = Limits {
                exec_timeout: PLUGIN_DEADLINE,
                ..Limits::default()
            };
            let client = match Client::with_config_limits(config, limits) {
                Ok(client) => client,
                Err(e) => return (0, Instant::now(), error_chain(&e)),
            };
            let mut ok = 0;
            loop {
                let started = Instant::now();
                match client.list(PODS, None).await {
                    Ok(_) => ok += 1,
                    Err(e) => return (ok, started, error_chain(&e)),
                }
            }
        };
        let (ok, started, error) =
            with_harness(case).unwrap_or_else(|| panic!("{what}: still hung after {HARNESS:?}"));
        let took = started.elapsed();
        assert_eq!(ok, served, "{what}: requests served before the hang");
        assert!(
            took >= PLUGIN_DEADLINE && took < PLUGIN_DEADLINE + Duration::from_secs(5),
            "{what}: failed after {took:?}, deadline {PLUGIN_DEADLINE:?}"
        );
        for part in [
            "hung-plugin.sh",
            "\"hung-user\"",
            "/etc/hung/kubeconfig",
            "did not finish within 2s",
        ] {
            assert!(error.contains(part), "{what}: {part:?} not in {error:?}");
        }
        let pids = plugin_pids(dir.path());
        assert_eq!(pids.len(), 2, "{what}: the plugin and its sleep ran");
        ambit_testkit::eventually_blocking(
            &format!("{what}: plugin processes {pids:?} to be gone"),
            Duration::from_secs(5),
            || !pids.iter().any(|p| alive(*p)),
        );
    }
}

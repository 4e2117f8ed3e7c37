//! Every command that prints survives a closed standard output (`ambit … | head`): it exits
//! quietly with success instead of panicking in `println!`. Every printing command goes
//! through the one writer in `src/out.rs`; `ambit status` is also checked this way on a
//! running mesh (`mesh_up.rs`, `a_killed_component_is_restarted`).

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used)]

#[path = "support/pipe.rs"]
mod pipe;
use pipe::run_into_closed_pipe;

#[test]
fn printing_to_a_closed_pipe_exits_quietly() {
    for args in [
        &["version"][..],
        &["completions", "bash"],
        &["completions", "zsh"],
    ] {
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        let (code, stderr) = run_into_closed_pipe(&args);
        assert_eq!(code, Some(0), "ambit {args:?}: {stderr}");
        assert!(stderr.is_empty(), "ambit {args:?}: {stderr}");
    }
}

//! Every command that prints survives a closed standard output (`ambit … | head`): it exits
//! quietly with success instead of panicking in `println!`. Every printing command goes
//! through the one writer in `src/out.rs`; `ambit status` is also checked this way on a
//! running mesh (`mesh_up.rs`).

#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};

/// Runs `ambit ARGS` with stdout a pipe whose read end is already closed.
fn run_into_closed_pipe(args: &[&str]) -> (Option<i32>, String) {
    // The write end of a pipe whose only reader (`true`) has exited.
    let mut reader = Command::new("true").stdin(Stdio::piped()).spawn().unwrap();
    let writer = reader.stdin.take().unwrap();
    assert!(reader.wait().unwrap().success());
    let out = Command::new(env!("CARGO_BIN_EXE_ambit"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn printing_to_a_closed_pipe_exits_quietly() {
    for args in [
        &["version"][..],
        &["completions", "bash"],
        &["completions", "zsh"],
    ] {
        let (code, stderr) = run_into_closed_pipe(args);
        assert_eq!(code, Some(0), "ambit {args:?}: {stderr}");
        assert!(stderr.is_empty(), "ambit {args:?}: {stderr}");
    }
}

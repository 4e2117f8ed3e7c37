//! Running `ambit` with its standard output a pipe nobody reads any more (`ambit … | head`
//! once `head` has exited).

use std::process::{Command, Stdio};

/// Runs `ambit ARGS` with stdout the write end of a pipe whose only reader has exited;
/// its exit code and standard error.
pub fn run_into_closed_pipe(args: &[&std::ffi::OsStr]) -> (Option<i32>, String) {
    let mut reader = Command::new("true")
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn true");
    let writer = reader.stdin.take().expect("pipe");
    assert!(reader.wait().expect("wait true").success());
    let out = Command::new(env!("CARGO_BIN_EXE_ambit"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run ambit");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

//! Standard output for the commands that print. `println!` panics when stdout is a closed pipe
//! (`ambit status | head`); here a closed pipe ends a short command quietly with success (the
//! reader wanted no more), and never stops `ambit up`, whose progress lines are a courtesy.

use std::io::{self, Write};
use std::process::exit;

/// One line of a command's output; exits quietly (status 0) once stdout is a closed pipe,
/// and with status 1 on any other write error.
pub fn say(line: &str) {
    bytes(format!("{line}\n").as_bytes());
}

/// Raw output, as [`say`].
pub fn bytes(data: &[u8]) {
    match write(data) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => exit(0),
        Err(e) => {
            let _ = writeln!(io::stderr(), "ambit: writing to standard output: {e}");
            exit(1)
        }
    }
}

/// A progress line of a long-running command: write errors (a closed pipe included) are
/// ignored, the command goes on.
#[cfg(unix)]
pub fn progress(line: &str) {
    let _ = write(format!("{line}\n").as_bytes());
}

fn write(data: &[u8]) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(data)?;
    out.flush()
}

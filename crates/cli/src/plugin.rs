//! `ambit cni-plugin` / `istio-cni`: environment and stdin in, CNI result or error out.

use std::io::{Read, Write};
use std::process::ExitCode;

pub fn main() -> ExitCode {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let mut stdin = Vec::new();
    // A read error leaves stdin empty, which the plugin reports as a CNI decoding error.
    let _ = std::io::stdin().take(1 << 20).read_to_end(&mut stdin);
    let (code, out) = ambit_agent::plugin_main(&env, &stdin);
    let _ = std::io::stdout().write_all(&out);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

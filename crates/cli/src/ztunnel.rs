//! `ambit ztunnel`: environment → [`ambit_ztunnel::Config`] → run.
//!
//! Also the upstream command line, so upstream's ztunnel chart and image conventions work
//! unchanged: started as `ztunnel` (a link to `ambit`), the words upstream's binary takes
//! (`proxy [ztunnel]`, `version`, `help`) are accepted ([`upstream_argv`]); `ambit ztunnel proxy
//! ztunnel` and `ambit proxy ztunnel` (the chart's `args` with the image's `ambit` entry point)
//! run the proxy too.

use std::ffi::OsString;
use std::process::ExitCode;

use ambit_ztunnel::Config;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Upstream's words: `proxy` or `proxy ztunnel` (the ztunnel chart's args); nothing else.
    #[arg(value_name = "proxy [ztunnel]", num_args = 0..=2)]
    pub words: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct ProxyArgs {
    /// Which proxy: only `ztunnel` (upstream's chart passes it).
    #[arg(value_name = "ztunnel")]
    kind: Option<String>,
}

/// Why the upstream words were refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown ztunnel arguments {words:?}: expected `proxy` or `proxy ztunnel`")]
pub struct WordsError {
    pub words: Vec<String>,
}

/// Checks `ambit ztunnel`'s positional words.
pub fn check_words(words: &[String]) -> Result<(), WordsError> {
    match words.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] | ["proxy"] | ["proxy", "ztunnel"] => Ok(()),
        _ => Err(WordsError {
            words: words.to_vec(),
        }),
    }
}

/// Checks `ambit proxy`'s argument.
pub fn check_proxy(args: &ProxyArgs) -> Result<(), WordsError> {
    match args.kind.as_deref() {
        None | Some("ztunnel") => Ok(()),
        Some(other) => Err(WordsError {
            words: vec!["proxy".into(), other.into()],
        }),
    }
}

/// The `ambit …` command line for a process started as `ztunnel ARGS`: upstream's `version`
/// and `help` map to `ambit version` / `ambit ztunnel --help`, everything else goes to `ambit
/// ztunnel` (where `proxy [ztunnel]` and clap's `--help` are understood).
pub fn upstream_argv(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let rest: Vec<OsString> = args.into_iter().collect();
    let mut argv: Vec<OsString> = vec!["ambit".into()];
    match rest.first().and_then(|a| a.to_str()) {
        Some("version") if rest.len() == 1 => argv.push("version".into()),
        Some("help") if rest.len() == 1 => argv.extend(["ztunnel".into(), "--help".into()]),
        _ => {
            argv.push("ztunnel".into());
            argv.extend(rest);
        }
    }
    argv
}

/// Reads the environment once, reports every invalid variable together, then runs the proxy.
pub fn main() -> ExitCode {
    let vars: Vec<(String, String)> = std::env::vars().collect();
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let config = match Config::from_vars(&vars, cpus, &|p| p.exists()) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(2);
        }
    };
    match ambit_ztunnel::app::run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ztunnel failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    #[test]
    fn upstream_command_lines() {
        let cases: [(&[&str], &[&str]); 6] = [
            (&[], &["ambit", "ztunnel"]),
            (
                &["proxy", "ztunnel"],
                &["ambit", "ztunnel", "proxy", "ztunnel"],
            ),
            (
                &["proxy", "ztunnel", "--help"],
                &["ambit", "ztunnel", "proxy", "ztunnel", "--help"],
            ),
            (&["version"], &["ambit", "version"]),
            (&["help"], &["ambit", "ztunnel", "--help"]),
            (&["router"], &["ambit", "ztunnel", "router"]),
        ];
        for (given, want) in cases {
            assert_eq!(upstream_argv(os(given)), os(want), "{given:?}");
        }
    }

    #[test]
    fn words() {
        let ok: [&[&str]; 3] = [&[], &["proxy"], &["proxy", "ztunnel"]];
        for w in ok {
            let w: Vec<String> = w.iter().map(|s| s.to_string()).collect();
            assert_eq!(check_words(&w), Ok(()), "{w:?}");
        }
        let bad: [&[&str]; 3] = [&["router"], &["proxy", "router"], &["ztunnel"]];
        for w in bad {
            let w: Vec<String> = w.iter().map(|s| s.to_string()).collect();
            let err = check_words(&w).expect_err("refused");
            assert!(err.to_string().contains("proxy ztunnel"), "{err}");
        }
        assert!(check_proxy(&ProxyArgs { kind: None }).is_ok());
        assert!(
            check_proxy(&ProxyArgs {
                kind: Some("ztunnel".into())
            })
            .is_ok()
        );
        assert!(
            check_proxy(&ProxyArgs {
                kind: Some("waypoint".into())
            })
            .is_err()
        );
    }
}

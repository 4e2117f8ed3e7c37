//! Support for tests that need network-namespace privileges, shared by every crate's
//! root-only tests so they all skip (or fail) the same way.

use std::path::{Path, PathBuf};

/// Whether this process may create and enter network namespaces.
///
/// Returns `true` when it can. When it cannot: panics if the environment variable `CI` is
/// `true` (CI must run these tests, a silent skip would hide regressions), otherwise
/// prints a skip message naming `test` and returns `false` so the caller returns early.
///
/// Reading the environment here is deliberate: this is test support, not library config.
#[cfg(unix)]
pub fn netns_capable_or_skip(test: &str) -> bool {
    use crate::NetnsFd;
    use std::sync::OnceLock;
    static CAPABLE: OnceLock<Result<(), String>> = OnceLock::new();
    // Creating a throwaway namespace is the one check that cannot be fooled by uid 0
    // without CAP_SYS_ADMIN (containers) or by a capable non-root user.
    let probe = CAPABLE.get_or_init(|| {
        NetnsFd::create_anonymous()
            .map(drop)
            .map_err(|e| e.to_string())
    });
    match probe {
        Ok(()) => true,
        Err(reason) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test}: needs network namespace privileges (CI=true): {reason}")
        }
        Err(reason) => {
            eprintln!("skipping {test}: needs network namespace privileges: {reason}");
            false
        }
    }
}

/// Whether this Windows test binary runs under Wine (`scripts/wine/run`) rather than on a
/// Windows host.
#[cfg(windows)]
pub fn under_wine() -> bool {
    crate::imp::under_wine()
}

/// The environment variable naming upstream ztunnel's release binary, which interop tests
/// and the benchmark run beside ambit (a measuring and interop tool, never linked).
pub const UPSTREAM_ZTUNNEL_ENV: &str = "AMBIT_UPSTREAM_ZTUNNEL";

/// Where upstream's reference binary is looked for when [`UPSTREAM_ZTUNNEL_ENV`] is unset:
/// `../shared/reference/upstream-ztunnel/ztunnel` relative to the workspace root, and, when
/// the workspace is a linked git worktree, relative to the main working tree as well (the
/// first that exists; the first candidate when none does).
pub fn upstream_ztunnel_candidates() -> Vec<PathBuf> {
    const REL: &str = "../shared/reference/upstream-ztunnel/ztunnel";
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut out = vec![root.join(REL)];
    if let Some(main) = main_worktree(&root) {
        out.push(main.join(REL));
    }
    out
}

/// The main working tree of the linked worktree at `root` (`.git` is then a file
/// `gitdir: <main>/.git/worktrees/<name>` whose `commondir` names the shared `.git`).
fn main_worktree(root: &Path) -> Option<PathBuf> {
    let dotgit = std::fs::read_to_string(root.join(".git")).ok()?;
    let gitdir = PathBuf::from(dotgit.strip_prefix("gitdir:")?.trim());
    let common = std::fs::read_to_string(gitdir.join("commondir")).ok()?;
    let common = std::fs::canonicalize(gitdir.join(common.trim())).ok()?;
    Some(common.parent()?.to_path_buf())
}

/// Upstream ztunnel's binary: the file [`UPSTREAM_ZTUNNEL_ENV`] names (an error if it names
/// nothing runnable), else the first existing [`upstream_ztunnel_candidates`] entry, else
/// `None`.
pub fn upstream_ztunnel() -> Result<Option<PathBuf>, String> {
    if let Some(p) = std::env::var_os(UPSTREAM_ZTUNNEL_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(Some(p))
        } else {
            Err(format!(
                "{UPSTREAM_ZTUNNEL_ENV}={} is not a file",
                p.display()
            ))
        };
    }
    Ok(upstream_ztunnel_candidates()
        .into_iter()
        .find(|p| p.is_file()))
}

/// For interop tests: upstream ztunnel's binary, or `None` after printing why `test` is
/// skipped. Only an absent binary skips; a variable naming a missing file panics.
pub fn upstream_ztunnel_or_skip(test: &str) -> Option<PathBuf> {
    match upstream_ztunnel() {
        Ok(Some(p)) => Some(p),
        Ok(None) => {
            let looked: Vec<String> = upstream_ztunnel_candidates()
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            eprintln!(
                "skipping {test}: no upstream ztunnel binary (set {UPSTREAM_ZTUNNEL_ENV}; looked at {})",
                looked.join(", ")
            );
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linked_worktree_finds_its_main_working_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let main = tmp.path().join("main");
        let gitdir = main.join(".git/worktrees/wt");
        std::fs::create_dir_all(&gitdir).unwrap();
        std::fs::write(gitdir.join("commondir"), "../..\n").unwrap();
        let wt = tmp.path().join("wt");
        std::fs::create_dir_all(&wt).unwrap();
        std::fs::write(wt.join(".git"), format!("gitdir: {}\n", gitdir.display())).unwrap();
        let found = main_worktree(&wt).unwrap();
        assert_eq!(found.canonicalize().unwrap(), main.canonicalize().unwrap());
        // The main working tree itself (a `.git` directory) has none.
        assert_eq!(main_worktree(&main), None);
    }
}

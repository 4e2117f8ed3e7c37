//! Support for tests that need network-namespace privileges, shared by every crate's
//! root-only tests so they all skip (or fail) the same way.

use std::sync::OnceLock;

use crate::NetnsFd;

/// Whether this process may create and enter network namespaces.
///
/// Returns `true` when it can. When it cannot: panics if the environment variable `CI` is
/// `true` (CI must run these tests, a silent skip would hide regressions), otherwise
/// prints a skip message naming `test` and returns `false` so the caller returns early.
///
/// Reading the environment here is deliberate: this is test support, not library config.
pub fn netns_capable_or_skip(test: &str) -> bool {
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

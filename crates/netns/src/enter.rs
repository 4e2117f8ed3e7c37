//! Running code inside a network namespace: on the current thread with a guaranteed
//! switch back ([`in_netns`]), or on a dedicated thread ([`run_in_netns_thread`],
//! [`spawn_in_netns_thread`]).

use std::{os::fd::AsFd, thread};

use crate::{NetnsError, NetnsFd, imp};

/// Runs `f` on the current thread inside `target`, then moves the thread back.
///
/// Only the calling thread changes namespace (network namespaces are per thread), so
/// other threads, including other tokio workers, are unaffected. `f` must not yield to an
/// async runtime in between: it is a plain closure, so it cannot.
///
/// The thread is moved back also when `f` panics (a drop guard does it during unwinding).
///
/// # Aborts
///
/// If moving back fails, the process aborts. A thread left in the wrong namespace would
/// silently create later sockets (for example a tokio worker's) in a pod's namespace, and
/// could bypass or leak traffic across pods: a security bug worse than a crash. `setns`
/// into a namespace we were just in, through a descriptor we hold, does not fail in
/// practice, so this is a last-resort check.
pub fn in_netns<R>(target: &NetnsFd, f: impl FnOnce() -> R) -> Result<R, NetnsError> {
    let original = match KNOWN.with(|k| k.borrow_mut().take()) {
        Some(fd) => fd,
        None => NetnsFd::current_thread()?,
    };
    if original.same_namespace(target) {
        KNOWN.with(|k| *k.borrow_mut() = Some(original));
        return Ok(f());
    }
    if let Err(e) = imp::enter(target.as_fd(), target.identity()) {
        KNOWN.with(|k| *k.borrow_mut() = Some(original));
        return Err(e);
    }
    // While `f` runs the thread is in `target`, which is not cached: a nested call opens
    // the thread's namespace itself, and caches it when it moves back.
    let _restore = RestoreGuard {
        original: Some(original),
    };
    Ok(f())
}

thread_local! {
    /// The namespace this thread is in, when known: the one [`in_netns`] last moved it back
    /// to. Saves opening `/proc/self/task/TID/ns/net` (a path walk, an `openat`, two checks
    /// and a `close`) on every call: ztunnel creates each pod's sockets through
    /// [`in_netns`], one per proxied connection. Sound because every `setns` on a thread
    /// of this process goes through this crate (`in_netns`, which keeps this current, and
    /// the namespace threads, which start with it empty); the forked children of
    /// [`crate::set_command_netns`] and the sandbox are other processes.
    static KNOWN: std::cell::RefCell<Option<NetnsFd>> = const { std::cell::RefCell::new(None) };
}

/// Moves the thread back into its original namespace when dropped.
struct RestoreGuard {
    original: Option<NetnsFd>,
}

impl Drop for RestoreGuard {
    fn drop(&mut self) {
        let Some(original) = self.original.take() else {
            return;
        };
        if let Err(e) = imp::enter(original.as_fd(), original.identity()) {
            // See `in_netns`: continuing would run unrelated code in a foreign namespace.
            eprintln!("ambit-netns: cannot restore the thread's network namespace: {e}; aborting");
            std::process::abort();
        }
        // `try_with`: during thread teardown the cache may be gone; nothing to keep then.
        let _ = KNOWN.try_with(|k| *k.borrow_mut() = Some(original));
    }
}

/// Runs `f` on a new OS thread that enters `netns` first, waits for it and returns its
/// result. The thread ends afterwards, so nothing else ever runs in the namespace by
/// accident. A panic in `f` is resumed on the caller.
///
/// Use this for blocking work; for short socket setup [`in_netns`] avoids the thread.
pub fn run_in_netns_thread<R: Send>(
    netns: &NetnsFd,
    f: impl FnOnce() -> R + Send,
) -> Result<R, NetnsError> {
    thread::scope(|s| {
        let handle = thread::Builder::new()
            .name("netns-run".into())
            .spawn_scoped(s, move || {
                imp::enter(netns.as_fd(), netns.identity())?;
                Ok(f())
            })
            .map_err(NetnsError::Spawn)?;
        handle
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Spawns a named OS thread that enters `netns` and runs `f` there, for long-running
/// servers. The thread owns `netns`; join the handle to get `f`'s result (or the error
/// from entering the namespace).
pub fn spawn_in_netns_thread<R: Send + 'static>(
    netns: NetnsFd,
    name: impl Into<String>,
    f: impl FnOnce() -> R + Send + 'static,
) -> Result<thread::JoinHandle<Result<R, NetnsError>>, NetnsError> {
    thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            imp::enter(netns.as_fd(), netns.identity())?;
            drop(netns);
            Ok(f())
        })
        .map_err(NetnsError::Spawn)
}

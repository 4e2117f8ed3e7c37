//! Test support shared by every crate's tests (a dev-dependency, or behind a crate's
//! `testing` feature; never in the shipped binary).
//!
//! [`eventually`] is the one way tests wait for something that happens in the background:
//! poll a condition until it holds, or fail the test naming what did not happen once the
//! deadline passes (design §5: poll with a deadline, never sleep to wait). The condition
//! returns `bool` or `Option<T>` (the value is handed back). [`eventually_async`] takes a
//! condition that must await (an HTTP probe), [`eventually_blocking`] serves synchronous
//! tests and threads outside a runtime; [`eventually_blocking_explained`] adds what the
//! failure should show (the processes' logs), and [`eventually_blocking_every`] polls less
//! often a condition that is costly to check (one that starts a process).

#![forbid(unsafe_code)]

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a condition is polled.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// What a condition returns: `true`/`Some` when it holds.
pub trait Outcome {
    /// What [`eventually`] returns once the condition holds.
    type Value;

    /// `Some` when the condition holds.
    fn holds(self) -> Option<Self::Value>;
}

impl Outcome for bool {
    type Value = ();

    fn holds(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;

    fn holds(self) -> Option<T> {
        self
    }
}

fn timed_out(what: &str, deadline: Duration) -> ! {
    panic!("timed out after {deadline:?} waiting for {what}")
}

fn timed_out_explained(what: &str, deadline: Duration, explain: String) -> ! {
    panic!("timed out after {deadline:?} waiting for {what}\n{explain}")
}

/// Polls `f` every [`POLL_INTERVAL`] until it holds; panics naming `what` once `deadline`
/// has passed. The condition is checked once more at the deadline.
pub async fn eventually<O: Outcome>(
    what: &str,
    deadline: Duration,
    mut f: impl FnMut() -> O,
) -> O::Value {
    eventually_async(what, deadline, || std::future::ready(f())).await
}

/// [`eventually`] for a condition that awaits.
pub async fn eventually_async<O, Fut>(
    what: &str,
    deadline: Duration,
    mut f: impl FnMut() -> Fut,
) -> O::Value
where
    O: Outcome,
    Fut: Future<Output = O>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        let last = tokio::time::Instant::now() >= end;
        if let Some(v) = f().await.holds() {
            return v;
        }
        if last {
            timed_out(what, deadline);
        }
        tokio::time::sleep(POLL_INTERVAL.min(end - tokio::time::Instant::now())).await;
    }
}

/// [`eventually`] for synchronous code: sleeps the calling thread between polls.
pub fn eventually_blocking<O: Outcome>(
    what: &str,
    deadline: Duration,
    f: impl FnMut() -> O,
) -> O::Value {
    blocking(what, deadline, POLL_INTERVAL, None::<fn() -> String>, f)
}

/// [`eventually_blocking`] that adds `explain()` (logs, state) to the failure message; it is
/// called only when the deadline has passed.
pub fn eventually_blocking_explained<O: Outcome>(
    what: &str,
    deadline: Duration,
    explain: impl FnOnce() -> String,
    f: impl FnMut() -> O,
) -> O::Value {
    blocking(what, deadline, POLL_INTERVAL, Some(explain), f)
}

/// [`eventually_blocking_explained`] polling every `every`, for a condition that is costly
/// to check (it starts a process or opens a connection).
pub fn eventually_blocking_every<O: Outcome>(
    what: &str,
    deadline: Duration,
    every: Duration,
    explain: impl FnOnce() -> String,
    f: impl FnMut() -> O,
) -> O::Value {
    blocking(what, deadline, every, Some(explain), f)
}

fn blocking<O: Outcome>(
    what: &str,
    deadline: Duration,
    every: Duration,
    explain: Option<impl FnOnce() -> String>,
    mut f: impl FnMut() -> O,
) -> O::Value {
    let end = Instant::now() + deadline;
    loop {
        let last = Instant::now() >= end;
        if let Some(v) = f().holds() {
            return v;
        }
        if last {
            match explain {
                Some(explain) => timed_out_explained(what, deadline, explain()),
                None => timed_out(what, deadline),
            }
        }
        std::thread::sleep(every.min(end.saturating_duration_since(Instant::now())));
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[tokio::test]
    async fn returns_once_the_condition_holds() {
        let n = Cell::new(0);
        eventually("three polls", Duration::from_secs(5), || {
            n.set(n.get() + 1);
            n.get() == 3
        })
        .await;
        assert_eq!(n.get(), 3);
        let v = eventually("a value", Duration::from_secs(5), || Some(7)).await;
        assert_eq!(v, 7);
        let v = eventually_blocking("a value", Duration::from_secs(5), || Some("x"));
        assert_eq!(v, "x");
    }

    #[tokio::test]
    #[should_panic(expected = "waiting for the impossible")]
    async fn panics_naming_what_did_not_happen() {
        eventually("the impossible", Duration::from_millis(50), || false).await;
    }

    #[test]
    #[should_panic(expected = "waiting for the impossible")]
    fn blocking_panics_naming_what_did_not_happen() {
        eventually_blocking("the impossible", Duration::from_millis(50), || false);
    }

    #[test]
    #[should_panic(expected = "waiting for the impossible\nthe logs say why")]
    fn explained_panics_with_the_explanation() {
        eventually_blocking_explained(
            "the impossible",
            Duration::from_millis(50),
            || "the logs say why".to_string(),
            || false,
        );
    }

    #[test]
    fn every_sets_the_poll_interval() {
        let polls = Cell::new(0);
        let started = Instant::now();
        eventually_blocking_every(
            "three polls",
            Duration::from_secs(5),
            Duration::from_millis(30),
            String::new,
            || {
                polls.set(polls.get() + 1);
                polls.get() == 3
            },
        );
        assert!(
            started.elapsed() >= Duration::from_millis(60),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn the_explanation_is_built_only_on_failure() {
        let v = eventually_blocking_explained(
            "a value",
            Duration::from_secs(5),
            || panic!("explained although the condition held"),
            || Some(1),
        );
        assert_eq!(v, 1);
    }
}

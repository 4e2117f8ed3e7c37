//! Waiting for a Windows pod's network compartment (`spec/windows.md` §1.2, §2.3). HNS
//! creates the compartment only when the first container starts in the namespace, so an
//! `AddWorkload` can name a namespace that has none yet. Upstream acks such a pod at once
//! and retries forever (and panics if the namespace then vanishes); ambit waits a bounded
//! time here, re-asking HNS with a doubling delay, and otherwise NACKs: the pod stays
//! pending (retried on the pending timer) until a `DelWorkload` or a new connection
//! forgets it, and the agent keeps it partially enrolled until a later `Add` is acked.
//! Platform-neutral: the HNS lookup is a closure, tested with tokio's paused clock.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// First delay between two lookups; doubles up to [`MAX_DELAY`].
pub const FIRST_DELAY: Duration = Duration::from_millis(500);
/// Longest delay between two lookups.
pub const MAX_DELAY: Duration = Duration::from_secs(2);
/// How long one `AddWorkload` waits for the compartment before its NACK: below the agent's
/// 5 s ack deadline, like the workload-record wait.
pub const ADD_BUDGET: Duration = Duration::from_secs(3);

/// What one lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The namespace has this compartment.
    Ready(u32),
    /// The namespace exists but has no compartment yet.
    NotYet,
}

/// Why the wait ended without a compartment.
#[derive(Debug, thiserror::Error)]
pub enum WaitError<E: std::error::Error + 'static> {
    /// Still no compartment when the budget ran out.
    #[error(
        "the pod's network compartment does not exist yet (asked HNS {attempts} times over {waited:?})"
    )]
    NotYet {
        /// Lookups made.
        attempts: u32,
        /// The budget.
        waited: Duration,
    },
    /// The lookup itself failed (e.g. the namespace is gone): no more waiting.
    #[error("looking up the pod's HNS namespace: {0}")]
    Lookup(#[source] E),
}

/// Asks `lookup` now and then after 500 ms, 1 s, 2 s, 2 s, … until it finds a compartment,
/// fails, or `budget` is spent (the last lookup is made at the deadline). A zero budget is
/// one lookup.
pub async fn wait_for_compartment<E, F, Fut>(
    mut lookup: F,
    budget: Duration,
) -> Result<u32, WaitError<E>>
where
    E: std::error::Error + 'static,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Lookup, E>>,
{
    let deadline = Instant::now() + budget;
    let mut delay = FIRST_DELAY;
    let mut attempts = 0;
    loop {
        attempts += 1;
        match lookup().await.map_err(WaitError::Lookup)? {
            Lookup::Ready(id) => return Ok(id),
            Lookup::NotYet => {}
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(WaitError::NotYet {
                attempts,
                waited: budget,
            });
        }
        tokio::time::sleep_until((now + delay).min(deadline)).await;
        delay = (delay * 2).min(MAX_DELAY);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::cell::RefCell;

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("namespace gone")]
    struct Gone;

    /// Runs a wait whose lookups answer from `answers` (then `NotYet`), returning the
    /// result and the milliseconds since start of every lookup.
    async fn run(
        answers: Vec<Result<Lookup, Gone>>,
        budget: Duration,
    ) -> (Result<u32, WaitError<Gone>>, Vec<u128>) {
        let start = Instant::now();
        let at = RefCell::new(Vec::new());
        let answers = RefCell::new(answers.into_iter());
        let result = wait_for_compartment(
            || {
                at.borrow_mut().push(start.elapsed().as_millis());
                let next = answers.borrow_mut().next().unwrap_or(Ok(Lookup::NotYet));
                async move { next }
            },
            budget,
        )
        .await;
        (result, at.into_inner())
    }

    #[tokio::test(start_paused = true)]
    async fn backs_off_doubling_capped_and_stops_at_the_budget() {
        let (r, at) = run(vec![], ADD_BUDGET).await;
        assert_eq!(
            at,
            [0, 500, 1500, 3000],
            "the last lookup is at the deadline"
        );
        assert!(
            matches!(r, Err(WaitError::NotYet { attempts: 4, .. })),
            "{r:?}"
        );
        let (_, at) = run(vec![], Duration::from_secs(10)).await;
        assert_eq!(
            at,
            [0, 500, 1500, 3500, 5500, 7500, 9500, 10000],
            "capped at 2 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn ends_as_soon_as_the_compartment_exists() {
        let answers = vec![Ok(Lookup::NotYet), Ok(Lookup::NotYet), Ok(Lookup::Ready(7))];
        let (r, at) = run(answers, ADD_BUDGET).await;
        assert_eq!(r.unwrap(), 7);
        assert_eq!(at, [0, 500, 1500]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_lookup_ends_the_wait_and_zero_budget_asks_once() {
        let (r, at) = run(vec![Ok(Lookup::NotYet), Err(Gone)], ADD_BUDGET).await;
        assert!(matches!(r, Err(WaitError::Lookup(Gone))), "{r:?}");
        assert_eq!(at, [0, 500]);
        let (r, at) = run(vec![], Duration::ZERO).await;
        assert!(matches!(r, Err(WaitError::NotYet { attempts: 1, .. })));
        assert_eq!(at, [0]);
    }
}

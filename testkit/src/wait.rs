//! Waiting on a condition with a deadline, never sleeping and hoping. The test forms panic with
//! what they waited for once [`wait_deadline`] passes; [`poll_within`] and [`poll_blocking`] give
//! up with `None` or an error instead, for harnesses that report failures as values.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// How long any condition in a test may take to come true before the test fails.
pub const wait_deadline: Duration = Duration::from_secs(20);
/// Pause between two checks of a condition in the async waits.
pub const poll_interval: Duration = Duration::from_millis(10);

/// Polls the async `check` until it gives a value; panics naming `what` after [`wait_deadline`].
pub async fn wait_value<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match poll_within(wait_deadline, check).await {
        Some(value) => value,
        None => panic!("timed out after {wait_deadline:?} waiting for {what}"),
    }
}

/// Polls the async `check` until it is true; panics naming `what` after [`wait_deadline`].
pub async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_value(what, || {
        let done = check();
        async move { done.await.then_some(()) }
    })
    .await
}

/// Polls the plain `check` (a read of shared state) until it is true, yielding to the runtime in
/// between; panics naming `what` after [`wait_deadline`].
pub async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    wait_value(what, || std::future::ready(check().then_some(()))).await
}

/// Polls the async `check` until it gives a value, or `None` once `within` has passed (the check
/// runs at least once).
pub async fn poll_within<T, F, Fut>(within: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(poll_interval).await;
    }
}

/// Polls `probe` on this thread every `every` until it gives a value; after `within` the error is
/// what the last probe said (its error, or "not yet").
pub fn poll_blocking<T, E: Display>(
    within: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Result<Option<T>, E>,
) -> Result<T, String> {
    let deadline = Instant::now() + within;
    loop {
        let last = match probe() {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => "not yet".to_string(),
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() >= deadline {
            return Err(last);
        }
        std::thread::sleep(every);
    }
}

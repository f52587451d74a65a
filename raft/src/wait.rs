//! Waiting on a watch channel (Raft's metrics, a leadership marker) with a bound that holds even
//! once the channel's sender is gone.

use std::time::Duration;

use tokio::sync::watch;

/// Waits until `rx` changes or `at_most` has passed. Once the sender is gone (Raft stopped,
/// the service shutting down) `changed()` fails at once; this then waits out `at_most`, so a
/// caller's loop reaches its deadline instead of spinning on the closed channel (a spin that
/// holds a core until the deadline, and forever under a paused clock).
pub async fn changed_within<T>(rx: &mut watch::Receiver<T>, at_most: Duration) {
    let until = tokio::time::Instant::now() + at_most;
    if let Ok(Err(_)) = tokio::time::timeout(at_most, rx.changed()).await {
        tokio::time::sleep_until(until).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wait_on_a_closed_channel_lets_the_clock_reach_the_callers_deadline() {
        // A leader search or a handover loops "wait for a change, look again" until its
        // deadline. With the sender dropped, each wait must still take its time: a loop that
        // spun would never let the paused clock move and never end.
        let (tx, mut rx) = watch::channel(0u64);
        drop(tx);
        let started = tokio::time::Instant::now();
        let deadline = started + Duration::from_millis(500);
        let mut rounds = 0u32;
        while tokio::time::Instant::now() < deadline {
            rounds += 1;
            assert!(rounds <= 10, "the wait returned without letting time pass");
            changed_within(&mut rx, Duration::from_millis(100)).await;
        }
        assert_eq!(rounds, 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_ends_the_wait_before_its_bound() {
        let (tx, mut rx) = watch::channel(0u64);
        let started = tokio::time::Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            let _ = tx.send(1);
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        changed_within(&mut rx, Duration::from_secs(10)).await;
        assert_eq!(*rx.borrow(), 1);
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}

//! The async runtime openraft runs on: tokio, as openraft's own `TokioRuntime`, except that the
//! random numbers it draws (the election timeout, `Config::new_rand_election_timeout`) come from a
//! per-thread generator that can be seeded. In meshd nothing seeds it: each thread's generator is
//! seeded from the OS on first use, as `rand::thread_rng` is. The simulator seeds its one thread
//! from the run's seed, so elections replay (decision 0322).

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use openraft::async_runtime::TokioOneShotSender;
use openraft::{AsyncRuntime, OptionalSend, TokioInstant};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

thread_local! {
    /// This thread's generator; `None` until first used or seeded.
    static rng: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Seeds the generator openraft draws from on the calling thread: every election timeout drawn on
/// this thread from now on follows from `seed`.
pub fn seed_thread_rng(seed: u64) {
    rng.with(|r| *r.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
}

/// A handle on this thread's generator (see [`seed_thread_rng`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadRng;

impl ThreadRng {
    fn with<R>(f: impl FnOnce(&mut StdRng) -> R) -> R {
        rng.with(|r| {
            let mut r = r.borrow_mut();
            let generator = r.get_or_insert_with(StdRng::from_entropy);
            f(generator)
        })
    }
}

impl RngCore for ThreadRng {
    fn next_u32(&mut self) -> u32 {
        ThreadRng::with(|r| r.next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        ThreadRng::with(|r| r.next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        ThreadRng::with(|r| r.fill_bytes(dest))
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        ThreadRng::with(|r| r.try_fill_bytes(dest))
    }
}

/// tokio with a seedable [`ThreadRng`]: mesh's openraft runtime.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SeededRuntime;

impl AsyncRuntime for SeededRuntime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = tokio::time::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = tokio::time::error::Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = tokio::time::Timeout<T>;
    type ThreadLocalRng = ThreadRng;
    type OneshotSender<T: OptionalSend> = TokioOneShotSender<T>;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        tokio::task::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        tokio::time::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        tokio::time::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        ThreadRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (TokioOneShotSender(tx), rx)
    }
}

//! Keeping the pool's workers awake for a moment after a program ran.
//!
//! A rayon worker that finds no work goes to sleep within microseconds, and waking it takes a
//! futex wake and, on a virtual machine, the host scheduling the halted vCPU again: tens of
//! microseconds before a parallel kernel has all its threads. A model's step runs many short
//! kernels with host work between them (and a benchmark, many runs of one), so each would pay
//! that again. After every run the workers of the pool it ran on therefore keep looking for
//! work, spinning, until [`linger`] has passed without a new run (the policy of OpenMP
//! runtimes, whose threads spin for a while before they block). A worker that finds work runs
//! it; one that lingers yields its CPU between polls, so host threads on the same cores keep
//! running.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long the workers keep polling after a run when `UOPC_POOL_LINGER_US` does not say: long
/// enough to cover the host work between a step's kernels and between short ops, short next
/// to a pause in the caller's work (OpenMP runtimes spin from a fraction of a millisecond to
/// 200 ms).
const DEFAULT_LINGER: Duration = Duration::from_millis(1);

/// The time workers keep polling after a run: `UOPC_POOL_LINGER_US` microseconds (0 turns
/// lingering off), else [`DEFAULT_LINGER`]. Read once per process.
pub(crate) fn linger() -> Duration {
    static LINGER: OnceLock<Duration> = OnceLock::new();
    *LINGER.get_or_init(|| {
        std::env::var("UOPC_POOL_LINGER_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(DEFAULT_LINGER, Duration::from_micros)
    })
}

/// Nanoseconds since the process's first run: when lingering workers stop.
static DEADLINE_NS: AtomicU64 = AtomicU64::new(0);

/// Linger jobs sent and not yet finished: a run sends new ones only when none are out, so a
/// stream of runs neither queues them up nor nests one inside another.
static OUT: AtomicUsize = AtomicUsize::new(0);

fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Called after each run: moves the deadline to [`linger`] from now, and sends every worker of
/// the current pool a job that polls for work until then, unless such jobs are still out.
pub(crate) fn after_run() {
    let threads = rayon::current_num_threads();
    let linger = linger();
    if threads <= 1 || linger.is_zero() {
        return;
    }
    let nanos = u64::try_from(linger.as_nanos()).unwrap_or(u64::MAX);
    DEADLINE_NS.fetch_max(now_ns().saturating_add(nanos), Ordering::Relaxed);
    if OUT.compare_exchange(0, threads, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
        rayon::spawn_broadcast(|_| {
            poll_until_deadline();
            OUT.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// Runs whatever work the pool has until the deadline passes with none.
fn poll_until_deadline() {
    while now_ns() < DEADLINE_NS.load(Ordering::Relaxed) {
        if rayon::yield_now() != Some(rayon::Yield::Executed) {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn lingering_workers_run_new_work_and_stop_after_the_deadline() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a pool");
        pool.install(after_run);
        // Work sent while the workers poll runs, on the pool, to the end.
        let sum: u64 = pool.install(|| (0..1000u64).into_par_iter().sum());
        assert_eq!(sum, 499_500);
        pool.install(after_run);
        // Every polling job ends once no run has moved the deadline for `linger` (other tests'
        // runs may move it for a while, hence the generous bound).
        let bound = Instant::now() + linger() * 10 + Duration::from_secs(10);
        while OUT.load(Ordering::Acquire) != 0 && Instant::now() < bound {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(OUT.load(Ordering::Acquire), 0, "polling jobs still out");
    }
}

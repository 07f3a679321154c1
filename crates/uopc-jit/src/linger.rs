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
//!
//! A polling job must never hold up the work it waits for. Rayon runs queued jobs on a thread
//! that waits inside a `join`, so a poller can start *inside* the next run's join (on the
//! thread that called that run, or on one that stole a piece of it), and that join cannot
//! return before the poller does. So a poller stops as soon as a run is under way (the run's
//! threads then find its work the ordinary way), and polls in slices of [`SLICE`] at most,
//! queueing its next slice as a new job: inside someone else's join (a packing step before a
//! run, or the caller's own rayon code) it holds the join up by one slice at most.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long the workers keep polling after a run when `UOPC_POOL_LINGER_US` does not say: long
/// enough to cover the host work between a step's kernels and between short ops, short next
/// to a pause in the caller's work (OpenMP runtimes spin from a fraction of a millisecond to
/// 200 ms).
const DEFAULT_LINGER: Duration = Duration::from_millis(1);

/// The longest a polling job keeps its thread before it hands it back and queues the rest of
/// its polling: the most it can delay a `join` it was started inside.
const SLICE: Duration = Duration::from_micros(20);

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

/// Linger jobs sent and not yet finished (a job that queues its next slice stays counted): a
/// run sends new ones only when none are out, so a stream of runs neither queues them up nor
/// nests one inside another.
static OUT: AtomicUsize = AtomicUsize::new(0);

/// Runs under way, in any pool: pollers stop while there is one.
static RUNNING: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread is inside a polling job: a slice queued by one poller and taken by
    /// a thread that already polls ends at once rather than nesting.
    static POLLING: Cell<bool> = const { Cell::new(false) };
}

fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A run under way, from [`running`] until it is dropped (a panicking run too).
pub(crate) struct Running(());

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Marks a run as under way for as long as the value lives: polling jobs stop meanwhile.
pub(crate) fn running() -> Running {
    RUNNING.fetch_add(1, Ordering::AcqRel);
    Running(())
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
        rayon::spawn_broadcast(|_| poll_slice());
    }
}

/// Whether a poller should go on: the deadline is ahead and no run is under way.
fn keep_polling() -> bool {
    RUNNING.load(Ordering::Acquire) == 0 && now_ns() < DEADLINE_NS.load(Ordering::Relaxed)
}

/// One slice of polling: runs whatever work the pool has until the slice ends, then queues the
/// next slice if polling should go on, else ends (one job fewer out).
fn poll_slice() {
    if POLLING.with(Cell::get) {
        OUT.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    POLLING.with(|p| p.set(true));
    let end = now_ns().saturating_add(SLICE.as_nanos() as u64);
    while keep_polling() && now_ns() < end {
        if rayon::yield_now() != Some(rayon::Yield::Executed) {
            std::thread::yield_now();
        }
    }
    POLLING.with(|p| p.set(false));
    if keep_polling() {
        // On a worker this lands in its own queue: taken next unless the thread returns to a
        // join that is now done.
        rayon::spawn(poll_slice);
    } else {
        OUT.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    /// Pollers told to go on for seconds, as after a run with a long linger, and queued on the
    /// thread that goes on to `join`: each join's wait runs that thread's poller, which must hand
    /// the thread back within a slice rather than at the deadline. (The bound is far from both:
    /// a held-up join would take the whole 2 s.)
    #[test]
    fn a_poller_run_inside_a_join_hands_the_thread_back() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a pool");
        pool.install(|| {
            let ahead = Duration::from_secs(2).as_nanos() as u64;
            DEADLINE_NS.fetch_max(now_ns() + ahead, Ordering::Relaxed);
            if OUT.compare_exchange(0, 2, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                rayon::spawn_broadcast(|_| poll_slice());
            }
            let start = Instant::now();
            // Both halves take a while, so the other worker steals one and this thread waits.
            let work = |i: u64| (0..20_000u64).map(|x| std::hint::black_box(x ^ i)).sum::<u64>();
            let mut sum = 0u64;
            for i in 0..100u64 {
                let (a, b) = rayon::join(|| work(i), || work(i + 1));
                sum += a + b;
            }
            assert!(sum > 0);
            assert!(start.elapsed() < Duration::from_millis(500), "joins held up for {:?}", start.elapsed());
            // While a run is under way nobody polls.
            let run = running();
            assert!(!keep_polling());
            drop(run);
        });
    }

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

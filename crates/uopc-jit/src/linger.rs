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
//! that waits inside a `join`, so a poller could start *inside* a join and make it wait for
//! the poller. So pollers go to the other workers only: one that finds itself on the thread
//! whose run sent it (that thread goes on with the caller's work, and meets the poller only
//! inside a join) ends at once, and so does one taken by a thread that already polls. And a
//! poller polls in slices of [`SLICE`] at most, queueing its next slice as a new job: inside
//! some other join (a packing step before a run, the caller's own rayon code) it holds the join
//! up by one slice at most.

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

/// Pollers sent and not yet ended (a poller that queues its next slice stays counted): a run
/// tops them up to one per other worker, so a stream of runs neither queues them up nor leaves
/// a worker without one.
static OUT: AtomicUsize = AtomicUsize::new(0);

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

/// Called after each run: moves the deadline to [`linger`] from now, and tops the pollers up to
/// one per worker of the current pool other than the calling one.
pub(crate) fn after_run() {
    let threads = rayon::current_num_threads();
    let linger = linger();
    if threads <= 1 || linger.is_zero() {
        return;
    }
    let nanos = u64::try_from(linger.as_nanos()).unwrap_or(u64::MAX);
    DEADLINE_NS.fetch_max(now_ns().saturating_add(nanos), Ordering::Relaxed);
    // The calling thread goes on with the caller's work; a caller outside the pool leaves
    // every worker idle.
    let caller = rayon::current_thread_index();
    let wanted = threads - usize::from(caller.is_some());
    let mut out = OUT.load(Ordering::Acquire);
    while out < wanted {
        match OUT.compare_exchange_weak(out, wanted, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                for _ in out..wanted {
                    // Idle workers take these (the spawn wakes a sleeping one).
                    rayon::spawn(move || poll_slice(caller));
                }
                return;
            }
            Err(now) => out = now,
        }
    }
}

/// One slice of polling for a run called from thread `caller` (`None`: from outside the pool):
/// runs whatever work the pool has until the slice ends, then queues the next slice while the
/// deadline is ahead, else ends (one poller fewer out). On the caller's thread, or on one
/// that already polls, it ends at once.
fn poll_slice(caller: Option<usize>) {
    if (caller.is_some() && rayon::current_thread_index() == caller) || POLLING.with(Cell::get) {
        OUT.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    POLLING.with(|p| p.set(true));
    let deadline = || DEADLINE_NS.load(Ordering::Relaxed);
    let end = now_ns().saturating_add(SLICE.as_nanos() as u64);
    while now_ns() < deadline().min(end) {
        if rayon::yield_now() != Some(rayon::Yield::Executed) {
            std::thread::yield_now();
        }
    }
    POLLING.with(|p| p.set(false));
    if now_ns() < deadline() {
        // On a worker this lands in its own queue: taken next unless the thread returns to a
        // join that is now done.
        rayon::spawn(move || poll_slice(caller));
    } else {
        OUT.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    /// Moves the deadline to `secs` seconds from now, as after a run with a long linger.
    fn deadline_in(secs: u64) {
        let ahead = Duration::from_secs(secs).as_nanos() as u64;
        DEADLINE_NS.fetch_max(now_ns() + ahead, Ordering::Relaxed);
    }

    /// A poller on the thread whose run sent it, or on one that already polls, ends at once,
    /// and any other ends its slice and queues the next: none holds its thread until the
    /// deadline. (The bounds are far from both: a held thread would take the whole 2 s.)
    #[test]
    fn a_poller_hands_its_thread_back_within_a_slice() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a pool");
        pool.install(|| {
            deadline_in(2);
            let me = rayon::current_thread_index();
            for (caller, polling) in [(me, false), (None, true), (None, false)] {
                OUT.fetch_add(1, Ordering::AcqRel);
                POLLING.with(|p| p.set(polling));
                let start = Instant::now();
                poll_slice(caller);
                POLLING.with(|p| p.set(false));
                assert!(
                    start.elapsed() < Duration::from_millis(500),
                    "{caller:?} {polling}: {:?}",
                    start.elapsed()
                );
            }
        });
    }

    /// After a run, the pool's other worker polls and this thread's joins are never held up by
    /// a poller, whichever thread takes it: the rounds of joins finish long before the 2 s
    /// deadline.
    #[test]
    fn joins_after_a_run_are_not_held_up_by_pollers() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a pool");
        pool.install(|| {
            deadline_in(2);
            // As `after_run` does, with more pollers than workers, so this thread's own queue
            // holds some when its joins wait.
            let me = rayon::current_thread_index();
            for _ in 0..4 {
                OUT.fetch_add(1, Ordering::AcqRel);
                rayon::spawn(move || poll_slice(me));
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

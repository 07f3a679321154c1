//! The per-thread packing buffer.
//!
//! Transposed B operands are copied into contiguous panels before the micro-kernel runs. The
//! buffer lives in a thread-local so the hot path allocates only when a thread first sees a
//! larger tile than before.

use std::cell::RefCell;

/// One cache line of floats, so the panels start 64-byte aligned.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([f32; 16]);

/// The largest buffer a thread keeps between calls: 16 MiB (the machine model's blocks stay
/// well below it; only unusual shapes reach past it, and they allocate per call).
const KEPT_MAX_LINES: usize = (16 << 20) / 64;

thread_local! {
    static PACK: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
    static STRIP: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with a pointer to at least `floats` writable, 64-byte aligned `f32`s.
///
/// Falls back to a temporary allocation if the thread-local is unavailable (thread teardown) or
/// already borrowed, so this never panics. `f` runs exactly once either way.
pub(crate) fn with_buffer<R>(floats: usize, f: impl FnMut(*mut f32) -> R) -> R {
    with_lines(&PACK, floats, f)
}

/// [`with_buffer`] for a second, small buffer used beside the packing buffer (a driver's strip
/// of sums), so that it never pushes the packing buffer past what a thread keeps.
pub(crate) fn with_strip<R>(floats: usize, f: impl FnMut(*mut f32) -> R) -> R {
    with_lines(&STRIP, floats, f)
}

/// [`with_buffer`] on the thread-local `key`.
fn with_lines<R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<Line>>>,
    floats: usize,
    mut f: impl FnMut(*mut f32) -> R,
) -> R {
    let lines = floats.div_ceil(16).max(1);
    let got = key.try_with(|cell| {
        cell.try_borrow_mut().ok().map(|mut buf| {
            if buf.len() < lines {
                // The old contents are not needed; a fresh buffer can still ask for huge pages.
                *buf = crate::memory::filled(lines, Line([0.0; 16]));
            }
            let r = f(buf.as_mut_ptr().cast::<f32>());
            if buf.len() > KEPT_MAX_LINES {
                // One outsized product must not pin its buffer in this thread for good.
                *buf = Vec::new();
            }
            r
        })
    });
    match got {
        Ok(Some(r)) => r,
        _ => {
            let mut buf = crate::memory::filled(lines, Line([0.0; 16]));
            f(buf.as_mut_ptr().cast::<f32>())
        }
    }
}

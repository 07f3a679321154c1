//! How one GEMM call is cut into blocks for the caller's rayon pool ([`crate::GemmShape::parallel`]).
//!
//! A caller that cuts a product into equal blocks can only use divisors of its sizes: 1023
//! rows split into 3 or 11 blocks, never 2 or 16. Here the blocks are whole register tiles
//! with a ragged last one, so every core gets an even share of any size.

/// Flops below which a product runs on one thread: waking the others costs more.
const MIN_SPLIT_FLOPS: f64 = 4e6;

/// The block each task of a [`crate::GemmShape::parallel`] call computes, `(rows, cols)`, for an
/// `m x n x k` product on `threads` threads with a register tile of `mr x nr`: the rows in
/// `threads` blocks of whole tiles (the last one ragged) when there are enough of them, else
/// the columns likewise; `None` when the call runs whole on one thread (one thread, too few
/// rows and columns, or too little work to wake the others).
///
/// A caller choosing between its own exact blocks and a split call can price the split with
/// this, the cut the call will make.
pub fn parallel_block(
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
    (mr, nr): (usize, usize),
) -> Option<(usize, usize)> {
    let flops = 2.0 * m as f64 * n as f64 * k as f64;
    if threads <= 1 || flops < MIN_SPLIT_FLOPS {
        return None;
    }
    if m >= threads * mr {
        Some((m.div_ceil(threads).next_multiple_of(mr), n))
    } else if n >= threads * nr {
        Some((m, n.div_ceil(threads).next_multiple_of(nr)))
    } else {
        None
    }
}

/// Rows of A up to which a [`crate::GemmShape::parallel`] f32 call against a row-major B
/// cuts k rather than C ([`depth_split`]): the few-rows kernels then read whole rows of B.
pub const DEPTH_SPLIT_MAX_ROWS: usize = 8;

/// Rows of B each task of a depth split takes at least: fewer, and summing the tasks' partial
/// rows of C costs more than the split saves.
const MIN_DEPTH_PER_TASK: usize = 256;

/// The depth (rows of B) each task of a [`crate::GemmShape::parallel`] f32 call computes when
/// the call cuts k instead of C: for at most [`DEPTH_SPLIT_MAX_ROWS`] rows of A (a decode
/// step's projection) against a B stored by rows, neither transposed, on `threads > 1`
/// threads, with enough work and depth to share. `None` otherwise.
///
/// Cutting the columns of such a product gives each task a stretch of every row of B: runs
/// of a few hundred bytes a row apart, which the hardware prefetcher follows poorly. Cutting
/// k gives each task whole rows, one contiguous run of B, and leaves a sum of `threads`
/// partial rows of C (a few KiB) to add.
pub fn depth_split(
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
    a_trans: bool,
    b_trans: bool,
) -> Option<usize> {
    let flops = 2.0 * m as f64 * n as f64 * k as f64;
    let few_rows = (1..=DEPTH_SPLIT_MAX_ROWS).contains(&m);
    if threads <= 1 || !few_rows || a_trans || b_trans || flops < MIN_SPLIT_FLOPS {
        return None;
    }
    let tasks = threads.min(k / MIN_DEPTH_PER_TASK);
    (tasks > 1).then(|| k.div_ceil(tasks))
}

/// Operand pointers shared by the tasks of one GEMM split over a rayon pool (this module's
/// split and [`crate::gemm_bf16_parallel`]'s), with A of type `A`, B of type `B` and C of
/// type `C`.
///
/// Only for tasks that read A and B, which nothing writes during the call, and write
/// disjoint blocks of C, which the call's contract gives it alone until every task finishes.
#[derive(Clone, Copy)]
pub(crate) struct SharedOperands<A, B, C = f32>(pub *const A, pub *const B, pub *mut C);
// SAFETY: the use the type documents: shared reads of A and B, disjoint writes of C.
unsafe impl<A, B, C> Send for SharedOperands<A, B, C> {}
// SAFETY: as above.
unsafe impl<A, B, C> Sync for SharedOperands<A, B, C> {}

impl<A, B, C> SharedOperands<A, B, C> {
    /// The pointers, taken through a method so that a closure captures the whole (`Sync`)
    /// value rather than its raw-pointer fields.
    pub(crate) fn get(&self) -> (*const A, *const B, *mut C) {
        (self.0, self.1, self.2)
    }
}

/// Runs `run(sub, (a_at, b_at, c_at))` once per block of `s` cut as `block` says (rows or
/// columns, from [`parallel_block`]), each on a task of the current rayon pool: `sub` is the
/// serial shape of the block and the offsets move A, B and C (counted in their elements, at
/// `s`'s leading dimensions) to its first element. With `None`, the whole of `s` runs here.
pub(crate) fn for_each_block(
    s: &crate::GemmShape,
    block: Option<(usize, usize)>,
    run: impl Fn(crate::GemmShape, (usize, usize, usize)) + Sync,
) {
    let serial = crate::GemmShape { parallel: false, ..*s };
    let run = &run;
    match block {
        None => run(serial, (0, 0, 0)),
        Some((rows, _)) if rows < s.m => rayon::scope(|scope| {
            for i0 in (0..s.m).step_by(rows) {
                let sub = crate::GemmShape { m: rows.min(s.m - i0), ..serial };
                let a_at = if s.a_trans { i0 } else { i0 * s.lda };
                scope.spawn(move |_| run(sub, (a_at, 0, i0 * s.ldc)));
            }
        }),
        Some((_, cols)) => rayon::scope(|scope| {
            for j0 in (0..s.n).step_by(cols) {
                let sub = crate::GemmShape { n: cols.min(s.n - j0), ..serial };
                let b_at = if s.b_trans { j0 * s.ldb } else { j0 };
                scope.spawn(move |_| run(sub, (0, b_at, j0)));
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::{depth_split, parallel_block};

    #[test]
    fn few_rows_against_a_deep_row_major_b_cut_k() {
        // A decode step's down projection: two halves of k.
        assert_eq!(depth_split(1, 768, 3072, 2, false, false), Some(1536));
        assert_eq!(depth_split(8, 768, 3072, 3, false, false), Some(1024));
        // No more tasks than k has stretches of the minimum depth.
        assert_eq!(depth_split(1, 4096, 600, 16, false, false), Some(300));
        // Too shallow, too many rows, a transposed operand, one thread, too little work.
        assert_eq!(depth_split(1, 4096, 300, 2, false, false), None);
        assert_eq!(depth_split(9, 768, 3072, 2, false, false), None);
        assert_eq!(depth_split(1, 768, 3072, 2, true, false), None);
        assert_eq!(depth_split(1, 768, 3072, 2, false, true), None);
        assert_eq!(depth_split(1, 768, 3072, 1, false, false), None);
        assert_eq!(depth_split(1, 16, 1024, 2, false, false), None);
    }

    #[test]
    fn rows_are_cut_into_whole_tiles_with_a_ragged_last_block() {
        let big = 1000;
        assert_eq!(parallel_block(1023, 1023, big, 2, (12, 32)), Some((516, 1023)));
        assert_eq!(parallel_block(777, 96, big, 16, (12, 32)), Some((60, 96)));
        // Too few rows for every thread: the columns instead, then nothing.
        assert_eq!(parallel_block(20, 1000, big, 2, (12, 32)), Some((20, 512)));
        assert_eq!(parallel_block(20, 40, big, 2, (12, 32)), None);
        assert_eq!(parallel_block(4096, 4096, big, 1, (12, 32)), None);
        // Too little work to wake another thread.
        assert_eq!(parallel_block(100, 100, 100, 2, (12, 32)), None);
    }
}

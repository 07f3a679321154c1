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

/// Operand pointers shared by the tasks of one GEMM split over a rayon pool (this module's
/// split and [`crate::gemm_bf16_parallel`]'s), with A of type `A` and B of type `B`.
///
/// Only for tasks that read A and B, which nothing writes during the call, and write
/// disjoint blocks of C, which the call's contract gives it alone until every task finishes.
#[derive(Clone, Copy)]
pub(crate) struct SharedOperands<A, B>(pub *const A, pub *const B, pub *mut f32);
// SAFETY: the use the type documents: shared reads of A and B, disjoint writes of C.
unsafe impl<A, B> Send for SharedOperands<A, B> {}
// SAFETY: as above.
unsafe impl<A, B> Sync for SharedOperands<A, B> {}

impl<A, B> SharedOperands<A, B> {
    /// The pointers, taken through a method so that a closure captures the whole (`Sync`)
    /// value rather than its raw-pointer fields.
    pub(crate) fn get(&self) -> (*const A, *const B, *mut f32) {
        (self.0, self.1, self.2)
    }
}

#[cfg(test)]
mod tests {
    use super::parallel_block;

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

//! One f32 GEMM cut into blocks run on the caller's rayon pool ([`GemmShape::parallel`]).
//!
//! A caller that cuts a product into equal blocks can only use divisors of its sizes: 1023
//! rows split into 3 or 11 blocks, never 2 or 16. Here the blocks are whole register tiles
//! with a ragged last one, so every core gets an even share of any size.

use crate::{GemmShape, Isa};

/// Flops below which a product runs on one thread: waking the others costs more.
const MIN_SPLIT_FLOPS: f64 = 4e6;

/// How a product is cut: along C's rows or its columns, into blocks of `step`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cut {
    Rows { step: usize },
    Columns { step: usize },
    Whole,
}

/// The cut of an `m x n` product for `threads` threads on a register tile of `mr x nr`: the
/// rows in `threads` blocks of whole tiles when there are enough of them, else the columns,
/// else nothing.
pub(crate) fn cut(m: usize, n: usize, threads: usize, (mr, nr): (usize, usize)) -> Cut {
    if threads <= 1 {
        return Cut::Whole;
    }
    if m >= threads * mr {
        return Cut::Rows { step: m.div_ceil(threads).next_multiple_of(mr) };
    }
    if n >= threads * nr {
        return Cut::Columns { step: n.div_ceil(threads).next_multiple_of(nr) };
    }
    Cut::Whole
}

/// Operand pointers shared by the tasks of one split GEMM.
#[derive(Clone, Copy)]
struct Operands(*const f32, *const f32, *mut f32);
// SAFETY: the tasks read A and B, which nothing writes during the call, and write disjoint
// blocks of C, which the call's contract gives it alone until every task has finished.
unsafe impl Send for Operands {}
// SAFETY: as above.
unsafe impl Sync for Operands {}

impl Operands {
    /// The pointers, taken through a method so that a closure captures the whole (`Sync`)
    /// value rather than its raw-pointer fields.
    fn get(&self) -> (*const f32, *const f32, *mut f32) {
        (self.0, self.1, self.2)
    }
}

/// [`crate::gemm_unchecked`] of `s` cut by [`cut`] over the current rayon pool, each block a
/// serial GEMM of its own.
///
/// # Safety
///
/// The contract of [`crate::gemm_unchecked`], with `s.b_panel_width == 0`.
pub(crate) unsafe fn gemm_split(isa: Isa, s: &GemmShape, a: *const f32, b: *const f32, c: *mut f32) {
    let serial = GemmShape { parallel: false, ..*s };
    let threads = rayon::current_num_threads();
    let how = if s.flops() < MIN_SPLIT_FLOPS {
        Cut::Whole
    } else {
        cut(s.m, s.n, threads, crate::register_tile(isa))
    };
    let ops = Operands(a, b, c);
    let run = |sub: GemmShape, (a_at, b_at, c_at): (usize, usize, usize)| {
        // SAFETY: the sub-shape is a block of rows or columns of `s` with the same leading
        // dimensions, and the offsets move A, B and C to that block's first element, so its
        // extents lie inside the ones the caller guarantees; blocks of C are disjoint.
        unsafe {
            let (a, b, c) = ops.get();
            crate::gemm_unchecked(isa, &sub, a.add(a_at), b.add(b_at), c.add(c_at));
        }
    };
    match how {
        Cut::Whole => run(serial, (0, 0, 0)),
        Cut::Rows { step } => rayon::scope(|scope| {
            for i0 in (0..s.m).step_by(step) {
                let sub = GemmShape { m: step.min(s.m - i0), ..serial };
                let a_at = if s.a_trans { i0 } else { i0 * s.lda };
                scope.spawn(move |_| run(sub, (a_at, 0, i0 * s.ldc)));
            }
        }),
        Cut::Columns { step } => rayon::scope(|scope| {
            for j0 in (0..s.n).step_by(step) {
                let sub = GemmShape { n: step.min(s.n - j0), ..serial };
                let b_at = if s.b_trans { j0 * s.ldb } else { j0 };
                scope.spawn(move |_| run(sub, (0, b_at, j0)));
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::{Cut, cut};

    #[test]
    fn rows_are_cut_into_whole_tiles_with_a_ragged_last_block() {
        assert_eq!(cut(1023, 1023, 2, (12, 32)), Cut::Rows { step: 516 });
        assert_eq!(cut(777, 96, 16, (12, 32)), Cut::Rows { step: 60 });
        // Too few rows for every thread: the columns instead, then nothing.
        assert_eq!(cut(20, 1000, 2, (12, 32)), Cut::Columns { step: 512 });
        assert_eq!(cut(20, 40, 2, (12, 32)), Cut::Whole);
        assert_eq!(cut(4096, 4096, 1, (12, 32)), Cut::Whole);
    }
}

//! Small arithmetic on shapes and block sizes, shared by the front end and the passes.

/// Elements of `shape` (1 for a scalar), saturating instead of overflowing so oversized shapes
/// are reported by the size checks rather than wrapping.
pub(crate) fn numel(shape: &[usize]) -> usize {
    shape.iter().fold(1usize, |a, &b| a.saturating_mul(b))
}

/// The largest divisor of `n` that is at most `want` (at least 1): a block size that tiles `n`
/// exactly, such as the rows each THREAD iteration owns.
pub fn largest_divisor_at_most(n: usize, want: usize) -> usize {
    (1..=want.max(1)).rev().find(|b| n.is_multiple_of(*b)).unwrap_or(1)
}

/// Row-major strides of `shape`, in elements.
pub(crate) fn dense_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1];
    }
    s
}

//! The A operand of one bf16 block in the form every bf16 block kernel takes (AMX tiles and
//! `vdpbf16ps` rows alike). A leaf, so the kernels and the blocked driver that packs for them
//! share it without importing each other.

/// The A operand of one block, in the form every path's block kernel takes.
#[derive(Clone, Copy)]
pub(crate) struct ATiles {
    /// Row 0 of the first k step.
    pub ptr: *const u16,
    /// Bytes between rows `r` and `r + 1` (for `r + 1 < 16`).
    pub stride: usize,
    /// Bytes from row `r` to row `16 + r`.
    pub hi: usize,
    /// Bytes from one k step (32 columns) to the next.
    pub step: usize,
}

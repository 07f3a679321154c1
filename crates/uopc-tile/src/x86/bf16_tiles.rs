//! The A operand of one bf16 block in the form every bf16 block kernel takes (AMX tiles and
//! `vdpbf16ps` rows alike), and the extent of a block's data. A leaf, so the kernels and the
//! blocked driver that packs for them share it without importing each other.

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

/// How much of a 32 x 32 block's last k step and of its columns holds data; the rest is the
/// zero padding of a ragged k or n, which `vdpbf16ps` need not multiply (AMX tiles and the
/// portable kernel multiply it: zeros add nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extent {
    /// Pairs of k (rows of the VNNI layout, 1 to 16) that the last k step holds.
    pub(crate) last_pairs: usize,
    /// Whether columns 16 to 31 hold data (the block is wider than 16 columns).
    pub(crate) wide: bool,
}

/// How the AMX block kernel loads B's tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BLoads {
    /// `tileloadd`: B stays in L1 for the next row block (a small slab of B).
    Cached,
    /// `tileloaddt1`, the streaming hint: a panel is read once per row block, while the row
    /// block's A tiles are read again for every panel and should keep L1.
    Streamed,
}

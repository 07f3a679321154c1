//! The error type of the checked entry points.

use crate::{Bf16Path, Isa};

/// Why a checked tile operation refused to run. Nothing is read or written when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TileError {
    /// The requested instruction set is not supported by this CPU (or this build target).
    #[error("instruction set {0} is not available on this CPU")]
    IsaUnavailable(Isa),
    /// The requested bf16 GEMM path cannot run here (missing instructions, OS support or
    /// permission).
    #[error("bf16 GEMM path {0} is not available on this machine")]
    PathUnavailable(Bf16Path),
    /// A buffer is shorter than its shape and leading dimension require.
    #[error("operand {operand}: buffer holds {len} elements but the shape needs {needed}")]
    BufferTooSmall {
        /// Which operand (`"a"`, `"b"`, `"c"`, `"s"`, `"o"`, `"row_max"`, `"row_sum"`).
        operand: &'static str,
        /// Elements the shape touches (last row's offset plus its length).
        needed: usize,
        /// Elements the slice actually has.
        len: usize,
    },
    /// A leading dimension is smaller than the row length, so rows would overlap.
    #[error("operand {operand}: leading dimension {ld} is smaller than the row length {cols}")]
    LeadingDim {
        /// Which operand.
        operand: &'static str,
        /// The leading dimension given.
        ld: usize,
        /// The row length it must be at least.
        cols: usize,
    },
    /// An operand's layout is not one the operation takes.
    #[error("operand {operand}: {reason}")]
    InvalidLayout {
        /// Which operand.
        operand: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The extent of an operand does not fit in `usize`.
    #[error("operand {operand}: size computation overflows")]
    Overflow {
        /// Which operand.
        operand: &'static str,
    },
}

/// Elements a row-major `rows x cols` view with leading dimension `ld` spans, or why it is invalid.
///
/// Empty views need nothing (any `ld` is fine). A single row ignores `ld`, so callers can pass
/// 0 there; with more rows `ld >= cols` keeps rows disjoint.
pub(crate) fn span(operand: &'static str, rows: usize, cols: usize, ld: usize) -> Result<usize, TileError> {
    if rows == 0 || cols == 0 {
        return Ok(0);
    }
    if rows > 1 && ld < cols {
        return Err(TileError::LeadingDim { operand, ld, cols });
    }
    (rows - 1).checked_mul(ld).and_then(|x| x.checked_add(cols)).ok_or(TileError::Overflow { operand })
}

/// Checks that a slice of `len` elements covers `needed`.
pub(crate) fn check_len(operand: &'static str, needed: usize, len: usize) -> Result<(), TileError> {
    if len < needed { Err(TileError::BufferTooSmall { operand, needed, len }) } else { Ok(()) }
}

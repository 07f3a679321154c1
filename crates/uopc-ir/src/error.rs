//! Errors for malformed programs.

use crate::uop::UOp;

/// What is wrong with a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IrErrorKind {
    /// Operand or result dtypes do not fit the op.
    DType,
    /// An END closes a range its body does not use (the range is not open there).
    RangeNotOpen,
    /// A RANGE is never closed by an END.
    RangeNotEnded,
    /// A STORE's index or value uses a range that no END around the store closes.
    StoreOutsideRange,
    /// A LOAD of an ALLOC that no STORE reaches.
    UninitializedLoad,
    /// An ALLOC written inside a THREAD range but declared outside it: threads would race.
    ThreadRace,
    /// An index whose bounds cannot be proven inside its buffer.
    OutOfBounds,
    /// Two STOREs that may write the same element with no dependency ordering them: which
    /// value is left would depend on statement order, which the program does not fix.
    UnorderedStores,
    /// Loops that do not nest, cyclic ordering, misplaced THREAD ranges, wrong arities, or
    /// ops that do not belong in a loop program.
    Structure,
}

/// A malformed program, naming the offending node.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{node}: {reason}")]
pub struct IrError {
    /// The category, for callers that branch on it.
    pub kind: IrErrorKind,
    /// The offending node, printed short (`%12 ADD f32`).
    pub node: String,
    /// What is wrong, in words.
    pub reason: String,
}

impl IrError {
    /// An error about `node`.
    pub fn new(kind: IrErrorKind, node: &UOp, reason: impl Into<String>) -> Self {
        IrError { kind, node: node.short(), reason: reason.into() }
    }
}

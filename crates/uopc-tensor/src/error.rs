//! The one error type of the tensor layer.

/// What went wrong building, planning or running a tensor graph.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    /// Operand shapes do not fit the operation; the message names both shapes.
    #[error("{op}: {msg}")]
    Shape {
        /// The operation the user called (`add`, `matmul`, ...).
        op: &'static str,
        /// What does not fit, with the shapes involved.
        msg: String,
    },
    /// Element types that the operation cannot combine or convert.
    #[error("{op}: {msg}")]
    DType {
        /// The operation the user called.
        op: &'static str,
        /// What does not fit.
        msg: String,
    },
    /// A lowered kernel was rejected by the IR verifier (a compiler bug, reported not hidden).
    #[error("kernel {kernel}: {source}")]
    Ir {
        /// The kernel's name.
        kernel: String,
        /// The verifier's error.
        source: uopc_ir::IrError,
    },
    /// The backend failed to compile or run a kernel.
    #[error("kernel {kernel}: backend: {msg}")]
    Backend {
        /// The kernel's name.
        kernel: String,
        /// The backend's message.
        msg: String,
    },
    /// The graph contains something the kernelizer or rangeify does not handle.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// Result with [`TensorError`].
pub type Result<T> = std::result::Result<T, TensorError>;

pub(crate) fn shape_err(op: &'static str, msg: impl Into<String>) -> TensorError {
    TensorError::Shape { op, msg: msg.into() }
}

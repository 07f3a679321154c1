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
    #[error("kernel {kernel}: backend: {source}")]
    Backend {
        /// The kernel's name.
        kernel: String,
        /// The backend's error, kept whole so callers can inspect it.
        source: BackendError,
    },
    /// The graph contains something the kernelizer or rangeify does not handle.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// The error type of the backend that compiles and runs kernels: the JIT's with the `jit`
/// feature (the default), the reference interpreter's without it.
#[cfg(feature = "jit")]
pub type BackendError = uopc_jit::JitError;
/// The error type of the backend that compiles and runs kernels: the JIT's with the `jit`
/// feature (the default), the reference interpreter's without it.
#[cfg(not(feature = "jit"))]
pub type BackendError = uopc_ir::interp::InterpError;

/// Result with [`TensorError`].
pub type Result<T> = std::result::Result<T, TensorError>;

impl TensorError {
    /// This error as reported by the public operation `op`: a composite operation (matmul,
    /// softmax, attention) is built from internal ones, and its errors must name the
    /// operation the user called, not the one that happened to fail.
    pub(crate) fn in_op(self, op: &'static str) -> TensorError {
        match self {
            TensorError::Shape { msg, .. } => TensorError::Shape { op, msg },
            TensorError::DType { msg, .. } => TensorError::DType { op, msg },
            e => e,
        }
    }
}

pub(crate) fn shape_err(op: &'static str, msg: impl Into<String>) -> TensorError {
    TensorError::Shape { op, msg: msg.into() }
}

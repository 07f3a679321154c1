//! [`Error`]: the one error type a program using uopc needs, and [`Result`].

use crate::gpt::GptError;
use crate::models::ModelError;
use uopc_ir::interp::InterpError;
use uopc_ir::{IrError, PrepareError};
use uopc_jit::{IsaError, JitError};
use uopc_kernels::backward::BackwardError;
use uopc_kernels::sdpa::SdpaError;
use uopc_tensor::TensorError;
use uopc_tile::TileError;

/// Any error a uopc operation returns, whichever crate of the workspace it comes from.
///
/// Every public error type of uopc converts into it (`From`), so `?` works across them in one
/// function returning [`uopc::Result`](crate::Result):
///
/// ```rust
/// use uopc::prelude::*;
///
/// fn run() -> uopc::Result<f32> {
///     let x = Tensor::try_from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?; // a TensorError
///     let q = x.try_reshape(&[1, 1, 2, 2])?;
///     let out = scaled_dot_product_attention(&q, &q, &q, None, false, None)?; // an SdpaError
///     Ok(out.sum(-1, false).sum(-1, false).sum(-1, false).sum(-1, false).item()?)
/// }
/// assert!(run()?.is_finite());
/// # Ok::<(), uopc::Error>(())
/// ```
///
/// The contract:
///
/// - The message (`Display`) is the original error's, unchanged: it names the operation and
///   the argument at fault (`matmul: ...`, ``sdpa: `mask` ...``).
/// - Each variant holds the original error whole, so a caller can match on it and inspect its
///   fields; [`std::error::Error::source`] passes through to the original's source.
/// - The enum is `#[non_exhaustive]`: a later version may add a variant for a new crate's
///   error, so a `match` needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor operation, the kernelizer or a realize failed (shapes, dtypes, a kernel).
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// The attention entry point refused its configuration or arguments.
    #[error(transparent)]
    Sdpa(#[from] SdpaError),
    /// The JIT could not compile or run a loop program, or its arguments did not fit.
    #[error(transparent)]
    Jit(#[from] JitError),
    /// A loop program is malformed (the verifier's error, naming the node).
    #[error(transparent)]
    Ir(#[from] IrError),
    /// Preparing a loop program for a backend failed.
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    /// The reference interpreter could not run a loop program.
    #[error(transparent)]
    Interp(#[from] InterpError),
    /// No code generator could be built for this host.
    #[error(transparent)]
    Isa(#[from] IsaError),
    /// An attention backward pass failed.
    #[error(transparent)]
    Backward(#[from] BackwardError),
    /// A checked tile operation (GEMM, softmax tile) refused its arguments.
    #[error(transparent)]
    Tile(#[from] TileError),
    /// A GPT block could not be built or run.
    #[error(transparent)]
    Gpt(#[from] GptError),
    /// A model could not be loaded or run (a checkpoint, its configuration, the KV cache).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// An ndarray could not be built or reshaped (from the re-exported [`ndarray`]).
    #[error(transparent)]
    Shape(#[from] ndarray::ShapeError),
}

/// `Result` with [`Error`]: the return type of a `main` or a function that mixes uopc's
/// operations, `fn main() -> uopc::Result<()>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

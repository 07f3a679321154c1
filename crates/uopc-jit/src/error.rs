//! Why compiling or running a program failed.

use crate::isa::IsaError;
use std::sync::Arc;
use uopc_ir::IrError;

/// Why compiling or running a program failed.
#[derive(Debug, thiserror::Error)]
pub enum JitError {
    /// The program is malformed (or an index cannot be proven in bounds).
    #[error("invalid program: {0}")]
    Ir(#[from] IrError),
    /// The program is well formed but the reference loops of its tile ops are not (compiled
    /// with [`crate::JitOptions::tile_calls`] off).
    #[error("{name}: the reference loops of its tile ops: {source}")]
    TileExpansion {
        /// The program's name.
        name: String,
        /// What the verifier found in the expansion.
        #[source]
        source: IrError,
    },
    /// No code generator for this host (shared by every compile: the ISA is built once).
    #[error("no native ISA: {0}")]
    Isa(#[source] Arc<IsaError>),
    /// Cranelift's verifier rejected the generated function (a backend bug).
    #[error("CLIF verifier: {0}")]
    ClifVerifier(#[from] cranelift_codegen::verifier::VerifierErrors),
    /// Declaring, compiling or finalizing the function failed (boxed: Cranelift's error is
    /// large, and every lowering step returns this type).
    #[error("code generation failed: {0}")]
    Module(#[source] Box<cranelift_module::ModuleError>),
    /// The arguments of a run do not match the program's buffers.
    #[error("{0}")]
    Argument(String),
    /// A program shape the backend does not support.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A bug in the backend.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<cranelift_module::ModuleError> for JitError {
    fn from(e: cranelift_module::ModuleError) -> Self {
        JitError::Module(Box::new(e))
    }
}

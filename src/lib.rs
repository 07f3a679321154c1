//! uopc: a small tensor compiler. Loop programs in the UOp IR are verified, linearized and
//! compiled straight to machine code with Cranelift, then run on all cores.
//!
//! - [`ir`]: the UOp graph, loop-IR builders, `simplify`, `verify`, printers.
//! - [`jit`]: `Program::compile` and `run`.
//! - [`attention`]: the attention programs.

pub mod attention;

/// The UOp IR (re-export of `uopc-ir`).
pub mod ir {
    pub use uopc_ir::*;
}

/// The Cranelift JIT (re-export of `uopc-jit`).
pub mod jit {
    pub use uopc_jit::*;
}

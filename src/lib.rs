//! uopc: a small tensor compiler. Loop programs in the UOp IR are verified, linearized and
//! compiled straight to machine code with Cranelift, then run on all cores.
//!
//! - [`ir`]: the UOp graph, loop-IR builders, `simplify`, `verify`, printers.
//! - [`jit`]: `Program::compile` and `run`.
//! - [`Tensor`], [`realize`], [`RealizeOptions`]: the lazy tensor front end and its kernelizer
//!   (re-exports of `uopc-tensor`; the whole crate is [`tensor`]).
//! - [`attention`]: the three attention programs.

// The README's examples are compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod attention;
pub mod attention_backward;
pub mod flash_tiled;
pub mod masked_attention;

/// The UOp IR (re-export of `uopc-ir`).
pub mod ir {
    pub use uopc_ir::*;
}

/// The Cranelift JIT (re-export of `uopc-jit`).
pub mod jit {
    pub use uopc_jit::*;
}

/// The tensor front end (re-export of `uopc-tensor`).
pub mod tensor {
    pub use uopc_tensor::*;
}

pub use uopc_tensor::{Plan, RealizeOptions, RealizeReport, Tensor, make_plan, realize};

//! uopc: a small tensor compiler. Loop programs in the UOp IR are verified, linearized and
//! compiled straight to machine code with Cranelift, then run on all cores.
//!
//! - [`ir`]: the UOp graph, loop-IR builders, `simplify`, `verify`, printers.
//! - [`jit`]: `Program::compile` and `run`.
//! - [`Tensor`], [`realize`], [`RealizeOptions`]: the lazy tensor front end and its kernelizer
//!   (re-exports of `uopc-tensor`; the whole crate is [`tensor`]).
//! - [`kernels`]: the hand-written loop programs (re-export of `uopc-kernels`), also reachable
//!   under the module names below.

#![warn(missing_docs)]

// The README's examples are compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The hand-written loop programs (re-export of `uopc-kernels`).
pub mod kernels {
    pub use uopc_kernels::*;
}

/// Online-softmax attention programs, and the Tensor one-liner they are measured against.
pub mod attention {
    pub use uopc_kernels::online::*;
    pub use uopc_kernels::query_block;
    /// Attention for every shape (batched, GQA, masks, strided layouts) through one entry point.
    pub use uopc_kernels::sdpa;
    /// The FlashAttention-2 kernel as a node of a lazy tensor graph, for every shape.
    pub use uopc_kernels::sdpa::scaled_dot_product_attention;
    pub use uopc_tensor::attention::{attention, try_attention};
}

/// The attention backward, unfused and with recompute.
pub mod attention_backward {
    pub use uopc_kernels::backward::*;
}

/// FlashAttention-2: plain loop IR tiling and its tile-op forms.
pub mod flash_tiled {
    pub use uopc_kernels::flash_tile_ops::*;
    pub use uopc_kernels::flash_tiled::*;
}

/// Batched masked attention, flash-decoding, their f64 reference and the bandwidth probe.
pub mod masked_attention {
    pub use uopc_kernels::bandwidth::streaming_read_gbs;
    pub use uopc_kernels::decode::*;
    pub use uopc_kernels::masked::*;
    pub use uopc_kernels::reference::masked_attention_reference;
}

pub mod gpt;

/// The UOp IR (re-export of `uopc-ir`).
pub mod ir {
    pub use uopc_ir::*;
}

/// The Cranelift JIT (re-export of `uopc-jit`).
pub mod jit {
    pub use uopc_jit::*;
}

/// The machine model (CPU, ISA, caches, probed throughputs) and the kernel choices derived
/// from it: `uopc::machine::Machine::get()` prints as what the kernels run with.
pub mod machine {
    pub use uopc_jit::machine::*;
}

/// The tensor front end (re-export of `uopc-tensor`).
pub mod tensor {
    pub use uopc_tensor::*;
}

pub use uopc_tensor::{Plan, RealizeOptions, RealizeReport, Tensor, make_plan, realize};

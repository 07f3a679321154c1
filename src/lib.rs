//! uopc: a small tensor compiler. Lazy tensors are cut into kernels, lowered to loop
//! programs and compiled straight to machine code with Cranelift, then run on all cores.
//!
//! # Start here
//!
//! `use uopc::prelude::*;` brings in what a first program needs: [`Tensor`], [`DType`], the
//! error type [`Error`], `bf16` and `f16`, and the attention op
//! [`scaled_dot_product_attention`](attention::sdpa::scaled_dot_product_attention). Every
//! fallible call returns an error that converts into [`Error`], so `?` works throughout a
//! function returning [`uopc::Result`](Result). [`half`] and [`ndarray`] are re-exported at
//! the root: use `uopc::ndarray` and `uopc::half` and your arrays are the ones uopc converts.
//!
//! ## 1. Tensors
//!
//! Operations only build a graph; reading the values ([`Tensor::item`], [`Tensor::to_ndarray`])
//! or [`Tensor::realize`] plans it into kernels, compiles them once (plans are cached by graph
//! shape) and runs them. Methods named `try_*` return a [`Result`]; the plain ones and the std
//! operators panic with the same message.
//!
//! ```rust
//! use uopc::prelude::*;
//!
//! let x = Tensor::randn(&[4, 3], 0);             // seeded N(0, 1) samples
//! let w = Tensor::eye(3) * 2.0;                  // lazy: no memory until it is read
//! let y = x.try_matmul(&w)?.relu();              // nothing has run yet
//! let total = y.sum(1, false).sum(0, false).item()?;
//! let want: f32 = x.to_ndarray::<f32>()?.iter().map(|v| 2.0 * v.max(0.0)).sum();
//! assert!((total - want).abs() < 1e-5);
//!
//! // The rows' largest entries, as i64 indices; an ndarray of uopc's own ndarray version.
//! let best: uopc::ndarray::ArrayD<i64> = x.argmax(-1, false).to_ndarray()?;
//! assert_eq!(best.shape(), &[4]);
//!
//! // Bad input is an error naming the operation and the shapes, not a panic.
//! let err = x.try_matmul(&Tensor::ones(&[4, 2])).unwrap_err();
//! assert!(err.to_string().starts_with("matmul: "), "{err}");
//! # Ok::<(), uopc::Error>(())
//! ```
//!
//! Gradients come from [`tensor::gradient`]; an SGD step is a new tensor per parameter:
//!
//! ```rust
//! use uopc::prelude::*;
//!
//! let w = Tensor::from_vec(vec![1.0f32, -2.0], &[2]);
//! let loss = (&w * &w).sum(0, false);                 // |w|^2
//! let grads = uopc::tensor::gradient(&loss, &[&w])?;  // 2 w
//! let stepped = &w - &(&grads[0] * 0.25);             // w - 0.25 * 2 w = w / 2
//! assert_eq!(stepped.to_ndarray::<f32>()?.as_slice(), Some(&[0.5, -1.0][..]));
//! # Ok::<(), uopc::Error>(())
//! ```
//!
//! ## 2. Attention
//!
//! [`scaled_dot_product_attention`](attention::sdpa::scaled_dot_product_attention) is
//! `softmax(q k^T * scale + mask) v` over `(batch, heads, tokens, head_dim)` tensors as one
//! FlashAttention-2 kernel of the graph (grouped-query heads, masks, causal, f32, bf16 and
//! f16, with a gradient). Here it is checked against the same attention written with tensor
//! ops:
//!
//! ```rust
//! use uopc::prelude::*;
//!
//! let (b, h, n, d) = (2, 4, 16, 8);
//! let q = Tensor::randn(&[b, h, n, d], 1);
//! let k = Tensor::randn(&[b, h, n, d], 2);
//! let v = Tensor::randn(&[b, h, n, d], 3);
//! let fast = scaled_dot_product_attention(&q, &k, &v, None, false, None)?;
//!
//! let scores = q.try_matmul(&k.try_transpose(-1, -2)?)? * (1.0 / (d as f64).sqrt());
//! let slow = scores.try_softmax(-1)?.try_matmul(&v)?;
//! let diff = (&fast - &slow).abs().reshape(&[b * h * n * d]).max(0, false).item()?;
//! assert!(diff < 1e-5, "{diff}");
//!
//! // An argument that does not fit is named in the error.
//! let narrow = k.slice(-1, 0, 4);
//! let err = scaled_dot_product_attention(&q, &narrow, &narrow, None, false, None).unwrap_err();
//! assert_eq!(err.to_string(), "sdpa: `k` head size 4 differs from q's 8");
//! # Ok::<(), uopc::Error>(())
//! ```
//!
//! [`attention`] also has the other attention forms (the unfused tensor expression, the
//! hand-written online-softmax kernels) and [`attention::sdpa`] the compiled entry point that
//! runs on your own slices, decode against a KV cache included.
//!
//! ## 3. Models
//!
//! [`gpt`] is a GPT-2 transformer block written with these ops, with an independent f64
//! reference of its forward pass:
//!
//! ```rust
//! use uopc::gpt::{GptBlock, GptConfig};
//! use uopc::prelude::*;
//!
//! let config = GptConfig { d_model: 32, heads: 4, hidden: 64, eps: 1e-5 };
//! let block = GptBlock::random(config, 1)?;
//! let x = Tensor::rand(&[2, 8, 32], 2);
//! let y = block.forward(&x)?;
//! let want = uopc::gpt::reference_forward_f64(&block, &x.to_ndarray::<f32>()?)?;
//! let got = y.to_ndarray::<f32>()?;
//! assert!(got.iter().zip(want.iter()).all(|(g, w)| (f64::from(*g) - w).abs() < 1e-4));
//!
//! // A bad configuration is an error, not a panic.
//! assert!(GptBlock::random(GptConfig { heads: 5, ..config }, 1).is_err());
//! # Ok::<(), uopc::Error>(())
//! ```
//!
//! ## 4. Your own loop programs
//!
//! Below the tensors, [`ir`] builds loop programs by hand and [`jit`] compiles one once and
//! runs it many times. Here `out[i] = a[i] + b[i]`, one element per THREAD iteration:
//!
//! ```rust
//! use uopc::ir::{AxisType, buffer, range, sink};
//! use uopc::jit::Program;
//! use uopc::prelude::*;
//!
//! let n = 8;
//! let (a, b, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n), buffer(2, DType::F32, n));
//! let i = range(n, 0, AxisType::Thread);
//! let sum = a.index(&i).load() + b.index(&i).load();
//! let program = sink(&[out.index(&i).store(sum).end(&[i])]);
//! let add = Program::compile(&program, "add")?;
//!
//! let (x, y) = (vec![1.0f32; n], (0..n).map(|v| v as f32).collect::<Vec<_>>());
//! let mut z = vec![0.0f32; n];
//! add.run_f32(&[&x, &y], &mut [&mut z])?;
//! assert_eq!(z, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
//!
//! // A wrong buffer is an error naming it (a JitError, converted by `?` like the rest).
//! assert!(add.run_f32(&[&x[..4], &y], &mut [&mut z]).is_err());
//! # Ok::<(), uopc::Error>(())
//! ```
//!
//! # The modules
//!
//! - [`prelude`]: the names above, for a glob import.
//! - [`Tensor`], [`realize`], [`RealizeOptions`]: the lazy tensor front end and its kernelizer
//!   (re-exports of `uopc-tensor`; the whole crate is [`tensor`]).
//! - [`attention`], [`attention_backward`], [`flash_tiled`], [`masked_attention`]: the
//!   attention kernels; [`kernels`] has every hand-written loop program (re-export of
//!   `uopc-kernels`).
//! - [`gpt`]: a GPT-2 block on the Tensor API.
//! - [`models`]: GPT-2 and Llama checkpoints from safetensors, generation with a KV cache, the
//!   training-step graph.
//! - [`optim`]: AdamW and SGD with momentum, as torch's.
//! - [`ir`]: the UOp graph, loop-IR builders, `simplify`, `verify`, printers; [`jit`]:
//!   `Program::compile` and `run`; [`tile`]: the CPU tile micro-kernels; [`machine`]: the
//!   machine model the kernels choose their paths from.
//! - [`Error`], [`Result`]: the one error type every crate's error converts into.

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
    /// The same kernel with a score function, a mask function and sinks compiled in.
    pub use uopc_kernels::sdpa::flex_attention;
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

mod error;
pub mod gpt;
pub mod models;
pub mod optim;
pub use error::{Error, Result};

/// What a first program needs, for `use uopc::prelude::*;`: the tensor type, its dtypes, the
/// one error type, the 16-bit float types and the attention op.
///
/// ```rust
/// use uopc::prelude::*;
///
/// let x = Tensor::from_vec(vec![bf16::from_f32(1.5), bf16::from_f32(2.5)], &[2]);
/// assert_eq!(x.dtype(), DType::BF16);
/// assert_eq!(x.sum(0, false).item()?, 4.0);
/// # Ok::<(), Error>(())
/// ```
pub mod prelude {
    pub use crate::Error;
    pub use half::{bf16, f16};
    pub use uopc_ir::DType;
    /// The attention op on lazy tensors (see [`crate::attention::sdpa`]), and its builder
    /// form `q.sdpa(&k, &v).causal().run()?`.
    pub use uopc_kernels::sdpa::{AttentionOp, scaled_dot_product_attention};
    pub use uopc_tensor::Tensor;
}

/// The 16-bit float types `bf16` and `f16` of 16-bit tensors (re-export of the `half` crate,
/// the version uopc converts to and from, so callers need not pin it themselves).
pub use half;
/// The ndarray version uopc's tensors convert to and from ([`Tensor::to_ndarray`],
/// [`Tensor::from_array`]), so callers need not pin it themselves.
pub use ndarray;
/// The element types of tensors and loop programs.
pub use uopc_ir::DType;

/// The CPU "tensor core": GEMM and softmax tile micro-kernels with checked entry points
/// (re-export of `uopc-tile`).
pub mod tile {
    pub use uopc_tile::*;
}

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

//! uopc's backend: loop programs compiled straight to machine code with Cranelift, run on all
//! cores with rayon.
//!
//! ```
//! use uopc_ir::*;
//! // out[i] = 2 * a[i]
//! let a = buffer(0, DType::F32, 8);
//! let out = buffer(1, DType::F32, 8);
//! let i = range(8, 0, AxisType::Thread);
//! let program = sink(&[out.index(&i).store(a.index(&i).load() * 2.0f32).end(&[i])]);
//! let prg = uopc_jit::Program::compile(&program, "double").unwrap();
//! let input: Vec<f32> = (0..8).map(|x| x as f32).collect();
//! let mut result = vec![0.0f32; 8];
//! prg.run_f32(&[&input], &mut [&mut result]).unwrap();
//! assert_eq!(result[3], 6.0);
//! ```
//!
//! Compiling is two halves: [`uopc_ir::prepare`] verifies, simplifies, analyses and
//! linearizes the program once; this crate translates the prepared kernel into Cranelift IR
//! and finalizes it ([`Program::compile_with`]). A program's CLIF text is formatted only when
//! asked for ([`Program::clif`]).

// Every call into generated code is unsafe: each must say why it is sound.
#![deny(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod args;
mod error;
mod externs;
mod isa;
mod linger;
mod lower;
mod options;
pub mod peak;
mod program;
mod run;
mod translate;

pub use args::{Arg, BufRef};
pub use error::JitError;
pub use isa::IsaError;
pub use options::{JitOptions, OptLevel};
pub use program::{MAX_LOCAL_BYTES, PARALLEL_MIN_ACCESS_BYTES, PARALLEL_MIN_FLOPS, Program};
pub use uopc_ir::{BufferSpec, Estimates, VarSpec};
/// The machine model every tile op chooses its path from (re-export of `uopc_tile::machine`).
pub use uopc_tile::machine;

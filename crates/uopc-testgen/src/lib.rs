//! Random well-formed uopc loop programs, their mutants, and the comparisons that judge runs.
//!
//! [`program::generate`] builds a verified program plus its input buffers from a [`rng::Rng`]
//! (a seed or fuzzer bytes); [`mutate::mutate`] damages programs to test that malformed input
//! is rejected cleanly; [`compare`] judges two runs' buffers; [`tile_cases`] builds tile-op
//! programs with inputs. This crate depends on `uopc-ir` only, so the IR's and the JIT's
//! integration tests can use it (they link the same `uopc-ir` as this crate does); the harness
//! that runs programs with the JIT is `uopc-testgen-jit`.

#![warn(missing_docs)]

pub mod compare;
pub mod mutate;
pub mod program;
pub mod rng;
pub mod tile_cases;

pub use program::{Case, Mode, Options, Profile, generate, magnitude_twin};
pub use rng::Rng;

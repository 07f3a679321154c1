//! Random well-formed uopc loop programs and the harness that runs them two ways.
//!
//! [`program::generate`] builds a verified program plus its input buffers from a [`rng::Rng`]
//! (a seed or fuzzer bytes); [`harness::check_case`] runs it with the JIT and with the reference
//! interpreter and compares; [`mutate::mutate`] damages programs to test that malformed input is
//! rejected cleanly. The modules refer to each other through `super::` only, so test crates that
//! cannot depend on this crate (the JIT's own tests) can include the files with `#[path]`.

pub mod compare;
pub mod harness;
pub mod mutate;
pub mod program;
pub mod rng;

pub use harness::{MutantStats, check_case, check_mutant, profile_of, strict_options};
pub use program::{Case, Mode, Options, Profile, generate, magnitude_twin};
pub use rng::Rng;

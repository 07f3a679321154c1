//! Bytes -> a random loop program (valid, or mutated) -> verify -> compile -> run with the JIT and
//! the interpreter, compared as in the differential tests. Any panic, abort or signal is a crash.
//!
//! The first byte chooses the case: Exact or Smooth generation, or a mutant; the rest drives the
//! generator. Every pattern the generator knows is explored.

#![no_main]

use libfuzzer_sys::fuzz_target;
use uopc_testgen::{Options, Profile, Rng};
use uopc_testgen_jit::{MutantStats, check_case, check_mutant};

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else { return };
    let rng = Rng::from_bytes(rest);
    let (opts, avoid) = (Options::default(), false);
    let outcome = match kind % 4 {
        0 | 1 => check_case(rng, Profile::Exact, opts).map(|_| ()),
        2 => check_case(rng, Profile::Smooth, opts).map(|_| ()),
        _ => check_mutant(rng, &mut MutantStats::default(), avoid),
    };
    if let Err(e) = outcome {
        panic!("{e}");
    }
});

//! Bytes -> a random loop program (valid, or mutated) -> verify -> compile -> run with the JIT and
//! the interpreter, compared as in the differential tests. Any panic, abort or signal is a crash.
//!
//! The first byte chooses the case: Exact or Smooth generation, or a mutant; the rest drives the
//! generator. Set UOPC_FUZZ_ALL_BUGS=1 to also explore patterns that hit known, pinned bugs.

#![no_main]

use libfuzzer_sys::fuzz_target;
use uopc_testgen::{MutantStats, Options, Profile, Rng, check_case, check_mutant};

fn options() -> (Options, bool) {
    if std::env::var_os("UOPC_FUZZ_ALL_BUGS").is_some() {
        (Options::default(), false)
    } else {
        let o = Options {
            foldable_ranges: false,
            vanishing_buffers: false,
            self_referencing_sums: false,
            signed_zeros: false,
        };
        (o, true)
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else { return };
    let rng = Rng::from_bytes(rest);
    let (opts, avoid) = options();
    let outcome = match kind % 4 {
        0 | 1 => check_case(rng, Profile::Exact, opts).map(|_| ()),
        2 => check_case(rng, Profile::Smooth, opts).map(|_| ()),
        _ => check_mutant(rng, &mut MutantStats::default(), avoid),
    };
    if let Err(e) = outcome {
        panic!("{e}");
    }
});

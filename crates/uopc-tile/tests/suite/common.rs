//! Code shared by the integration tests.

#![allow(dead_code)] // each test file uses a different subset

use uopc_tile::Isa;

/// The ISAs this CPU can run, announcing any that are skipped.
pub fn isas() -> Vec<Isa> {
    Isa::ALL
        .into_iter()
        .filter(|isa| uopc_tile::machine::require_or_skip(isa.name(), isa.available()))
        .collect()
}

//! The integration tests that share no process-wide state, in one binary (one link instead of
//! one per file): each module is one area of the backend. Tests that read the process's memory
//! use or re-run the binary in a child process keep binaries of their own beside this one.

mod concurrency;
mod half;
mod jit;
mod lane_compares;
mod packed_stores;
mod tile_activation;
mod tile_backward_ops;
mod tile_exp_rows;
mod tile_expand;
mod tile_max_sum_exp;
mod tile_ops;
mod tile_score_ramp;
mod tile_softcap;
mod vars;

use uopc_ir::interp::{self, Precision};
use uopc_ir::{HostBuffer, UOp, expand_tile_ops, verify};
use uopc_jit::Program;

/// The values of an f32 host buffer (a test's own buffers; any other type is a test bug).
fn f32s(b: &HostBuffer) -> &[f32] {
    match b {
        HostBuffer::F32(v) => v,
        other => panic!("expected an f32 buffer, got {:?}", other.dtype()),
    }
}

/// Runs `program`'s reference expansion of its tile ops in the interpreter on `buffers` and
/// checks buffer `slot` against `want` bit for bit (the expansion must compute what the
/// interpreter's tile semantics do, NaN payloads included).
fn expansion_matches(program: &UOp, mut buffers: Vec<HostBuffer>, slot: usize, want: &[f32], what: &str) {
    interp::run(&expand_tile_ops(program), &mut buffers, Precision::Native).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(f32s(&buffers[slot])), bits(want), "{what}: expansion against the interpreter");
}

/// A tile program whose block runs one element past its buffer is refused: by the verifier,
/// naming the elements, and by the JIT's compile.
fn refused_past_its_buffer(program: &UOp) {
    let err = verify(program).unwrap_err();
    assert!(format!("{err}").contains("elements"), "{err}");
    assert!(Program::compile(program, "short").is_err());
}

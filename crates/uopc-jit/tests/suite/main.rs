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

use uopc_ir::HostBuffer;

/// The values of an f32 host buffer (a test's own buffers; any other type is a test bug).
fn f32s(b: &HostBuffer) -> &[f32] {
    match b {
        HostBuffer::F32(v) => v,
        other => panic!("expected an f32 buffer, got {:?}", other.dtype()),
    }
}

//! Bytes -> a random tensor graph, realized with the default optimizer, fused and without
//! opts (see `uopc-testgen-tensor`). Any panic, abort or signal is a crash, and so is a
//! failed check: the bytes decode twice, as a valid graph of rank 0 to 4 compared with its
//! f64 reference, and as a walk through the fallible `try_` API (shape errors are fine) whose
//! three realizations must agree.
//!
//! The corpus in `fuzz/corpus/tensor_realize` is replayed by the workspace's tests
//! (`cargo test -p uopc-testgen-tensor --test corpus`), so CI checks it without cargo-fuzz.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = uopc_testgen_tensor::check(data) {
        panic!("{e}");
    }
    if let Err(e) = uopc_testgen_tensor::check_try_api(data) {
        panic!("{e}");
    }
});

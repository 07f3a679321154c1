//! Random graphs of small tensors of rank 0 to 4 (broadcasts, reductions, softmax, movement
//! ops, matmuls with 1-D and batch-broadcast operands) against their f64 reference, realized
//! with the default optimizer, fused and without opts (see `uopc-testgen-tensor`).

use proptest::prelude::*;

/// Cases per run: `UOPC_GRAPH_CASES` raises the default of 32 (CI runs 2,000).
fn cases() -> u32 {
    std::env::var("UOPC_GRAPH_CASES").ok().and_then(|v| v.parse::<u32>().ok()).unwrap_or(32)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]
    /// Any bytes decode into a valid graph; proptest shrinks a failing byte string towards
    /// a small graph.
    #[test]
    fn random_graphs_match_the_reference(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        if let Err(e) = uopc_testgen_tensor::check(&bytes) {
            prop_assert!(false, "{}", e);
        }
    }
}

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

/// A graph the rank 0-4 generator found once it made 16-bit products (the bug needs none),
/// reduced by hand: a batched product plus a softmax of one element, then a softmax, a
/// maximum, a softmax and a sum over axis 0, sliced to one element. Fused, the one-element
/// softmax's row tile is written per row, but the product's reduces, whose index lost the
/// row of one iteration, were hoisted above that row ("the loops around this RANGE do not
/// nest"). Each part is needed: an input instead of the product, no one-element softmax, or
/// no slice, and it realized. The unfused realization without opts is the reference here.
#[test]
fn a_chain_of_axis_0_softmaxes_over_a_batched_product_realizes_fused() {
    use uopc_tensor::{NoOpt, RealizeOptions, Tensor};
    let a = Tensor::from_vec(vec![0.0f32, -1.0, -1.0, -2.0, 0.0, 1.0, 1.0, 2.0], &[2, 2, 2]);
    let b = Tensor::from_vec(vec![-2.0f32, 0.0, 0.0, -2.0], &[2, 2]);
    let s = Tensor::from_vec(vec![1.17f32], &[1]).softmax(0);
    let x = (a.matmul(&b) + s).softmax(0).max(0, false).softmax(0);
    let y = (x.sum(0, false) + 0.52f32).slice(0, 0, 1);
    let plain = y.to_ndarray_with::<f32>(&RealizeOptions::default().with_opt(NoOpt)).unwrap();
    for opts in [RealizeOptions::default(), RealizeOptions::fused()] {
        let got =
            y.to_ndarray_with::<f32>(&opts).unwrap_or_else(|e| panic!("fused={}: {e}", opts.fuse_reduce));
        for (g, p) in got.iter().zip(&plain) {
            assert!((g - p).abs() <= 1e-5, "fused={}: {g} vs {p}", opts.fuse_reduce);
        }
    }
}

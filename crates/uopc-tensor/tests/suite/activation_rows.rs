//! Elementwise kernels that end in GELU's tanh form or SiLU run the activation on
//! `TILE_ACTIVATION`, one call per row after rangeify's loop wrote the row's argument; kernels
//! of other shapes or dtypes keep the loop. Values against f64 either way.

use crate::common::*;
use half::bf16;
use ndarray::ArrayD;
use uopc_ir::{Op, TileOp, UnaryOp};
use uopc_tensor::*;

/// The activation tile ops of the plan's one kernel, whether its loops take an exponential,
/// and the lowering that made it.
fn lowered(t: &Tensor) -> (Vec<uopc_tile::Activation>, bool, &'static str) {
    let plan = make_plan(&[t.uop().clone()], &RealizeOptions::default()).expect("plans");
    assert_eq!(plan.kernels.len(), 1, "{plan}");
    let k = &plan.kernels[0];
    let nodes = uopc_ir::UOp::toposort(std::slice::from_ref(&k.program));
    let kinds = nodes
        .iter()
        .filter_map(|u| match u.op() {
            Op::Tile(TileOp::Activation { kind, .. }) => Some(*kind),
            _ => None,
        })
        .collect();
    let exp2 = nodes.iter().any(|u| matches!(u.op(), Op::Unary(UnaryOp::Exp2)));
    (kinds, exp2, k.lowering)
}

fn gelu64(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

fn silu64(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

#[test]
fn gelu_and_silu_kernels_run_the_tile_op_per_row() {
    let x = uniform(&[37, 300], -6.0, 6.0, 1);
    let t = Tensor::from_array(&x);
    let gelu = t.gelu_tanh();
    assert_eq!(lowered(&gelu), (vec![uopc_tile::Activation::GeluTanh], false, "activation_rows"));
    assert_close(&gelu.to_ndarray::<f32>().unwrap(), &f64s(&x).mapv(gelu64), 1e-5);
    // The argument is the loop's: a scaled input, then SiLU.
    let silu = (&t * 0.5).silu();
    assert_eq!(lowered(&silu), (vec![uopc_tile::Activation::Silu], false, "activation_rows"));
    assert_close(&silu.to_ndarray::<f32>().unwrap(), &f64s(&x).mapv(|v| silu64(0.5 * v)), 1e-5);
}

#[test]
fn other_kernels_keep_their_loops_and_their_values() {
    let x = uniform(&[24, 40], -6.0, 6.0, 2);
    let t = Tensor::from_array(&x);
    // Not exactly an activation: the loop computes it.
    let scaled = t.gelu_tanh() * 3.0;
    let (kinds, _, lowering) = lowered(&scaled);
    assert!(kinds.is_empty() && lowering == "rangeify");
    assert_close(&scaled.to_ndarray::<f32>().unwrap(), &f64s(&x).mapv(|v| 3.0 * gelu64(v)), 1e-5);
    // A transposed argument: whichever lowering takes it, the values hold.
    let transposed = t.permute(&[1, 0]).gelu_tanh();
    let want = f64s(&x).permuted_axes(vec![1, 0]).mapv(gelu64);
    assert_close(&transposed.to_ndarray::<f32>().unwrap(), &want, 1e-5);
    // A bf16 activation rounds its f32 result: the loop does.
    let xb: ArrayD<bf16> = x.mapv(bf16::from_f32);
    let b = Tensor::from_array(&xb).silu();
    assert!(lowered(&b).0.is_empty());
    for (got, v) in b.to_ndarray::<bf16>().unwrap().iter().zip(xb.iter()) {
        let want = silu64(f64::from(v.to_f32()));
        assert!((f64::from(got.to_f32()) - want).abs() <= (1.0 + want.abs()) / 256.0, "{got} vs {want}");
    }
}

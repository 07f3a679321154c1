//! The entry table against the calls every op makes, and the operands each entry takes.

use super::*;

/// One op of each kind, with the operand types that pick each of its entries.
fn every_call() -> Vec<TileCall> {
    use Elem::{Bf16, F16, F32};
    let gemm = TileOp::Gemm(GemmShape::dense(2, 3, 4, false, false, false));
    let rounded = TileOp::SoftmaxUpdateRounded {
        rows: 2,
        cols: 3,
        lds: 3,
        d: 4,
        ldo: 4,
        ldp: 3,
        scale: 1.0f32.to_bits(),
        round_to: Half::F16,
    };
    let mut calls: Vec<TileCall> =
        [[F32, F32], [Bf16, Bf16], [F16, F16], [F32, F16], [F32, Bf16], [F16, F32], [Bf16, F32]]
            .iter()
            .map(|e| gemm.call(e))
            .collect();
    calls.push(gemm.call(&[Bf16, Bf16, Bf16]));
    calls.push(gemm.call(&[F16, F16, F16]));
    calls.push(rounded.call(&[F32, F32, F32, F32, F16]));
    calls.push(rounded.call(&[F32, F32, F32, F32, F32]));
    let scale = 1.0f32.to_bits();
    for op in [
        TileOp::SoftmaxUpdate { rows: 2, cols: 3, lds: 3, d: 4, ldo: 4, scale },
        TileOp::SoftmaxRecompute { rows: 2, cols: 3, ld: 3 },
        TileOp::SoftmaxGrad { rows: 2, cols: 3, ld: 3 },
        TileOp::MaxSumExp { rows: 2, cols: 3, ld: 3, scale },
        TileOp::Convert { rows: 2, cols: 3, lds: 3, ldd: 3 },
        TileOp::ExpRows { rows: 2, cols: 3, ldx: 3, ldy: 3, scale },
        TileOp::Activation { rows: 2, cols: 3, ld: 3, kind: crate::Activation::GeluTanh },
        TileOp::ActivationGrad { rows: 2, cols: 3, ldx: 3, ldg: 4, kind: crate::Activation::Silu },
        TileOp::Softcap { rows: 2, cols: 3, ld: 3, inner: scale, outer: scale },
        TileOp::ScoreRamp { rows: 2, cols: 3, ld: 3, scale, slope_scale: scale },
    ] {
        calls.push(op.call(&[F32; 5]));
    }
    calls
}

#[test]
fn every_entry_is_called_with_its_declared_arguments() {
    let calls = every_call();
    for entry in TileEntry::ALL {
        let call =
            calls.iter().find(|c| c.entry == entry).unwrap_or_else(|| panic!("{entry:?} never called"));
        assert_eq!(call.operands + call.fields.len(), entry.params(), "{entry:?}");
        assert_eq!(call.operands, entry.row().1, "{entry:?}");
    }
}

#[test]
fn the_operands_an_entry_takes_are_the_ops_own() {
    let rounded = |elem| {
        let op = TileOp::SoftmaxUpdateRounded {
            rows: 2,
            cols: 3,
            lds: 3,
            d: 4,
            ldo: 4,
            ldp: 5,
            scale: 2.0f32.to_bits(),
            round_to: Half::Bf16,
        };
        (op.operands().len(), op.call(&[Elem::F32, Elem::F32, Elem::F32, Elem::F32, elem]))
    };
    let (all, own) = rounded(Elem::Bf16);
    assert_eq!((own.operands, own.fields), (all, vec![2, 3, 3, 4, 4, 5, 2.0f32.to_bits().into(), 0]));
    // P over the scores: the in-place entry takes neither P nor its stride.
    let (_, over) = rounded(Elem::F32);
    assert_eq!((over.operands, over.fields), (4, vec![2, 3, 3, 4, 4, 2.0f32.to_bits().into(), 0]));
}

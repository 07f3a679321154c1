//! The safe entry points refuse bad input with an error, never a panic or a stray access.

use crate::common;

use uopc_tile::{GemmShape, Isa, SoftmaxShape, TileError, gemm, softmax_update};

fn gemm_shapes() -> Vec<GemmShape> {
    let mut v = Vec::new();
    for (at, bt) in [(false, false), (false, true), (true, false), (true, true)] {
        for acc in [false, true] {
            let mut s = GemmShape::dense(5, 7, 3, at, bt, acc);
            s.lda += 2;
            s.ldc += 1;
            v.push(s);
            v.push(GemmShape::dense(1, 1, 1, at, bt, acc));
            v.push(GemmShape::dense(17, 33, 9, at, bt, acc));
        }
    }
    v
}

#[test]
fn gemm_slices_one_short_are_rejected() {
    for isa in common::isas() {
        for s in gemm_shapes() {
            let [na, nb, nc] = s.extents().unwrap();
            let (a, b, mut c) = (vec![0.5f32; na], vec![0.25f32; nb], vec![1.0f32; nc]);
            assert_eq!(gemm(isa, &s, &a, &b, &mut c), Ok(()));
            let short = |n: usize| n - 1;
            let e = gemm(isa, &s, &a[..short(na)], &b, &mut c);
            assert_eq!(e, Err(TileError::BufferTooSmall { operand: "a", needed: na, len: na - 1 }));
            let e = gemm(isa, &s, &a, &b[..short(nb)], &mut c);
            assert_eq!(e, Err(TileError::BufferTooSmall { operand: "b", needed: nb, len: nb - 1 }));
            let before = c.clone();
            let e = gemm(isa, &s, &a, &b, &mut c[..short(nc)]);
            assert_eq!(e, Err(TileError::BufferTooSmall { operand: "c", needed: nc, len: nc - 1 }));
            assert_eq!(c, before, "a refused call must not write");
        }
    }
}

#[test]
fn gemm_bad_strides_and_overflow_are_rejected() {
    let isa = Isa::Portable;
    let mut s = GemmShape::dense(4, 4, 4, false, false, false);
    s.lda = 3;
    let buf = vec![0.0f32; 64];
    let mut c = vec![0.0f32; 64];
    assert_eq!(
        gemm(isa, &s, &buf, &buf, &mut c),
        Err(TileError::LeadingDim { operand: "a", ld: 3, cols: 4 })
    );
    // One row ignores its leading dimension.
    let s1 = GemmShape { lda: 0, ldc: 0, ..GemmShape::dense(1, 4, 4, false, false, false) };
    assert_eq!(gemm(isa, &s1, &buf, &buf, &mut c), Ok(()));
    // Sizes whose extents overflow usize.
    let huge =
        GemmShape { m: usize::MAX, k: 2, lda: usize::MAX, ..GemmShape::dense(1, 1, 2, false, false, false) };
    assert_eq!(gemm(isa, &huge, &buf, &buf, &mut c), Err(TileError::Overflow { operand: "a" }));
    let huge = GemmShape::dense(1 << 40, 1 << 40, 1 << 40, false, true, true);
    assert!(gemm(isa, &huge, &buf, &buf, &mut c).is_err());
    // Operands with an empty shape need no storage.
    let s = GemmShape::dense(0, 3, 3, true, true, false);
    assert_eq!(gemm(isa, &s, &[], &[0.0; 9], &mut []), Ok(()));
    let s = GemmShape::dense(3, 0, 3, false, false, false);
    assert_eq!(gemm(isa, &s, &[0.0; 9], &[], &mut []), Ok(()));
}

#[test]
fn k_zero_overwrites_or_keeps_c() {
    for isa in common::isas() {
        let mut c = vec![3.0f32; 6];
        gemm(isa, &GemmShape::dense(2, 3, 0, false, false, true), &[], &[], &mut c).unwrap();
        assert_eq!(c, [3.0; 6]);
        gemm(isa, &GemmShape::dense(2, 3, 0, false, false, false), &[], &[], &mut c).unwrap();
        assert_eq!(c, [0.0; 6]);
    }
}

#[test]
fn unavailable_isa_is_an_error() {
    let s = GemmShape::dense(2, 2, 2, false, false, false);
    let sh = SoftmaxShape::dense(1, 2, 2);
    let mut tested = false;
    for isa in Isa::ALL {
        let mut c = [0.0f32; 4];
        let r = gemm(isa, &s, &[1.0; 4], &[1.0; 4], &mut c);
        let (mut sc, mut o) = ([0.0f32; 2], [0.0f32; 2]);
        let q = softmax_update(isa, &sh, &mut sc, &mut [0.0], &mut [0.0], &mut o);
        if isa.available() {
            assert_eq!((r, q), (Ok(()), Ok(())));
        } else {
            tested = true;
            assert_eq!(r, Err(TileError::IsaUnavailable(isa)));
            assert_eq!(q, Err(TileError::IsaUnavailable(isa)));
            assert_eq!(c, [0.0; 4]);
        }
    }
    if !tested {
        println!("every ISA is available on this CPU; the refusal path was not exercised");
    }
    assert!(Isa::detect().available());
    assert!(Isa::Portable.available());
}

#[test]
fn softmax_slices_one_short_are_rejected() {
    for isa in common::isas() {
        let sh = SoftmaxShape { rows: 3, cols: 10, lds: 12, ldo: 5, d: 4 };
        let [ns, no] = sh.extents().unwrap();
        let (mut s, mut o) = (vec![0.0f32; ns], vec![0.0f32; no]);
        let (mut mx, mut sum) = (vec![0.0f32; 3], vec![0.0f32; 3]);
        assert_eq!(softmax_update(isa, &sh, &mut s, &mut mx, &mut sum, &mut o), Ok(()));
        let e = softmax_update(isa, &sh, &mut s[..ns - 1], &mut mx, &mut sum, &mut o);
        assert_eq!(e, Err(TileError::BufferTooSmall { operand: "s", needed: ns, len: ns - 1 }));
        let e = softmax_update(isa, &sh, &mut s, &mut mx[..2], &mut sum, &mut o);
        assert_eq!(e, Err(TileError::BufferTooSmall { operand: "row_max", needed: 3, len: 2 }));
        let e = softmax_update(isa, &sh, &mut s, &mut mx, &mut sum[..2], &mut o);
        assert_eq!(e, Err(TileError::BufferTooSmall { operand: "row_sum", needed: 3, len: 2 }));
        let e = softmax_update(isa, &sh, &mut s, &mut mx, &mut sum, &mut o[..no - 1]);
        assert_eq!(e, Err(TileError::BufferTooSmall { operand: "o", needed: no, len: no - 1 }));
        let bad = SoftmaxShape { lds: 9, ..sh };
        let e = softmax_update(isa, &bad, &mut s, &mut mx, &mut sum, &mut o);
        assert_eq!(e, Err(TileError::LeadingDim { operand: "s", ld: 9, cols: 10 }));
        let huge = SoftmaxShape { rows: usize::MAX, cols: 2, lds: usize::MAX, ldo: 0, d: 0 };
        assert_eq!(
            softmax_update(isa, &huge, &mut s, &mut mx, &mut sum, &mut o),
            Err(TileError::Overflow { operand: "s" })
        );
    }
}

//! BF16 and F16 in the IR: which ops the verifier accepts on them, constant folding of casts,
//! and the interpreter's loads, stores and casts in both precisions, against the `half` crate.

use half::{bf16, f16};
use uopc_ir::interp::{Precision, run};
use uopc_ir::*;

fn one_store(out: &UOp, value: UOp) -> UOp {
    sink(&[out.index(0).store(value)])
}

#[test]
fn only_casts_loads_stores_and_selects_take_16_bit_values() {
    let (a, out) = (buffer(0, DType::BF16, 1), buffer(1, DType::BF16, 1));
    let x = a.index(0).load();
    let c = const_of(0.1, DType::BF16);
    // Accepted: a select between 16-bit values, a constant, a round trip through f64.
    let cond = x.cast(DType::F32).lt(1.0f32);
    verify(&one_store(&out, cond.where_(&x, &c))).unwrap();
    verify(&one_store(&out, x.cast(DType::F64).cast(DType::F16).cast(DType::BF16))).unwrap();
    // Rejected: arithmetic, comparisons, and casts to or from integers and bools.
    let f32_out = buffer(1, DType::F32, 1);
    let bool_out = buffer(1, DType::Bool, 1);
    for (what, p) in [
        ("sqrt", one_store(&out, x.sqrt())),
        ("neg", one_store(&out, -&x)),
        ("mul", one_store(&out, &x * &c)),
        ("max", one_store(&out, x.maximum(&c))),
        ("cmplt", one_store(&bool_out, x.lt(&c))),
        ("cmpne", one_store(&bool_out, x.ne(&c))),
        ("cast to bool", one_store(&bool_out, x.cast(DType::Bool))),
        ("cast from bool", one_store(&out, cond.cast(DType::BF16))),
        ("cast to i64", one_store(&f32_out, x.cast(DType::I64).cast(DType::F32))),
    ] {
        let e = verify(&p).expect_err(what);
        assert_eq!(e.kind, IrErrorKind::DType, "{what}: {e}");
    }
    // A 16-bit buffer stores only 16-bit values of its own type.
    let e = verify(&one_store(&out, x.cast(DType::F32))).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::DType);
    let e = verify(&one_store(&out, x.cast(DType::F16))).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::DType);
}

#[test]
fn casts_of_constants_fold_to_the_rounded_value() {
    let c = const_of(0.1, DType::F32);
    let folded = simplify(&c.cast(DType::BF16));
    assert_eq!(folded.dtype(), DType::BF16);
    assert_eq!(folded.const_value().unwrap().as_f64(), bf16::from_f32(0.1).to_f64());
    let folded = simplify(&c.cast(DType::F16).cast(DType::F32));
    assert_eq!(folded.dtype(), DType::F32);
    assert_eq!(folded.const_value().unwrap().as_f64(), f16::from_f32(0.1).to_f64());
    // From f64 through f32 (as torch converts): just above a bf16 midpoint by less than an
    // f32 ulp, the f32 is the midpoint, which rounds to even (down, here).
    let above = (1.0 + 1.0 / 256.0) * (1.0 + 1e-12);
    let folded = simplify(&const_of(above, DType::F64).cast(DType::BF16));
    assert_eq!(folded.const_value().unwrap().as_f64(), 1.0);
    // NaN and infinity survive; f16 overflows to infinity.
    for (v, want) in [(f64::NAN, f64::NAN), (f64::INFINITY, f64::INFINITY), (1e6, f64::INFINITY)] {
        let folded = simplify(&const_of(v, DType::F32).cast(DType::F16).cast(DType::F32));
        let got = folded.const_value().unwrap().as_f64();
        assert!(got == want || (got.is_nan() && want.is_nan()), "{v}: {got}");
    }
}

#[test]
fn the_interpreter_rounds_at_each_cast_in_native_precision_only() {
    // out16[0] = bf16(f32(a) * f32(b)); out64[0] = f64(f16(x))
    let (a, b) = (buffer(0, DType::BF16, 1), buffer(1, DType::BF16, 1));
    let (x, out16, out64) = (buffer(2, DType::F64, 1), buffer(3, DType::BF16, 1), buffer(4, DType::F64, 1));
    let prod = a.index(0).load().cast(DType::F32) * b.index(0).load().cast(DType::F32);
    let program = sink(&[
        out16.index(0).store(prod.cast(DType::BF16)),
        out64.index(0).store(x.index(0).load().cast(DType::F16).cast(DType::F64)),
    ]);
    // a * b is exact in f32 (8-bit significands); the product then rounds once to bf16.
    let (va, vb) = (bf16::from_f32(1.0078125), bf16::from_f32(3.0234375));
    let vx = 1.0 + 3.0 * 2f64.powi(-12); // 3/4 of the way from 1 to the next f16
    for precision in [Precision::Native, Precision::F64] {
        let mut bufs = [
            HostBuffer::BF16(vec![va]),
            HostBuffer::BF16(vec![vb]),
            HostBuffer::F64(vec![vx]),
            HostBuffer::zeros(DType::BF16, 1),
            HostBuffer::zeros(DType::F64, 1),
        ];
        run(&program, &mut bufs, precision).unwrap();
        let want = bf16::from_f32((va.to_f64() * vb.to_f64()) as f32);
        assert_ne!(want.to_f64(), va.to_f64() * vb.to_f64(), "the product needs rounding");
        assert_eq!(bufs[3], HostBuffer::BF16(vec![want]), "{precision:?}");
        let rounded = f16::from_f32(vx as f32).to_f64();
        // Native: the f16 value; F64 (the accuracy reference) keeps the f64 value through CASTs.
        let expect = if precision == Precision::Native { rounded } else { vx };
        assert_eq!(bufs[4], HostBuffer::F64(vec![expect]), "{precision:?}");
    }
    assert_eq!(f16::from_f32(vx as f32).to_f64(), 1.0 + 2f64.powi(-10));
}

#[test]
fn the_rounded_softmax_takes_p_in_its_rounding_dtype_or_over_its_own_scores() {
    let op = |round_to, ldp| TileOp::SoftmaxUpdateRounded {
        rows: 2,
        cols: 3,
        lds: 3,
        d: 1,
        ldo: 1,
        ldp,
        scale: 1.0f32.to_bits(),
        round_to,
    };
    let bufs: Vec<UOp> = (0..4).map(|k| buffer(k, DType::F32, 8)).collect();
    let ops: Vec<UOp> = bufs.iter().map(|b| b.index(0)).collect();
    let with_p = |round_to, ldp, p: &UOp| {
        let mut src = ops.clone();
        src.push(p.clone());
        sink(&[tile(op(round_to, ldp), &src)])
    };
    let (p16, pb16, other) = (buffer(4, DType::F16, 8), buffer(4, DType::BF16, 8), buffer(4, DType::F32, 8));
    // Accepted: a P of the rounding dtype, or the score operand itself with its stride.
    verify(&with_p(Half::F16, 3, &p16.index(0))).unwrap();
    verify(&with_p(Half::Bf16, 3, &pb16.index(0))).unwrap();
    verify(&with_p(Half::F16, 3, &ops[0])).unwrap();
    verify(&with_p(Half::Bf16, 3, &ops[0])).unwrap();
    // Rejected: a P of the other 16-bit type, and an f32 P that is not S or has another
    // stride. (A rounding type that is not 16-bit cannot be written: `Half` has none.)
    for (what, p) in [
        ("bf16 P rounded to f16", with_p(Half::F16, 3, &pb16.index(0))),
        ("another f32 tile", with_p(Half::F16, 3, &other.index(0))),
        ("S at another offset", with_p(Half::F16, 3, &bufs[0].index(1))),
        ("S with another stride", with_p(Half::F16, 4, &ops[0])),
    ] {
        let e = verify(&p).expect_err(what);
        assert_eq!(e.kind, IrErrorKind::DType, "{what}: {e}");
    }
}

#[test]
fn a_block_conversion_widens_16_bit_to_f32_or_rounds_f32_to_16_bit() {
    let convert = |from: DType, to: DType| {
        let (s, d) = (buffer(0, from, 8), buffer(1, to, 8));
        sink(&[tile(TileOp::Convert { rows: 2, cols: 3, lds: 4, ldd: 3 }, &[s.index(0), d.index(0)])])
    };
    for (from, to) in [
        (DType::F16, DType::F32),
        (DType::BF16, DType::F32),
        (DType::F32, DType::F16),
        (DType::F32, DType::BF16),
    ] {
        verify(&convert(from, to)).unwrap();
    }
    for (from, to) in [
        (DType::F32, DType::F32),
        (DType::F16, DType::BF16),
        (DType::F16, DType::F16),
        (DType::F64, DType::F16),
    ] {
        let e = verify(&convert(from, to)).expect_err("not a conversion the op has");
        assert_eq!(e.kind, IrErrorKind::DType, "{from} -> {to}: {e}");
    }
}

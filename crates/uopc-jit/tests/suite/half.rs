//! BF16 and F16 through the JIT: conversions exhaustive over all 65,536 bit patterns of each
//! type against the `half` crate, f32 values around every rounding midpoint, f64 ones, the
//! interpreter against the JIT on programs mixing 16-bit buffers, and the bf16 and f16 tile
//! GEMMs of a compiled program against an f64 reference.

use half::{bf16, f16};
use uopc_ir::interp::{self, Precision};
use uopc_ir::*;
use uopc_jit::{Arg, Program};

/// `out[i] = cast(inp[i], to)`, one element per iteration.
fn cast_program(from: DType, to: DType, n: usize) -> UOp {
    let (inp, out) = (buffer(0, from, n), buffer(1, to, n));
    let i = range(n, 0, AxisType::Loop);
    let x = inp.index(&i).load();
    let v = if from == to { x } else { x.cast(to) };
    sink(&[out.index(&i).store(v).end(&[i])])
}

/// Runs a one-input, one-output program compiled with the default options (vectorized: every
/// loop here is, but those over f64 memory) and scalar: both must give the same bits.
fn run(program: &UOp, bufs: &mut [HostBuffer]) {
    let mut results = Vec::new();
    for opts in [uopc_jit::JitOptions::default(), uopc_jit::JitOptions::scalar()] {
        let prg = Program::compile_with(program, "half", &opts).unwrap();
        if opts.vectorize && bufs.iter().all(|b| b.dtype() != DType::F64) {
            assert!(prg.clif().contains("f32x4"), "not vectorized:\n{}", prg.loop_ir());
        }
        let mut mine = bufs.to_vec();
        let (inputs, outputs) = mine.split_at_mut(1);
        prg.run(&mut [Arg::from(&inputs[0]), Arg::from(&mut outputs[0])]).unwrap();
        results.push(mine);
    }
    let bits = |b: &HostBuffer| (0..b.len()).map(|i| b.get_f64(i).to_bits()).collect::<Vec<_>>();
    let (v, s) = (bits(&results[0][1]), bits(&results[1][1]));
    if let Some(i) = (0..v.len()).find(|&i| v[i] != s[i]) {
        let input = results[0][0].get_f64(i);
        panic!(
            "element {i} (input {input:e}): default build {:e}, scalar {:e}",
            f64::from_bits(v[i]),
            f64::from_bits(s[i])
        );
    }
    bufs.clone_from_slice(&results[0]);
}

fn all_bf16() -> Vec<bf16> {
    (0..=u16::MAX).map(bf16::from_bits).collect()
}

fn all_f16() -> Vec<f16> {
    (0..=u16::MAX).map(f16::from_bits).collect()
}

#[test]
fn every_bf16_widens_and_round_trips_like_half() {
    let n = 1 << 16;
    let mut bufs = [HostBuffer::BF16(all_bf16()), HostBuffer::zeros(DType::F32, n)];
    run(&cast_program(DType::BF16, DType::F32, n), &mut bufs);
    let HostBuffer::F32(wide) = &bufs[1] else { unreachable!() };
    for (h, w) in all_bf16().iter().zip(wide) {
        assert_eq!(w.to_bits(), h.to_f32().to_bits(), "bf16 {:#06x}", h.to_bits());
    }
    // A LOAD stored straight back: the identity, except that signaling NaNs come back quiet.
    let mut bufs = [HostBuffer::BF16(all_bf16()), HostBuffer::zeros(DType::BF16, n)];
    run(&cast_program(DType::BF16, DType::BF16, n), &mut bufs);
    let HostBuffer::BF16(back) = &bufs[1] else { unreachable!() };
    for (h, b) in all_bf16().iter().zip(back) {
        assert_eq!(b.to_bits(), bf16::from_f32(h.to_f32()).to_bits(), "bf16 {:#06x}", h.to_bits());
        if !h.is_nan() {
            assert_eq!(b.to_bits(), h.to_bits());
        }
    }
}

#[test]
fn every_f16_widens_and_round_trips_like_half() {
    let n = 1 << 16;
    let mut bufs = [HostBuffer::F16(all_f16()), HostBuffer::zeros(DType::F32, n)];
    run(&cast_program(DType::F16, DType::F32, n), &mut bufs);
    let HostBuffer::F32(wide) = &bufs[1] else { unreachable!() };
    for (h, w) in all_f16().iter().zip(wide) {
        assert_eq!(w.to_bits(), h.to_f32().to_bits(), "f16 {:#06x}", h.to_bits());
    }
    let mut bufs = [HostBuffer::F16(all_f16()), HostBuffer::zeros(DType::F16, n)];
    run(&cast_program(DType::F16, DType::F16, n), &mut bufs);
    let HostBuffer::F16(back) = &bufs[1] else { unreachable!() };
    for (h, b) in all_f16().iter().zip(back) {
        assert_eq!(b.to_bits(), f16::from_f32(h.to_f32()).to_bits(), "f16 {:#06x}", h.to_bits());
        if !h.is_nan() {
            assert_eq!(b.to_bits(), h.to_bits());
        }
    }
    // The straight copy stores the loaded bits (NaNs quieted) instead of rounding the widened
    // value again: f16 rounding is the only source of an `fadd` in this program.
    for opts in [uopc_jit::JitOptions::default(), uopc_jit::JitOptions::scalar()] {
        let prg = Program::compile_with(&cast_program(DType::F16, DType::F16, n), "copy", &opts).unwrap();
        assert!(!prg.clif().contains("fadd"), "{}", prg.clif());
    }
    // F16 -> BF16 and back through f32 registers.
    let mut bufs = [HostBuffer::F16(all_f16()), HostBuffer::zeros(DType::BF16, n)];
    run(&cast_program(DType::F16, DType::BF16, n), &mut bufs);
    let HostBuffer::BF16(as_bf16) = &bufs[1] else { unreachable!() };
    for (h, b) in all_f16().iter().zip(as_bf16) {
        assert_eq!(b.to_bits(), bf16::from_f32(h.to_f32()).to_bits(), "f16 {:#06x}", h.to_bits());
    }
}

/// For every finite 16-bit value `v` (widened with `widen`): `v`, the f32 midpoint to the next
/// value up in magnitude, and the f32 neighbours on both sides of `v` and of the midpoint; plus
/// the infinities, NaNs with payloads in the dropped bits, and the overflow threshold's
/// neighbourhood.
fn values_around_midpoints(widen: impl Fn(u16) -> f32) -> Vec<f32> {
    let mut out = Vec::new();
    for bits in 0..0x7FFFu16 {
        let (v, next) = (widen(bits), widen(bits + 1));
        if !v.is_finite() || !next.is_finite() {
            continue;
        }
        let mid = ((v as f64 + next as f64) / 2.0) as f32;
        assert_eq!(mid as f64, (v as f64 + next as f64) / 2.0, "midpoints are exact in f32");
        for x in [v, mid] {
            for y in [f32::from_bits(x.to_bits().wrapping_sub(1)), x, f32::from_bits(x.to_bits() + 1)] {
                out.extend([y, -y]);
            }
        }
    }
    out.extend([f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN, 65520.0, 65519.996, 1e-30, -0.0]);
    out.extend([f32::from_bits(0x7F80_0001), f32::from_bits(0xFFC0_1234), f32::from_bits(0x7FBF_FFFF)]);
    out
}

#[test]
fn f32_rounds_to_bf16_and_f16_like_half_around_every_midpoint() {
    for (to, values) in [
        (DType::BF16, values_around_midpoints(|b| bf16::from_bits(b).to_f32())),
        (DType::F16, values_around_midpoints(|b| f16::from_bits(b).to_f32())),
    ] {
        let n = values.len();
        let want: Vec<u16> = values
            .iter()
            .map(
                |&x| if to == DType::BF16 { bf16::from_f32(x).to_bits() } else { f16::from_f32(x).to_bits() },
            )
            .collect();
        // Rounded by the STORE of a CAST.
        let mut bufs = [HostBuffer::F32(values.clone()), HostBuffer::zeros(to, n)];
        run(&cast_program(DType::F32, to, n), &mut bufs);
        let got: Vec<u16> = match &bufs[1] {
            HostBuffer::BF16(v) => v.iter().map(|h| h.to_bits()).collect(),
            HostBuffer::F16(v) => v.iter().map(|h| h.to_bits()).collect(),
            _ => unreachable!(),
        };
        for ((x, g), w) in values.iter().zip(&got).zip(&want) {
            assert_eq!(g, w, "{to}: f32 {x:e} ({:#010x}) gives {g:#06x}, half gives {w:#06x}", x.to_bits());
        }
        // Rounded in a register: CAST to the 16-bit type and back to f32, stored as f32.
        let (inp, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n));
        let i = range(n, 0, AxisType::Loop);
        let program = sink(&[out.index(&i).store(inp.index(&i).load().cast(to).cast(DType::F32)).end(&[i])]);
        let mut bufs = [HostBuffer::F32(values.clone()), HostBuffer::zeros(DType::F32, n)];
        run(&program, &mut bufs);
        let HostBuffer::F32(widened) = &bufs[1] else { unreachable!() };
        for ((x, g), w) in values.iter().zip(widened).zip(&want) {
            let w =
                if to == DType::BF16 { bf16::from_bits(*w).to_f32() } else { f16::from_bits(*w).to_f32() };
            assert_eq!(g.to_bits(), w.to_bits(), "{to}: f32 {x:e} in a register");
        }
    }
}

#[test]
fn f64_rounds_to_bf16_and_f16_through_f32() {
    // Values just above a 16-bit midpoint by less than an f32 ulp (they round to the midpoint
    // in f32, then to even), at midpoints, and specials.
    let mut values: Vec<f64> = Vec::new();
    for bits in (0x0400..0x7B00u16).step_by(7) {
        let (v, next) = (f16::from_bits(bits).to_f64(), f16::from_bits(bits + 1).to_f64());
        values.extend([(v + next) / 2.0 * (1.0 + 1e-12), (v + next) / 2.0, -v]);
        let (v, next) = (bf16::from_bits(bits).to_f64(), bf16::from_bits(bits + 1).to_f64());
        values.extend([(v + next) / 2.0 * (1.0 + 1e-12), (v + next) / 2.0, f64::NAN, 1e300]);
    }
    let n = values.len();
    for to in [DType::BF16, DType::F16] {
        let mut bufs = [HostBuffer::F64(values.clone()), HostBuffer::zeros(to, n)];
        run(&cast_program(DType::F64, to, n), &mut bufs);
        for (k, &x) in values.iter().enumerate() {
            let (got, want) = match &bufs[1] {
                HostBuffer::BF16(v) => (v[k].to_bits(), bf16::from_f32(x as f32).to_bits()),
                HostBuffer::F16(v) => (v[k].to_bits(), f16::from_f32(x as f32).to_bits()),
                _ => unreachable!(),
            };
            assert_eq!(got, want, "{to}: f64 {x:e}");
        }
    }
}

/// `out[i] = bf16(f32(a[i]) * f32(b[i]) + 0.1)` when `a[i] < b[i]`, else `a[i]` moved to
/// f16; plus a bf16 ALLOC used as a per-iteration register and a bf16 constant.
fn mixed_program(n: usize) -> UOp {
    let (a, b) = (buffer(0, DType::BF16, n), buffer(1, DType::F16, n));
    let (out, out16) = (buffer(2, DType::BF16, n), buffer(3, DType::F16, n));
    let i = range(n, 0, AxisType::Thread);
    let (x, y) = (a.index(&i).load().cast(DType::F32), b.index(&i).load().cast(DType::F32));
    let value = (&x * &y + 0.1f32).cast(DType::BF16);
    let tmp = alloc(0, DType::BF16, 1).after(&[i.clone()]);
    let put = tmp.index(0).store(value);
    let kept = tmp.after(&[put]).index(0).load();
    let small = x.lt(&y).where_(&kept, const_of(-1.5, DType::BF16));
    let other = x.cast(DType::F64).cast(DType::F16);
    sink(&[out.index(&i).store(small).end(&[i.clone()]), out16.index(&i).store(other).end(&[i])])
}

#[test]
fn interpreter_and_jit_agree_on_16_bit_buffers() {
    let n = 1000;
    let a: Vec<bf16> = (0..n).map(|k| bf16::from_f32((k as f32 * 0.37).sin() * 300.0)).collect();
    let b: Vec<f16> = (0..n).map(|k| f16::from_f32((k as f32 * 0.11).cos() * 70.0)).collect();
    let program = mixed_program(n);
    let fresh = || {
        [
            HostBuffer::BF16(a.clone()),
            HostBuffer::F16(b.clone()),
            HostBuffer::zeros(DType::BF16, n),
            HostBuffer::zeros(DType::F16, n),
        ]
    };
    let mut want = fresh();
    interp::run(&program, &mut want, Precision::Native).unwrap();
    for (name, opts) in
        [("default", uopc_jit::JitOptions::default()), ("scalar", uopc_jit::JitOptions::scalar())]
    {
        let prg = Program::compile_with(&program, "mixed", &opts).unwrap();
        let mut got = fresh();
        let [a, b, out, out16] = &mut got;
        prg.run(&mut [Arg::from(&*a), Arg::from(&*b), Arg::from(out), Arg::from(out16)]).unwrap();
        assert_eq!(got, want, "{name}");
    }
    // Independently: the first output from f32 arithmetic and half's rounding.
    let HostBuffer::BF16(out) = &want[2] else { unreachable!() };
    for k in 0..n {
        let (x, y) = (a[k].to_f32(), b[k].to_f32());
        let expect = if x < y { bf16::from_f32(x * y + 0.1) } else { bf16::from_f32(-1.5) };
        assert_eq!(out[k], expect, "element {k}");
    }
}

#[test]
fn vectorized_16_bit_loops_match_the_interpreter() {
    // Contiguous 16-bit loads, a broadcast (stride 0) and a strided gather, arithmetic in f32,
    // rounding stores of both types; 1003 iterations leave a scalar tail.
    let n = 1003;
    let (a, b, c) = (buffer(0, DType::BF16, n), buffer(1, DType::F16, 2 * n), buffer(2, DType::BF16, 1));
    let (out, out16) = (buffer(3, DType::BF16, n), buffer(4, DType::F16, n));
    let i = range(n, 0, AxisType::Loop);
    let x = a.index(&i).load().cast(DType::F32);
    let y = b.index(&i * 2 + 1).load().cast(DType::F32);
    let s = c.index(0).load().cast(DType::F32);
    let program = sink(&[
        out.index(&i).store((&x * &s + &y).cast(DType::BF16)),
        out16.index(&i).store(((&x - &y) * 2.0f32).cast(DType::F16)).end(&[i.clone()]),
    ]);
    let [first, second] = program.src() else { unreachable!("a SINK of the two stores built above") };
    let program = sink(&[first.clone().end(&[i]), second.clone()]);
    let fresh = || {
        [
            HostBuffer::BF16((0..n).map(|k| bf16::from_f32((k as f32 * 0.731).sin() * 2e4)).collect()),
            HostBuffer::F16((0..2 * n).map(|k| f16::from_f32((k as f32 * 0.377).cos() * 3e4)).collect()),
            HostBuffer::BF16(vec![bf16::from_f32(-1.75)]),
            HostBuffer::zeros(DType::BF16, n),
            HostBuffer::zeros(DType::F16, n),
        ]
    };
    let mut want = fresh();
    interp::run(&program, &mut want, Precision::Native).unwrap();
    let prg = Program::compile(&program, "vector16").unwrap();
    assert!(prg.clif().contains("uload16x4"), "{}", prg.clif());
    let mut got = fresh();
    let [a, b, c, out, out16] = &mut got;
    prg.run(&mut [Arg::from(&*a), Arg::from(&*b), Arg::from(&*c), Arg::from(out), Arg::from(out16)]).unwrap();
    assert_eq!(got, want);
    // Large values: f16 outputs overflow to infinity in some lanes.
    let HostBuffer::F16(v) = &want[4] else { unreachable!() };
    assert!(v.iter().any(|h| h.is_infinite()) && v.iter().any(|h| h.is_finite()));
}

#[test]
fn arithmetic_on_16_bit_values_is_rejected() {
    let a = buffer(0, DType::BF16, 4);
    let out = buffer(1, DType::BF16, 4);
    let i = range(4, 0, AxisType::Loop);
    let x = a.index(&i).load();
    let p = sink(&[out.index(&i).store(&x + &x).end(&[i.clone()])]);
    assert_eq!(verify(&p).unwrap_err().kind, IrErrorKind::DType);
    let ints = buffer(2, DType::I32, 4);
    let p = sink(&[out.index(&i).store(ints.index(&i).load().cast(DType::BF16)).end(&[i])]);
    let e = verify(&p).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::DType);
    assert!(e.to_string().contains("16-bit floats cast only to and from floats"), "{e}");
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A tile GEMM on an `a_dtype` A and a `dtype` B (one of them or both 16-bit) in a compiled
/// program, and its reference expansion through the interpreter, against an f64 product of the same inputs.
fn half_tile_gemm_matches_f64(a_dtype: DType, dtype: DType) {
    let narrow_to = |dtype: DType, v: Vec<f32>| match dtype {
        DType::BF16 => HostBuffer::BF16(v.into_iter().map(bf16::from_f32).collect()),
        DType::F16 => HostBuffer::F16(v.into_iter().map(f16::from_f32).collect()),
        _ => HostBuffer::F32(v),
    };
    let wide = |h: &HostBuffer, at: usize| match h {
        HostBuffer::BF16(v) => v[at].to_f64(),
        HostBuffer::F16(v) => v[at].to_f64(),
        HostBuffer::F32(v) => f64::from(v[at]),
        _ => unreachable!("f32 or 16-bit operands"),
    };
    for (m, n, k, a_trans, b_trans, accumulate) in [
        (37, 45, 70, false, false, false),
        (64, 32, 96, true, false, true),
        (5, 130, 33, false, true, false),
        (33, 17, 1, true, true, true),
        (40, 24, 300, true, false, false),
    ] {
        let g = GemmShape::dense(m, n, k, a_trans, b_trans, accumulate);
        let (na, nb, nc) = (m * k, k * n, m * n);
        let (a, b) = (narrow_to(a_dtype, values(na, 1)), narrow_to(dtype, values(nb, 2)));
        let c0 = values(nc, 3);
        let (ab, bb, cb) = (buffer(0, a_dtype, na), buffer(1, dtype, nb), buffer(2, DType::F32, nc));
        let program = sink(&[tile(TileOp::Gemm(g), &[ab.index(0), bb.index(0), cb.index(0)])]);
        let prg = Program::compile(&program, "gemm_half").unwrap();
        let mut c = c0.clone();
        prg.run(&mut [Arg::from(&a), Arg::from(&b), Arg::from(&mut c[..])]).unwrap();
        // The reference expansion through the interpreter, too.
        let mut bufs = [a.clone(), b.clone(), HostBuffer::F32(c0.clone())];
        interp::run(&expand_tile_ops(&program), &mut bufs, Precision::Native).unwrap();
        let HostBuffer::F32(expanded) = &bufs[2] else { unreachable!() };
        for i in 0..m {
            for j in 0..n {
                let mut want = if accumulate { c0[i * n + j] as f64 } else { 0.0 };
                let mut magnitude = want.abs();
                for p in 0..k {
                    let x = wide(&a, if a_trans { p * m + i } else { i * k + p });
                    let y = wide(&b, if b_trans { j * k + p } else { p * n + j });
                    want += x * y;
                    magnitude += (x * y).abs();
                }
                // Products of two bf16 (8 significant bits each) or two f16 (11) are exact in
                // f32; only the f32 sums round (k + 1 of them, each within 2^-24 of the
                // running magnitude). An f32 A rounds each product once more (2^-24 of it),
                // still inside twice the sums' bound.
                let tol = (k as f64 + 2.0) * f32::EPSILON as f64 * magnitude;
                let got = c[i * n + j] as f64;
                assert!((got - want).abs() <= tol, "{dtype} {m}x{n}x{k} ({i},{j}): {got} vs {want}");
                assert!((expanded[i * n + j] as f64 - want).abs() <= tol, "{dtype} expansion ({i},{j})");
            }
        }
    }
}

#[test]
fn bf16_tile_gemm_in_a_compiled_program_matches_f64() {
    half_tile_gemm_matches_f64(DType::BF16, DType::BF16);
}

#[test]
fn f16_tile_gemm_in_a_compiled_program_matches_f64() {
    let prg_clif = {
        let g = GemmShape::dense(2, 2, 2, false, false, false);
        let (a, b, c) = (buffer(0, DType::F16, 4), buffer(1, DType::F16, 4), buffer(2, DType::F32, 4));
        let p = sink(&[tile(TileOp::Gemm(g), &[a.index(0), b.index(0), c.index(0)])]);
        Program::compile(&p, "gemm_f16").unwrap().clif().to_string()
    };
    // The f16 kernel, not the bf16 or f32 one: the call goes to the extern declared ninth
    // (`Extern::ALL` order), after the bf16 GEMM's.
    assert!(prg_clif.contains("call fn8("), "{prg_clif}");
    half_tile_gemm_matches_f64(DType::F16, DType::F16);
}

#[test]
fn f32_by_f16_tile_gemm_in_a_compiled_program_matches_f64() {
    let prg_clif = {
        let g = GemmShape::dense(2, 2, 2, false, false, false);
        let (a, b, c) = (buffer(0, DType::F32, 4), buffer(1, DType::F16, 4), buffer(2, DType::F32, 4));
        let p = sink(&[tile(TileOp::Gemm(g), &[a.index(0), b.index(0), c.index(0)])]);
        Program::compile(&p, "gemm_f32_f16").unwrap().clif().to_string()
    };
    // The mixed kernel: the extern declared eleventh (`Extern::ALL` order), the last.
    assert!(prg_clif.contains("call fn10("), "{prg_clif}");
    half_tile_gemm_matches_f64(DType::F32, DType::F16);
}

#[test]
fn f32_by_bf16_tile_gemm_in_a_compiled_program_matches_f64() {
    let prg_clif = {
        let g = GemmShape::dense(2, 2, 2, false, false, false);
        let (a, b, c) = (buffer(0, DType::F32, 4), buffer(1, DType::BF16, 4), buffer(2, DType::F32, 4));
        let p = sink(&[tile(TileOp::Gemm(g), &[a.index(0), b.index(0), c.index(0)])]);
        Program::compile(&p, "gemm_f32_bf16").unwrap().clif().to_string()
    };
    // The mixed bf16 kernel: the extern declared right after the f32 x f16 one.
    assert!(prg_clif.contains("call fn11("), "{prg_clif}");
    half_tile_gemm_matches_f64(DType::F32, DType::BF16);
}

#[test]
fn half_by_f32_tile_gemms_in_a_compiled_program_match_f64() {
    // Each 16-bit A with an f32 B calls its own kernel: the two externs declared last
    // (`Extern::ALL` order), f16's then bf16's.
    for (a_dtype, call) in [(DType::F16, "call fn16("), (DType::BF16, "call fn17(")] {
        let g = GemmShape::dense(2, 2, 2, false, false, false);
        let (a, b, c) = (buffer(0, a_dtype, 4), buffer(1, DType::F32, 4), buffer(2, DType::F32, 4));
        let p = sink(&[tile(TileOp::Gemm(g), &[a.index(0), b.index(0), c.index(0)])]);
        let clif = Program::compile(&p, "gemm_half_f32").unwrap().clif().to_string();
        assert!(clif.contains(call), "{a_dtype}: {clif}");
        half_tile_gemm_matches_f64(a_dtype, DType::F32);
    }
}

#[test]
fn bf16_tile_gemm_operands_are_checked() {
    let g = GemmShape::dense(4, 4, 4, false, false, false);
    let (a, b, c) = (buffer(0, DType::BF16, 16), buffer(1, DType::F16, 16), buffer(2, DType::F32, 16));
    let p = sink(&[tile(TileOp::Gemm(g), &[a.index(0), b.index(0), c.index(0)])]);
    let e = verify(&p).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::DType, "{e}");
    let (a, b, c) = (buffer(0, DType::BF16, 15), buffer(1, DType::BF16, 16), buffer(2, DType::F32, 16));
    let p = sink(&[tile(TileOp::Gemm(g), &[a.index(0), b.index(0), c.index(0)])]);
    assert_eq!(verify(&p).unwrap_err().kind, IrErrorKind::OutOfBounds);
    // A and B alike, or f32 with a 16-bit type either way round (no other mix has a
    // kernel); C stays f32, unless two operands of one 16-bit type round into their own.
    for (da, db, dc, ok) in [
        (DType::BF16, DType::F16, DType::F32, false),
        (DType::F16, DType::BF16, DType::F32, false),
        (DType::F16, DType::F32, DType::F32, true),
        (DType::BF16, DType::F32, DType::F32, true),
        (DType::F64, DType::F32, DType::F32, false),
        (DType::F32, DType::BF16, DType::F32, true),
        (DType::F32, DType::F64, DType::F32, false),
        (DType::F64, DType::F64, DType::F32, false),
        (DType::F16, DType::F16, DType::F16, true),
        (DType::BF16, DType::BF16, DType::BF16, true),
        (DType::F16, DType::F16, DType::BF16, false),
        (DType::BF16, DType::BF16, DType::F16, false),
        (DType::F32, DType::F16, DType::F16, false),
        (DType::F16, DType::F16, DType::F32, true),
        (DType::F32, DType::F16, DType::F32, true),
        (DType::F32, DType::F32, DType::F32, true),
    ] {
        let (a, b, c) = (buffer(0, da, 16), buffer(1, db, 16), buffer(2, dc, 16));
        let p = sink(&[tile(TileOp::Gemm(g), &[a.index(0), b.index(0), c.index(0)])]);
        match verify(&p) {
            Ok(_) => assert!(ok, "{da} x {db} -> {dc} accepted"),
            Err(e) => {
                assert!(!ok, "{da} x {db} -> {dc} refused: {e}");
                assert_eq!(e.kind, IrErrorKind::DType, "{e}");
                // The message names the offending operands' dtypes.
                let named = if dc == DType::F32 { format!("A {da}") } else { format!("{dc}") };
                assert!(e.to_string().contains(&named) || e.to_string().contains(&format!("({da})")), "{e}");
            }
        }
    }
}

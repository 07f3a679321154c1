//! The f16 GEMM, and the one with an f32 A and an f16 B, on every instruction set this machine
//! has, forced one by one, against an f64 reference computed from the same inputs; an
//! instruction set the machine lacks is reported as skipped.

use half::f16;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{
    GEMM_A_TRANS, GEMM_ACCUMULATE, GemmShape, Isa, TileError, gemm_f16, gemm_f32_f16, uopc_tile_gemm_f16,
    uopc_tile_gemm_f16_desc, uopc_tile_gemm_f32_f16,
};

/// Marks storage padding of C (between rows and past the last one); it must survive every call.
const SENTINEL: f32 = 12345.5;

struct Case {
    s: GemmShape,
    a: Vec<f16>,
    /// An f32 A for [`gemm_f32_f16`], of full f32 precision (not f16 values), NaN padding.
    a32: Vec<f32>,
    b: Vec<f16>,
    c0: Vec<f32>,
    /// Whether the reference reads `a32` rather than `a`.
    wide_a: bool,
}

/// Random operands for `s` in `[-scale, scale)`, each slice exactly as long as its extent. A
/// and B padding holds NaN (a read of it would poison the result); C padding holds
/// [`SENTINEL`], and without accumulation C starts as NaN so any read of it shows.
fn make_case(rng: &mut StdRng, s: GemmShape, scale: f32) -> Case {
    let [na, nb, nc] = s.extents().expect("test shapes are valid");
    let mut fill16 = |len: usize, (rows, cols): (usize, usize), ld: usize| {
        let mut x = vec![f16::NAN; len];
        for r in 0..rows {
            for c in 0..cols {
                x[r * ld + c] = f16::from_f32(rng.random_range(-scale..scale));
            }
        }
        x
    };
    let a = fill16(na, s.a_dims(), s.lda);
    let b = fill16(nb, s.b_dims(), s.ldb);
    let mut a32 = vec![f32::NAN; na];
    let (rows, cols) = s.a_dims();
    for r in 0..rows {
        for c in 0..cols {
            a32[r * s.lda + c] = rng.random_range(-scale..scale);
        }
    }
    let mut c0 = vec![SENTINEL; nc];
    for i in 0..s.m {
        for j in 0..s.n {
            c0[i * s.ldc + j] = if s.accumulate { rng.random_range(-1.0f32..1.0) } else { f32::NAN };
        }
    }
    Case { s, a, a32, b, c0, wide_a: false }
}

fn a_at(c: &Case, i: usize, p: usize) -> f64 {
    let at = if c.s.a_trans { p * c.s.lda + i } else { i * c.s.lda + p };
    if c.wide_a { f64::from(c.a32[at]) } else { c.a[at].to_f64() }
}

fn b_at(c: &Case, p: usize, j: usize) -> f64 {
    if c.s.b_trans { c.b[j * c.s.ldb + p] } else { c.b[p * c.s.ldb + j] }.to_f64()
}

/// Checks `got` (C after the call) against an f64 product of the f16 inputs.
///
/// Tolerance: a product of two f16 values (11 significant bits each, 22 together) is exact in
/// f32, and so is the widening, so the only error is the f32 summation of the k products and
/// `c0`, in any order: at most `(k + 1) u sum |t|` to first order with u = 2^-24 (Higham,
/// eq. 3.5), t running over the products and `c0`. We allow twice that, `(k + 2) 2u sum |t|`.
/// With an f32 A each product is rounded once more (at most `u |t|`), which the doubled bound
/// still covers: `(k + 2) u sum |t| <= (k + 2) 2u sum |t|`.
fn check(c: &Case, got: &[f32], what: &str) {
    let s = &c.s;
    for (idx, (&g, &c0)) in got.iter().zip(&c.c0).enumerate() {
        let (i, j) = (idx / s.ldc.max(1), idx % s.ldc.max(1));
        let inside = if s.m == 1 { idx < s.n } else { i < s.m && j < s.n };
        if !inside {
            assert_eq!(g.to_bits(), c0.to_bits(), "{what}: padding C[{idx}] changed");
        }
    }
    let u = 2f64.powi(-24);
    for i in 0..s.m {
        for j in 0..s.n {
            let c0 = if s.accumulate { f64::from(c.c0[i * s.ldc + j]) } else { 0.0 };
            let (mut exact, mut mag) = (c0, c0.abs());
            for p in 0..s.k {
                let t = a_at(c, i, p) * b_at(c, p, j);
                exact += t;
                mag += t.abs();
            }
            let g = f64::from(got[i * s.ldc + j]);
            let tol = (s.k + 2) as f64 * 2.0 * u * mag;
            assert!(
                (g - exact).abs() <= tol,
                "{what}: C[{i},{j}] = {g}, expected {exact} (tolerance {tol:e})"
            );
        }
    }
}

/// Random shapes with tails in m, n and k (around the register tiles, and the blocked driver's
/// k slabs and row blocks of A of a few hundred, from the machine model, all widened while
/// packed), both transposes, accumulation on and off, padded leading dimensions, and few-row
/// products (the AVX-512 streamed paths).
fn shapes(rng: &mut StdRng, count: usize) -> Vec<GemmShape> {
    let dim = |rng: &mut StdRng| match rng.random_range(0..4) {
        0 => rng.random_range(1..9),
        1 => 32 * rng.random_range(1..3) + rng.random_range(0..2) * rng.random_range(1..32),
        2 => rng.random_range(1..100),
        _ => 32 * rng.random_range(1..4),
    };
    let mut out = vec![
        GemmShape::dense(32, 32, 32, false, false, false),
        GemmShape::dense(64, 96, 300, false, false, true),
        GemmShape::dense(33, 47, 290, true, true, false),
        GemmShape::dense(1, 1, 1, false, false, false),
        GemmShape::dense(4, 70, 513, false, true, true),
        // A few rows against a B stored by rows in rows of 2 KiB or more (swept), over two k
        // slabs of 16-bit A.
        GemmShape::dense(3, 1030, 600, false, false, true),
        GemmShape::dense(1, 1100, 37, false, false, false),
        GemmShape::dense(70, 20, 769, true, false, false),
        // Past the 512-column blocks B is packed in, with and without a k tail.
        GemmShape::dense(9, 1100, 300, true, true, true),
        GemmShape::dense(20, 1030, 40, false, false, false),
        // Past the row blocks A is packed in (a few hundred rows), in both orientations.
        GemmShape::dense(700, 40, 100, true, false, false),
        GemmShape::dense(650, 70, 50, false, true, true),
    ];
    for _ in 0..count {
        let k = if rng.random_range(0..5) == 0 { rng.random_range(250..600) } else { dim(rng) };
        let (m, n) = (dim(rng), dim(rng));
        let (at, bt, acc) = (rng.random_bool(0.5), rng.random_bool(0.5), rng.random_bool(0.5));
        let mut s = GemmShape::dense(m, n, k, at, bt, acc);
        let pad = |rng: &mut StdRng| if rng.random_bool(0.5) { rng.random_range(1..9) } else { 0 };
        s.lda += pad(rng);
        s.ldb += pad(rng);
        s.ldc += pad(rng);
        out.push(s);
    }
    out
}

/// Returns false (after printing why) when `isa` cannot run here, so the caller returns early
/// and the output says it was skipped rather than passed as tested.
fn have(isa: Isa) -> bool {
    uopc_tile::machine::require_or_skip(isa.name(), isa.available())
}

/// Runs the random-shape suite on `isa`, with values of magnitude 1 and of 300 (products near
/// f16's largest finite value, 65504, which widen and multiply exactly in f32).
fn run_isa(isa: Isa, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let all = shapes(&mut rng, 100);
    for (t, s) in all.iter().enumerate() {
        let case = make_case(&mut rng, *s, if t % 4 == 3 { 300.0 } else { 1.0 });
        let mut got = case.c0.clone();
        gemm_f16(isa, s, &case.a, &case.b, &mut got).expect("valid operands");
        check(&case, &got, &format!("{isa} {s:?}"));
    }
    println!("ran: f16 GEMM on {isa}, {} shapes", all.len());
}

#[test]
fn avx512_against_f64_or_skipped_without_avx512() {
    if have(Isa::Avx512) {
        run_isa(Isa::Avx512, 1);
    }
}

#[test]
fn avx2_against_f64_or_skipped_without_avx2() {
    if have(Isa::Avx2Fma) {
        run_isa(Isa::Avx2Fma, 2);
    }
}

#[test]
fn portable_against_f64() {
    run_isa(Isa::Portable, 3);
}

#[test]
fn every_f16_value_passes_through_exactly() {
    // A column of every non-NaN f16 (subnormals, the largest finite values and the infinities
    // included) times 1: C must be each value widened, exactly.
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).filter(|x| !x.is_nan()).collect();
    let s = GemmShape::dense(all.len(), 1, 1, false, false, false);
    for isa in Isa::ALL.into_iter().filter(|&i| have(i)) {
        let mut c = vec![f32::NAN; all.len()];
        gemm_f16(isa, &s, &all, &[f16::ONE], &mut c).unwrap();
        for (x, g) in all.iter().zip(&c) {
            assert_eq!(*g, x.to_f32(), "{isa}: {x:?} (bits {:#06x})", x.to_bits());
        }
        // The same column stored as a transposed A (one stored row), which is widened by the
        // strip packing.
        let st = GemmShape::dense(all.len(), 1, 1, true, false, false);
        let mut c = vec![f32::NAN; all.len()];
        gemm_f16(isa, &st, &all, &[f16::ONE], &mut c).unwrap();
        for (x, g) in all.iter().zip(&c) {
            assert_eq!(*g, x.to_f32(), "{isa}, A transposed: {x:?} (bits {:#06x})", x.to_bits());
        }
    }
}

#[test]
fn every_f16_value_in_b_passes_through_exactly() {
    // Nine rows of ones (more than the few-row path takes, so B is packed) times a row of
    // every non-NaN f16, stored as is and transposed: every row of C must be B widened.
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).filter(|x| !x.is_nan()).collect();
    let ones = [f16::ONE; 9];
    for isa in Isa::ALL.into_iter().filter(|&i| have(i)) {
        for b_trans in [false, true] {
            let s = GemmShape::dense(9, all.len(), 1, false, b_trans, false);
            let mut c = vec![f32::NAN; 9 * all.len()];
            gemm_f16(isa, &s, &ones, &all, &mut c).unwrap();
            for (idx, g) in c.iter().enumerate() {
                let x = all[idx % all.len()];
                assert_eq!(*g, x.to_f32(), "{isa}, b_trans {b_trans}: {x:?} (bits {:#06x})", x.to_bits());
            }
        }
    }
}

#[test]
fn isas_agree_on_exactly_representable_sums() {
    // Small integers times powers of two: every partial sum is exact in f32, so all ISAs must
    // agree bit for bit whatever their summation order.
    let mut rng = StdRng::seed_from_u64(5);
    let s = GemmShape::dense(50, 70, 600, true, true, false);
    let [na, nb, nc] = s.extents().unwrap();
    let v = |rng: &mut StdRng| f16::from_f32(rng.random_range(-8i32..8) as f32 * 0.25);
    let a: Vec<f16> = (0..na).map(|_| v(&mut rng)).collect();
    let b: Vec<f16> = (0..nb).map(|_| v(&mut rng)).collect();
    let mut want = vec![0.0f32; nc];
    gemm_f16(Isa::Portable, &s, &a, &b, &mut want).unwrap();
    for isa in Isa::ALL.into_iter().filter(|&i| have(i)) {
        let mut got = vec![f32::NAN; nc];
        gemm_f16(isa, &s, &a, &b, &mut got).unwrap();
        assert_eq!(got, want, "{isa}");
    }
}

#[test]
fn k_zero_overwrites_or_keeps_c() {
    for isa in Isa::ALL.into_iter().filter(|&i| have(i)) {
        let mut c = vec![f32::NAN; 6];
        gemm_f16(isa, &GemmShape::dense(2, 3, 0, false, false, false), &[], &[], &mut c).unwrap();
        assert_eq!(c, vec![0.0; 6]);
        let mut c = vec![1.5f32; 6];
        gemm_f16(isa, &GemmShape::dense(2, 3, 0, false, false, true), &[], &[], &mut c).unwrap();
        assert_eq!(c, vec![1.5; 6]);
    }
}

#[test]
fn bad_input_is_an_error() {
    let s = GemmShape::dense(4, 5, 6, false, false, false);
    let (a, b) = (vec![f16::ONE; 24], vec![f16::ONE; 30]);
    let mut c = vec![0.0f32; 20];
    let p = Isa::Portable;
    assert_eq!(
        gemm_f16(p, &s, &a[..23], &b, &mut c),
        Err(TileError::BufferTooSmall { operand: "a", needed: 24, len: 23 })
    );
    assert_eq!(
        gemm_f16(p, &s, &a, &b[..29], &mut c),
        Err(TileError::BufferTooSmall { operand: "b", needed: 30, len: 29 })
    );
    assert_eq!(
        gemm_f16(p, &s, &a, &b, &mut c[..19]),
        Err(TileError::BufferTooSmall { operand: "c", needed: 20, len: 19 })
    );
    assert_eq!(
        gemm_f16(p, &GemmShape { lda: 5, ..s }, &a, &b, &mut c),
        Err(TileError::LeadingDim { operand: "a", ld: 5, cols: 6 })
    );
    assert_eq!(
        gemm_f16(p, &GemmShape { ldb: usize::MAX, ..s }, &a, &b, &mut c),
        Err(TileError::Overflow { operand: "b" })
    );
    for isa in Isa::ALL.into_iter().filter(|i| !i.available()) {
        assert_eq!(gemm_f16(isa, &s, &a, &b, &mut c), Err(TileError::IsaUnavailable(isa)));
    }
    assert!(c.iter().all(|&x| x == 0.0), "a refused call wrote C");
}

#[test]
fn extern_entry_computes_and_refuses_bad_descriptors() {
    let mut rng = StdRng::seed_from_u64(6);
    let s = GemmShape::dense(37, 41, 300, true, false, true);
    let case = make_case(&mut rng, s, 1.0);
    let mut got = case.c0.clone();
    // SAFETY: the slices cover the extents of the shape passed.
    let r = unsafe {
        uopc_tile_gemm_f16(
            case.a.as_ptr(),
            case.b.as_ptr(),
            got.as_mut_ptr(),
            37,
            41,
            300,
            37,
            41,
            41,
            GEMM_A_TRANS | GEMM_ACCUMULATE,
        )
    };
    assert_eq!(r, 0);
    check(&case, &got, "extern");
    let before = got.clone();
    // SAFETY: every call is refused before touching memory.
    unsafe {
        let (a, b, c) = (case.a.as_ptr(), case.b.as_ptr(), got.as_mut_ptr());
        assert_eq!(uopc_tile_gemm_f16(a, b, c, -1, 41, 300, 37, 41, 41, 0), -1, "negative m");
        assert_eq!(uopc_tile_gemm_f16(a, b, c, 37, 41, 300, 37, 41, 41, 8), -1, "unknown flag");
        assert_eq!(uopc_tile_gemm_f16(a, b, c, 37, 41, 300, 37, 40, 41, 0), -1, "ldb < n");
        assert_eq!(uopc_tile_gemm_f16(std::ptr::null(), b, c, 37, 41, 300, 37, 41, 41, 0), -1, "null a");
        assert_eq!(uopc_tile_gemm_f16_desc(std::ptr::null(), a, b, c), -1, "null descriptor");
    }
    assert_eq!(got, before);
}

/// Products of at most eight rows of A (not transposed) stream and widen B in registers on
/// AVX-512: every row count, both layouts of B, k around the 512-deep slab and the 16-wide
/// vectors, n around the 32-column strips, with and without accumulation and padding.
#[test]
fn few_rows_against_f64_on_every_available_isa() {
    let mut rng = StdRng::seed_from_u64(9);
    for isa in Isa::ALL {
        if !have(isa) {
            continue;
        }
        for m in 1..=8 {
            for (t, (n, k)) in
                [(1, 1), (15, 17), (16, 16), (33, 513), (100, 64), (31, 1100), (64, 512), (1100, 37)]
                    .into_iter()
                    .enumerate()
            {
                for b_trans in [false, true] {
                    let mut s = GemmShape::dense(m, n, k, false, b_trans, (m + t) % 2 == 0);
                    s.lda += t % 3;
                    s.ldb += t % 2;
                    s.ldc += (m + t) % 3;
                    let case = make_case(&mut rng, s, if t % 3 == 2 { 300.0 } else { 1.0 });
                    let mut got = case.c0.clone();
                    gemm_f16(isa, &s, &case.a, &case.b, &mut got).expect("valid operands");
                    check(&case, &got, &format!("{isa} {s:?}"));
                }
            }
        }
        println!("ran: f16 GEMM on {isa}, few-row shapes");
    }
}

/// Runs [`shapes`] on `isa` through [`gemm_f32_f16`], A of full f32 precision.
fn run_isa_wide_a(isa: Isa, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let all = shapes(&mut rng, 100);
    for (t, s) in all.iter().enumerate() {
        let case = Case { wide_a: true, ..make_case(&mut rng, *s, if t % 4 == 3 { 300.0 } else { 1.0 }) };
        let mut got = case.c0.clone();
        gemm_f32_f16(isa, s, &case.a32, &case.b, &mut got).expect("valid operands");
        check(&case, &got, &format!("f32 A, {isa} {s:?}"));
    }
    println!("ran: f32 x f16 GEMM on {isa}, {} shapes", all.len());
}

#[test]
fn f32_a_on_every_available_isa_against_f64() {
    for (seed, isa) in (20..).zip(Isa::ALL) {
        if have(isa) {
            run_isa_wide_a(isa, seed);
        }
    }
}

/// The few-row shapes of [`few_rows_against_f64_on_every_available_isa`] with an f32 A: on
/// AVX-512 they read A's rows with masked f32 loads instead of widening them.
#[test]
fn f32_a_few_rows_against_f64_on_every_available_isa() {
    let mut rng = StdRng::seed_from_u64(29);
    for isa in Isa::ALL.into_iter().filter(|&i| have(i)) {
        for m in 1..=8 {
            for (t, (n, k)) in
                [(1, 1), (15, 17), (16, 16), (33, 513), (100, 64), (31, 1100)].into_iter().enumerate()
            {
                for b_trans in [false, true] {
                    let mut s = GemmShape::dense(m, n, k, false, b_trans, (m + t) % 2 == 0);
                    s.lda += t % 3;
                    s.ldb += t % 2;
                    s.ldc += (m + t) % 3;
                    let case = Case { wide_a: true, ..make_case(&mut rng, s, 1.0) };
                    let mut got = case.c0.clone();
                    gemm_f32_f16(isa, &s, &case.a32, &case.b, &mut got).expect("valid operands");
                    check(&case, &got, &format!("f32 A, {isa} {s:?}"));
                }
            }
        }
        println!("ran: f32 x f16 GEMM on {isa}, few-row shapes");
    }
}

#[test]
fn f32_a_bad_input_is_an_error_and_extern_refuses() {
    let s = GemmShape::dense(4, 5, 6, false, false, false);
    let (a, b) = (vec![1.0f32; 24], vec![f16::ONE; 30]);
    let mut c = vec![0.0f32; 20];
    let p = Isa::Portable;
    assert_eq!(
        gemm_f32_f16(p, &s, &a[..23], &b, &mut c),
        Err(TileError::BufferTooSmall { operand: "a", needed: 24, len: 23 })
    );
    assert_eq!(
        gemm_f32_f16(p, &s, &a, &b[..29], &mut c),
        Err(TileError::BufferTooSmall { operand: "b", needed: 30, len: 29 })
    );
    assert_eq!(
        gemm_f32_f16(p, &GemmShape { lda: 5, ..s }, &a, &b, &mut c),
        Err(TileError::LeadingDim { operand: "a", ld: 5, cols: 6 })
    );
    for isa in Isa::ALL.into_iter().filter(|i| !i.available()) {
        assert_eq!(gemm_f32_f16(isa, &s, &a, &b, &mut c), Err(TileError::IsaUnavailable(isa)));
    }
    assert!(c.iter().all(|&x| x == 0.0), "a refused call wrote C");

    let mut rng = StdRng::seed_from_u64(26);
    let s = GemmShape::dense(37, 41, 300, true, false, true);
    let case = Case { wide_a: true, ..make_case(&mut rng, s, 1.0) };
    let mut got = case.c0.clone();
    // SAFETY: the slices cover the extents of the shape passed.
    let r = unsafe {
        uopc_tile_gemm_f32_f16(
            case.a32.as_ptr(),
            case.b.as_ptr(),
            got.as_mut_ptr(),
            37,
            41,
            300,
            37,
            41,
            41,
            GEMM_A_TRANS | GEMM_ACCUMULATE,
        )
    };
    assert_eq!(r, 0);
    check(&case, &got, "f32 A extern");
    let before = got.clone();
    // SAFETY: every call is refused before touching memory.
    unsafe {
        let (a, b, c) = (case.a32.as_ptr(), case.b.as_ptr(), got.as_mut_ptr());
        assert_eq!(uopc_tile_gemm_f32_f16(a, b, c, -1, 41, 300, 37, 41, 41, 0), -1, "negative m");
        assert_eq!(uopc_tile_gemm_f32_f16(a, b, c, 37, 41, 300, 37, 40, 41, 0), -1, "ldb < n");
        assert_eq!(uopc_tile_gemm_f32_f16(std::ptr::null(), b, c, 37, 41, 300, 37, 41, 41, 0), -1, "null a");
    }
    assert_eq!(got, before);
}

//! The bf16 GEMM on every path this machine has, forced one by one, against an f64 reference
//! computed from the same bf16 inputs; a path the machine lacks is reported as skipped.

use half::bf16;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{
    Bf16Path, GEMM_ACCUMULATE, GEMM_B_TRANS, GemmDesc, GemmShape, Isa, PanelPacking, TileError, gemm,
    gemm_bf16, gemm_bf16_parallel, pack_pair_panels_bf16, uopc_tile_gemm_bf16, uopc_tile_gemm_bf16_desc,
};

/// Marks storage padding of C (between rows and past the last one); it must survive every call.
const SENTINEL: f32 = 12345.5;

struct Case {
    s: GemmShape,
    a: Vec<bf16>,
    b: Vec<bf16>,
    c0: Vec<f32>,
}

/// Random operands for `s`, each slice exactly as long as its extent. A and B padding holds
/// NaN (a read of it would poison the result); C padding holds [`SENTINEL`], and without
/// accumulation C starts as NaN so any read of it shows.
fn make_case(rng: &mut StdRng, s: GemmShape) -> Case {
    let [na, nb, nc] = s.extents().expect("test shapes are valid");
    let mut fill16 = |len: usize, (rows, cols): (usize, usize), ld: usize| {
        let mut x = vec![bf16::NAN; len];
        for r in 0..rows {
            for c in 0..cols {
                x[r * ld + c] = bf16::from_f32(rng.random_range(-1.0f32..1.0));
            }
        }
        x
    };
    let a = fill16(na, s.a_dims(), s.lda);
    let b = fill16(nb, s.b_dims(), s.ldb);
    let mut c0 = vec![SENTINEL; nc];
    for i in 0..s.m {
        for j in 0..s.n {
            c0[i * s.ldc + j] = if s.accumulate { rng.random_range(-1.0f32..1.0) } else { f32::NAN };
        }
    }
    Case { s, a, b, c0 }
}

fn a_at(c: &Case, i: usize, p: usize) -> f64 {
    f64::from(if c.s.a_trans { c.a[p * c.s.lda + i] } else { c.a[i * c.s.lda + p] }.to_f32())
}

fn b_at(c: &Case, p: usize, j: usize) -> f64 {
    f64::from(c.b[c.s.b_index(p, j)].to_f32())
}

/// Checks `got` (C after the call) against an f64 product of the bf16 inputs.
///
/// Tolerance: a product of two bf16 values (8 significant bits each) is exact in f32, so the
/// only error is the f32 summation of k products (and of `c0`), in any order and grouping
/// (`tdpbf16ps` and `vdpbf16ps` add a pair of products at a time): at most `(k + 1) u sum |t|`
/// to first order with u = 2^-24 (Higham, eq. 3.5), where t runs over the products and `c0`.
/// We allow twice that, `(k + 2) 2u sum |t|`; the absolute floor of `k * 2^-120` covers the
/// flushing of subnormal partial sums to zero that the AMX and AVX512_BF16 instructions do.
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
            let mut exact = c0;
            let mut mag = c0.abs();
            for p in 0..s.k {
                let t = a_at(c, i, p) * b_at(c, p, j);
                exact += t;
                mag += t.abs();
            }
            let g = f64::from(got[i * s.ldc + j]);
            let tol = (s.k + 2) as f64 * 2.0 * u * mag + s.k as f64 * 2f64.powi(-120);
            assert!(
                (g - exact).abs() <= tol,
                "{what}: C[{i},{j}] = {g}, expected {exact} (tolerance {tol:e})"
            );
        }
    }
}

/// Random shapes with tails in m, n and k (around the 32-element blocks and the 256-deep k
/// slab), both transposes, accumulation on and off, and padded leading dimensions.
fn shapes(rng: &mut StdRng, count: usize) -> Vec<GemmShape> {
    let dim = |rng: &mut StdRng| match rng.random_range(0..4) {
        0 => rng.random_range(1..8),
        1 => 32 * rng.random_range(1..3) + rng.random_range(0..2) * rng.random_range(1..32),
        2 => rng.random_range(1..100),
        _ => 32 * rng.random_range(1..4),
    };
    let mut out = vec![
        GemmShape::dense(32, 32, 32, false, false, false),
        GemmShape::dense(64, 96, 300, false, false, true),
        GemmShape::dense(33, 47, 290, true, true, false),
        GemmShape::dense(1, 1, 1, false, false, false),
        GemmShape::dense(70, 20, 513, false, true, true),
        // A last k step of 4, 1 and 15 pairs (k = 40, 33, 62), and last column blocks of 8,
        // 16 and 17 columns (n = 40, 48, 49): `vdpbf16ps` multiplies only their data.
        GemmShape::dense(35, 40, 40, false, false, false),
        GemmShape::dense(33, 48, 33, false, true, true),
        GemmShape::dense(40, 49, 62, true, false, false),
        // A few rows against a B stored by rows in rows of 2 KiB or more (swept where the
        // path widens into f32 lanes), over two k slabs and with a k tail under four rows.
        GemmShape::dense(3, 1030, 600, false, false, true),
        GemmShape::dense(1, 1100, 37, false, false, false),
        GemmShape::dense(4, 4100, 9, false, false, false),
    ];
    for _ in 0..count {
        let (m, n, k) = (
            dim(rng),
            dim(rng),
            if rng.random_range(0..5) == 0 { rng.random_range(250..600) } else { dim(rng) },
        );
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

/// Runs the random-shape suite on `path`.
fn run_path(path: Bf16Path, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let all = shapes(&mut rng, 120);
    for s in &all {
        let case = make_case(&mut rng, *s);
        let mut got = case.c0.clone();
        gemm_bf16(path, s, &case.a, &case.b, &mut got).expect("valid operands");
        check(&case, &got, &format!("{path} {s:?}"));
    }
    println!("ran: {path} on {} shapes", all.len());
}

/// Returns false (after printing why) when `path` cannot run here, so the caller returns early
/// and the output says it was skipped rather than passed as tested; fails instead when
/// `UOPC_REQUIRE_ISA` names the path.
fn have(path: Bf16Path) -> bool {
    uopc_tile::machine::require_or_skip(path.name(), path.available())
}

#[test]
fn amx_against_f64_or_skipped_without_amx() {
    if have(Bf16Path::Amx) {
        run_path(Bf16Path::Amx, 1);
    }
}

#[test]
fn avx512bf16_against_f64_or_skipped_without_avx512bf16() {
    if have(Bf16Path::Avx512Bf16) {
        run_path(Bf16Path::Avx512Bf16, 2);
    }
}

#[test]
fn avx512widen_against_f64_or_skipped_without_avx512() {
    if have(Bf16Path::Avx512Widen) {
        run_path(Bf16Path::Avx512Widen, 5);
    }
}

#[test]
fn avx2fma_against_f64_or_skipped_without_avx2() {
    if have(Bf16Path::Avx2Fma) {
        run_path(Bf16Path::Avx2Fma, 4);
    }
}

#[test]
fn portable_against_f64() {
    run_path(Bf16Path::Portable, 3);
}

#[test]
fn detect_picks_the_models_choice() {
    let p = Bf16Path::detect();
    assert!(p.available());
    let model = uopc_tile::machine::Machine::get().choices().bf16;
    if model == Bf16Path::Amx {
        // AMX only after its known-answer check; a failed check falls back to the next choice.
        assert!(p == Bf16Path::Amx || p == Bf16Path::without_amx(), "{p}");
    } else {
        assert_eq!(p, model, "detect() must take the machine model's choice");
    }
    for p in Bf16Path::ALL {
        println!("path {p}: {}", if p.available() { "available" } else { "not available" });
    }
}

#[test]
fn amx_passes_its_known_answer_check_or_skipped_without_amx() {
    if have(Bf16Path::Amx) {
        uopc_tile::amx_known_answer_check(Bf16Path::Portable).expect("AMX against the portable path");
        uopc_tile::amx_known_answer_check(Bf16Path::without_amx()).expect("AMX against the model's fallback");
    } else {
        assert!(
            uopc_tile::amx_known_answer_check(Bf16Path::Portable).is_err(),
            "no AMX, so the check cannot pass"
        );
    }
}

#[test]
fn parallel_split_matches_reference_on_every_path() {
    let mut rng = StdRng::seed_from_u64(4);
    for path in Bf16Path::ALL {
        if !have(path) {
            continue;
        }
        for s in [
            GemmShape::dense(45, 200, 70, false, false, true),
            GemmShape::dense(64, 131, 64, true, true, false),
        ] {
            let case = make_case(&mut rng, s);
            for tasks in [0, 2, 3, 100] {
                let mut got = case.c0.clone();
                gemm_bf16_parallel(path, &s, &case.a, &case.b, &mut got, tasks).expect("valid operands");
                check(&case, &got, &format!("{path} {tasks} tasks {s:?}"));
            }
        }
    }
}

#[test]
fn paths_agree_on_exactly_representable_sums() {
    // Small integers times powers of two: every partial sum is exact in f32, so all paths must
    // agree bit for bit whatever their summation order.
    let mut rng = StdRng::seed_from_u64(5);
    let s = GemmShape::dense(50, 70, 90, false, true, false);
    let [na, nb, nc] = s.extents().unwrap();
    let v = |rng: &mut StdRng| bf16::from_f32(rng.random_range(-8i32..8) as f32 * 0.25);
    let a: Vec<bf16> = (0..na).map(|_| v(&mut rng)).collect();
    let b: Vec<bf16> = (0..nb).map(|_| v(&mut rng)).collect();
    let mut want = vec![0.0f32; nc];
    gemm_bf16(Bf16Path::Portable, &s, &a, &b, &mut want).unwrap();
    for path in Bf16Path::ALL.into_iter().filter(|p| have(*p)) {
        let mut got = vec![f32::NAN; nc];
        gemm_bf16(path, &s, &a, &b, &mut got).unwrap();
        assert_eq!(got, want, "{path}");
    }
}

#[test]
fn k_zero_overwrites_or_keeps_c() {
    for path in Bf16Path::ALL.into_iter().filter(|p| have(*p)) {
        let mut c = vec![f32::NAN; 6];
        gemm_bf16(path, &GemmShape::dense(2, 3, 0, false, false, false), &[], &[], &mut c).unwrap();
        assert_eq!(c, vec![0.0; 6]);
        let mut c = vec![1.5f32; 6];
        gemm_bf16(path, &GemmShape::dense(2, 3, 0, false, false, true), &[], &[], &mut c).unwrap();
        assert_eq!(c, vec![1.5; 6]);
    }
}

#[test]
fn bad_input_is_an_error() {
    let s = GemmShape::dense(4, 5, 6, false, false, false);
    let a = vec![bf16::ONE; 24];
    let b = vec![bf16::ONE; 30];
    let mut c = vec![0.0f32; 20];
    let p = Bf16Path::Portable;
    assert_eq!(
        gemm_bf16(p, &s, &a[..23], &b, &mut c),
        Err(TileError::BufferTooSmall { operand: "a", needed: 24, len: 23 })
    );
    assert_eq!(
        gemm_bf16(p, &s, &a, &b[..29], &mut c),
        Err(TileError::BufferTooSmall { operand: "b", needed: 30, len: 29 })
    );
    assert_eq!(
        gemm_bf16(p, &s, &a, &b, &mut c[..19]),
        Err(TileError::BufferTooSmall { operand: "c", needed: 20, len: 19 })
    );
    assert_eq!(
        gemm_bf16(p, &GemmShape { lda: 5, ..s }, &a, &b, &mut c),
        Err(TileError::LeadingDim { operand: "a", ld: 5, cols: 6 })
    );
    assert_eq!(
        gemm_bf16_parallel(p, &GemmShape { ldc: 4, ..s }, &a, &b, &mut c, 2),
        Err(TileError::LeadingDim { operand: "c", ld: 4, cols: 5 })
    );
    assert_eq!(
        gemm_bf16(p, &GemmShape { ldb: usize::MAX, ..s }, &a, &b, &mut c),
        Err(TileError::Overflow { operand: "b" })
    );
    for path in Bf16Path::ALL.into_iter().filter(|p| !p.available()) {
        assert_eq!(gemm_bf16(path, &s, &a, &b, &mut c), Err(TileError::PathUnavailable(path)));
    }
    assert!(c.iter().all(|&x| x == 0.0), "a refused call wrote C");
}

#[test]
fn extern_entry_computes_and_refuses_bad_descriptors() {
    let mut rng = StdRng::seed_from_u64(6);
    let s = GemmShape::dense(37, 41, 43, false, true, true);
    let case = make_case(&mut rng, s);
    let mut got = case.c0.clone();
    // SAFETY: the slices cover the extents of the shape passed.
    let r = unsafe {
        uopc_tile_gemm_bf16(
            case.a.as_ptr(),
            case.b.as_ptr(),
            got.as_mut_ptr(),
            37,
            41,
            43,
            43,
            43,
            41,
            GEMM_B_TRANS | GEMM_ACCUMULATE,
        )
    };
    assert_eq!(r, 0);
    check(&case, &got, "extern");
    let before = got.clone();
    // SAFETY: every call is refused before touching memory.
    unsafe {
        let (a, b, c) = (case.a.as_ptr(), case.b.as_ptr(), got.as_mut_ptr());
        assert_eq!(uopc_tile_gemm_bf16(a, b, c, -1, 41, 43, 43, 43, 41, 0), -1, "negative m");
        assert_eq!(uopc_tile_gemm_bf16(a, b, c, 37, 41, 43, 43, 43, 41, 16), -1, "unknown flag");
        assert_eq!(uopc_tile_gemm_bf16(a, b, c, 37, 41, 43, 42, 43, 41, 0), -1, "lda < k");
        assert_eq!(uopc_tile_gemm_bf16(std::ptr::null(), b, c, 37, 41, 43, 43, 43, 41, 0), -1, "null a");
        assert_eq!(uopc_tile_gemm_bf16_desc(std::ptr::null(), a, b, c), -1, "null descriptor");
    }
    assert_eq!(got, before);
}

/// Products of at most eight rows of A (not transposed) stream B without packing it on the
/// vector paths: every row count, both layouts of B, k around the 512-deep slab and the
/// 16-wide vectors, n around the 32-column strips and past a wide B's sweep threshold (1 KiB
/// a row), with and without accumulation and padding.
fn few_row_shapes() -> Vec<GemmShape> {
    let mut out = Vec::new();
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
                out.push(s);
            }
        }
    }
    out
}

#[test]
fn few_rows_against_f64_on_every_available_path() {
    let mut rng = StdRng::seed_from_u64(8);
    for path in Bf16Path::ALL {
        if !have(path) {
            continue;
        }
        for s in few_row_shapes() {
            let case = make_case(&mut rng, s);
            let mut got = case.c0.clone();
            gemm_bf16(path, &s, &case.a, &case.b, &mut got).expect("valid operands");
            check(&case, &got, &format!("{path} {s:?}"));
        }
        println!("ran: {path} on the few-row shapes");
    }
}

/// `case`'s B packed into pair panels (an extra 96 elements between panels), and the shape that
/// reads them in place of B, with A and C as `case` has them.
fn in_pair_panels(case: &Case) -> (GemmShape, Vec<bf16>) {
    let s = &case.s;
    let stride = s.k.div_ceil(32) * 1024 + 96;
    let p = PanelPacking { k: s.k, n: s.n, trans: s.b_trans, ld: s.ldb, width: 32, panel_stride: stride };
    let [_, nd] = p.pair_extents().expect("valid packing");
    let mut panels = vec![bf16::NAN; nd];
    pack_pair_panels_bf16(&p, &case.b, &mut panels).expect("packs");
    let shape =
        GemmShape { lda: s.lda, ldc: s.ldc, a_trans: s.a_trans, ..p.pair_gemm(s.m, s.lda, s.accumulate) };
    (shape, panels)
}

/// A B packed once into pair panels gives the product of the B it came from, on every path
/// (the widening ones run it on the portable kernel), through the parallel split and the C
/// entry; the f32 GEMM and a descriptor without the flag refuse the layout.
#[test]
fn pair_panels_give_the_product_of_their_b_on_every_path() {
    let mut rng = StdRng::seed_from_u64(11);
    let mut all = shapes(&mut rng, 40);
    all.push(GemmShape::dense(128, 192, 128, false, true, false));
    all.push(GemmShape::dense(128, 128, 71, false, false, true));
    for path in Bf16Path::ALL.into_iter().filter(|&p| have(p)) {
        for s in all.iter().filter(|s| s.k > 0) {
            let case = make_case(&mut rng, *s);
            let (shape, panels) = in_pair_panels(&case);
            let mut got = case.c0.clone();
            gemm_bf16(path, &shape, &case.a, &panels, &mut got).expect("valid operands");
            check(&case, &got, &format!("{path} pair panels {s:?}"));
            let mut split = case.c0.clone();
            gemm_bf16_parallel(path, &shape, &case.a, &panels, &mut split, 3).expect("valid operands");
            check(&case, &split, &format!("{path} pair panels in 3 tasks {s:?}"));
        }
        println!("ran: {path} with B in pair panels");
    }
    let case = make_case(&mut rng, GemmShape::dense(40, 70, 45, false, false, false));
    let (shape, panels) = in_pair_panels(&case);
    let desc = GemmDesc::from(&shape);
    let mut got = case.c0.clone();
    // SAFETY: the slices hold the shape's extents.
    let rc = unsafe { uopc_tile_gemm_bf16_desc(&desc, case.a.as_ptr(), panels.as_ptr(), got.as_mut_ptr()) };
    assert_eq!(rc, 0);
    check(&case, &got, "C entry with pair panels");
    let plain_flags = GemmDesc { flags: desc.flags & !uopc_tile::GEMM_B_PAIR_PANELS, ..desc };
    assert_eq!(plain_flags.shape().map(|s| s.b_pair_panels), Some(false));
    let wide: Vec<f32> = panels.iter().map(|x| x.to_f32()).collect();
    let a32: Vec<f32> = case.a.iter().map(|x| x.to_f32()).collect();
    let refused = gemm(Isa::Portable, &shape, &a32, &wide, &mut got);
    assert!(matches!(refused, Err(TileError::InvalidLayout { operand: "b", .. })), "{refused:?}");
}

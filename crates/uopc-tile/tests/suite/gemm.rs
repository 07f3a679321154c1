//! GEMM against an f64 reference on every ISA, layout, mode and many ragged shapes.

use crate::common;

use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{GEMM_A_TRANS, GEMM_ACCUMULATE, GEMM_B_TRANS, GemmShape, Isa, gemm, uopc_tile_gemm_f32};

/// Marks storage padding (between rows and past the last one); it must survive every call.
const SENTINEL: f32 = 12345.5;

struct Case {
    s: GemmShape,
    a: Vec<f32>,
    b: Vec<f32>,
    c0: Vec<f32>,
}

/// Random operands for `s`, each slice exactly as long as its extent; values live in the used
/// region, padding holds [`SENTINEL`]. Without accumulation C starts as NaN so any read of it
/// would show up in the result.
fn make_case(rng: &mut StdRng, s: GemmShape) -> Case {
    let [na, nb, nc] = s.extents().expect("test shapes are valid");
    let fill = |rng: &mut StdRng,
                len: usize,
                rows: usize,
                cols: usize,
                ld: usize,
                v: &dyn Fn(&mut StdRng) -> f32| {
        let mut x = vec![SENTINEL; len];
        for r in 0..rows {
            for c in 0..cols {
                x[r * ld + c] = v(rng);
            }
        }
        x
    };
    let (ar, ac) = s.a_dims();
    let (br, bc) = s.b_dims();
    let uni = |rng: &mut StdRng| rng.random_range(-1.0f32..1.0);
    let a = fill(rng, na, ar, ac, s.lda, &uni);
    let b = fill(rng, nb, br, bc, s.ldb, &uni);
    let c0 = if s.accumulate {
        fill(rng, nc, s.m, s.n, s.ldc, &uni)
    } else {
        fill(rng, nc, s.m, s.n, s.ldc, &|_| f32::NAN)
    };
    Case { s, a, b, c0 }
}

fn a_at(c: &Case, i: usize, p: usize) -> f64 {
    f64::from(if c.s.a_trans { c.a[p * c.s.lda + i] } else { c.a[i * c.s.lda + p] })
}

fn b_at(c: &Case, p: usize, j: usize) -> f64 {
    f64::from(if c.s.b_trans { c.b[j * c.s.ldb + p] } else { c.b[p * c.s.ldb + j] })
}

/// Checks `got` (C after the call) against an f64 product.
///
/// Tolerance: f32 dot products of length k, summed in any order with or without FMA, are within
/// `k * u * sum_p |a_ip b_pj|` of the exact value (u = 2^-24 the unit roundoff; Higham, eq. 3.5
/// to first order); accumulation adds one more rounding of `|c0|`. We allow
/// `(k + 2) * 2u * (sum_p |a_ip b_pj| + |c0|)`, twice that bound, plus a tiny absolute floor.
fn check(c: &Case, got: &[f32], what: &str) {
    let s = &c.s;
    let mut inside = vec![false; got.len()];
    for i in 0..s.m {
        for j in 0..s.n {
            inside[i * s.ldc + j] = true;
        }
    }
    for (idx, _) in inside.iter().enumerate().filter(|(_, x)| !**x) {
        assert_eq!(got[idx], c.c0[idx], "{what}: padding C[{idx}] changed");
    }
    for i in 0..s.m {
        for j in 0..s.n {
            let mut exact = 0.0f64;
            let mut mag = 0.0f64;
            for p in 0..s.k {
                let t = a_at(c, i, p) * b_at(c, p, j);
                exact += t;
                mag += t.abs();
            }
            let c0 = f64::from(c.c0[i * s.ldc + j]);
            if s.accumulate {
                exact += c0;
                mag += c0.abs();
            }
            let tol = (s.k as f64 + 2.0) * f64::from(f32::EPSILON) * mag + 1e-30;
            let v = f64::from(got[i * s.ldc + j]);
            assert!((v - exact).abs() <= tol, "{what}: C[{i},{j}] = {v}, expected {exact} (tol {tol:e})");
        }
    }
}

fn run_case(rng: &mut StdRng, isa: Isa, s: GemmShape) {
    let case = make_case(rng, s);
    let mut c = case.c0.clone();
    gemm(isa, &s, &case.a, &case.b, &mut c).expect("valid case");
    check(&case, &c, &format!("{isa} {s:?}"));
}

/// `s` with its leading dimensions padded by `0..=pad` beyond the minimum.
fn padded(rng: &mut StdRng, mut s: GemmShape, pad: usize) -> GemmShape {
    s.lda += rng.random_range(0..=pad);
    s.ldb += rng.random_range(0..=pad);
    s.ldc += rng.random_range(0..=pad);
    s
}

fn all_modes(rng: &mut StdRng, m: usize, n: usize, k: usize, pad: usize) {
    for isa in common::isas() {
        for at in [false, true] {
            for bt in [false, true] {
                for acc in [false, true] {
                    let s = padded(rng, GemmShape::dense(m, n, k, at, bt, acc), pad);
                    run_case(rng, isa, s);
                }
            }
        }
    }
}

#[test]
fn edge_shapes() {
    let mut rng = StdRng::seed_from_u64(1);
    // Empty dimensions, single elements, and tails around the register tiles (6/8 rows,
    // 8/16/32 columns) and the 8-wide transpose blocks of the packing.
    let dims = [
        (0, 0, 0),
        (0, 5, 3),
        (5, 0, 3),
        (5, 3, 0),
        (1, 1, 1),
        (1, 70, 1),
        (70, 1, 70),
        (1, 1, 67),
        (8, 32, 8),
        (9, 33, 9),
        (7, 31, 7),
        (6, 16, 16),
        (13, 17, 15),
        (16, 48, 17),
        (15, 15, 31),
        (24, 64, 64),
        (64, 64, 64),
        (33, 47, 65),
    ];
    for (m, n, k) in dims {
        all_modes(&mut rng, m, n, k, 0);
        all_modes(&mut rng, m, n, k, 5);
    }
}

#[test]
fn few_rows() {
    // Up to eight rows of A take the dot-product kernel (B^T) or the streamed-rows kernel (B)
    // on AVX-512 and AVX2: column counts around their 8- and 16-lane groups and k around the
    // 8- and 16-lane steps, with padded strides.
    let mut rng = StdRng::seed_from_u64(6);
    for m in [1, 2, 3, 4, 5, 6, 7, 8, 9] {
        for n in [1, 3, 15, 16, 17, 33, 64, 100, 129, 256] {
            for k in [1, 7, 16, 17, 64, 80, 127, 256] {
                for isa in common::isas() {
                    for (bt, acc) in [(false, false), (false, true), (true, false), (true, true)] {
                        let s = padded(&mut rng, GemmShape::dense(m, n, k, false, bt, acc), 9);
                        run_case(&mut rng, isa, s);
                    }
                }
            }
        }
    }
}

#[test]
fn few_rows_against_a_wide_row_major_b() {
    // One to eight rows of A against a B of 256 columns or more, stored by rows (a linear
    // layer's weight in decode, or its column block in a task) sweep B's rows into C: within
    // and past one stretch of C (4096 floats over all rows of A), with k not a multiple of the
    // four rows added per step, and from five rows on in two groups of rows.
    let mut rng = StdRng::seed_from_u64(16);
    for m in 1..=8 {
        for n in [300, 1100, 4100] {
            for k in [3, 9] {
                for isa in common::isas() {
                    for acc in [false, true] {
                        let s = padded(&mut rng, GemmShape::dense(m, n, k, false, false, acc), 9);
                        run_case(&mut rng, isa, s);
                    }
                }
            }
        }
    }
}

#[test]
fn random_shapes() {
    let mut rng = StdRng::seed_from_u64(2);
    for _ in 0..40 {
        let (m, n, k) = (rng.random_range(0..=70), rng.random_range(0..=70), rng.random_range(0..=70));
        all_modes(&mut rng, m, n, k, 7);
    }
}

#[test]
fn larger_shapes() {
    let mut rng = StdRng::seed_from_u64(3);
    // 129 x 257 x 64: tails in every dimension. k = 300 spans two k slabs (the second always
    // accumulates), m = 300 two row blocks, and n = 600 with k = 260 two packed column blocks.
    // An untransposed B of at most 8192 floats per slab has its full panels read in place:
    // 256 x 64 x 128 is just inside (flash attention's P V block), 256 x 64 x 129 just out.
    for (m, n, k) in
        [(129, 257, 64), (20, 40, 300), (300, 33, 20), (9, 600, 260), (256, 64, 128), (256, 64, 129)]
    {
        all_modes(&mut rng, m, n, k, 3);
    }
}

#[test]
fn power_of_two_leading_dimensions() {
    // Transposed A with `lda` a multiple of 128 takes the packed-strip path even for narrow C.
    let mut rng = StdRng::seed_from_u64(5);
    for isa in common::isas() {
        for (m, n, k, ld) in [(45, 20, 33, 128), (100, 7, 300, 384), (8, 32, 1, 128)] {
            for bt in [false, true] {
                for acc in [false, true] {
                    let s = GemmShape { lda: ld, ..GemmShape::dense(m, n, k, true, bt, acc) };
                    run_case(&mut rng, isa, s);
                    let s =
                        GemmShape { lda: ld, ldb: ld, ldc: ld, ..GemmShape::dense(m, n, k, false, bt, acc) };
                    run_case(&mut rng, isa, s);
                }
            }
        }
    }
}

#[test]
fn c_abi_entry_matches() {
    let mut rng = StdRng::seed_from_u64(4);
    for (at, bt, acc) in
        [(false, true, false), (true, false, true), (true, true, true), (false, false, false)]
    {
        let s = padded(&mut rng, GemmShape::dense(37, 45, 29, at, bt, acc), 4);
        let case = make_case(&mut rng, s);
        let mut c = case.c0.clone();
        let flags = (if at { GEMM_A_TRANS } else { 0 })
            | (if bt { GEMM_B_TRANS } else { 0 })
            | (if acc { GEMM_ACCUMULATE } else { 0 });
        let i = |x: usize| x as i64;
        // SAFETY: the slices cover the extents of the shape passed.
        let rc = unsafe {
            uopc_tile_gemm_f32(
                case.a.as_ptr(),
                case.b.as_ptr(),
                c.as_mut_ptr(),
                i(s.m),
                i(s.n),
                i(s.k),
                i(s.lda),
                i(s.ldb),
                i(s.ldc),
                flags,
            )
        };
        assert_eq!(rc, 0);
        check(&case, &c, "c abi");
    }
}

#[test]
fn c_abi_rejects_bad_arguments() {
    let (a, b, mut c) = (vec![0.0f32; 16], vec![0.0f32; 16], vec![0.0f32; 16]);
    let call = |c: *mut f32, m: i64, lda: i64, flags: i64| {
        // SAFETY: every call here is rejected before any memory is touched, or fits in 16
        // elements (4 x 4 x 4, dense).
        unsafe { uopc_tile_gemm_f32(a.as_ptr(), b.as_ptr(), c, m, 4, 4, lda, 4, 4, flags) }
    };
    let cp = c.as_mut_ptr();
    assert_eq!(call(cp, 4, 4, 0), 0);
    assert_eq!(call(cp, -1, 4, 0), -1, "negative size");
    assert_eq!(call(cp, 4, 3, 0), -1, "leading dimension too small");
    assert_eq!(call(cp, 4, 4, 16), -1, "unknown flag bit");
    assert_eq!(call(std::ptr::null_mut(), 4, 4, 0), -1, "null C");
    assert_eq!(call(std::ptr::null_mut(), 0, 4, 0), 0, "null is fine for an empty C");
}

#[test]
fn a_gemm_split_over_the_pool_matches_the_reference() {
    // Ragged row blocks (1023 = 3 * 11 * 31 rows on 2, 3 and 16 threads), column blocks when
    // the rows are too few, one product too small to split, every layout and accumulation.
    // Blocks of the blocked kernel sum in the serial order (the k slabs depend on k alone),
    // so those match the serial call bit for bit; a block of few rows takes the few-row
    // kernel, which rounds differently.
    let mut rng = StdRng::seed_from_u64(31);
    for threads in [2, 3, 16] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        for (m, n, k) in [(1023, 77, 65), (20, 1021, 200), (5, 9, 200)] {
            for isa in common::isas() {
                for (at, bt, acc) in
                    [(false, false, false), (true, false, true), (false, true, false), (true, true, true)]
                {
                    let s = padded(&mut rng, GemmShape::dense(m, n, k, at, bt, acc), 3);
                    let case = make_case(&mut rng, s);
                    let mut serial = case.c0.clone();
                    gemm(isa, &s, &case.a, &case.b, &mut serial).unwrap();
                    let split = parallel_call(&pool, isa, &case);
                    let what = format!("{isa} {threads} threads {s:?}");
                    let few_row_blocks = split_rows(m, threads, uopc_tile::register_tile(isa)) <= 8;
                    if !few_row_blocks {
                        assert!(serial.iter().zip(&split).all(|(x, y)| x.to_bits() == y.to_bits()), "{what}");
                    }
                    check(&case, &split, &what);
                }
            }
        }
    }
}

#[test]
fn few_rows_split_along_k_over_the_pool_match_the_reference() {
    // A decode step's projections: up to eight rows of A against a deep B stored by rows are
    // cut along k, the partial products added into C; ragged stretches of k (1100 on 3
    // threads), more threads than stretches (16), C accumulated into or overwritten, padded.
    let mut rng = StdRng::seed_from_u64(37);
    for threads in [2, 3, 16] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        for (m, n, k) in [(1, 1000, 3000), (8, 300, 1100), (3, 1100, 777)] {
            assert!(uopc_tile::depth_split(m, n, k, threads, false, false).is_some(), "{m}x{n}x{k}");
            for isa in common::isas() {
                for acc in [false, true] {
                    let s = padded(&mut rng, GemmShape::dense(m, n, k, false, false, acc), 3);
                    let case = make_case(&mut rng, s);
                    let split = parallel_call(&pool, isa, &case);
                    check(&case, &split, &format!("{isa} {threads} threads {s:?}"));
                }
            }
        }
    }
}

/// C after `case`'s product as one call that may cut itself over `pool`
/// ([`GemmShape::parallel`]).
fn parallel_call(pool: &rayon::ThreadPool, isa: Isa, case: &Case) -> Vec<f32> {
    let mut c = case.c0.clone();
    let par = GemmShape { parallel: true, ..case.s };
    pool.install(|| gemm(isa, &par, &case.a, &case.b, &mut c)).unwrap();
    c
}

/// The fewest rows a block of the split GEMM gets (its last row block's), or all `m` when it
/// cuts columns or nothing.
fn split_rows(m: usize, threads: usize, (mr, _): (usize, usize)) -> usize {
    if m >= threads * mr {
        let step = m.div_ceil(threads).next_multiple_of(mr);
        m - (m - 1) / step * step
    } else {
        m
    }
}

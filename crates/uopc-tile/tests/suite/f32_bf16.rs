//! The f32 x bf16 GEMM (f32 A, bf16 B widened while packed) on every ISA this machine has,
//! forced one by one, against an f64 reference on the same inputs; every layout, accumulate,
//! padded leading dimensions whose padding must be neither read nor written.

use half::bf16;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{GemmShape, gemm_f32_bf16};

/// `C (+)= A · B` in f64, reading only the elements `s` names.
fn reference(s: &GemmShape, a: &[f32], b: &[bf16], c: &mut [f64]) {
    for i in 0..s.m {
        for j in 0..s.n {
            let dot: f64 = (0..s.k)
                .map(|p| {
                    let x = if s.a_trans { a[p * s.lda + i] } else { a[i * s.lda + p] };
                    let y = if s.b_trans { b[j * s.ldb + p] } else { b[p * s.ldb + j] };
                    f64::from(x) * f64::from(y.to_f32())
                })
                .sum();
            let cell = &mut c[i * s.ldc + j];
            *cell = if s.accumulate { *cell + dot } else { dot };
        }
    }
}

#[test]
fn f32_a_bf16_b_against_f64_on_every_available_isa() {
    let mut rng = StdRng::seed_from_u64(41);
    // Few rows (streamed; A read in place over k past 512 and a ragged end), small and large
    // products (blocked, several k slabs, ragged tiles).
    let sizes = [
        (1, 37, 19),
        (5, 64, 130),
        (8, 3, 1),
        (1, 70, 1030),
        (3, 45, 700),
        (2, 1100, 37),
        (4, 1030, 9),
        (13, 33, 70),
        (40, 100, 600),
        (97, 65, 17),
        (130, 257, 64),
    ];
    for isa in crate::common::isas() {
        for (t, &(m, n, k)) in sizes.iter().enumerate() {
            for layout in 0..8 {
                let (a_trans, b_trans, accumulate) = (layout & 1 != 0, layout & 2 != 0, layout & 4 != 0);
                let mut s = GemmShape::dense(m, n, k, a_trans, b_trans, accumulate);
                // Padded rows: padding is NaN in A and B, a sentinel in C.
                s.lda += 3;
                s.ldb += 5 * (t % 2);
                s.ldc += 2;
                let [na, nb, nc] = s.extents().expect("valid shape");
                let mut a = vec![f32::NAN; na];
                let mut b = vec![bf16::NAN; nb];
                let ((ar, ac), (br, bc)) = (s.a_dims(), s.b_dims());
                for r in 0..ar {
                    for x in &mut a[r * s.lda..r * s.lda + ac] {
                        *x = rng.random_range(-1.0f32..1.0);
                    }
                }
                for r in 0..br {
                    for x in &mut b[r * s.ldb..r * s.ldb + bc] {
                        *x = bf16::from_f32(rng.random_range(-1.0f32..1.0));
                    }
                }
                let sentinel = 12345.5f32;
                let mut c = vec![sentinel; nc];
                for i in 0..m {
                    for x in &mut c[i * s.ldc..i * s.ldc + n] {
                        *x = if accumulate { rng.random_range(-1.0f32..1.0) } else { f32::NAN };
                    }
                }
                let mut want: Vec<f64> = c.iter().map(|&x| f64::from(x)).collect();
                reference(&s, &a, &b, &mut want);
                gemm_f32_bf16(isa, &s, &a, &b, &mut c).expect("valid operands");
                for (idx, (&got, &want)) in c.iter().zip(&want).enumerate() {
                    let (i, j) = (idx / s.ldc, idx % s.ldc);
                    if i >= m || j >= n {
                        assert_eq!(
                            got.to_bits(),
                            sentinel.to_bits(),
                            "{isa} {s:?}: padding at {idx} written"
                        );
                        continue;
                    }
                    // k products of magnitude below 1, each exact in f32, summed in f32: the
                    // sums' rounding, k + 1 roundings of at most 2^-24 of a value below k + 1.
                    let tol = (k as f64 + 2.0) * (k as f64 + 1.0) * f64::from(f32::EPSILON) / 2.0;
                    assert!(
                        (f64::from(got) - want).abs() <= tol,
                        "{isa} {s:?} C[{i},{j}] = {got}, want {want}"
                    );
                }
            }
        }
        println!("ran: f32 x bf16 GEMM on {isa}, {} shapes x 8 layouts", sizes.len());
    }
}

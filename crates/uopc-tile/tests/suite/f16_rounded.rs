//! The f16 GEMM writing an f16 C, on every ISA this machine has, serial and cut over a pool:
//! bit for bit the f32 GEMM of the same ISA rounded to nearest even, within f16's rounding of
//! an f64 reference, and C's padding untouched.

use half::f16;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{
    GEMM_ACCUMULATE, GemmShape, Isa, TileError, gemm_f16, gemm_f16_rounded, uopc_tile_gemm_f16_rounded,
};

/// Shapes that reach each way the rounded GEMM runs: one k slab (each strip summed in a
/// scratch strip, wider than one B block too) and several (each strip rounded once, after the
/// last), ragged strips and panels, transposed operands, padded
/// leading dimensions, few rows (B streamed, then rounded whole), an empty sum, and a product
/// large enough to be cut over a pool.
fn shapes() -> Vec<GemmShape> {
    let mut padded = GemmShape::dense(37, 70, 45, false, true, false);
    (padded.lda, padded.ldb, padded.ldc) = (50, 47, 75);
    vec![
        GemmShape::dense(64, 96, 300, false, false, false),
        GemmShape::dense(40, 1100, 100, false, false, false),
        GemmShape::dense(30, 50, 64, true, false, false),
        GemmShape::dense(50, 70, 700, false, false, false),
        GemmShape::dense(33, 47, 290, true, true, false),
        padded,
        GemmShape::dense(3, 1030, 60, false, false, false),
        GemmShape::dense(40, 33, 0, false, false, false),
        GemmShape::dense(131, 200, 530, false, false, false),
    ]
}

fn random(rng: &mut StdRng, len: usize) -> Vec<f16> {
    (0..len).map(|_| f16::from_f32(rng.random_range(-1.0f32..1.0))).collect()
}

/// The f64 sum of `(i, j)`, and the sum of its terms' magnitudes.
fn reference(s: &GemmShape, a: &[f16], b: &[f16], (i, j): (usize, usize)) -> (f64, f64) {
    (0..s.k).fold((0.0, 0.0), |(sum, mag), p| {
        let x = f64::from(a[if s.a_trans { p * s.lda + i } else { i * s.lda + p }]);
        let y = f64::from(b[if s.b_trans { j * s.ldb + p } else { p * s.ldb + j }]);
        (sum + x * y, mag + (x * y).abs())
    })
}

#[test]
fn rounded_is_the_isas_f32_result_rounded_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(11);
    for isa in [Isa::Avx512, Isa::Avx2Fma, Isa::Portable] {
        if !uopc_tile::machine::require_or_skip(isa.name(), isa.available()) {
            continue;
        }
        for (s, threads) in shapes().into_iter().flat_map(|s| {
            [(s, 1), (GemmShape { parallel: true, ..s }, 2), (GemmShape { parallel: true, ..s }, 3)]
        }) {
            let [na, nb, nc] = s.extents().expect("valid shape");
            let (a, b) = (random(&mut rng, na), random(&mut rng, nb));
            let mut sums = vec![0.0f32; nc];
            gemm_f16(isa, &GemmShape { parallel: false, ..s }, &a, &b, &mut sums).expect("valid operands");
            // Padding (between rows and one past the end) must keep its sentinel.
            let sentinel = f16::from_f32(12345.0);
            let mut c = vec![sentinel; nc + 1];
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a pool");
            pool.install(|| gemm_f16_rounded(isa, &s, &a, &b, &mut c)).expect("valid operands");
            for (at, &got) in c.iter().enumerate() {
                let (i, j) = (at / s.ldc, at % s.ldc);
                if i >= s.m || j >= s.n {
                    assert_eq!(got.to_bits(), sentinel.to_bits(), "{isa:?} {s:?}: padding at {at}");
                    continue;
                }
                let want = f16::from_f32(sums[at]);
                assert_eq!(got.to_bits(), want.to_bits(), "{isa:?} {s:?} on {threads} threads at {at}");
                // Half an f16 ulp of rounding (2^-11 relative) on f32 sums within k units of
                // f32 rounding of the terms' magnitudes.
                let (exact, magnitude) = reference(&s, &a, &b, (i, j));
                let bound = exact.abs() * 2f64.powi(-11) + magnitude * s.k as f64 * 2f64.powi(-24) + 1e-7;
                assert!(
                    (f64::from(got) - exact).abs() <= bound,
                    "{isa:?} {s:?} at ({i}, {j}): {got} vs {exact}"
                );
            }
        }
        println!("ran: {isa:?}");
    }
}

#[test]
fn an_accumulating_or_short_rounded_f16_gemm_is_refused_untouched() {
    let s = GemmShape::dense(2, 2, 2, false, false, false);
    let (a, b) = ([f16::ONE; 4], [f16::ONE; 4]);
    let mut c = [f16::NAN; 4];
    let accumulate = GemmShape { accumulate: true, ..s };
    let err = gemm_f16_rounded(Isa::Portable, &accumulate, &a, &b, &mut c).unwrap_err();
    assert!(matches!(err, TileError::InvalidLayout { operand: "c", .. }), "{err:?}");
    let short = gemm_f16_rounded(Isa::Portable, &s, &a, &b, &mut c[..3]);
    assert_eq!(short, Err(TileError::BufferTooSmall { operand: "c", needed: 4, len: 3 }));
    assert!(c.iter().all(|x| x.is_nan()));
    let call = |c: &mut [f16; 4], flags: i64| {
        // SAFETY: 2 x 2 operands of 4 elements each, C a unique borrow.
        unsafe { uopc_tile_gemm_f16_rounded(a.as_ptr(), b.as_ptr(), c.as_mut_ptr(), 2, 2, 2, 2, 2, 2, flags) }
    };
    assert_eq!(call(&mut c, GEMM_ACCUMULATE), -1);
    assert!(c.iter().all(|x| x.is_nan()));
    assert_eq!(call(&mut c, 0), 0);
    assert_eq!(c, [f16::from_f32(2.0); 4]);
}

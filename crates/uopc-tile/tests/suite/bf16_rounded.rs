//! The bf16 GEMM writing a bf16 C, on every path this machine has: bit for bit the f32 GEMM of
//! the same path rounded to nearest even, and C's padding untouched.

use half::bf16;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{
    Bf16Path, GEMM_ACCUMULATE, GemmShape, TileError, gemm_bf16, gemm_bf16_rounded,
    uopc_tile_gemm_bf16_rounded,
};

/// Shapes that reach each way the rounded GEMM runs: whole and ragged 32 x 32 blocks, a
/// transposed A (packed) and B, padded leading dimensions, few rows (B streamed), an empty
/// sum, and a sum deeper than AMX's one k slab (then C goes through f32).
fn shapes() -> Vec<GemmShape> {
    let mut padded = GemmShape::dense(37, 70, 45, false, true, false);
    (padded.lda, padded.ldb, padded.ldc) = (50, 47, 75);
    vec![
        GemmShape::dense(64, 96, 300, false, false, false),
        GemmShape::dense(33, 47, 290, true, true, false),
        GemmShape::dense(70, 40, 33, false, false, false),
        padded,
        GemmShape::dense(3, 1030, 60, false, false, false),
        GemmShape::dense(40, 33, 0, false, false, false),
        GemmShape::dense(40, 33, 8200, false, true, false),
    ]
}

fn random(rng: &mut StdRng, len: usize) -> Vec<bf16> {
    (0..len).map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0))).collect()
}

#[test]
fn rounded_is_the_paths_f32_result_rounded_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(7);
    let paths =
        [Bf16Path::Amx, Bf16Path::Avx512Bf16, Bf16Path::Avx512Widen, Bf16Path::Avx2Fma, Bf16Path::Portable];
    for path in paths.into_iter().filter(|p| uopc_tile::machine::require_or_skip(p.name(), p.available())) {
        for s in shapes() {
            let [na, nb, nc] = s.extents().expect("valid shape");
            let (a, b) = (random(&mut rng, na), random(&mut rng, nb));
            let mut sums = vec![0.0f32; nc];
            gemm_bf16(path, &s, &a, &b, &mut sums).expect("valid operands");
            // Padding (between rows and one past the end) must keep its sentinel.
            let sentinel = bf16::from_f32(12345.0);
            let mut c = vec![sentinel; nc + 1];
            gemm_bf16_rounded(path, &s, &a, &b, &mut c).expect("valid operands");
            for (at, &got) in c.iter().enumerate() {
                let (i, j) = (at / s.ldc, at % s.ldc);
                let want = if i < s.m && j < s.n { bf16::from_f32(sums[at]) } else { sentinel };
                assert_eq!(got.to_bits(), want.to_bits(), "{path} {s:?} at {at}");
            }
        }
        println!("ran: {path}");
    }
}

#[test]
fn an_accumulating_or_short_rounded_gemm_is_refused_untouched() {
    let s = GemmShape::dense(2, 2, 2, false, false, false);
    let (a, b) = ([bf16::ONE; 4], [bf16::ONE; 4]);
    let mut c = [bf16::NAN; 4];
    let accumulate = GemmShape { accumulate: true, ..s };
    let err = gemm_bf16_rounded(Bf16Path::Portable, &accumulate, &a, &b, &mut c).unwrap_err();
    assert!(matches!(err, TileError::InvalidLayout { operand: "c", .. }), "{err:?}");
    let short = gemm_bf16_rounded(Bf16Path::Portable, &s, &a, &b, &mut c[..3]);
    assert_eq!(short, Err(TileError::BufferTooSmall { operand: "c", needed: 4, len: 3 }));
    assert!(c.iter().all(|x| x.is_nan()));
    let call = |c: &mut [bf16; 4], flags: i64| {
        // SAFETY: 2 x 2 operands of 4 elements each, C a unique borrow.
        unsafe {
            uopc_tile_gemm_bf16_rounded(a.as_ptr(), b.as_ptr(), c.as_mut_ptr(), 2, 2, 2, 2, 2, 2, flags)
        }
    };
    assert_eq!(call(&mut c, GEMM_ACCUMULATE), -1);
    assert!(c.iter().all(|x| x.is_nan()));
    assert_eq!(call(&mut c, 0), 0);
    assert_eq!(c, [bf16::from_f32(2.0); 4]);
}

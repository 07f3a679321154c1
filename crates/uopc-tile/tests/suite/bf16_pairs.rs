//! B packed once into the bf16 GEMM's pair panels and read in place (`GemmShape::b_pairs`),
//! on every bf16 path this machine has, against an f64 reference of the same bf16 inputs.

use super::bf16::{check, have, make_case};
use half::bf16;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{
    BF16_PAIR_PANEL, Bf16Path, GEMM_B_PAIRS, GemmDesc, GemmShape, Isa, TileError, bf16_pair_panel_len, gemm,
    gemm_bf16, gemm_bf16_parallel, pack_bf16_pairs, uopc_tile_gemm_bf16_desc,
};

/// `(m, n, k, first k row, rows of B packed, B packed from its transpose, accumulate)`:
/// ragged rows, columns and k blocks, a GEMM over a stretch of k rows from a 32-multiple
/// inside longer panels, one row of A (which otherwise streams B), and attention's 128^3.
const SHAPES: [(usize, usize, usize, usize, usize, bool, bool); 7] = [
    (37, 70, 64, 32, 96, false, false),
    (5, 33, 80, 0, 80, true, true),
    (64, 128, 50, 64, 128, false, true),
    (1, 1, 1, 0, 1, true, false),
    (33, 100, 104, 96, 200, true, false),
    (128, 128, 128, 0, 128, false, false),
    (3, 40, 40, 32, 72, true, true),
];

/// B's `total` rows (of `n` values) as stored for packing, with the case's `k x n` B at rows
/// `p0 ..` and random values elsewhere: transposed (`n x total`, rows 3 apart more than
/// needed) or not (`total x n`, one more); returns the storage and its leading dimension.
fn stored_b(
    rng: &mut StdRng,
    b: &[bf16],
    (k, n, p0, total, trans): (usize, usize, usize, usize, bool),
) -> (Vec<bf16>, usize) {
    let ld = if trans { total + 3 } else { n + 1 };
    let len = if trans { n * ld } else { total * ld };
    let mut out: Vec<bf16> = (0..len).map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0))).collect();
    for p in 0..k {
        for j in 0..n {
            let at = if trans { j * ld + p0 + p } else { (p0 + p) * ld + j };
            out[at] = b[p * n + j];
        }
    }
    (out, ld)
}

#[test]
fn pair_panels_read_in_place_against_f64_on_every_available_path() {
    let mut rng = StdRng::seed_from_u64(31);
    for path in Bf16Path::ALL {
        if !have(path) {
            continue;
        }
        for (m, n, k, p0, total, trans, accumulate) in SHAPES {
            let case = make_case(&mut rng, GemmShape::dense(m, n, k, false, false, accumulate));
            let (stored, ld) = stored_b(&mut rng, &case.b, (k, n, p0, total, trans));
            let len = bf16_pair_panel_len(total);
            let mut panels = vec![bf16::NAN; n.div_ceil(BF16_PAIR_PANEL) * len];
            pack_bf16_pairs(total, n, trans, ld, &stored, &mut panels).expect("valid packing");
            let s = GemmShape { b_pairs: true, ldb: len, ..case.s };
            let b = &panels[p0 / 32 * 1024..];
            let what = format!("{path} {s:?} from k row {p0} of {total}");
            let mut got = case.c0.clone();
            gemm_bf16(path, &s, &case.a, b, &mut got).expect("valid operands");
            check(&case, &got, &what);
            let mut got = case.c0.clone();
            gemm_bf16_parallel(path, &s, &case.a, b, &mut got, 3).expect("valid operands");
            check(&case, &got, &format!("{what}, in three tasks"));
        }
        println!("ran: {path} on B in pair panels");
    }
}

#[test]
fn the_c_entry_takes_pair_panels() {
    let mut rng = StdRng::seed_from_u64(32);
    let case = make_case(&mut rng, GemmShape::dense(20, 40, 70, false, false, false));
    let mut panels = vec![bf16::NAN; 2 * bf16_pair_panel_len(70)];
    pack_bf16_pairs(70, 40, false, 40, &case.b, &mut panels).expect("valid packing");
    let s = GemmShape { b_pairs: true, ldb: bf16_pair_panel_len(70), ..case.s };
    let desc = GemmDesc::from(&s);
    assert_ne!(desc.flags & GEMM_B_PAIRS, 0);
    assert_eq!(desc.shape(), Some(s));
    let mut got = case.c0.clone();
    // SAFETY: the descriptor's extents lie inside the slices.
    let rc = unsafe { uopc_tile_gemm_bf16_desc(&desc, case.a.as_ptr(), panels.as_ptr(), got.as_mut_ptr()) };
    assert_eq!(rc, 0);
    check(&case, &got, "the C entry");
}

#[test]
fn bad_pair_panels_are_refused_without_touching_memory() {
    let s = GemmShape {
        b_pairs: true,
        ldb: bf16_pair_panel_len(40),
        ..GemmShape::dense(2, 40, 40, false, false, false)
    };
    let (a, mut c) = (vec![bf16::ONE; 80], vec![7.0f32; 80]);
    // Two panels: the second starts one panel on, and holds a whole panel.
    let needed = 2 * bf16_pair_panel_len(40);
    let short = gemm_bf16(Bf16Path::Portable, &s, &a, &vec![bf16::ZERO; needed - 1], &mut c);
    assert_eq!(short, Err(TileError::BufferTooSmall { operand: "b", needed, len: needed - 1 }));
    let transposed = gemm_bf16(Bf16Path::Portable, &GemmShape { b_trans: true, ..s }, &a, &[], &mut c);
    assert!(matches!(transposed, Err(TileError::InvalidLayout { operand: "b", .. })), "{transposed:?}");
    let wide = gemm_bf16(Bf16Path::Portable, &GemmShape { b_panel_width: 32, ..s }, &a, &[], &mut c);
    assert!(matches!(wide, Err(TileError::InvalidLayout { operand: "b", .. })), "{wide:?}");
    // The f32 GEMM reads no pair panels.
    let f32s = vec![1.0f32; 1 << 16];
    let mut c32 = vec![7.0f32; 80];
    let f32_gemm = gemm(Isa::Portable, &s, &f32s, &f32s, &mut c32);
    assert!(matches!(f32_gemm, Err(TileError::InvalidLayout { operand: "b", .. })), "{f32_gemm:?}");
    assert!(c.iter().chain(&c32).all(|&x| x == 7.0), "a refused call wrote C");
    // A packing into too few elements, or from too few, writes nothing.
    let mut dst = vec![bf16::NAN; needed - 1];
    let packed = pack_bf16_pairs(40, 40, false, 40, &[bf16::ONE; 1600], &mut dst);
    assert_eq!(packed, Err(TileError::BufferTooSmall { operand: "dst", needed, len: needed - 1 }));
    let from_short = pack_bf16_pairs(40, 40, true, 41, &[bf16::ONE; 1600], &mut dst);
    assert!(matches!(from_short, Err(TileError::BufferTooSmall { operand: "src", .. })), "{from_short:?}");
    assert!(dst.iter().all(|x| x.is_nan()), "a refused packing wrote");
}

//! Batched multi-head attention with causal and padding masks, and flash-decoding, against
//! f64 references.

use uopc_jit::Program;
use uopc_kernels::decode::{FlashDecode, decode_chunks, flash_decode_merge_ir, flash_decode_partial_ir};
use uopc_kernels::masked::{AttentionShape, Causal, MaskSpec, MaskedAttention, PadData, Padding};
use uopc_kernels::reference::masked_attention_reference;
use uopc_testgen::rng::uniform_values as pseudo_random;

/// Masked attention in f64: query `i` of item `b` attends key `j` iff `keep(b, i, j)` (and
/// `j <= i + n_k - n_q` when `causal`); a row with no key attended is zeros.
fn reference(
    s: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    causal: bool,
    keep: impl Fn(usize, usize, usize) -> bool,
) -> Vec<f64> {
    let AttentionShape { batch, heads, n_q, n_k, d } = *s;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0f64; s.q_len()];
    for b in 0..batch {
        for h in 0..heads {
            let bh = b * heads + h;
            for i in 0..n_q {
                let keys: Vec<usize> = (0..n_k)
                    .filter(|&j| keep(b, i, j) && (!causal || (j as i64) <= i as i64 + s.causal_offset()))
                    .collect();
                if keys.is_empty() {
                    continue;
                }
                let qi = &q[(bh * n_q + i) * d..][..d];
                let sc: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let kj = &k[(bh * n_k + j) * d..][..d];
                        qi.iter().zip(kj).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                let l: f64 = p.iter().sum();
                for (pj, &j) in p.iter().zip(&keys) {
                    for e in 0..d {
                        out[(bh * n_q + i) * d + e] += pj / l * v[(bh * n_k + j) * d + e] as f64;
                    }
                }
            }
        }
    }
    out
}

use uopc_kernels::reference::max_abs_err;

// Outputs are convex combinations of V rows (|v| < 1), accumulated in f32 with exp2's ~1e-7
// relative error: far below 1e-5 at these sizes.
const TOL: f64 = 1e-5;

fn inputs(s: &AttentionShape, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    (pseudo_random(s.q_len(), seed), pseudo_random(s.kv_len(), seed + 1), pseudo_random(s.kv_len(), seed + 2))
}

fn run(s: AttentionShape, spec: MaskSpec, q: &[f32], k: &[f32], v: &[f32], pad: PadData<'_>) -> Vec<f32> {
    let kernel = MaskedAttention::compile(s, spec).expect("compiles");
    assert!(kernel.program.is_parallel(), "{s:?} {spec:?}: THREAD iterations write disjoint rows");
    // NaN-filled output: every element must be written
    let mut out = vec![f32::NAN; s.q_len()];
    kernel.run(q, k, v, pad, &mut out).expect("runs");
    assert!(out.iter().all(|x| x.is_finite()), "{s:?} {spec:?}: non-finite output");
    out
}

fn shape(batch: usize, heads: usize, n_q: usize, n_k: usize, d: usize) -> AttentionShape {
    AttentionShape { batch, heads, n_q, n_k, d }
}

const SHAPES: [(usize, usize, usize, usize, usize); 8] = [
    (1, 1, 1, 1, 1),
    (1, 1, 17, 17, 64),
    (2, 3, 7, 11, 5),   // n_q < n_k, odd sizes
    (2, 2, 16, 9, 8),   // n_q > n_k: under a causal mask the first 7 rows see no key
    (3, 1, 1, 33, 16),  // one query (decoding-like)
    (1, 2, 24, 24, 32), // several query blocks
    (2, 1, 12, 40, 3),
    (1, 1, 64, 64, 64),
];

#[test]
fn batched_multi_head_matches_f64() {
    for (n, &(b, h, nq, nk, d)) in SHAPES.iter().enumerate() {
        let s = shape(b, h, nq, nk, d);
        let (q, k, v) = inputs(&s, 10 + n as u64);
        let want = reference(&s, &q, &k, &v, false, |_, _, _| true);
        for qb in [1, 4] {
            let spec = MaskSpec { query_block: qb, ..MaskSpec::default() };
            let err = max_abs_err(&run(s, spec, &q, &k, &v, PadData::None), &want);
            assert!(err <= TOL, "{s:?} qb={qb}: {err:e}");
        }
    }
}

#[test]
fn causal_where_and_ragged_match_f64() {
    for (n, &(b, h, nq, nk, d)) in SHAPES.iter().enumerate() {
        let s = shape(b, h, nq, nk, d);
        let (q, k, v) = inputs(&s, 30 + n as u64);
        let want = reference(&s, &q, &k, &v, true, |_, _, _| true);
        for causal in [Causal::Where, Causal::Ragged] {
            for qb in [1, 3, 4] {
                let spec = MaskSpec { causal, query_block: qb, ..MaskSpec::default() };
                let got = run(s, spec, &q, &k, &v, PadData::None);
                let err = max_abs_err(&got, &want);
                assert!(err <= TOL, "{s:?} {causal:?} qb={qb}: {err:e}");
            }
        }
    }
}

#[test]
fn causal_rows_without_keys_are_zero() {
    // n_q > n_k: query i sees keys j <= i - 7, so rows 0..7 see nothing.
    let s = shape(2, 2, 16, 9, 8);
    let (q, k, v) = inputs(&s, 5);
    for causal in [Causal::Where, Causal::Ragged] {
        let out = run(s, MaskSpec { causal, ..MaskSpec::default() }, &q, &k, &v, PadData::None);
        for bh in 0..4 {
            for i in 0..16 {
                let row = &out[(bh * 16 + i) * 8..][..8];
                assert_eq!(row.iter().all(|x| *x == 0.0), i < 7, "{causal:?} bh={bh} row {i}: {row:?}");
            }
        }
    }
}

#[test]
fn key_lengths_mask_keys_and_empty_items_give_zeros() {
    let s = shape(4, 2, 6, 13, 8);
    let (q, k, v) = inputs(&s, 50);
    let lens = [13i32, 5, 0, 1];
    for causal in [Causal::None, Causal::Where, Causal::Ragged] {
        let want = reference(&s, &q, &k, &v, causal != Causal::None, |b, _, j| (j as i32) < lens[b]);
        for qb in [1, 2] {
            let spec = MaskSpec { causal, padding: Padding::KeyLengths, query_block: qb };
            let out = run(s, spec, &q, &k, &v, PadData::KeyLengths(&lens));
            let err = max_abs_err(&out, &want);
            assert!(err <= TOL, "{causal:?} qb={qb}: {err:e}");
            // item 2 has no keys: all of its rows (both heads) are exactly zero
            let item2 = &out[2 * 2 * 6 * 8..3 * 2 * 6 * 8];
            assert!(item2.iter().all(|x| *x == 0.0), "{causal:?}: empty item not zero");
        }
    }
}

#[test]
fn boolean_mask_with_fully_masked_rows() {
    let s = shape(2, 3, 5, 11, 16);
    let (q, k, v) = inputs(&s, 70);
    // a sparse pseudo-random mask; rows (0, 1) and (1, 4) masked entirely
    let bits = pseudo_random(s.mask_len(), 71);
    let mask: Vec<bool> = (0..s.mask_len())
        .map(|x| {
            let (b, i) = (x / (5 * 11), (x / 11) % 5);
            !((b, i) == (0, 1) || (b, i) == (1, 4)) && bits[x] > -0.3
        })
        .collect();
    let keep = |b: usize, i: usize, j: usize| mask[(b * 5 + i) * 11 + j];
    for causal in [Causal::None, Causal::Where, Causal::Ragged] {
        let want = reference(&s, &q, &k, &v, causal != Causal::None, keep);
        let spec = MaskSpec { causal, padding: Padding::Mask, query_block: 5 };
        let out = run(s, spec, &q, &k, &v, PadData::Mask(&mask));
        let err = max_abs_err(&out, &want);
        assert!(err <= TOL, "{causal:?}: {err:e}");
        for h in 0..3 {
            let r01 = &out[((h) * 5 + 1) * 16..][..16];
            let r14 = &out[((3 + h) * 5 + 4) * 16..][..16];
            assert!(r01.iter().chain(r14).all(|x| *x == 0.0), "{causal:?}: masked rows not zero");
        }
    }
}

#[test]
fn library_reference_agrees_with_the_test_reference() {
    let s = shape(2, 2, 6, 9, 4);
    let (q, k, v) = inputs(&s, 80);
    let lens = [4i32, 0];
    let mask: Vec<bool> = (0..s.mask_len()).map(|x| x % 3 != 1).collect();
    let pads = [PadData::None, PadData::KeyLengths(&lens), PadData::Mask(&mask)];
    for (pad, causal) in pads.iter().flat_map(|p| [(*p, false), (*p, true)]) {
        let want = reference(&s, &q, &k, &v, causal, |b, i, j| match pad {
            PadData::None => true,
            PadData::KeyLengths(l) => (j as i32) < l[b],
            PadData::Mask(m) => m[(b * 6 + i) * 9 + j],
        });
        let got = masked_attention_reference(&s, &q, &k, &v, causal, pad);
        assert!(
            got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-12),
            "{:?} causal={causal}",
            pad.kind()
        );
    }
}

#[test]
fn masks_survive_large_scores_and_late_maxima() {
    // Scores up to ~400 (exp overflows without max subtraction) that grow along the keys, so
    // the running max changes at every key; half the keys are padding.
    let s = shape(1, 2, 8, 32, 16);
    let q: Vec<f32> = (0..s.q_len()).map(|x| 1.0 + (x % 3) as f32).collect();
    let k: Vec<f32> = (0..s.kv_len()).map(|x| ((x / 16) % 32) as f32 * 0.8).collect();
    let v = pseudo_random(s.kv_len(), 90);
    let lens = [16i32];
    for causal in [Causal::None, Causal::Ragged] {
        let want = reference(&s, &q, &k, &v, causal != Causal::None, |_, _, j| j < 16);
        let spec = MaskSpec { causal, padding: Padding::KeyLengths, query_block: 4 };
        let err = max_abs_err(&run(s, spec, &q, &k, &v, PadData::KeyLengths(&lens)), &want);
        assert!(err <= TOL, "{causal:?}: {err:e}");
    }
}

#[test]
fn ragged_causal_does_about_half_the_work() {
    let s = AttentionShape::single(256, 256, 64);
    let flops = |causal| {
        let spec = MaskSpec { causal, ..MaskSpec::default() };
        let k = MaskedAttention::compile(s, spec).expect("compiles");
        assert!(k.program.is_parallel());
        k.program.estimates().flops as f64
    };
    let (full, masked, ragged) = (flops(Causal::None), flops(Causal::Where), flops(Causal::Ragged));
    assert!(masked >= full, "the WHERE mask visits every key: {masked} vs {full}");
    let ratio = ragged / full;
    // (n + qb) / 2n keys on average, plus the block-diagonal WHERE masks
    assert!((0.45..0.6).contains(&ratio), "ragged/full FLOPs = {ratio:.3} ({ragged} / {full})");
}

#[test]
fn unsupported_arguments_are_errors() {
    let s = AttentionShape::single(4, 4, 4);
    let kernel =
        MaskedAttention::compile(s, MaskSpec { padding: Padding::KeyLengths, ..MaskSpec::default() })
            .expect("compiles");
    let x = vec![0.0f32; 16];
    let mut out = vec![0.0f32; 16];
    assert!(kernel.run(&x, &x, &x, PadData::None, &mut out).is_err());
    assert!(kernel.run(&x, &x, &x, PadData::KeyLengths(&[1, 2]), &mut out).is_err());
    assert!(FlashDecode::compile(s, 4, Padding::None).is_err(), "flash-decoding needs one query");
    assert!(FlashDecode::compile(shape(1, 1, 1, 0, 4), 4, Padding::None).is_err(), "no keys");
    assert!(MaskedAttention::compile(shape(1, 0, 4, 4, 4), MaskSpec::default()).is_err(), "no heads");
}

fn decode_reference(s: &AttentionShape, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f64> {
    reference(s, q, k, v, false, |_, _, _| true)
}

#[test]
fn decode_chunks_cover_the_keys() {
    for (n_k, want) in [(1, 8), (3, 8), (1001, 7), (65536, 64), (10, 3), (10, 4)] {
        let (size, chunks) = decode_chunks(n_k, want);
        assert!(chunks <= want && size * chunks >= n_k && size * (chunks - 1) < n_k, "{n_k} {want}");
    }
}

#[test]
fn flash_decoding_matches_f64() {
    for (b, h, n_k, d, chunks) in
        [(1, 1, 1, 4, 8), (1, 1, 3, 4, 8), (2, 3, 1001, 16, 7), (1, 2, 4096, 64, 16), (3, 1, 777, 5, 1)]
    {
        let s = shape(b, h, 1, n_k, d);
        let (q, k, v) = inputs(&s, n_k as u64);
        let dec = FlashDecode::compile(s, chunks, Padding::None).expect("compiles");
        assert!(dec.partial.is_parallel() && dec.merge.is_parallel(), "{s:?}");
        assert!(dec.chunks <= chunks);
        let mut out = vec![f32::NAN; b * h * d];
        dec.run(&q, &k, &v, PadData::None, &mut out).expect("runs");
        let err = max_abs_err(&out, &decode_reference(&s, &q, &k, &v));
        assert!(err <= TOL, "{s:?} chunks={chunks}: {err:e}");
        assert_eq!(dec.kv_bytes(), 2 * b * h * n_k * d * 4);
    }
}

#[test]
fn flash_decoding_of_a_padded_cache() {
    // item 1 has 17 valid keys (all in the first of 8 chunks), item 2 none at all
    let s = shape(3, 2, 1, 300, 8);
    let (q, k, v) = inputs(&s, 77);
    let lens = [300i32, 17, 0];
    let mask: Vec<bool> = (0..3 * 300).map(|x| (x % 300) < lens[x / 300] as usize).collect();
    let want = reference(&s, &q, &k, &v, false, |b, _, j| (j as i32) < lens[b]);
    for pad in [PadData::KeyLengths(&lens), PadData::Mask(&mask)] {
        let dec = FlashDecode::compile(s, 8, pad.kind()).expect("compiles");
        assert!(dec.partial.is_parallel());
        let mut out = vec![f32::NAN; 3 * 2 * 8];
        dec.run(&q, &k, &v, pad, &mut out).expect("runs");
        let err = max_abs_err(&out, &want);
        assert!(err <= TOL, "{:?}: {err:e}", pad.kind());
        assert!(out[4 * 8..].iter().all(|x| *x == 0.0), "{:?}: empty cache gives zeros", pad.kind());
        assert!(dec.run(&q, &k, &v, PadData::None, &mut out).is_err(), "padding data is required");
    }
}

/// Runs kernel 1 with one chunk over keys `lo..hi` of a single head.
fn partial_state(q: &[f32], k: &[f32], v: &[f32], lo: usize, hi: usize, d: usize) -> (f32, f32, Vec<f32>) {
    let s = shape(1, 1, 1, hi - lo, d);
    let prg = Program::compile(&flash_decode_partial_ir(&s, 1, Padding::None), "partial").expect("compiles");
    let (mut m, mut l, mut o) = (vec![0.0f32], vec![0.0f32], vec![0.0f32; d]);
    prg.run_f32(&[q, &k[lo * d..hi * d], &v[lo * d..hi * d]], &mut [&mut m, &mut l, &mut o]).expect("runs");
    (m[0], l[0], o)
}

#[test]
fn merge_rule_at_split_points_1_middle_and_n_minus_1() {
    let (n, d) = (101, 8);
    // scores that grow along the keys: the second part always holds the larger max
    let q = vec![0.5f32; d];
    let k: Vec<f32> = (0..n * d).map(|x| (x / d) as f32 * 0.1).collect();
    let v = pseudo_random(n * d, 3);
    let s = shape(1, 1, 1, n, d);
    let want = decode_reference(&s, &q, &k, &v);
    let merge = Program::compile(&flash_decode_merge_ir(1, 2, d), "merge").expect("compiles");
    for split in [1, n / 2, n - 1] {
        let (m1, l1, o1) = partial_state(&q, &k, &v, 0, split, d);
        let (m2, l2, o2) = partial_state(&q, &k, &v, split, n, d);
        assert!(m2 > m1, "split {split}: later keys score higher");
        for order in [false, true] {
            // the rule is symmetric: merging (2, 1) equals merging (1, 2)
            let (ms, ls, os) = if order {
                (vec![m2, m1], vec![l2, l1], [o2.clone(), o1.clone()].concat())
            } else {
                (vec![m1, m2], vec![l1, l2], [o1.clone(), o2.clone()].concat())
            };
            let mut out = vec![f32::NAN; d];
            merge.run_f32(&[&ms, &ls, &os], &mut [&mut out]).expect("runs");
            let err = max_abs_err(&out, &want);
            assert!(err <= TOL, "split {split} swapped={order}: {err:e}");
        }
    }
}

#[test]
fn merge_of_empty_partials_is_zero_not_nan() {
    // Partials that saw no (unmasked) key: m at the floor, l = 0, o = 0.
    let d = 4;
    let merge = Program::compile(&flash_decode_merge_ir(2, 3, d), "merge").expect("compiles");
    let floor = uopc_kernels::masked::M_FLOOR;
    let m = vec![floor; 6];
    let l = vec![0.0f32; 6];
    let mut o = vec![0.0f32; 6 * d];
    // head 1, chunk 2 has one key of weight 1 with value row [1, 2, 3, 4]
    let (mut m1, mut l1) = (m.clone(), l.clone());
    m1[5] = 0.25;
    l1[5] = 1.0;
    o[5 * d..].copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
    let mut out = vec![f32::NAN; 2 * d];
    merge.run_f32(&[&m1, &l1, &o], &mut [&mut out]).expect("runs");
    assert_eq!(out, vec![0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
}

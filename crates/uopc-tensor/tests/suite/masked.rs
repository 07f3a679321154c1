//! `attention_masked` (batched heads, causal and padding masks) unfused and fused, against an
//! f64 reference.

use uopc_tensor::masked::{attention_masked, causal_mask, try_attention_masked};
use uopc_tensor::{RealizeOptions, Tensor};
use uopc_testgen::rng::uniform_values as pseudo_random;

/// `(bh, n_q, d)` attention in f64 where query `i` of head `h` sees key `j` iff `keep(h, i, j)`;
/// rows with no key are zeros.
#[allow(clippy::too_many_arguments)]
fn reference(
    bh: usize,
    n_q: usize,
    n_k: usize,
    d: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    keep: impl Fn(usize, usize, usize) -> bool,
) -> Vec<f64> {
    let mut out = vec![0.0; bh * n_q * d];
    for h in 0..bh {
        for i in 0..n_q {
            let keys: Vec<usize> = (0..n_k).filter(|&j| keep(h, i, j)).collect();
            let s: Vec<f64> = keys
                .iter()
                .map(|&j| {
                    (0..d)
                        .map(|e| q[(h * n_q + i) * d + e] as f64 * k[(h * n_k + j) * d + e] as f64)
                        .sum::<f64>()
                        / (d as f64).sqrt()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = p.iter().sum();
            for (pj, &j) in p.iter().zip(&keys) {
                for e in 0..d {
                    out[(h * n_q + i) * d + e] += pj / l * v[(h * n_k + j) * d + e] as f64;
                }
            }
        }
    }
    out
}

fn both_forms(t: &Tensor) -> [Vec<f32>; 2] {
    let unfused = t.to_ndarray::<f32>().expect("unfused realizes").iter().copied().collect();
    let fused =
        t.to_ndarray_with::<f32>(&RealizeOptions::fused()).expect("fused realizes").iter().copied().collect();
    [unfused, fused]
}

fn check(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len());
    assert!(got.iter().all(|x| x.is_finite()), "{what}: NaN or inf");
    let err = got.iter().zip(want).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
    assert!(err <= 1e-5, "{what}: max abs err {err:e}");
}

#[test]
fn causal_batched_heads_with_nq_ne_nk() {
    let (b, h, n_q, n_k, d) = (2, 3, 5, 7, 4);
    let q = pseudo_random(b * h * n_q * d, 1);
    let k = pseudo_random(b * h * n_k * d, 2);
    let v = pseudo_random(b * h * n_k * d, 3);
    let t = |x: &[f32], n| Tensor::from_vec(x.to_vec(), &[b, h, n, d]);
    let o = attention_masked(&t(&q, n_q), &t(&k, n_k), &t(&v, n_k), None, true);
    assert_eq!(o.shape(), &[b, h, n_q, d]);
    let want = reference(b * h, n_q, n_k, d, &q, &k, &v, |_, i, j| j <= i + 2);
    for (form, got) in ["unfused", "fused"].iter().zip(both_forms(&o)) {
        check(&got, &want, form);
    }
    // no mask at all is plain attention
    let plain = attention_masked(&t(&q, n_q), &t(&k, n_k), &t(&v, n_k), None, false);
    check(&both_forms(&plain)[0], &reference(b * h, n_q, n_k, d, &q, &k, &v, |_, _, _| true), "plain");
}

#[test]
fn padding_mask_with_fully_masked_rows_gives_zeros_in_every_form() {
    let (b, h, n_q, n_k, d) = (2, 2, 4, 6, 3);
    let q = pseudo_random(b * h * n_q * d, 4);
    let k = pseudo_random(b * h * n_k * d, 5);
    let v = pseudo_random(b * h * n_k * d, 6);
    // (b, 1, n_q, n_k) mask shared by heads: item 0 keeps keys < 4; item 1 row 2 has no key
    let keep =
        |bb: usize, i: usize, j: usize| if bb == 0 { j < 4 } else { i != 2 && !(j + i).is_multiple_of(3) };
    let mask: Vec<f32> =
        (0..b * n_q * n_k).map(|x| keep(x / (n_q * n_k), (x / n_k) % n_q, x % n_k) as i32 as f32).collect();
    let mask_t = Tensor::from_vec(mask, &[b, 1, n_q, n_k]);
    let t = |x: &[f32], n| Tensor::from_vec(x.to_vec(), &[b, h, n, d]);
    for causal in [false, true] {
        let o = attention_masked(&t(&q, n_q), &t(&k, n_k), &t(&v, n_k), Some(&mask_t), causal);
        let want = reference(b * h, n_q, n_k, d, &q, &k, &v, |hh, i, j| {
            keep(hh / h, i, j) && (!causal || j <= i + n_k - n_q)
        });
        for (form, got) in ["unfused", "fused"].iter().zip(both_forms(&o)) {
            check(&got, &want, &format!("{form} causal={causal}"));
            for hh in 0..h {
                let row = &got[((h + hh) * n_q + 2) * d..][..d];
                assert!(row.iter().all(|x| *x == 0.0), "{form}: fully masked row is {row:?}");
            }
        }
    }
}

#[test]
fn causal_mask_aligns_queries_to_the_end_of_the_keys() {
    let m = causal_mask(2, 4).to_ndarray::<f32>().unwrap();
    assert_eq!(m.iter().copied().collect::<Vec<_>>(), vec![1., 1., 1., 0., 1., 1., 1., 1.]);
    let m = causal_mask(3, 2).to_ndarray::<f32>().unwrap();
    assert_eq!(m.iter().copied().collect::<Vec<_>>(), vec![0., 0., 1., 0., 1., 1.]);
}

#[test]
fn mismatched_shapes_are_errors() {
    let a = Tensor::from_vec(vec![0.0f32; 8], &[2, 4]);
    let b = Tensor::from_vec(vec![0.0f32; 6], &[2, 3]);
    assert!(try_attention_masked(&a, &b, &b, None, false).is_err());
    let mask = Tensor::from_vec(vec![1.0f32; 3], &[3]);
    assert!(try_attention_masked(&a, &a, &a, Some(&mask), false).is_err());
}

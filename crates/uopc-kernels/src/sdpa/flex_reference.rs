//! The f64 attention that kernels compiled with [`AttentionMods`](super::AttentionMods) are
//! checked against, with the score and mask functions given again as plain Rust closures (an
//! independent statement of the same functions, not the IR the kernel runs).

use super::{Extras, SdpaConfig};

/// A score function in f64: the modified score of `(b, h, q, kv)` from the scaled score.
pub type ScoreRef<'a> = &'a dyn Fn(f64, [usize; 4]) -> f64;

/// A mask function: whether query `q` of `(b, h)` sees key `kv`.
pub type MaskRef<'a> = &'a dyn Fn([usize; 4]) -> bool;

/// The functions of a flex attention for [`reference_flex_f64`].
#[derive(Clone, Copy, Default)]
pub struct FlexReference<'a> {
    /// The score function, or none.
    pub score: Option<ScoreRef<'a>>,
    /// The mask function, or none.
    pub mask: Option<MaskRef<'a>>,
    /// Per-head sink logits, or none.
    pub sinks: Option<&'a [f32]>,
}

/// Attention in f64 with score and mask functions and sinks: per query row, `s = score(scale *
/// q · k)` over the keys the row sees (the configuration's causal limit, key lengths and KV
/// length, and `mask`), then `softmax` over those scores and the row's sink logit (which has
/// no value), the weighted sum of values. A row that sees no key and has no sink is zeros.
/// `extras` gives the key lengths and KV length (its captures are not read).
pub fn reference_flex_f64(
    c: &SdpaConfig,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    extras: Extras<'_>,
    f: FlexReference<'_>,
) -> Vec<f64> {
    let [qsb, qsh, qsn] = c.layout.strides(c.heads, c.n_q, c.d);
    let mut out = vec![0.0f64; c.q_len()];
    for b in 0..c.batch {
        for h in 0..c.heads {
            for i in 0..c.n_q {
                let row = reference_flex_row(c, (q, k, v), extras, f, [b, h, i]);
                out[b * qsb + h * qsh + i * qsn..][..c.d].copy_from_slice(&row);
            }
        }
    }
    out
}

/// One output row of [`reference_flex_f64`]: query `i` of head `h` of item `b` (for checking
/// a sample of rows of a large attention).
pub fn reference_flex_row(
    c: &SdpaConfig,
    (q, k, v): (&[f32], &[f32], &[f32]),
    extras: Extras<'_>,
    f: FlexReference<'_>,
    [b, h, i]: [usize; 3],
) -> Vec<f64> {
    let group = c.heads / c.kv_heads;
    let scale = f64::from(c.effective_scale());
    let [qsb, qsh, qsn] = c.layout.strides(c.heads, c.n_q, c.d);
    let [ksb, ksh, ksn] = c.layout.strides(c.kv_heads, c.n_k, c.d);
    let kv_len = extras.kv_length.unwrap_or(c.n_k);
    let offset = kv_len as i64 - c.n_q as i64;
    let len = extras.key_lengths.map_or(c.n_k, |l| l[b].max(0) as usize).min(kv_len);
    let kv_at = b * ksb + (h / group) * ksh;
    let q_at = b * qsb + h * qsh + i * qsn;
    let mut scores = Vec::with_capacity(len);
    for j in 0..len {
        let seen = !(c.causal && j as i64 > i as i64 + offset) && f.mask.is_none_or(|m| m([b, h, i, j]));
        if !seen {
            continue;
        }
        let dot: f64 = q[q_at..][..c.d]
            .iter()
            .zip(&k[kv_at + j * ksn..][..c.d])
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum();
        let s = f.score.map_or(dot * scale, |g| g(dot * scale, [b, h, i, j]));
        scores.push((j, s));
    }
    let sink = f.sinks.map(|z| f64::from(z[h]));
    let m = scores.iter().map(|s| s.1).chain(sink).fold(f64::NEG_INFINITY, f64::max);
    let mut o = vec![0.0f64; c.d];
    if m == f64::NEG_INFINITY {
        return o;
    }
    let mut l = sink.map_or(0.0, |z| (z - m).exp());
    for &(j, s) in &scores {
        let p = (s - m).exp();
        l += p;
        for (o, &x) in o.iter_mut().zip(&v[kv_at + j * ksn..][..c.d]) {
            *o += p * f64::from(x);
        }
    }
    o.iter_mut().for_each(|o| *o /= l);
    o
}

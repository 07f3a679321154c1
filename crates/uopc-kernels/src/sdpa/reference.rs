//! The f64 attention the kernel of [`super`] is checked against.

use super::{Extras, MaskKind, SdpaConfig};

/// Attention in f64 for `config` (same masks, layout and conventions as [`Sdpa::run`](super::Sdpa::run)), the
/// reference the kernel is checked against: per query row, the scores of the keys it sees
/// (a `-inf` score counts as unseen), max-subtracted exponentials, the weighted sum of values.
/// `extras` must match the configuration (unchecked beyond slice indexing).
pub fn reference_f64(config: &SdpaConfig, q: &[f32], k: &[f32], v: &[f32], extras: Extras<'_>) -> Vec<f64> {
    let c = config;
    let mut out = vec![0.0f64; c.q_len()];
    for_each_row(c, q, k, extras, |row, scores| {
        let m = scores.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
        let o = &mut out[row.q..][..c.d];
        let mut l = 0.0;
        for &(j, s) in scores {
            let p = (s - m).exp();
            l += p;
            let vj = &v[row.kv + j * row.key_stride..][..c.d];
            for (o, &x) in o.iter_mut().zip(vj) {
                *o += p * f64::from(x);
            }
        }
        if l != 0.0 {
            o.iter_mut().for_each(|o| *o /= l);
        }
    });
    out
}

/// Where one query row of the f64 references lives: its offset in q (and the output), the
/// offset of its key/value head in k and v, the element stride between keys, and the offset
/// and key stride of its row in the mask or bias (0 on broadcast axes).
pub(super) struct RowAt {
    pub q: usize,
    pub kv: usize,
    pub key_stride: usize,
    pub mask: usize,
    pub mask_key_stride: usize,
}

/// Calls `row` for every query row with the keys it sees and their scores in f64
/// (`scale * q · k` plus the bias): causal (aligned to the end of the keys, or to the runtime
/// KV length), key lengths and the bool mask hide keys, and a `-inf` score counts as unseen.
pub(super) fn for_each_row(
    c: &SdpaConfig,
    q: &[f32],
    k: &[f32],
    extras: Extras<'_>,
    mut row: impl FnMut(RowAt, &[(usize, f64)]),
) {
    let group = c.heads / c.kv_heads;
    let scale = f64::from(c.effective_scale());
    let [qsb, qsh, qsn] = c.layout.strides(c.heads, c.n_q, c.d);
    let [ksb, ksh, ksn] = c.layout.strides(c.kv_heads, c.n_k, c.d);
    let mstr = match c.mask {
        MaskKind::Bool(s) | MaskKind::Bias(s) => SdpaConfig::mask_strides(s),
        MaskKind::None => [0; 4],
    };
    let mut scores: Vec<(usize, f64)> = Vec::with_capacity(c.n_k);
    let kv = extras.kv_length.unwrap_or(c.n_k);
    let offset = kv as i64 - c.n_q as i64;
    for b in 0..c.batch {
        let len = extras.key_lengths.map_or(c.n_k, |l| l[b].max(0) as usize).min(kv);
        for h in 0..c.heads {
            let kv_at = b * ksb + (h / group) * ksh;
            for i in 0..c.n_q {
                let q_at = b * qsb + h * qsh + i * qsn;
                let qi = &q[q_at..][..c.d];
                scores.clear();
                for j in 0..c.n_k {
                    if (c.causal && j as i64 > i as i64 + offset) || j >= len {
                        continue;
                    }
                    let at = b * mstr[0] + h * mstr[1] + i * mstr[2] + j * mstr[3];
                    if extras.mask.is_some_and(|m| !m[at]) {
                        continue;
                    }
                    let kj = &k[kv_at + j * ksn..][..c.d];
                    let dot: f64 = qi.iter().zip(kj).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
                    let s = dot * scale + extras.bias.map_or(0.0, |bias| f64::from(bias[at]));
                    if s != f64::NEG_INFINITY {
                        scores.push((j, s));
                    }
                }
                let mask = b * mstr[0] + h * mstr[1] + i * mstr[2];
                row(RowAt { q: q_at, kv: kv_at, key_stride: ksn, mask, mask_key_stride: mstr[3] }, &scores);
            }
        }
    }
}

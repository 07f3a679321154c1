//! The f64 attention backward the kernel of [`super::SdpaBackward`] is checked against.

use super::{Extras, MaskKind, SdpaConfig};

/// The exact gradients `[dq, dk, dv]` of `sum(d_o * attention(q, k, v))` in f64 for `config`
/// (same masks, layout and conventions as [`Sdpa::run`](super::Sdpa::run)): per query row,
/// the softmax over the keys it sees, `dP = dO · v`, `dS = P (dP - sum_j P dP)`, then
/// `dv += P dO`, `dk += scale dS q`, `dq += scale dS k`. Rows that see no key contribute
/// nothing. `extras` must match the configuration (unchecked beyond slice indexing).
pub fn reference_backward_f64(
    config: &SdpaConfig,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d_o: &[f32],
    extras: Extras<'_>,
) -> [Vec<f64>; 3] {
    let c = config;
    let group = c.heads / c.kv_heads;
    let scale = f64::from(c.effective_scale());
    let [qsb, qsh, qsn] = c.layout.strides(c.heads, c.n_q, c.d);
    let [ksb, ksh, ksn] = c.layout.strides(c.kv_heads, c.n_k, c.d);
    let mstr = match c.mask {
        MaskKind::Bool(s) | MaskKind::Bias(s) => SdpaConfig::mask_strides(s),
        MaskKind::None => [0; 4],
    };
    let f = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
    let (q, k, v, d_o) = (f(q), f(k), f(v), f(d_o));
    let (mut dq, mut dk, mut dv) = (vec![0.0; c.q_len()], vec![0.0; c.kv_len()], vec![0.0; c.kv_len()]);
    let mut seen: Vec<(usize, f64)> = Vec::with_capacity(c.n_k);
    for b in 0..c.batch {
        let len = extras.key_lengths.map_or(c.n_k, |l| l[b].max(0) as usize);
        for h in 0..c.heads {
            let hk = h / group;
            for i in 0..c.n_q {
                let qa = b * qsb + h * qsh + i * qsn;
                seen.clear();
                for j in 0..c.n_k {
                    if (c.causal && j as i64 > i as i64 + c.causal_offset()) || j >= len {
                        continue;
                    }
                    let at = b * mstr[0] + h * mstr[1] + i * mstr[2] + j * mstr[3];
                    if extras.mask.is_some_and(|m| !m[at]) {
                        continue;
                    }
                    let ka = b * ksb + hk * ksh + j * ksn;
                    let dot: f64 = (0..c.d).map(|e| q[qa + e] * k[ka + e]).sum();
                    let s = dot * scale + extras.bias.map_or(0.0, |bias| f64::from(bias[at]));
                    if s != f64::NEG_INFINITY {
                        seen.push((j, s));
                    }
                }
                if seen.is_empty() {
                    continue;
                }
                let m = seen.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = seen.iter().map(|s| (s.1 - m).exp()).sum();
                let probs: Vec<(usize, f64, f64)> = seen
                    .iter()
                    .map(|&(j, s)| {
                        let ka = b * ksb + hk * ksh + j * ksn;
                        let dp: f64 = (0..c.d).map(|e| d_o[qa + e] * v[ka + e]).sum();
                        (ka, (s - m).exp() / l, dp)
                    })
                    .collect();
                let delta: f64 = probs.iter().map(|&(_, p, dp)| p * dp).sum();
                for &(ka, p, dp) in &probs {
                    let ds = scale * p * (dp - delta);
                    for e in 0..c.d {
                        dv[ka + e] += p * d_o[qa + e];
                        dk[ka + e] += ds * q[qa + e];
                        dq[qa + e] += ds * k[ka + e];
                    }
                }
            }
        }
    }
    [dq, dk, dv]
}

//! The f64 attention backward the kernel of [`super::SdpaBackward`] is checked against.

use super::reference::for_each_row;
use super::{Extras, MaskKind, SdpaConfig};

/// The exact gradients `[dq, dk, dv, dbias]` of `sum(d_o * attention(q, k, v))` in f64 for
/// `config` (same masks, layout and conventions as [`Sdpa::run`](super::Sdpa::run)): per
/// query row, the softmax over the keys it sees, `dP = dO · v`, `dS = P (dP - sum_j P dP)`
/// (the gradient at the scores), then `dv += P dO`, `dk += scale dS q`, `dq += scale dS k`,
/// and `dbias += dS` at the bias element each score read, which sums `dS` over the bias's
/// broadcast axes. `dbias` has the bias's shape, and is empty unless the mask is a
/// [`MaskKind::Bias`]. Rows that see no key, and keys a row does not see, contribute nothing.
/// `extras` must match the configuration (unchecked beyond slice indexing).
pub fn reference_backward_f64(
    config: &SdpaConfig,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d_o: &[f32],
    extras: Extras<'_>,
) -> [Vec<f64>; 4] {
    let c = config;
    let scale = f64::from(c.effective_scale());
    let f = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
    let (qf, kf, v, d_o) = (f(q), f(k), f(v), f(d_o));
    let (mut dq, mut dk, mut dv) = (vec![0.0; c.q_len()], vec![0.0; c.kv_len()], vec![0.0; c.kv_len()]);
    let bias_len = match c.mask {
        MaskKind::Bias(shape) => shape.iter().product(),
        _ => 0,
    };
    let mut dbias = vec![0.0; bias_len];
    for_each_row(c, q, k, extras, |row, seen| {
        if seen.is_empty() {
            return;
        }
        let qa = row.q;
        let m = seen.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
        let l: f64 = seen.iter().map(|s| (s.1 - m).exp()).sum();
        let probs: Vec<(usize, usize, f64, f64)> = seen
            .iter()
            .map(|&(j, s)| {
                let ka = row.kv + j * row.key_stride;
                let dp: f64 = (0..c.d).map(|e| d_o[qa + e] * v[ka + e]).sum();
                (j, ka, (s - m).exp() / l, dp)
            })
            .collect();
        let delta: f64 = probs.iter().map(|&(_, _, p, dp)| p * dp).sum();
        for &(j, ka, p, dp) in &probs {
            let d_score = p * (dp - delta);
            if bias_len > 0 {
                dbias[row.mask + j * row.mask_key_stride] += d_score;
            }
            let ds = scale * d_score;
            for e in 0..c.d {
                dv[ka + e] += p * d_o[qa + e];
                dk[ka + e] += ds * qf[qa + e];
                dq[qa + e] += ds * kf[ka + e];
            }
        }
    });
    [dq, dk, dv, dbias]
}

//! The host steps of a backward run: `Delta`, the gather of chunked targets into the caller's
//! layout, and the sum of the dbias partials.

use super::{Geometry, SdpaBackward};
use crate::sdpa::{MaskKind, SdpaConfig};

impl SdpaBackward {
    /// Adds the tasks' dbias regions (see [`sdpa_backward_ir_with_bias_grad`]) into `dbias`,
    /// each element to the bias element it stands for.
    pub(super) fn sum_bias_partials(&self, g: &Geometry, partials: &[f32], dbias: &mut [f32]) {
        let c = &self.config;
        let (MaskKind::Bias(shape), Some([heads, rows, keys])) = (c.mask, g.bias_region) else { return };
        let [sb, sh, sq, sk] = SdpaConfig::mask_strides(shape);
        let chunks = self.blocking.chunks;
        dbias.fill(0.0);
        let mut regions = partials.chunks_exact(g.bias_task_len());
        for item in 0..c.batch {
            for kvh in 0..c.kv_heads {
                for ch in 0..chunks {
                    let region = regions.next().expect("one region per task");
                    for hh in 0..heads {
                        for i in 0..rows {
                            let base = item * sb + (kvh * g.group + hh) * sh + i * sq;
                            let from = &region[(hh * rows + i) * keys..][..keys];
                            if keys == 1 {
                                dbias[base] += from[0];
                                continue;
                            }
                            for (slot, &x) in from.iter().enumerate() {
                                if let Some(key) = g.slot_key(&self.blocking, ch, slot) {
                                    dbias[base + key * sk] += x;
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// `scale * Delta`, with `Delta_i = dO_i · O_i` per row, `(batch, head, row)`.
    pub(super) fn delta(&self, o: &[f32], d_o: &[f32]) -> Vec<f32> {
        let c = &self.config;
        let [sb, sh, sn] = c.layout.strides(c.heads, c.n_q, c.d);
        let scale = c.effective_scale();
        let mut delta = Vec::with_capacity(self.lse_len());
        for b in 0..c.batch {
            for h in 0..c.heads {
                for i in 0..c.n_q {
                    let at = b * sb + h * sh + i * sn;
                    delta.push(scale * dot(&o[at..at + c.d], &d_o[at..at + c.d]));
                }
            }
        }
        delta
    }

    /// Sums the dq partials of the chunks into `dq` and scatters the task-major dk and dv
    /// into the caller's layout.
    pub(super) fn gather(
        &self,
        g: &Geometry,
        [dq_t, dk_t, dv_t]: [&[f32]; 3],
        [dq, dk, dv]: [&mut [f32]; 3],
    ) {
        let c = &self.config;
        let d = c.d;
        let chunks = self.blocking.chunks;
        let bc = self.blocking.keys;
        let [qsb, qsh, qsn] = c.layout.strides(c.heads, c.n_q, d);
        let [ksb, ksh, ksn] = c.layout.strides(c.kv_heads, c.n_k, d);
        let per_task_q = g.group * c.n_q * d;
        for item in 0..c.batch {
            for kvh in 0..c.kv_heads {
                let t0 = (item * c.kv_heads + kvh) * chunks;
                for hh in 0..g.group {
                    for i in 0..c.n_q {
                        let to = item * qsb + (kvh * g.group + hh) * qsh + i * qsn;
                        let row = &mut dq[to..to + d];
                        row.fill(0.0);
                        for ch in 0..chunks {
                            let from = (t0 + ch) * per_task_q + (hh * c.n_q + i) * d;
                            for (x, &y) in row.iter_mut().zip(&dq_t[from..from + d]) {
                                *x += y;
                            }
                        }
                    }
                }
                for ch in 0..chunks {
                    let task_base = (t0 + ch) * g.task_rows * d;
                    let mut copy = |slot_row: usize, key: usize| {
                        let from = task_base + slot_row * d;
                        let to = item * ksb + kvh * ksh + key * ksn;
                        dk[to..to + d].copy_from_slice(&dk_t[from..from + d]);
                        dv[to..to + d].copy_from_slice(&dv_t[from..from + d]);
                    };
                    let mut sb = 0;
                    while ch + sb * chunks < g.full_kb {
                        for j in 0..bc {
                            copy(sb * bc + j, (ch + sb * chunks) * bc + j);
                        }
                        sb += 1;
                    }
                    if ch == 0 {
                        for j in 0..g.rest_k {
                            copy(g.slots * bc + j, g.full_kb * bc + j);
                        }
                    }
                }
            }
        }
    }
}

/// Dot product with eight independent partial sums (vectorizable).
fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (xs, ys) = (x.chunks_exact(8), y.chunks_exact(8));
    let tail: f32 = xs.remainder().iter().zip(ys.remainder()).map(|(a, b)| a * b).sum();
    for (xa, ya) in xs.zip(ys) {
        for ((s, &a), &b) in acc.iter_mut().zip(xa).zip(ya) {
            *s += a * b;
        }
    }
    acc.iter().sum::<f32>() + tail
}

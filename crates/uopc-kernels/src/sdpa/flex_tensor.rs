//! Attention with a score function, a mask function and sinks on lazy tensors
//! ([`flex_attention`]): the kernels of [`Sdpa::compile_flex`](super::Sdpa::compile_flex) and
//! [`SdpaBackward::compile_flex`](super::SdpaBackward::compile_flex) as kernel nodes of a
//! graph, with every host step of their runs (the block plan, the capture gradients' sums, the
//! sinks' gradient) written as tensor ops.

use super::backward::flex_backward_for_graph;
use super::flex::CaptureReads;
use super::forward::{capture_out_of_bounds, causal_equivalent, check_flex, describe_mods, flex_blocking};
use super::graph_backward::{renumber_slots, saved_parts, scaled_delta};
use super::kernel::{PlanMode, sdpa_flex_ir_with_lse};
use super::tensor::{config_of, shape_fault};
use super::{AttentionMods, Blocking, SdpaConfig, SdpaDType, SdpaError, sdpa_flex_ir, sdpa_flex_plan_ir};
use crate::LOG2E;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use uopc_ir::{DType, UOp};
use uopc_jit::JitError;
use uopc_tensor::{CustomVjpWanted, Tensor, TensorError};

/// `softmax(score(scale * q k^T) masked, with the sinks in the denominator) v` on lazy
/// tensors: the flex attention of [`AttentionMods`] as one kernel node of the graph, with its
/// gradient. `captures` are the tensors the functions read, one per
/// [`AttentionMods::capture`] in declaration order, each of its declared shape and dtype.
///
/// q, k, v, `causal` and `scale` are as [`scaled_dot_product_attention`](super::scaled_dot_product_attention)
/// takes them (f32, bf16 or f16; grouped-query heads). Blocks the mask's key bounds exclude
/// are skipped; a mask without exact bounds (document ids) gets a block plan counted by a
/// kernel node of its own on every run. A mask that is exactly the causal mask runs the
/// causal kernel. At `UOPC_DEBUG` level 1 or more the build prints the node's configuration,
/// blocks and what the mods compile into (which key blocks are skipped, and why) to stderr.
///
/// The gradient (through [`uopc_tensor::gradient`]) runs the flex backward as kernel nodes:
/// dq, dk and dv through the score function's derivative and the mask, and, only when a float
/// capture's gradient is asked for, its terms summed over every score that read it (the
/// sinks' from the saved log-sum-exp). I32 captures and the plan get none. 16-bit inputs get
/// the f32 backward of their widened values, rounded to their dtype.
///
/// # Errors
///
/// [`SdpaError::Shape`] naming `q`, `k` or `v`; [`SdpaError::Capture`] naming a capture of
/// the wrong count, shape or dtype, a capture the functions read out of its bounds, or faults
/// of the functions (see [`Sdpa::compile_flex`](super::Sdpa::compile_flex)).
pub fn flex_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mods: &AttentionMods,
    captures: &[&Tensor],
    causal: bool,
    scale: Option<f32>,
) -> Result<Tensor, SdpaError> {
    let config = config_of(q, k, v, causal, scale)?;
    config.validate()?;
    check_flex(&config, mods)?;
    check_captures(mods, captures)?;
    let (config, mods) = match causal_equivalent(&config, mods) {
        Some(causal) => (causal, mods.without_mask()),
        None => (config, mods.clone()),
    };
    let flex = FlexGraph { config, reads: CaptureReads::of(&mods), mods };
    if uopc_tensor::debug_level() >= 1 {
        let b = flex.blocking(&flex.config);
        eprintln!(
            "sdpa flex node: {}; tasks of {} head(s) x {} queries, keys in blocks of {}; {}",
            flex.config,
            b.heads_per_task,
            b.queries,
            b.keys,
            describe_mods(&flex.mods)
        );
    }
    let all: Vec<Tensor> = captures.iter().map(|&c| c.clone()).collect();
    // An f32 node also writes the rows' log-sum-exp, so its gradient reads the forward's
    // output and lse instead of running the forward again; a 16-bit one's gradient runs the
    // f32 forward of the widened inputs.
    let saves_lse = flex.config.dtype == SdpaDType::F32;
    let q_len = flex.config.q_len();
    let node = flex.attention_node(&flex.config, [q, k, v], &all, saves_lse)?;
    let rule: Arc<CustomVjpWanted> =
        Arc::new(move |src: &[Tensor], wanted: &[bool], out: &Tensor, g: &Tensor| {
            if saves_lse {
                flex.backward(src, wanted, &g.try_slice(0, 0, q_len)?, Some(out))
            } else {
                flex.backward(src, wanted, g, None)
            }
        });
    let node = node.with_custom_vjp_wanted(rule).map_err(shape_fault)?;
    if saves_lse {
        node.try_slice(0, 0, q_len).and_then(|o| o.try_reshape(q.shape())).map_err(shape_fault)
    } else {
        Ok(node)
    }
}

/// Programs verified in this process, kept so that an identical rebuild (the same interned
/// node) is not verified again; cleared when it holds [`VERIFIED_KEPT`].
static VERIFIED: Mutex<Option<HashSet<UOp>>> = Mutex::new(None);
/// Programs [`VERIFIED`] holds at most.
const VERIFIED_KEPT: usize = 64;

/// [`uopc_ir::verify`] of `program`, once per program per process.
fn verified(program: &UOp) -> Result<(), uopc_ir::IrError> {
    let seen =
        |p: &UOp| VERIFIED.lock().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(|s| s.contains(p));
    if seen(program) {
        return Ok(());
    }
    uopc_ir::verify(program)?;
    let mut kept = VERIFIED.lock().unwrap_or_else(|e| e.into_inner());
    let set = kept.get_or_insert_with(HashSet::new);
    if set.len() >= VERIFIED_KEPT {
        set.clear();
    }
    set.insert(program.clone());
    Ok(())
}

/// Each capture against its declaration: their count, then each one's shape and dtype.
fn check_captures(mods: &AttentionMods, captures: &[&Tensor]) -> Result<(), SdpaError> {
    let specs = mods.captures();
    if captures.len() != specs.len() {
        return Err(SdpaError::Capture {
            name: String::new(),
            reason: format!("{} capture tensor(s) given, the mods declare {}", captures.len(), specs.len()),
        });
    }
    for (spec, t) in specs.iter().zip(captures) {
        if t.shape() != spec.shape.as_slice() || t.dtype() != spec.dtype {
            return Err(SdpaError::Capture {
                name: spec.name.clone(),
                reason: format!(
                    "is {} of shape {:?}, declared {} of shape {:?}",
                    t.dtype(),
                    t.shape(),
                    spec.dtype,
                    spec.shape
                ),
            });
        }
    }
    Ok(())
}

/// One flex attention of a graph: its configuration (after the causal rewrite), its mods and
/// which captures each kernel reads.
struct FlexGraph {
    config: SdpaConfig,
    mods: AttentionMods,
    reads: CaptureReads,
}

impl FlexGraph {
    /// The forward's block sizes for configuration `c` (no K/V panels: a node reads k and v
    /// as the graph holds them).
    fn blocking(&self, c: &SdpaConfig) -> Blocking {
        Blocking { kv_panel_width: 0, ..flex_blocking(c, &self.mods) }
    }

    /// The captures among `all` (one per declaration) that `used` marks.
    fn used<'a>(all: &'a [Tensor], used: &[bool]) -> impl Iterator<Item = &'a Tensor> {
        all.iter().zip(used.iter()).filter(|(_, u)| **u).map(|(t, _)| t)
    }

    /// The attention kernel of configuration `c` over `[q, k, v]` and the captures it reads
    /// (then its runtime plan): its output, or with `save_lse` the flat f32 concatenation of
    /// the output and the rows' base-2 log-sum-exp. The kernel is verified first, so a read
    /// out of a capture's bounds is an error naming it here rather than at the run that
    /// compiles the kernel.
    fn attention_node(
        &self,
        c: &SdpaConfig,
        [q, k, v]: [&Tensor; 3],
        all: &[Tensor],
        save_lse: bool,
    ) -> Result<Tensor, SdpaError> {
        let blocking = self.blocking(c);
        let ir = if save_lse {
            sdpa_flex_ir_with_lse(c, &blocking, &self.mods)
        } else {
            sdpa_flex_ir(c, &blocking, &self.mods)
        };
        if let Err(e) = verified(&ir) {
            let text = e.to_string();
            return Err(capture_out_of_bounds(&text, c, &self.mods)
                .unwrap_or_else(|| JitError::Unsupported(format!("sdpa flex: {text}")).into()));
        }
        let plan = self.plan(c, &blocking, all).map_err(shape_fault)?;
        let mut sources = vec![q, k, v];
        sources.extend(Self::used(all, &self.reads.all));
        sources.extend(plan.as_ref());
        // The kernel's slots are q, k, v, out, the captures, the plan (then the lse); a
        // node's are its sources, then its outputs: the output moves after the sources.
        let n = sources.len();
        let program = renumber_slots(&ir, |slot| match slot {
            3 => n,
            s if s > 3 && s <= n => s - 1,
            s => s,
        });
        if save_lse {
            Tensor::try_custom_parts(
                "sdpa_flex_lse",
                program,
                &sources,
                &[c.q_len(), c.batch * c.heads * c.n_q],
                None,
            )
        } else {
            Tensor::try_custom("sdpa_flex", program, &sources, q.shape(), q.dtype(), None)
        }
        .map_err(shape_fault)
    }

    /// The runtime block plan of the kernel of `c` with `blocking` (`[t0, c0, c1, t1]` per
    /// unit, I32), when the mask's key bounds are not exact: the counting kernel as a node,
    /// then [`plan_from_counts`] as tensor ops.
    fn plan(
        &self,
        c: &SdpaConfig,
        blocking: &Blocking,
        all: &[Tensor],
    ) -> Result<Option<Tensor>, TensorError> {
        let mode = PlanMode::of(&self.mods);
        if mode == PlanMode::Static {
            return Ok(None);
        }
        let (units, full) = (mode.units(c, blocking), c.n_k / blocking.keys);
        let counts = self.counts(sdpa_flex_plan_ir(c, blocking, &self.mods), units * full, all)?;
        plan_from_counts(&counts, units, full, mode.rows(blocking) * blocking.keys).map(Some)
    }

    /// The counting kernel `program` (reading the captures the mask reads) as a node of `len`
    /// f32 counts.
    fn counts(&self, program: UOp, len: usize, all: &[Tensor]) -> Result<Tensor, TensorError> {
        let sources: Vec<&Tensor> = Self::used(all, &self.reads.mask).collect();
        Tensor::try_custom("sdpa_flex_plan", program, &sources, &[len], DType::F32, None)
    }

    /// The cotangents of the attention node's sources (`[q, k, v]`, the captures the forward
    /// reads, the plan) for output cotangent `d_o` (flat or shaped), building the capture
    /// gradients only where `wanted`. `saved` is the f32 node's output and lse (flat), else
    /// the forward runs again.
    fn backward(
        &self,
        src: &[Tensor],
        wanted: &[bool],
        d_o: &Tensor,
        saved: Option<&Tensor>,
    ) -> Result<Vec<Option<Tensor>>, TensorError> {
        let specs = self.mods.captures();
        // Each declared capture's tensor and its position among the sources, if the forward
        // reads it.
        let mut all: Vec<Tensor> = Vec::with_capacity(specs.len());
        let mut position: Vec<Option<usize>> = Vec::with_capacity(specs.len());
        let mut next = 3;
        for (spec, &read) in specs.iter().zip(&self.reads.all) {
            if read {
                all.push(src[next].clone());
                position.push(Some(next));
                next += 1;
            } else {
                // Never read by any kernel: a placeholder of its declared shape.
                all.push(Tensor::zeros(&spec.shape).cast(spec.dtype));
                position.push(None);
            }
        }
        let dtype = src[0].dtype();
        let c = SdpaConfig { dtype: SdpaDType::F32, ..self.config };
        let wide = |t: &Tensor| if t.dtype() == DType::F32 { t.clone() } else { t.cast(DType::F32) };
        let (q, k, v, d_o) = (wide(&src[0]), wide(&src[1]), wide(&src[2]), wide(&d_o.detach()));
        let (q_len, kv_len) = (c.q_len(), c.kv_len());
        let forward = match saved {
            Some(out) => out.detach(),
            None => self.attention_node(&c, [&q, &k, &v], &all, true).map_err(TensorError::from)?,
        };
        let (o, lse) = saved_parts(&forward, &c)?;
        let delta = scaled_delta(&o, &d_o, &c)?;
        let wanted_capture = |i: usize| position[i].is_some_and(|p| wanted.get(p).copied().unwrap_or(false));
        let capture_grads = (0..specs.len()).any(|i| self.reads.with_gradient[i] && wanted_capture(i));
        let fb = flex_backward_for_graph(&c, &self.mods, capture_grads).map_err(TensorError::from)?;
        let mut sources = vec![&q, &k, &v, &d_o, &lse, &delta];
        sources.extend(Self::used(&all, &self.reads.backward));
        let counts = match &fb.counts {
            Some((program, len)) => Some(self.counts(program.clone(), *len, &all)?),
            None => None,
        };
        sources.extend(counts.as_ref());
        let n = sources.len();
        // The program's slots are q, k, v, dO, lse, Delta, dq, dk, dv, the captures, the
        // counts, then the capture gradients' regions: dq, dk and dv move after the sources.
        let program = renumber_slots(&fb.program, |slot| match slot {
            6..=8 => n + slot - 6,
            s if s > 8 && s < n + 3 => s - 3,
            s => s,
        });
        let mut parts = vec![q_len, kv_len, kv_len];
        let mut region_at = vec![None; specs.len()];
        if capture_grads {
            for (i, spec) in specs.iter().enumerate().filter(|(i, _)| self.reads.with_gradient[*i]) {
                region_at[i] = Some(parts.iter().sum::<usize>());
                parts.push(fb.tasks * spec.len());
            }
        }
        let name = if capture_grads { "sdpa_flex_backward_capture_grads" } else { "sdpa_flex_backward" };
        let grads = Tensor::try_custom_parts(name, program, &sources, &parts, None)?;
        let part = |from: usize, len: usize, like: &Tensor| -> Result<Tensor, TensorError> {
            let g = grads.try_slice(0, from, from + len)?.try_reshape(like.shape())?;
            Ok(if dtype == DType::F32 { g } else { g.cast(dtype) })
        };
        let mut out = vec![
            Some(part(0, q_len, &src[0])?),
            Some(part(q_len, kv_len, &src[1])?),
            Some(part(q_len + kv_len, kv_len, &src[2])?),
        ];
        for (i, spec) in specs.iter().enumerate() {
            if position[i].is_none() {
                continue;
            }
            let mut g = match region_at[i] {
                Some(at) if wanted_capture(i) => Some(
                    grads
                        .try_slice(0, at, at + fb.tasks * spec.len())?
                        .try_reshape(&[fb.tasks, spec.len()])?
                        .try_sum(0, false)?,
                ),
                _ => None,
            };
            if self.mods.sink_logits().is_some_and(|s| s.position() == i) && wanted_capture(i) {
                let term = self.sink_grad(&c, &all[i], &lse, &delta)?;
                g = Some(match g {
                    Some(g) => g.try_sub(&term)?,
                    None => term.try_mul(&Tensor::full(&[], -1.0))?,
                });
            }
            out.push(match g {
                Some(g) => Some(g.try_reshape(&spec.shape)?),
                None => None,
            });
        }
        // The plan has no gradient.
        out.resize(src.len(), None);
        Ok(out)
    }

    /// `sum P_sink * Delta` over the rows of each head (the sink logits' gradient is its
    /// negative): `P_sink = exp2(z * log2(e) - lse)`, zero where the sink logit is `-inf`;
    /// `delta` is `scale * Delta`.
    fn sink_grad(
        &self,
        c: &SdpaConfig,
        z: &Tensor,
        lse: &Tensor,
        delta: &Tensor,
    ) -> Result<Tensor, TensorError> {
        let rows = [c.batch, c.heads, c.n_q];
        let z = z.try_reshape(&[1, c.heads, 1])?;
        let p = z.try_mul(&Tensor::full(&[], LOG2E as f32))?.try_sub(&lse.try_reshape(&rows)?)?.exp2();
        let p = z.try_eq(&Tensor::full(&[], f32::NEG_INFINITY))?.try_where(&Tensor::full(&[], 0.0), &p)?;
        p.try_mul(&delta.try_reshape(&rows)?)?
            .try_mul(&Tensor::full(&[], 1.0 / c.effective_scale()))?
            .try_sum(2, false)?
            .try_sum(0, false)
    }
}

/// Each unit's `[t0, c0, c1, t1]` (I32, flat) from the counting kernel's `counts` (`units x
/// full`, each out of `whole` pairs), as tensor ops: what the host's
/// [`plan_from_counts`](super::kernel::plan_from_counts) computes, the key blocks from the
/// first to the last one a pair is seen in, and the first longest run of blocks seen whole.
fn plan_from_counts(counts: &Tensor, units: usize, full: usize, whole: usize) -> Result<Tensor, TensorError> {
    if full == 0 {
        return Ok(Tensor::zeros(&[units * 4]).cast(DType::I32));
    }
    let s = |v: f32| Tensor::full(&[], v);
    let f = full as f32;
    let counts = counts.try_reshape(&[units, full])?;
    let block = Tensor::arange(full).cast(DType::F32).try_reshape(&[1, full])?;
    let seen = counts.try_gt(&s(0.0))?;
    let t1 = seen.try_where(&block.try_add(&s(1.0))?, &s(0.0))?.try_max(-1, true)?;
    let first = seen.try_where(&block, &s(f))?.try_min(-1, true)?;
    let t0 = t1.try_eq(&s(0.0))?.try_where(&s(0.0), &first)?;
    // Run length from each block: the first block at or after it not seen whole, less it.
    let is_whole = counts.try_eq(&s(whole as f32))?;
    let breaks = is_whole.try_where(&s(f), &block)?.try_reshape(&[units, 1, full])?;
    let later = block.try_ge(&block.try_reshape(&[full, 1])?)?;
    let next_break = later.try_where(&breaks, &s(f))?.try_min(-1, false)?;
    let run = is_whole.try_where(&next_break.try_sub(&block)?, &s(0.0))?;
    let longest = run.try_max(-1, true)?;
    let start = run.try_eq(&longest)?.try_where(&block, &s(f))?.try_min(-1, true)?;
    let any = longest.try_gt(&s(0.0))?;
    let c0 = any.try_where(&start, &t1)?;
    let c1 = any.try_where(&start.try_add(&longest)?, &t1)?;
    Tensor::try_stack(&[&t0, &c0, &c1, &t1], -1)?.try_reshape(&[units * 4]).map(|p| p.cast(DType::I32))
}

#[cfg(test)]
mod tests {
    use super::plan_from_counts;
    use uopc_tensor::Tensor;

    /// The tensor form equals the host's on counts with empty, partial and whole blocks, ties
    /// between runs and units that see nothing.
    #[test]
    fn the_plan_as_tensor_ops_is_the_hosts() {
        let (units, full, whole) = (7, 9, 4);
        let mut state = 12345u64;
        let mut counts: Vec<f32> = (0..units * full)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                [0.0, 0.0, 2.0, 4.0, 4.0, 4.0][(state >> 33) as usize % 6]
            })
            .collect();
        counts[..full].fill(0.0);
        counts[full..2 * full].copy_from_slice(&[4.0, 4.0, 0.0, 4.0, 4.0, 1.0, 0.0, 0.0, 0.0]);
        let want = crate::sdpa::kernel::plan_from_counts(&counts, full, whole);
        let t = Tensor::from_vec(counts, &[units * full]);
        let got = plan_from_counts(&t, units, full, whole).unwrap().to_ndarray::<i32>().unwrap();
        assert_eq!(got.as_slice().unwrap(), want.as_slice());
    }
}

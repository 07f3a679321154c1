//! The gradient of the f32 attention node of a tensor graph as kernel nodes: `Delta` from the
//! saved output, then one backward kernel for dq, dk and dv (and one for a bias's gradient
//! when it is asked for).

use super::backward::{sdpa_backward_ir_for_graph, sdpa_bias_grad_ir_for_graph};
use super::blocking::cores;
use super::kernel::sdpa_ir_output_last_with_lse;
use super::{Blocking, MaskKind, SdpaConfig, SdpaDType};
use std::collections::HashMap;
use uopc_ir::{DType, Op, UOp, buffer};
use uopc_tensor::{Tensor, TensorError};

/// The cotangents of `[q, k, v, mask]` for output cotangent `d_o`, as kernel nodes; `saved`
/// is the forward node's output (flat, `(batch, head, row)` order) and lse, else the forward
/// runs again with the lse.
pub(super) fn backward_nodes(
    c: &SdpaConfig,
    blocking: &Blocking,
    src: &[Tensor],
    d_o: &Tensor,
    saved: Option<(Tensor, Tensor)>,
) -> Result<Vec<Option<Tensor>>, TensorError> {
    let (q, k, v) = (&src[0], &src[1], &src[2]);
    let mask = src.get(3);
    let (q_len, kv_len, rows) = (c.q_len(), c.kv_len(), c.batch * c.heads * c.n_q);
    let mut fwd_sources = vec![q, k, v];
    fwd_sources.extend(mask);
    let (o, lse) = match saved {
        Some((o, lse)) => (o.detach(), lse.detach()),
        None => saved_parts(
            &Tensor::try_custom_parts(
                "sdpa_forward_lse",
                sdpa_ir_output_last_with_lse(c, blocking, None),
                &fwd_sources,
                &[q_len, rows],
                None,
            )?,
            c,
        )?,
    };
    let d_o = d_o.detach();
    let delta = scaled_delta(&o, &d_o, c)?;
    let mut bwd_sources = vec![q, k, v, &d_o, &lse, &delta];
    bwd_sources.extend(mask);
    // The program's slots are q, k, v, dO, lse, Delta, dq, dk, dv, mask; a node's are its
    // sources, then its outputs: the mask moves before the outputs.
    let extras = usize::from(mask.is_some());
    let program = renumber_slots(&sdpa_backward_ir_for_graph(c), |slot| match slot {
        6..=8 => slot + extras,
        9 => 6,
        other => other,
    });
    let grads = Tensor::try_custom_parts(
        "sdpa_backward_tile_ops",
        program,
        &bwd_sources,
        &[q_len, kv_len, kv_len],
        None,
    )?;
    let part = |from: usize, len: usize, like: &Tensor| {
        grads.try_slice(0, from, from + len)?.try_reshape(like.shape())
    };
    let mut out =
        vec![Some(part(0, q_len, q)?), Some(part(q_len, kv_len, k)?), Some(part(q_len + kv_len, kv_len, v)?)];
    match (mask, c.mask) {
        (Some(bias), MaskKind::Bias(shape)) => out.push(Some(bias_grad_node(c, shape, &bwd_sources, bias)?)),
        (Some(_), _) => out.push(None),
        (None, _) => {}
    }
    Ok(out)
}

/// The output and the rows' log-sum-exp of a forward node of `c` (its flat output and lse).
pub(super) fn saved_parts(forward: &Tensor, c: &SdpaConfig) -> Result<(Tensor, Tensor), TensorError> {
    let (q_len, rows) = (c.q_len(), c.batch * c.heads * c.n_q);
    Ok((forward.try_slice(0, 0, q_len)?, forward.try_slice(0, q_len, q_len + rows)?))
}

/// `scale * Delta` (`Delta_i = dO_i . O_i`), what a backward program takes beside the lse, from
/// the output `o` and its cotangent `d_o` (both `(batch, head, row)` order).
pub(super) fn scaled_delta(o: &Tensor, d_o: &Tensor, c: &SdpaConfig) -> Result<Tensor, TensorError> {
    let (rows, d) = (c.batch * c.heads * c.n_q, c.d);
    d_o.try_reshape(&[rows, d])?
        .try_mul(&o.try_reshape(&[rows, d])?)?
        .try_sum(-1, false)?
        .try_mul(&Tensor::full(&[], c.effective_scale()))
}

/// The gradient of the bias `bias` (of kind `MaskKind::Bias(shape)`): the tasks' dbias
/// regions from [`sdpa_bias_grad_ir_for_graph`], summed over the tasks that share an element
/// (batch items and key/value heads the bias broadcasts along), in the bias's own shape.
/// `sources` are the backward node's (q, k, v, dO, lse, Delta, bias).
fn bias_grad_node(
    c: &SdpaConfig,
    shape: [usize; 4],
    sources: &[&Tensor],
    bias: &Tensor,
) -> Result<Tensor, TensorError> {
    let (program, [tasks, heads, rows, keys]) = sdpa_bias_grad_ir_for_graph(c);
    // The program's slots are q, k, v, dO, lse, Delta, bias (9), dbias (10).
    let program = renumber_slots(&program, |slot| match slot {
        9 => 6,
        10 => 7,
        other => other,
    });
    let partials = Tensor::try_custom(
        "sdpa_backward_bias_grad_tile_ops",
        program,
        sources,
        &[tasks * heads * rows * keys],
        DType::F32,
        None,
    )?;
    // One chunk per (item, key/value head): the regions are (B, H_kv, heads, rows, keys).
    let mut g = partials.try_reshape(&[c.batch, c.kv_heads, heads, rows, keys])?;
    if shape[0] == 1 {
        g = g.try_sum(0, true)?;
    }
    if shape[1] == 1 {
        g = g.try_sum(1, true)?;
    }
    g.try_reshape(bias.shape())
}

/// `program` with every BUFFER slot `s` renumbered to `to(s)`.
pub(super) fn renumber_slots(program: &UOp, to: impl Fn(usize) -> usize) -> UOp {
    let mut map: HashMap<UOp, UOp> = HashMap::new();
    for u in UOp::toposort(std::slice::from_ref(program)) {
        let new = match u.op() {
            Op::Buffer { slot, len } => buffer(to(slot.index()), u.dtype(), *len),
            _ => u.with_src(u.src().iter().map(|s| map[s].clone()).collect()),
        };
        map.insert(u, new);
    }
    map[program].clone()
}

/// The cotangents of 16-bit attention: [`backward_nodes`] of the f32 twin of `c` (its own
/// blocking) on q, k, v and `d_o` widened to f32, with dq, dk and dv rounded to the inputs'
/// dtype; a bias's gradient stays f32, as the bias is.
pub(super) fn half_backward_nodes(
    c: &SdpaConfig,
    src: &[Tensor],
    d_o: &Tensor,
) -> Result<Vec<Option<Tensor>>, TensorError> {
    let wide_config = SdpaConfig { dtype: SdpaDType::F32, ..*c };
    let blocking = Blocking { splits: 1, kv_panel_width: 0, ..Blocking::choose(&wide_config, cores()) };
    let dtype = src[0].dtype();
    let mut wide: Vec<Tensor> = src[..3].iter().map(|t| t.cast(DType::F32)).collect();
    wide.extend(src.get(3).cloned());
    let grads = backward_nodes(&wide_config, &blocking, &wide, &d_o.cast(DType::F32), None)?;
    Ok(grads.into_iter().enumerate().map(|(i, g)| if i < 3 { g.map(|g| g.cast(dtype)) } else { g }).collect())
}

//! The f32 attention node of a tensor graph reading q, k and v where they lie: heads sliced
//! and permuted out of a fused QKV projection's output (or any other evenly strided view) are
//! read at their strides instead of being copied into `(B, H, n, D)` tensors first, and an
//! output whose queries come `(batch, row, head)` ordered is written in that order, which an
//! output projection reads in place after the usual `permute(0, 2, 1, 3)` and reshape.

use super::graph_backward::{backward_nodes, half_backward_nodes, saved_parts};
use super::views::{OperandView, Views};
use super::{Blocking, SdpaConfig};
use crate::sdpa::kernel::{sdpa_ir_output_last, sdpa_ir_output_last_with_lse};
use std::sync::Arc;
use uopc_tensor::{CustomVjp, Tensor, TensorError, vjp};

/// The views of q, k and v (rank `r >= 2`, `(.., heads, rows, d)`) over the tensors their
/// movement ops start from, and those tensors, when at least one of them is such a view and
/// all three are evenly strided with a contiguous head dimension (and batch axes that collapse
/// into one stride); `None` otherwise (the node then reads materialized copies).
pub(super) fn read_in_place(c: &SdpaConfig, qkv: [&Tensor; 3]) -> Option<(Views, [Tensor; 3])> {
    let operand = |t: &Tensor| -> Option<(OperandView, Tensor)> {
        let view = t.strided_view()?;
        let (shape, s, r) = (t.shape(), &view.strides, t.ndim());
        let lead = r.saturating_sub(3);
        // The batch axes as one: each steps over the next whole (size-1 axes aside).
        let batch_axes: Vec<usize> = (0..lead).filter(|&a| shape[a] != 1).collect();
        if batch_axes.windows(2).any(|w| s[w[0]] != s[w[1]] * shape[w[1]]) || s[r - 1] != 1 {
            return None;
        }
        let batch_stride = batch_axes.last().map_or(0, |&a| s[a]);
        let head_stride = if r >= 3 { s[r - 3] } else { 0 };
        let strides = [batch_stride, head_stride, s[r - 2]];
        Some((OperandView { offset: view.offset, strides, len: view.base.numel() }, view.base))
    };
    let [q, k, v] = qkv.map(operand);
    let ((q, qb), (k, kb), (v, vb)) = (q?, k?, v?);
    // Queries whose rows lie farther apart than their heads come from a (batch, row, head)
    // tensor: the output takes that order too.
    let (h, n, d) = (c.heads, c.n_q, c.d);
    let rows_outer = h > 1 && q.strides[2] > q.strides[1];
    let out_strides = if rows_outer { [n * h * d, d, h * d] } else { [h * n * d, n * d, d] };
    let views = Views { q, k, v, out: OperandView { offset: 0, strides: out_strides, len: c.q_len() } };
    let copies = qkv.iter().zip([&qb, &kb, &vb]).any(|(t, base)| t.uop() != base.uop());
    (copies && views.check(c).is_ok()).then_some((views, [qb, kb, vb]))
}

/// The node of [`super::scaled_dot_product_attention`] over `bases` (q, k and v where `views`
/// places them, then the mask), its result shaped as q (`qkv[0]`): the f32 node, or, with
/// `equivalent` (the unfused graph shaped as q, for its reference), the 16-bit one. Its
/// gradient runs the backward on `qkv` themselves (the f32 backward of the widened views for
/// 16 bits) and hands each cotangent back to its base through the view's movement ops.
pub(super) fn in_place_node(
    config: &SdpaConfig,
    blocking: &Blocking,
    (views, bases): (Views, [Tensor; 3]),
    qkv: [&Tensor; 3],
    mask: Option<&Tensor>,
    equivalent: Option<&Tensor>,
) -> Result<Tensor, TensorError> {
    let mut sources: Vec<&Tensor> = bases.iter().collect();
    sources.extend(mask);
    match equivalent {
        None => f32_node(config, blocking, views, &sources, qkv),
        Some(e) => half_node(config, blocking, views, &sources, qkv, e),
    }
}

/// The cotangents `grads` of the views `views_of` (q, k, v, then the mask's) as cotangents of
/// the node's sources `src`: each through autograd of its view's movement ops.
fn to_bases(views_of: &[Tensor; 3], src: &[Tensor], grads: &mut [Option<Tensor>]) -> Result<(), TensorError> {
    for (i, grad) in grads.iter_mut().take(3).enumerate() {
        if let Some(g) = grad.take() {
            *grad = Some(vjp(&views_of[i], &[&src[i]], &g.try_reshape(views_of[i].shape())?)?.remove(0));
        }
    }
    Ok(())
}

/// The node's output as a 4-D tensor of `views.out`'s order, and the permutation between it
/// and `(batch, head, row, d)` (its own inverse): rows outside heads, or heads outside rows.
fn output_order(c: &SdpaConfig, views: &Views) -> ([usize; 4], [usize; 4]) {
    if views.out.strides[1] < views.out.strides[2] {
        ([c.batch, c.n_q, c.heads, c.d], [0, 2, 1, 3])
    } else {
        ([c.batch, c.heads, c.n_q, c.d], [0, 1, 2, 3])
    }
}

/// The f32 node of [`in_place_node`].
fn f32_node(
    config: &SdpaConfig,
    blocking: &Blocking,
    views: Views,
    sources: &[&Tensor],
    qkv: [&Tensor; 3],
) -> Result<Tensor, TensorError> {
    let (c, b) = (*config, *blocking);
    let (q_len, rows) = (c.q_len(), c.batch * c.heads * c.n_q);
    let program = sdpa_ir_output_last_with_lse(&c, &b, Some(views));
    let node = Tensor::try_custom_parts("sdpa_flash_tile_ops", program, sources, &[q_len, rows], None)?;
    let (shape, order) = output_order(&c, &views);
    // The output part (and its cotangent) in `(batch, head, row, d)` order.
    let heads_first = move |flat: &Tensor| flat.try_reshape(&shape)?.try_permute(&order);
    let views_of: [Tensor; 3] = qkv.map(Tensor::clone);
    let rule: Arc<CustomVjp> = Arc::new(move |src: &[Tensor], out: &Tensor, g: &Tensor| {
        let (o, lse) = saved_parts(out, &c)?;
        let d_o = heads_first(&g.try_slice(0, 0, q_len)?)?;
        let mut inputs: Vec<Tensor> = views_of.to_vec();
        inputs.extend(src.get(3).cloned());
        let mut grads = backward_nodes(&c, &b, &inputs, &d_o, Some((heads_first(&o)?, lse)))?;
        to_bases(&views_of, src, &mut grads)?;
        Ok(grads)
    });
    let node = node.with_custom_vjp(rule)?;
    heads_first(&node.try_slice(0, 0, q_len)?)?.try_reshape(qkv[0].shape())
}

/// The 16-bit node of [`in_place_node`], with `equivalent` for its reference.
fn half_node(
    config: &SdpaConfig,
    blocking: &Blocking,
    views: Views,
    sources: &[&Tensor],
    qkv: [&Tensor; 3],
    equivalent: &Tensor,
) -> Result<Tensor, TensorError> {
    let c = *config;
    let program = sdpa_ir_output_last(&c, blocking, Some(views));
    let (shape, order) = output_order(&c, &views);
    let equivalent = equivalent.try_reshape(&[c.batch, c.heads, c.n_q, c.d])?.try_permute(&order)?;
    let node = Tensor::try_custom(
        "sdpa_flash_tile_ops",
        program,
        sources,
        &shape,
        qkv[0].dtype(),
        Some(equivalent),
    )?;
    let views_of: [Tensor; 3] = qkv.map(Tensor::clone);
    let rule: Arc<CustomVjp> = Arc::new(move |src: &[Tensor], _out: &Tensor, d_o: &Tensor| {
        let d_o = d_o.try_permute(&order)?.try_reshape(views_of[0].shape())?;
        let mut inputs: Vec<Tensor> = views_of.to_vec();
        inputs.extend(src.get(3).cloned());
        let mut grads = half_backward_nodes(&c, &inputs, &d_o)?;
        to_bases(&views_of, src, &mut grads)?;
        Ok(grads)
    });
    node.with_custom_vjp(rule)?.try_permute(&order)?.try_reshape(qkv[0].shape())
}

//! Hand-written loop programs as nodes of a tensor graph.

use super::Tensor;
use crate::error::{Result, TensorError};
use crate::util::numel;
use std::sync::Arc;
use uopc_ir::{CustomKernel, DType, DataRef, Op, UOp};

/// The vector-Jacobian product of a custom kernel: given its sources, its output and the
/// output's cotangent, the cotangent of each source (`None`: no gradient flows to it).
pub type CustomVjp = dyn Fn(&[Tensor], &Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync;

/// [`CustomVjp`] also told which sources a parameter reaches the output through (`wanted[i]`
/// for source `i`): a rule may then build only the kernels those cotangents need, since a
/// cotangent of a source that is not wanted is dropped unread.
pub type CustomVjpWanted =
    dyn Fn(&[Tensor], &[bool], &Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync;

impl Tensor {
    /// A tensor computed by the hand-written loop `program` from `sources`: a kernel node that
    /// plans, caches and runs like the kernels the compiler cuts itself (each source is
    /// materialized contiguous first, unless it already is a buffer).
    ///
    /// The program's BUFFER slot `i < sources.len()` must read source `i` (its dtype, `numel`
    /// elements, row-major) and slot `sources.len()` must be the output: `dtype`, `numel(shape)`
    /// elements, every one of them written. `equivalent`, if given, is the same value built
    /// from `sources` with ordinary tensor ops; autograd differentiates it (without it the node
    /// has no gradient, and asking for one is an error).
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`] naming `custom` and `name` when a slot is missing, has the wrong
    /// dtype or length, or `equivalent` has another shape or dtype than the output.
    pub fn try_custom(
        name: &str,
        program: UOp,
        sources: &[&Tensor],
        shape: &[usize],
        dtype: DType,
        equivalent: Option<Tensor>,
    ) -> Result<Tensor> {
        Self::custom_node(name, program, sources, shape, dtype, &[numel(shape)], equivalent)
    }

    /// [`Tensor::try_custom`] for a program with several f32 outputs: slots `sources.len() ..`
    /// hold `parts[0], parts[1], ..` elements, and the node is their concatenation, a flat f32
    /// tensor of `parts.iter().sum()` elements (slice it to get each part).
    ///
    /// # Errors
    ///
    /// As [`Tensor::try_custom`]; also when `parts` is empty.
    pub fn try_custom_parts(
        name: &str,
        program: UOp,
        sources: &[&Tensor],
        parts: &[usize],
        equivalent: Option<Tensor>,
    ) -> Result<Tensor> {
        if parts.is_empty() {
            return Err(TensorError::Shape { op: "custom", msg: format!("kernel {name}: no output parts") });
        }
        let total = parts.iter().sum::<usize>();
        Self::custom_node(name, program, sources, &[total], DType::F32, parts, equivalent)
    }

    fn custom_node(
        name: &str,
        program: UOp,
        sources: &[&Tensor],
        shape: &[usize],
        dtype: DType,
        parts: &[usize],
        equivalent: Option<Tensor>,
    ) -> Result<Tensor> {
        let err = |msg: String| TensorError::Shape { op: "custom", msg: format!("kernel {name}: {msg}") };
        let mut slots: Vec<Option<(DType, usize)>> = vec![None; sources.len() + parts.len()];
        for u in UOp::toposort(std::slice::from_ref(&program)) {
            if let Op::Buffer { slot, len } = u.op() {
                let Some(entry) = slots.get_mut(slot.index()) else {
                    return Err(err(format!(
                        "BUFFER slot {slot} has no source (there are {})",
                        sources.len()
                    )));
                };
                *entry = Some((u.dtype(), *len));
            }
        }
        let wanted = sources.iter().map(|s| (s.dtype(), s.numel())).chain(parts.iter().map(|&p| (dtype, p)));
        for (slot, (got, want)) in slots.iter().zip(wanted).enumerate() {
            match got {
                None => return Err(err(format!("the program has no BUFFER slot {slot}"))),
                Some(g) if *g != want => {
                    return Err(err(format!(
                        "BUFFER slot {slot} is {} x {}, but its {} is {} x {}",
                        g.1,
                        g.0,
                        if slot < sources.len() { "source" } else { "output" },
                        want.1,
                        want.0
                    )));
                }
                Some(_) => {}
            }
        }
        if let Some(e) = &equivalent
            && (e.shape() != shape || e.dtype() != dtype)
        {
            return Err(err(format!(
                "equivalent is {:?} {}, the output {shape:?} {dtype}",
                e.shape(),
                e.dtype()
            )));
        }
        let kernel = CustomKernel {
            name: name.to_string(),
            program,
            shape: shape.to_vec(),
            output_parts: if parts.len() > 1 { parts.to_vec() } else { Vec::new() },
            equivalent: equivalent.map(|e| e.uop().clone()),
            vjp: None,
        };
        let src = sources.iter().map(|s| s.uop().clone()).collect();
        Ok(Tensor::from_uop(UOp::new(Op::Custom(kernel), dtype, src)))
    }

    /// This custom kernel node with `vjp` as its gradient rule: autograd calls it (with the
    /// node's sources, the node and its cotangent) instead of differentiating the equivalent
    /// graph; typically it builds more custom kernels (a hand-written backward).
    ///
    /// # Errors
    ///
    /// [`TensorError::Unsupported`] when this tensor is not a custom kernel node.
    pub fn with_custom_vjp(&self, vjp: Arc<CustomVjp>) -> Result<Tensor> {
        self.with_rule(DataRef(Arc::new(vjp)))
    }

    /// [`Tensor::with_custom_vjp`] with a rule that is told which sources need a cotangent
    /// ([`CustomVjpWanted`]).
    ///
    /// # Errors
    ///
    /// [`TensorError::Unsupported`] when this tensor is not a custom kernel node.
    pub fn with_custom_vjp_wanted(&self, vjp: Arc<CustomVjpWanted>) -> Result<Tensor> {
        self.with_rule(DataRef(Arc::new(vjp)))
    }

    /// This custom kernel node with `rule` (an `Arc` of either rule type) attached.
    fn with_rule(&self, rule: DataRef) -> Result<Tensor> {
        let Op::Custom(kernel) = self.uop().op() else {
            return Err(TensorError::Unsupported(
                "with_custom_vjp: the tensor is not a custom kernel".into(),
            ));
        };
        let kernel = CustomKernel { vjp: Some(rule), ..kernel.clone() };
        Ok(Tensor::from_uop(UOp::new(Op::Custom(kernel), self.dtype(), self.uop().src().to_vec())))
    }
}

/// The gradient rule attached to a custom kernel by [`Tensor::with_custom_vjp`] or
/// [`Tensor::with_custom_vjp_wanted`].
pub(crate) enum AttachedVjp<'a> {
    /// A rule that gives every source's cotangent.
    Plain(&'a Arc<CustomVjp>),
    /// A rule told which sources need one.
    Wanted(&'a Arc<CustomVjpWanted>),
}

/// The gradient rule attached to `kernel`, if any.
pub(crate) fn custom_vjp(kernel: &CustomKernel) -> Option<AttachedVjp<'_>> {
    let rule = &kernel.vjp.as_ref()?.0;
    if let Some(plain) = rule.downcast_ref::<Arc<CustomVjp>>() {
        return Some(AttachedVjp::Plain(plain));
    }
    rule.downcast_ref::<Arc<CustomVjpWanted>>().map(AttachedVjp::Wanted)
}

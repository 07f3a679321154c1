//! Hand-written loop programs as nodes of a tensor graph.

use super::Tensor;
use crate::error::{Result, TensorError};
use crate::util::numel;
use uopc_ir::{CustomKernel, DType, Op, UOp};

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
        let err = |msg: String| TensorError::Shape { op: "custom", msg: format!("kernel {name}: {msg}") };
        let mut slots: Vec<Option<(DType, usize)>> = vec![None; sources.len() + 1];
        for u in UOp::toposort(std::slice::from_ref(&program)) {
            if let Op::Buffer { slot, len } = u.op() {
                let Some(entry) = slots.get_mut(*slot) else {
                    return Err(err(format!(
                        "BUFFER slot {slot} has no source (there are {})",
                        sources.len()
                    )));
                };
                *entry = Some((u.dtype(), *len));
            }
        }
        let wanted = sources.iter().map(|s| (s.dtype(), s.numel())).chain([(dtype, numel(shape))]);
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
            equivalent: equivalent.map(|e| e.uop().clone()),
        };
        let src = sources.iter().map(|s| s.uop().clone()).collect();
        Ok(Tensor::from_uop(UOp::new(Op::Custom(kernel), dtype, src)))
    }
}

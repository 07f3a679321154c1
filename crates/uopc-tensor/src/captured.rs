//! [`Captured`]: a graph planned once and run again on new values of some of its inputs, with
//! no graph built, canonicalized or looked up per run (a decode step runs the same layer
//! graphs for every token, on a new token's values).

use crate::error::{Result, shape_err};
use crate::options::RealizeOptions;
use crate::plan::Plan;
use crate::realize::{planned, run_plan};
use crate::tensor::Tensor;
use std::sync::Arc;
use std::time::Instant;
use uopc_ir::{DType, UOp};

/// The plan of some tensors' graph, with the realized tensors it reads; [`Captured::run`]
/// computes the same graph with some of those inputs replaced.
#[derive(Clone, Debug)]
pub struct Captured {
    plan: Arc<Plan>,
    /// The DATA leaves the plan reads, in slot order, as captured.
    leaves: Vec<UOp>,
    /// The slot of each replaceable input, in the order [`Captured::run`] takes them.
    slots: Vec<usize>,
    /// Each output's shape and dtype.
    roots: Vec<(Vec<usize>, DType)>,
}

impl Captured {
    /// Plans `outputs` (compiling what the plan cache does not hold) and records which of the
    /// realized tensors they read are `inputs`, the ones [`Captured::run`] replaces; every other
    /// tensor read (weights) is read as it is now by every run.
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `capture` when an output is empty or an input is not a
    /// realized tensor that the outputs read; the errors of planning.
    pub fn new(outputs: &[&Tensor], inputs: &[&Tensor], opts: &RealizeOptions) -> Result<Captured> {
        let err = |m: String| shape_err("capture", m);
        if outputs.iter().any(|t| t.numel() == 0) {
            return Err(err("an output has no elements".into()));
        }
        let roots: Vec<UOp> = outputs.iter().map(|t| t.uop().clone()).collect();
        let (plan, leaves, _) = planned(&roots, opts)?;
        let slots = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| {
                leaves.iter().position(|l| l == t.uop()).ok_or_else(|| {
                    err(format!("input {i} ({:?}) is not a realized tensor the outputs read", t.shape()))
                })
            })
            .collect::<Result<Vec<usize>>>()?;
        let roots = roots.iter().map(|r| (r.shape().to_vec(), r.dtype())).collect();
        Ok(Captured { plan, leaves, slots, roots })
    }

    /// The outputs computed with `inputs` in place of the captured ones (same count, order,
    /// shapes and dtypes; each realized), every other tensor read as captured.
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `capture` when `inputs` does not match the captured
    /// inputs or one is not realized; [`TensorError::Backend`](crate::TensorError::Backend) when a kernel fails.
    pub fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let err = |m: String| shape_err("capture", m);
        if inputs.len() != self.slots.len() {
            return Err(err(format!("{} inputs given for {} captured", inputs.len(), self.slots.len())));
        }
        let mut leaves = self.leaves.clone();
        for (i, (t, &slot)) in inputs.iter().zip(&self.slots).enumerate() {
            let was = &self.leaves[slot];
            let realized = t.is_realized();
            if !realized || t.shape() != was.shape() || t.dtype() != was.dtype() {
                return Err(err(format!(
                    "input {i} must be a realized {} tensor of shape {:?}, got {}{} of shape {:?}",
                    was.dtype(),
                    was.shape(),
                    if realized { "" } else { "an unrealized " },
                    t.dtype(),
                    t.shape()
                )));
            }
            leaves[slot] = t.uop().clone();
        }
        let (out, _, _) = run_plan(&self.plan, true, &leaves, &self.roots, None, Instant::now())?;
        Ok(out)
    }
}

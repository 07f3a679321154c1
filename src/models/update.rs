//! Training a loaded model: its leaf tensors, a copy of it with new leaves (an optimizer's
//! step), and saving its weights back to a checkpoint directory.

use super::{CausalLm, ModelError, write_f32_safetensors};
use std::collections::HashMap;
use std::path::Path;
use uopc_ir::{Op, UOp};
use uopc_tensor::Tensor;

impl CausalLm {
    /// The distinct leaf tensors of its parameters (a stacked q/k/v leaf once), in load
    /// order: what to differentiate and step.
    pub fn leaves(&self) -> Vec<Tensor> {
        let mut seen = std::collections::HashSet::new();
        self.params.iter().filter(|p| seen.insert(p.leaf.uop().clone())).map(|p| p.leaf.clone()).collect()
    }

    /// This model with each leaf of [`CausalLm::leaves`] replaced by the tensor at the same
    /// position of `new` (an optimizer step's output), every view of it (a transposed
    /// weight, a tied output projection) following.
    ///
    /// # Errors
    ///
    /// [`ModelError::Input`] when `new` does not hold one tensor of each leaf's shape.
    pub fn with_leaves(&self, new: &[Tensor]) -> Result<CausalLm, ModelError> {
        let leaves = self.leaves();
        if new.len() != leaves.len() || leaves.iter().zip(new).any(|(a, b)| a.shape() != b.shape()) {
            return Err(ModelError::Input(format!(
                "{} new leaves given for {} leaves, or a shape differs",
                new.len(),
                leaves.len()
            )));
        }
        let map: HashMap<UOp, Tensor> =
            leaves.iter().map(|l| l.uop().clone()).zip(new.iter().cloned()).collect();
        let remap = |t: &Tensor| -> Tensor {
            if let Some(n) = map.get(t.uop()) {
                return n.clone();
            }
            // The one view a model keeps of a leaf: its transpose.
            match (t.uop().op(), t.uop().src().first().and_then(|s| map.get(s))) {
                (Op::Permute(_), Some(n)) => n.t(),
                _ => t.clone(),
            }
        };
        let mut model = self.clone();
        // The captured decode graphs read the old weights.
        model.steps = Default::default();
        model.embed = remap(&model.embed);
        model.positions = model.positions.as_ref().map(remap);
        model.head = remap(&model.head);
        model.final_norm = model.final_norm.remapped(&remap);
        for b in &mut model.blocks {
            b.attn_norm = b.attn_norm.remapped(&remap);
            b.mlp_norm = b.mlp_norm.remapped(&remap);
            b.qkv = b.qkv.remapped(&remap);
            b.out = b.out.remapped(&remap);
            b.mlp = b.mlp.remapped(&remap);
        }
        for p in &mut model.params {
            p.leaf = remap(&p.leaf);
        }
        Ok(model)
    }

    /// Writes its weights, under the checkpoint's own names (the rows of a stacked leaf
    /// apart again), as f32 to `dir/model.safetensors`, and `dir/config.json` as loaded.
    ///
    /// # Errors
    ///
    /// [`ModelError::Io`] when the directory or files cannot be written; the errors of
    /// computing the weights.
    pub fn save(&self, dir: &Path) -> Result<(), ModelError> {
        std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
        let mut data: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::with_capacity(self.params.len());
        for p in &self.params {
            let part = p.part(&p.leaf)?.cast(uopc_ir::DType::F32);
            let mut values = vec![0.0f32; part.numel()];
            part.realize_into(&mut values)?;
            data.push((p.name.clone(), part.shape().to_vec(), values));
        }
        write_f32_safetensors(&dir.join("model.safetensors"), &data)?;
        let config = dir.join("config.json");
        std::fs::write(&config, &self.config_json).map_err(|e| ModelError::io(&config, e))
    }
}

/// The tensors of a layer rebuilt over new leaves.
pub(super) trait Remapped {
    /// This layer with each tensor passed through `remap`.
    fn remapped(&self, remap: &dyn Fn(&Tensor) -> Tensor) -> Self;
}

impl Remapped for super::Linear {
    fn remapped(&self, remap: &dyn Fn(&Tensor) -> Tensor) -> Self {
        super::Linear { weight: remap(&self.weight), bias: self.bias.as_ref().map(remap) }
    }
}

impl Remapped for super::Norm {
    fn remapped(&self, remap: &dyn Fn(&Tensor) -> Tensor) -> Self {
        match self {
            super::Norm::Layer { weight, bias, eps } => {
                super::Norm::Layer { weight: remap(weight), bias: remap(bias), eps: *eps }
            }
            super::Norm::Rms { weight, eps } => super::Norm::Rms { weight: remap(weight), eps: *eps },
        }
    }
}

impl Remapped for super::Mlp {
    fn remapped(&self, remap: &dyn Fn(&Tensor) -> Tensor) -> Self {
        match self {
            super::Mlp::Gelu { fc, proj } => {
                super::Mlp::Gelu { fc: fc.remapped(remap), proj: proj.remapped(remap) }
            }
            super::Mlp::SwiGlu { gate_up, down, width } => super::Mlp::SwiGlu {
                gate_up: gate_up.remapped(remap),
                down: down.remapped(remap),
                width: *width,
            },
        }
    }
}

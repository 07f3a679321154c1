//! The layers of the decoders, on the Tensor API: linear maps over weights in the
//! checkpoint's layout, the two norms, the two MLPs.

use super::ModelError;
use uopc_ir::DType;
use uopc_tensor::Tensor;

/// `y = x W + b` with `W` viewed `(in, out)`: a Hugging Face `Linear`'s `(out, in)` weight
/// read through a transposed view, a GPT-2 `Conv1D`'s `(in, out)` as it is. A bf16 or f16
/// weight is widened as the product reads it (the sums and the result are f32).
#[derive(Clone, Debug)]
pub struct Linear {
    /// `(in, out)` (a view).
    pub weight: Tensor,
    /// `(out,)`, when the layer has one.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// `x W + b` for `x` of shape `(.., in)`, with `x` in f32.
    ///
    /// # Errors
    ///
    /// A shape error of the product or the sum.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        self.forward_as(x, Activations::F32)
    }

    /// [`Linear::forward`] with `x` held in the product as `activations` says for this
    /// weight and this many rows.
    ///
    /// # Errors
    ///
    /// A shape error of the product or the sum.
    pub fn forward_as(&self, x: &Tensor, activations: Activations) -> Result<Tensor, ModelError> {
        let y = activations.held(x, &self.weight).try_matmul(&widened(&self.weight))?;
        Ok(match &self.bias {
            Some(b) => y.try_add(b)?,
            None => y,
        })
    }
}

/// How the activations entering a product with a 16-bit weight matrix are held.
///
/// The sums and results of products are f32 either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activations {
    /// In f32: a product's result is the f32 model's of the weights' rounded values, with
    /// any number of rows and on any machine.
    #[default]
    F32,
    /// Rounded to bf16 (to nearest even) into a buffer of their own before products with a
    /// bf16 weight over more than [`Activations::ROUNDED_MIN_ROWS`] rows, where the machine
    /// multiplies bf16 pairs itself (`vdpbf16ps`, AMX): those products then run the bf16
    /// GEMM, whose dot products do twice the f32 work per instruction. A bf16 model in
    /// PyTorch rounds every activation likewise. Other products (fewer rows, f16 or f32
    /// weights, machines whose bf16 GEMM widens to f32) are as [`Activations::F32`], so
    /// decode steps and a prompt's products may differ by the activations' rounding. The
    /// model's caches ([`CausalLm::new_cache`](super::CausalLm::new_cache)) hold bf16 keys
    /// and values, and attention rounds its queries to bf16, on every machine.
    Bf16,
}

impl Activations {
    /// Up to this many rows a product is bound by reading its weight, which the few-row
    /// kernels do as fast from f32 activations: rounding them would be a pass for nothing.
    pub const ROUNDED_MIN_ROWS: usize = 16;

    /// `x` as the product with `weight` reads it.
    pub(crate) fn held(self, x: &Tensor, weight: &Tensor) -> Tensor {
        let rows = x.shape().iter().rev().skip(1).product::<usize>();
        let rounds = self == Activations::Bf16
            && weight.dtype() == DType::BF16
            && rows > Activations::ROUNDED_MIN_ROWS
            && !uopc_tile::Bf16Path::detect().widens();
        // Staged, so the bf16 values are a buffer the GEMM reads, not a rounding it fuses in.
        if rounds { x.cast(DType::BF16).staged().cast(DType::F32) } else { x.clone() }
    }
}

/// `w` as f32: a bf16 or f16 weight through a widening cast, which a tile GEMM reads through
/// (the stored 16-bit values are read in place and widened in registers).
pub(crate) fn widened(w: &Tensor) -> Tensor {
    if w.dtype().is_half() { w.cast(DType::F32) } else { w.clone() }
}

/// A norm over the last axis.
#[derive(Clone, Debug)]
pub enum Norm {
    /// `(x - mean) / sqrt(var + eps) * weight + bias` (GPT-2).
    Layer {
        /// Scale.
        weight: Tensor,
        /// Shift.
        bias: Tensor,
        /// Epsilon.
        eps: f32,
    },
    /// `x / sqrt(mean(x^2) + eps) * weight` (Llama).
    Rms {
        /// Scale.
        weight: Tensor,
        /// Epsilon.
        eps: f32,
    },
}

impl Norm {
    /// The norm of `x` over its last axis.
    ///
    /// # Errors
    ///
    /// A shape error when the weight does not match the last axis.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        Ok(match self {
            Norm::Layer { weight, bias, eps } => {
                x.try_layer_norm(Some(weight), Some(bias), f64::from(*eps))?
            }
            Norm::Rms { weight, eps } => {
                let inv_rms = ((x * x).try_mean(-1, true)? + f64::from(*eps)).sqrt().recip();
                (x * &inv_rms).try_mul(weight)?
            }
        })
    }
}

/// The feed-forward part of a block.
#[derive(Clone, Debug)]
pub enum Mlp {
    /// `proj(gelu_tanh(fc(x)))` (GPT-2).
    Gelu {
        /// `(d, ffn)`.
        fc: Linear,
        /// `(ffn, d)`.
        proj: Linear,
    },
    /// `down(silu(gate(x)) * up(x))` (Llama), gate and up as one `(d, 2 ffn)` product.
    SwiGlu {
        /// `(d, 2 ffn)`: gate, then up.
        gate_up: Linear,
        /// `(ffn, d)`.
        down: Linear,
        /// `ffn`.
        width: usize,
    },
}

impl Mlp {
    /// The MLP of `x`.
    ///
    /// # Errors
    ///
    /// A shape error of its products.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        self.forward_as(x, Activations::F32)
    }

    /// [`Mlp::forward`] with the activations of its products held as `activations` says.
    ///
    /// # Errors
    ///
    /// A shape error of its products.
    pub fn forward_as(&self, x: &Tensor, activations: Activations) -> Result<Tensor, ModelError> {
        match self {
            Mlp::Gelu { fc, proj } => {
                proj.forward_as(&fc.forward_as(x, activations)?.gelu_tanh(), activations)
            }
            Mlp::SwiGlu { gate_up, down, width } => {
                let h = gate_up.forward_as(x, activations)?;
                let (gate, up) = (h.try_slice(-1, 0, *width)?, h.try_slice(-1, *width, 2 * width)?);
                down.forward_as(&(gate.silu() * up), activations)
            }
        }
    }
}

/// The rotary frequencies `theta^(-2i / head_dim)` of the first half of a head, in f32 as the
/// reference computes them (as are the angles and their cos and sin after them).
pub(crate) fn rotary_frequencies(head_dim: usize, theta: f32) -> Vec<f32> {
    (0..head_dim / 2).map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32)).collect()
}

/// Rotates the heads that lead each row in place by the row's position (the Llama / GPT-NeoX
/// form: the two halves of each head, `x1 cos - x2 sin` and `x2 cos + x1 sin`, with
/// frequencies `theta^(-2i / head_dim)`). `rows` holds `tokens` rows `stride` elements apart,
/// the first at position `first`, each starting with `heads` heads of `head_dim` (q's, or q's
/// and k's side by side) that are rotated; the rest of a row is left as it is.
pub(crate) fn rotate(
    rows: &mut [f32],
    stride: usize,
    (heads, head_dim): (usize, usize),
    first: usize,
    theta: f32,
) {
    let half = head_dim / 2;
    let inv_freq = rotary_frequencies(head_dim, theta);
    for (t, row) in rows.chunks_mut(stride).enumerate() {
        let position = (first + t) as f32;
        let (cos, sin): (Vec<f32>, Vec<f32>) =
            inv_freq.iter().map(|f| (position * f).sin_cos()).map(|(s, c)| (c, s)).unzip();
        for head in row[..heads * head_dim].chunks_mut(head_dim) {
            let (x1, x2) = head.split_at_mut(half);
            for i in 0..half {
                let (a, b) = (x1[i], x2[i]);
                x1[i] = a * cos[i] - b * sin[i];
                x2[i] = b * cos[i] + a * sin[i];
            }
        }
    }
}

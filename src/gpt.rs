//! A GPT-2 transformer block written with the Tensor API: pre-LayerNorm, a fused QKV
//! projection, causal attention through [`scaled_dot_product_attention`], a GELU (tanh) MLP and
//! residuals ([`Tensor::gelu_tanh`], [`Tensor::layer_norm`]); plus an f64 reference of its forward pass to check it against.
//!
//! ```rust
//! use uopc::gpt::{GptBlock, GptConfig};
//! use uopc::Tensor;
//!
//! let config = GptConfig { d_model: 32, heads: 4, hidden: 64, eps: 1e-5 };
//! let block = GptBlock::random(config, 1)?;
//! let x = Tensor::full(&[2, 8, 32], 0.5);
//! let y = block.forward(&x)?;
//! assert_eq!(y.shape(), &[2, 8, 32]);
//! # Ok::<(), uopc::gpt::GptError>(())
//! ```

use ndarray::{Array1, Array2, ArrayD, IxDyn};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use uopc_kernels::sdpa::{SdpaError, scaled_dot_product_attention};
use uopc_tensor::{MAX_ELEMENTS, Tensor, TensorError};

/// Sizes of a block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptConfig {
    /// Width of the residual stream.
    pub d_model: usize,
    /// Attention heads; `d_model` must be a multiple of it.
    pub heads: usize,
    /// Width of the MLP's hidden layer (4 x `d_model` in GPT-2).
    pub hidden: usize,
    /// The LayerNorm epsilon.
    pub eps: f32,
}

impl GptConfig {
    /// GPT-2 small: d_model 768, 12 heads, hidden 3072, eps 1e-5.
    pub fn gpt2_small() -> GptConfig {
        GptConfig { d_model: 768, heads: 12, hidden: 3072, eps: 1e-5 }
    }

    /// Whether a block of these sizes can be built: `d_model` a positive multiple of
    /// `heads`, `hidden` positive, `eps` finite and not negative, and the largest weight
    /// matrix (`d_model x 3 d_model`, `d_model x hidden`) within the tensor size limit.
    ///
    /// # Errors
    ///
    /// [`GptError::Shape`] naming the first field at fault.
    pub fn validate(&self) -> Result<(), GptError> {
        let GptConfig { d_model: c, heads, hidden, eps } = *self;
        if heads == 0 || c == 0 || !c.is_multiple_of(heads) {
            return Err(GptError::Shape(format!(
                "d_model ({c}) must be a positive multiple of heads ({heads})"
            )));
        }
        if hidden == 0 {
            return Err(GptError::Shape("hidden must be positive".into()));
        }
        if !eps.is_finite() || eps < 0.0 {
            return Err(GptError::Shape(format!("eps ({eps}) must be a finite number >= 0")));
        }
        let fits = |rows: usize, cols: usize| rows.checked_mul(cols).is_some_and(|n| n <= MAX_ELEMENTS);
        if !c.checked_mul(3).is_some_and(|c3| fits(c, c3)) || !fits(c, hidden) {
            return Err(GptError::Shape(format!(
                "d_model ({c}) and hidden ({hidden}) make a weight matrix of more than 2^40 elements"
            )));
        }
        Ok(())
    }
}

/// Why a block could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum GptError {
    /// The configuration or the input does not fit.
    #[error("gpt: {0}")]
    Shape(String),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// The attention node refused its arguments.
    #[error(transparent)]
    Attention(#[from] SdpaError),
}

/// `y = x W + b` with `W` stored `(in, out)`.
#[derive(Clone, Debug)]
pub struct Linear {
    /// `(in, out)`.
    pub weight: Tensor,
    /// `(out,)`.
    pub bias: Tensor,
}

impl Linear {
    /// `x W + b` for `x` of shape `(rows, in)`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, GptError> {
        Ok(x.try_matmul(&self.weight)?.try_add(&self.bias)?)
    }
}

/// A LayerNorm's scale and shift over the last axis.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// `(d_model,)`.
    pub weight: Tensor,
    /// `(d_model,)`.
    pub bias: Tensor,
}

impl LayerNorm {
    /// `(x - mean) / sqrt(var + eps) * weight + bias` over the last axis (biased variance), as
    /// [`Tensor::try_layer_norm`].
    pub fn forward(&self, x: &Tensor, eps: f32) -> Result<Tensor, GptError> {
        Ok(x.try_layer_norm(Some(&self.weight), Some(&self.bias), f64::from(eps))?)
    }
}

/// One pre-LayerNorm transformer block.
#[derive(Clone, Debug)]
pub struct GptBlock {
    /// Its sizes.
    pub config: GptConfig,
    /// The LayerNorm before attention.
    pub ln1: LayerNorm,
    /// The fused Q, K, V projection: `d_model -> 3 d_model`, Q first.
    pub qkv: Linear,
    /// The attention output projection.
    pub attn_out: Linear,
    /// The LayerNorm before the MLP.
    pub ln2: LayerNorm,
    /// The MLP's first layer, `d_model -> hidden`.
    pub fc: Linear,
    /// The MLP's second layer, `hidden -> d_model`.
    pub proj: Linear,
}

/// A tensor of `shape` drawn from N(0, `std`^2) by `rng` (standard normals scaled by `std`),
/// for seeded initializations.
pub fn normal(shape: &[usize], std: f32, rng: &mut StdRng) -> Tensor {
    let n: usize = shape.iter().product();
    let z = rng.sample_iter(rand_distr::StandardNormal).take(n);
    Tensor::from_vec(z.map(|z: f32| std * z).collect(), shape)
}

impl GptBlock {
    /// A block with GPT-2's initialization (weights N(0, 0.02), biases 0, LayerNorm scale 1 and
    /// shift 0), seeded: the same config and seed give the same block.
    ///
    /// ```rust
    /// use uopc::gpt::{GptBlock, GptConfig, GptError};
    /// let config = GptConfig { d_model: 32, heads: 4, hidden: 64, eps: 1e-5 };
    /// let block = GptBlock::random(config, 1)?;
    /// assert_eq!(block.params().len(), 12);
    /// let err = GptBlock::random(GptConfig { heads: 3, ..config }, 1).unwrap_err();
    /// assert_eq!(err.to_string(), "gpt: d_model (32) must be a positive multiple of heads (3)");
    /// # Ok::<(), GptError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`GptError::Shape`] naming the field at fault when `d_model` is not a positive multiple
    /// of `heads`, `hidden` is 0, `eps` is not a finite number at least 0, or a weight matrix
    /// would hold more than 2^40 elements; nothing is allocated then.
    pub fn random(config: GptConfig, seed: u64) -> Result<GptBlock, GptError> {
        config.validate()?;
        let GptConfig { d_model: c, hidden, .. } = config;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut linear = |i: usize, o: usize| Linear {
            weight: normal(&[i, o], 0.02, &mut rng),
            bias: Tensor::full(&[o], 0.0),
        };
        let (qkv, attn_out, fc, proj) =
            (linear(c, 3 * c), linear(c, c), linear(c, hidden), linear(hidden, c));
        let ln = || LayerNorm { weight: Tensor::full(&[c], 1.0), bias: Tensor::full(&[c], 0.0) };
        Ok(GptBlock { config, ln1: ln(), qkv, attn_out, ln2: ln(), fc, proj })
    }

    /// Every parameter, in a fixed order: ln1 (weight, bias), qkv, attn_out, ln2, fc, proj.
    pub fn params(&self) -> Vec<&Tensor> {
        let mut p = Vec::with_capacity(12);
        for (w, b) in [
            (&self.ln1.weight, &self.ln1.bias),
            (&self.qkv.weight, &self.qkv.bias),
            (&self.attn_out.weight, &self.attn_out.bias),
            (&self.ln2.weight, &self.ln2.bias),
            (&self.fc.weight, &self.fc.bias),
            (&self.proj.weight, &self.proj.bias),
        ] {
            p.push(w);
            p.push(b);
        }
        p
    }

    /// The same block with each parameter replaced by `f(parameter, its index in
    /// [`GptBlock::params`])`: an optimizer step.
    pub fn map_params(&self, mut f: impl FnMut(&Tensor, usize) -> Tensor) -> GptBlock {
        let mut new =
            self.params().into_iter().enumerate().map(|(k, p)| f(p, k)).collect::<Vec<_>>().into_iter();
        let mut next = || new.next().expect("params() lists twelve tensors");
        let ln1 = LayerNorm { weight: next(), bias: next() };
        let qkv = Linear { weight: next(), bias: next() };
        let attn_out = Linear { weight: next(), bias: next() };
        let ln2 = LayerNorm { weight: next(), bias: next() };
        let fc = Linear { weight: next(), bias: next() };
        let proj = Linear { weight: next(), bias: next() };
        GptBlock { config: self.config, ln1, qkv, attn_out, ln2, fc, proj }
    }

    /// The block on `x` of shape `(batch, tokens, d_model)`; token `t` attends to tokens `<= t`.
    ///
    /// # Errors
    ///
    /// [`GptError::Shape`] when `x` is not `(batch, tokens, d_model)` or `d_model` is not a
    /// multiple of `heads`; the errors of the tensor and attention operations.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, GptError> {
        let GptConfig { d_model: c, heads, eps, .. } = self.config;
        let [b, t, width] = *x.shape() else {
            return Err(GptError::Shape(format!(
                "x has shape {:?}; expected (batch, tokens, d_model)",
                x.shape()
            )));
        };
        if width != c || heads == 0 || !c.is_multiple_of(heads) {
            return Err(GptError::Shape(format!(
                "x has width {width} for d_model {c} and {heads} heads (d_model must be a multiple of heads)"
            )));
        }
        let d = c / heads;
        let rows = x.try_reshape(&[b * t, c])?;
        let h = self.ln1.forward(&rows, eps)?;
        // (b t, 3 c) -> (3, b, heads, t, d): Q, K and V as strided views of one product.
        let qkv = self.qkv.forward(&h)?.try_reshape(&[b, t, 3, heads, d])?.try_permute(&[2, 0, 3, 1, 4])?;
        let part = |i: usize| -> Result<Tensor, TensorError> {
            qkv.try_slice(0, i, i + 1)?.try_reshape(&[b, heads, t, d])
        };
        let attn = scaled_dot_product_attention(&part(0)?, &part(1)?, &part(2)?, None, true, None)?;
        let merged = attn.try_permute(&[0, 2, 1, 3])?.try_reshape(&[b * t, c])?;
        let x1 = rows.try_add(&self.attn_out.forward(&merged)?)?;
        let hidden = self.fc.forward(&self.ln2.forward(&x1, eps)?)?.gelu_tanh();
        let out = x1.try_add(&self.proj.forward(&hidden)?)?;
        Ok(out.try_reshape(&[b, t, c])?)
    }
}

fn f64_array(t: &Tensor) -> Result<ArrayD<f64>, GptError> {
    Ok(t.to_ndarray::<f32>()?.mapv(f64::from))
}

fn matrix(t: &Tensor) -> Result<Array2<f64>, GptError> {
    f64_array(t)?.into_dimensionality().map_err(|e| GptError::Shape(format!("expected a matrix: {e}")))
}

fn vector(t: &Tensor) -> Result<Array1<f64>, GptError> {
    f64_array(t)?.into_dimensionality().map_err(|e| GptError::Shape(format!("expected a vector: {e}")))
}

fn layer_norm_f64(x: &Array2<f64>, ln: &LayerNorm, eps: f64) -> Result<Array2<f64>, GptError> {
    let (w, b) = (vector(&ln.weight)?, vector(&ln.bias)?);
    let mut y = x.clone();
    for mut row in y.rows_mut() {
        let mean = row.mean().unwrap_or(0.0);
        let var = row.mapv(|v| (v - mean).powi(2)).mean().unwrap_or(0.0);
        let inv = 1.0 / (var + eps).sqrt();
        row.mapv_inplace(|v| (v - mean) * inv);
        row *= &w;
        row += &b;
    }
    Ok(y)
}

fn linear_f64(x: &Array2<f64>, l: &Linear) -> Result<Array2<f64>, GptError> {
    Ok(x.dot(&matrix(&l.weight)?) + &vector(&l.bias)?)
}

/// The block's forward pass in f64 with plain loops and ndarray products, written
/// independently of the Tensor graph (tanh from the standard library, attention as an explicit
/// causal softmax), for checking [`GptBlock::forward`]. `x` is `(batch, tokens, d_model)`.
///
/// # Errors
///
/// [`GptError::Shape`] when `x` does not fit the block; a tensor error when a parameter cannot
/// be read.
pub fn reference_forward_f64(block: &GptBlock, x: &ArrayD<f32>) -> Result<ArrayD<f64>, GptError> {
    let GptConfig { d_model: c, heads, eps, .. } = block.config;
    let &[b, t, width] = x.shape() else {
        return Err(GptError::Shape(format!(
            "x has shape {:?}; expected (batch, tokens, d_model)",
            x.shape()
        )));
    };
    if width != c || heads == 0 || !c.is_multiple_of(heads) {
        return Err(GptError::Shape(format!("x has width {width} for d_model {c} and {heads} heads")));
    }
    let d = c / heads;
    let rows: Array2<f64> =
        x.mapv(f64::from).into_shape_with_order((b * t, c)).map_err(|e| GptError::Shape(e.to_string()))?;
    let qkv = linear_f64(&layer_norm_f64(&rows, &block.ln1, eps as f64)?, &block.qkv)?;
    let mut merged = Array2::<f64>::zeros((b * t, c));
    let scale = 1.0 / (d as f64).sqrt();
    for item in 0..b {
        for h in 0..heads {
            let at = |token: usize, part: usize, j: usize| qkv[[item * t + token, part * c + h * d + j]];
            for i in 0..t {
                let scores: Vec<f64> = (0..=i)
                    .map(|key| (0..d).map(|j| at(i, 0, j) * at(key, 1, j)).sum::<f64>() * scale)
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for j in 0..d {
                    merged[[item * t + i, h * d + j]] =
                        weights.iter().enumerate().map(|(key, w)| w * at(key, 2, j)).sum::<f64>() / total;
                }
            }
        }
    }
    let x1 = &rows + &linear_f64(&merged, &block.attn_out)?;
    let mut hidden = linear_f64(&layer_norm_f64(&x1, &block.ln2, eps as f64)?, &block.fc)?;
    let k = (2.0 / std::f64::consts::PI).sqrt();
    hidden.mapv_inplace(|v| 0.5 * v * (1.0 + (k * (v + 0.044715 * v.powi(3))).tanh()));
    let out = &x1 + &linear_f64(&hidden, &block.proj)?;
    out.into_shape_with_order(IxDyn(&[b, t, c])).map_err(|e| GptError::Shape(e.to_string()))
}

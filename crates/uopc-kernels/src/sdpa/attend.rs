//! Attention as a tensor op with named options: `q.sdpa(&k, &v).causal().run()?`, the builder
//! form of [`scaled_dot_product_attention`] returning [`TensorError`] like every other op.

use super::{AttentionMods, SdpaError, flex_attention, scaled_dot_product_attention};
use uopc_tensor::{Tensor, TensorError};

/// One attention call being described: `softmax(scale * q k^T + mask) v` over lazy tensors,
/// with the causal limit, a mask and the scale named. Nothing is built until
/// [`Attention::run`].
///
/// ```rust
/// use uopc_kernels::sdpa::AttentionOp;
/// use uopc_tensor::Tensor;
/// let q = Tensor::randn(&[2, 4, 16, 8], 1); // (batch, heads, tokens, head dim)
/// let (k, v) = (Tensor::randn(&[2, 4, 16, 8], 2), Tensor::randn(&[2, 4, 16, 8], 3));
/// let o = q.sdpa(&k, &v).causal().scale(0.25).run()?;
/// assert_eq!(o.shape(), &[2, 4, 16, 8]);
/// // Each error names the op and the argument.
/// let err = q.sdpa(&k, &Tensor::randn(&[2, 4, 15, 8], 4)).run().unwrap_err();
/// assert!(err.to_string().starts_with("sdpa: `v`"), "{err}");
/// # Ok::<(), uopc_tensor::TensorError>(())
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use = "an attention call is built by `run`"]
pub struct Attention<'a> {
    q: &'a Tensor,
    k: &'a Tensor,
    v: &'a Tensor,
    mask: Option<&'a Tensor>,
    causal: bool,
    scale: Option<f32>,
    mods: Option<(&'a AttentionMods, &'a [&'a Tensor])>,
}

impl<'a> Attention<'a> {
    /// Attention of `q` `(.., H, n_q, D)` over `k` and `v` `(.., H_kv, n_k, D)`, unmasked,
    /// with scale `1 / sqrt(D)`; shapes and dtypes as [`scaled_dot_product_attention`] takes.
    pub fn new(q: &'a Tensor, k: &'a Tensor, v: &'a Tensor) -> Attention<'a> {
        Attention { q, k, v, mask: None, causal: false, scale: None, mods: None }
    }

    /// Each query sees the keys up to its own position, aligned to the end of the keys
    /// (query `i` sees keys `j <= i + n_k - n_q`).
    pub fn causal(self) -> Attention<'a> {
        Attention { causal: true, ..self }
    }

    /// A bool mask (`true` = attend) or an f32 additive bias, broadcast to `(.., H, n_q, n_k)`.
    pub fn mask(self, mask: &'a Tensor) -> Attention<'a> {
        Attention { mask: Some(mask), ..self }
    }

    /// The factor on the scores, in place of `1 / sqrt(D)`.
    pub fn scale(self, scale: f32) -> Attention<'a> {
        Attention { scale: Some(scale), ..self }
    }

    /// A score function, a mask function and sinks compiled into the kernel (see
    /// [`flex_attention`]), reading `captures`: one tensor per [`AttentionMods::capture`], in
    /// declaration order. A mask is then written in the mask function, not given by
    /// [`Attention::mask`].
    ///
    /// ```rust
    /// use uopc_ir::DType;
    /// use uopc_kernels::sdpa::{AttentionMods, AttentionOp};
    /// use uopc_tensor::Tensor;
    /// let q = Tensor::randn(&[1, 2, 16, 8], 1);
    /// let (k, v) = (Tensor::randn(&[1, 2, 16, 8], 2), Tensor::randn(&[1, 2, 16, 8], 3));
    /// // ALiBi over a sliding window of 4 keys, with one slope per head.
    /// let mut mods = AttentionMods::new();
    /// let slope = mods.capture("slopes", &[2], DType::F32);
    /// let mods = mods
    ///     .score(move |x, s| s + x.load(slope, &[x.h.clone()]) * (&x.kv - &x.q).cast(DType::F32))
    ///     .mask(|x| (&x.q - &x.kv).lt(4));
    /// let slopes = Tensor::from_vec(vec![-0.5f32, -0.25], &[2]);
    /// let o = q.sdpa(&k, &v).causal().mods(&mods, &[&slopes]).run()?;
    /// let loss = o.try_reshape(&[256])?.try_sum(0, false)?;
    /// let grads = loss.gradient(&[&q, &slopes])?;
    /// assert_eq!(grads[1].shape(), &[2]);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn mods(self, mods: &'a AttentionMods, captures: &'a [&'a Tensor]) -> Attention<'a> {
        Attention { mods: Some((mods, captures)), ..self }
    }

    /// The attention output, shaped and typed as `q`: one kernel node of the graph, with its
    /// gradient.
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`] or [`TensorError::DType`] naming `sdpa` and the argument that
    /// does not fit.
    pub fn run(self) -> Result<Tensor, TensorError> {
        if let Some((mods, captures)) = self.mods {
            if self.mask.is_some() {
                return Err(TensorError::Shape {
                    op: "sdpa",
                    msg: "`mask`: with mods, the mask is written in the mask function".into(),
                });
            }
            return flex_attention(self.q, self.k, self.v, mods, captures, self.causal, self.scale)
                .map_err(TensorError::from);
        }
        scaled_dot_product_attention(self.q, self.k, self.v, self.mask, self.causal, self.scale)
            .map_err(TensorError::from)
    }
}

/// `sdpa` as a method of [`Tensor`]: `q.sdpa(&k, &v)` starts an [`Attention`].
pub trait AttentionOp {
    /// Attention of this tensor's queries over `k` and `v` (see [`Attention::new`]).
    fn sdpa<'a>(&'a self, k: &'a Tensor, v: &'a Tensor) -> Attention<'a>;
}

impl AttentionOp for Tensor {
    fn sdpa<'a>(&'a self, k: &'a Tensor, v: &'a Tensor) -> Attention<'a> {
        Attention::new(self, k, v)
    }
}

impl From<SdpaError> for TensorError {
    /// The same fault as a tensor op's error naming `sdpa`: argument faults as shape or dtype
    /// errors (the message keeps the argument's name), the JIT's as a backend error.
    fn from(e: SdpaError) -> TensorError {
        match e {
            SdpaError::Jit(source) => TensorError::Backend { kernel: "sdpa".into(), source },
            SdpaError::DType { .. } => TensorError::DType { op: "sdpa", msg: message(&e) },
            other => TensorError::Shape { op: "sdpa", msg: message(&other) },
        }
    }
}

/// `e`'s message without the `sdpa: ` its display starts with (the tensor error adds it).
fn message(e: &SdpaError) -> String {
    let text = e.to_string();
    text.strip_prefix("sdpa: ").map(str::to_string).unwrap_or(text)
}

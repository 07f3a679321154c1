//! The configuration of a compiled attention: sizes, layout, mask, dtype, and its validation.

use super::{SdpaDType, SdpaError};

/// How q, k, v and the output are laid out in memory; the head dimension is always contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Layout {
    /// `(batch, head, row, d)`, contiguous.
    #[default]
    Bhnd,
    /// `(batch, row, head, d)`, contiguous: what splitting a fused QKV projection's output by
    /// heads gives, read in place (the row stride is `heads * d`).
    Bnhd,
}

impl Layout {
    /// Element strides `[batch, head, row]` of a tensor with `heads` heads of `rows` rows of `d`.
    pub fn strides(self, heads: usize, rows: usize, d: usize) -> [usize; 3] {
        match self {
            Layout::Bhnd => [heads * rows * d, rows * d, d],
            Layout::Bnhd => [rows * heads * d, d, heads * d],
        }
    }
}

/// An optional mask over `(B, H, n_q, n_k)`, given with its own shape: each of the four
/// dimensions is either the full size or 1 (broadcast along that axis).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MaskKind {
    /// No mask.
    #[default]
    None,
    /// A bool mask of this shape, row-major; `true` = attend.
    Bool([usize; 4]),
    /// An additive f32 bias of this shape, row-major, added to the scaled scores (ALiBi,
    /// relative positions); `-inf` masks a key.
    Bias([usize; 4]),
}

/// Everything that selects a compiled attention program.
#[derive(Clone, Copy, Debug, Default)]
pub struct SdpaConfig {
    /// Batch items.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads; must divide `heads`.
    pub kv_heads: usize,
    /// Query rows per head.
    pub n_q: usize,
    /// Key (and value) rows per head.
    pub n_k: usize,
    /// Head dimension.
    pub d: usize,
    /// The causal mask, aligned to the end of the keys (see the [module docs](super)).
    pub causal: bool,
    /// Score scale; `None` is `1 / sqrt(d)`.
    pub scale: Option<f32>,
    /// Memory layout of q, k, v and the output.
    pub layout: Layout,
    /// The mask or bias, if any.
    pub mask: MaskKind,
    /// Whether `run` takes per-batch key lengths: item `b` attends keys `j < len[b]` only.
    pub key_lengths: bool,
    /// Whether `n_k` is a capacity and `run` takes the current KV length `L` (`0..=n_k`, the
    /// keys `0..L` of each head are attended, the causal mask aligns queries to `L`): one
    /// compiled program serves a KV cache at every length.
    pub runtime_kv_length: bool,
    /// The element type of q, k, v and the output (f32 by default).
    pub dtype: SdpaDType,
}

impl SdpaConfig {
    /// A multi-head configuration without masks: `heads` query and key/value heads, BHND.
    pub fn new(batch: usize, heads: usize, n_q: usize, n_k: usize, d: usize) -> Self {
        SdpaConfig { batch, heads, kv_heads: heads, n_q, n_k, d, ..SdpaConfig::default() }
    }

    /// The scale actually applied to `q · k`.
    pub fn effective_scale(&self) -> f32 {
        self.scale.unwrap_or((1.0 / (self.d as f64).sqrt()) as f32)
    }

    /// Elements of q (and of the output); `usize::MAX` when the product overflows, which
    /// [`SdpaConfig::validate`] rejects (a wrapped length could match a slice).
    pub fn q_len(&self) -> usize {
        [self.batch, self.heads, self.n_q, self.d].iter().fold(1, |n: usize, &s| n.saturating_mul(s))
    }

    /// Elements of k (and of v); `usize::MAX` when the product overflows, as
    /// [`SdpaConfig::q_len`].
    pub fn kv_len(&self) -> usize {
        [self.batch, self.kv_heads, self.n_k, self.d].iter().fold(1, |n: usize, &s| n.saturating_mul(s))
    }

    /// How far keys run ahead of queries under the causal mask: query `i` sees `j <= i + offset`.
    pub fn causal_offset(&self) -> i64 {
        self.n_k as i64 - self.n_q as i64
    }

    /// The full extents `(B, H, n_q, n_k)` a mask broadcasts against.
    fn mask_dims(&self) -> [usize; 4] {
        [self.batch, self.heads, self.n_q, self.n_k]
    }

    /// Row-major element strides of a mask of `shape`, 0 on broadcast axes.
    pub(super) fn mask_strides(shape: [usize; 4]) -> [usize; 4] {
        let mut strides = [0; 4];
        let mut acc = 1;
        for a in (0..4).rev() {
            strides[a] = if shape[a] == 1 { 0 } else { acc };
            acc *= shape[a];
        }
        strides
    }

    /// The configuration's own consistency: sizes (each tensor at most 2^40 elements), head
    /// grouping, mask shape.
    pub fn validate(&self) -> Result<(), SdpaError> {
        for (what, v) in [
            ("batch", self.batch),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("n_q", self.n_q),
            ("n_k", self.n_k),
            ("d", self.d),
        ] {
            if v == 0 {
                return Err(SdpaError::Empty { what });
            }
        }
        // Every length and index the kernels compute is a product of these sizes: bounding
        // each tensor's element count bounds them all.
        let (b, d) = (self.batch, self.d);
        check_elements("q", &[("batch", b), ("heads", self.heads), ("n_q", self.n_q), ("d", d)])?;
        check_elements("k", &[("batch", b), ("kv_heads", self.kv_heads), ("n_k", self.n_k), ("d", d)])?;
        if let MaskKind::Bool(shape) | MaskKind::Bias(shape) = self.mask {
            check_elements("mask", &shape.map(|s| ("mask", s)))?;
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(SdpaError::HeadGrouping { heads: self.heads, kv_heads: self.kv_heads });
        }
        if let MaskKind::Bool(shape) | MaskKind::Bias(shape) = self.mask {
            let full = self.mask_dims();
            for axis in 0..4 {
                if shape[axis] != 1 && shape[axis] != full[axis] {
                    return Err(SdpaError::MaskShape { axis, got: shape[axis], full: full[axis] });
                }
            }
        }
        if let Some(s) = self.scale
            && !s.is_finite()
        {
            return Err(SdpaError::Scale(s));
        }
        Ok(())
    }

    /// The fields as a hashable key (the scale by its bits).
    pub(super) fn key(&self) -> impl std::hash::Hash + Eq + use<> {
        let s = *self;
        (
            [s.batch, s.heads, s.kv_heads, s.n_q, s.n_k, s.d],
            (s.causal, s.key_lengths, s.runtime_kv_length),
            s.scale.map(f32::to_bits),
            s.layout,
            s.mask,
            s.dtype,
        )
    }
}

/// The most elements one tensor of a configuration may hold.
const MAX_ELEMENTS: usize = 1 << 40;

/// Whether the product of `sizes` stays within [`MAX_ELEMENTS`]; if not, the error names the
/// field at which it first passes the limit.
fn check_elements(tensor: &'static str, sizes: &[(&'static str, usize)]) -> Result<(), SdpaError> {
    let mut n: usize = 1;
    for &(what, s) in sizes {
        n = n.checked_mul(s).filter(|&n| n <= MAX_ELEMENTS).ok_or(SdpaError::TooLarge { what, tensor })?;
    }
    Ok(())
}

/// The shape as the compiled attentions print it: `B=.. H=.. H_kv=.. n_q=.. n_k=.. D=..`, then
/// the dtype unless f32 and `causal` when causal.
impl std::fmt::Display for SdpaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self;
        write!(f, "B={} H={} H_kv={} n_q={} n_k={} D={}", c.batch, c.heads, c.kv_heads, c.n_q, c.n_k, c.d)?;
        if c.dtype != SdpaDType::F32 {
            write!(f, " {}", c.dtype)?;
        }
        if c.causal {
            write!(f, " causal")?;
        }
        Ok(())
    }
}

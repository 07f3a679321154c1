//! Scaled dot-product attention for the shapes models run, through one entry point:
//! [`Sdpa::compile`] for a [`SdpaConfig`], then [`Sdpa::run`] any number of times from any
//! thread, or [`attention`], which compiles each configuration once per process.
//!
//! q is `(B, H, n_q, D)`, k and v are `(B, H_kv, n_k, D)` with `H % H_kv == 0`: query head `h`
//! reads key/value head `h / (H / H_kv)` (multi-head, grouped-query and multi-query attention
//! by index arithmetic, never by copying K or V). The output has q's shape and layout.
//!
//! **Causal convention**: queries are aligned to the end of the keys, so query `i` sees keys
//! `j <= i + n_k - n_q` (the KV-cache convention; with `n_q = n_k` this is `j <= i`). A query
//! row that sees no key at all (under any combination of masks) gives zeros, never NaN. A NaN in
//! a key or value that a row sees makes that row NaN, as in an exact softmax.
//!
//! The kernel is FlashAttention-2 on tile ops (see [`sdpa_ir`]); [`reference_f64`] is the f64
//! attention it is checked against.
//!
//! **16-bit inputs**: with [`SdpaConfig::dtype`] `BF16` or `F16`, q, k, v and the output are
//! `half::bf16` or `half::f16` ([`Sdpa::run`] is generic over the element type, and
//! [`Sdpa::run_values`] checks each argument's); both GEMMs run on the 16-bit tile GEMMs with
//! f32 sums, the softmax in f32, the probabilities rounded once to the input type for `P · V`
//! and the output once at the end (see [`SdpaDType`] for the error this costs). Masks, bias
//! and key lengths are as for f32. Their backward, [`SdpaBackwardHalf`], runs the f32 one on
//! the widened inputs and rounds the gradients to the input type.
//!
//! [`SdpaBackward`] is its FlashAttention-2 backward (a forward that also saves the per-row
//! log-sum-exp, then dQ, dK and dV, and the bias's gradient when asked for, on tile ops),
//! checked against [`reference_backward_f64`].

mod backward;
mod backward_half;
mod backward_reference;
mod kernel;
mod merge;
mod reference;
mod tensor;

pub use backward::{
    BackwardBlocking, ForwardSaved, SdpaBackward, compiled_backward, sdpa_backward_ir,
    sdpa_backward_ir_with_bias_grad,
};
pub use backward_half::SdpaBackwardHalf;
pub use backward_reference::reference_backward_f64;
use kernel::cores;
pub use kernel::{Blocking, sdpa_ir, sdpa_ir_with_lse};
pub use merge::sdpa_merge_ir;
pub use reference::reference_f64;
pub use tensor::scaled_dot_product_attention;

use half::{bf16, f16};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use thiserror::Error;
use uopc_ir::DType;
use uopc_jit::{Arg, BufRef, JitError, Program};

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

/// The element type of q, k, v and the output (masks, biases, key lengths and the split-K
/// partial states are the same for every one).
///
/// With `BF16` or `F16` both GEMMs of a key block run on 16-bit tile GEMMs with f32
/// accumulation (q and k read as stored, f32 scores; the probabilities rounded to the input
/// dtype in the softmax step's pass, then multiplied with v in place), the softmax is computed
/// in f32 and the output is rounded once at the end. `F16` rounds P to f16 as `BF16` rounds
/// it to bf16: the f16 GEMM takes both operands in one dtype, and f16's 11 significant bits
/// keep each weight within 2^-11 of itself, a quarter of the error that f16 storage of v
/// already carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum SdpaDType {
    /// 32-bit floats.
    #[default]
    F32,
    /// bfloat16 (8 significant bits, f32's exponent range).
    BF16,
    /// IEEE half precision (11 significant bits, largest finite value 65504).
    F16,
}

impl SdpaDType {
    /// The IR dtype of the buffers.
    pub fn dtype(self) -> DType {
        match self {
            SdpaDType::F32 => DType::F32,
            SdpaDType::BF16 => DType::BF16,
            SdpaDType::F16 => DType::F16,
        }
    }

    /// A short lowercase name (`"f32"`, `"bf16"`, `"f16"`).
    pub fn name(self) -> &'static str {
        match self {
            SdpaDType::F32 => "f32",
            SdpaDType::BF16 => "bf16",
            SdpaDType::F16 => "f16",
        }
    }
}

impl fmt::Display for SdpaDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// The read-only values of one argument of [`Sdpa::run_values`], in any of the supported
/// element types (the run checks it against the configuration's).
#[derive(Clone, Copy, Debug)]
pub enum Values<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// bf16 values.
    BF16(&'a [bf16]),
    /// f16 values.
    F16(&'a [f16]),
}

/// The writable output of [`Sdpa::run_values`].
#[derive(Debug)]
pub enum ValuesMut<'a> {
    /// f32 values.
    F32(&'a mut [f32]),
    /// bf16 values.
    BF16(&'a mut [bf16]),
    /// f16 values.
    F16(&'a mut [f16]),
}

impl<'a> Values<'a> {
    fn dtype(&self) -> SdpaDType {
        match self {
            Values::F32(_) => SdpaDType::F32,
            Values::BF16(_) => SdpaDType::BF16,
            Values::F16(_) => SdpaDType::F16,
        }
    }

    fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::BF16(v) => v.len(),
            Values::F16(v) => v.len(),
        }
    }

    fn arg(self) -> Arg<'a> {
        match self {
            Values::F32(v) => v.into(),
            Values::BF16(v) => v.into(),
            Values::F16(v) => v.into(),
        }
    }
}

impl ValuesMut<'_> {
    fn dtype(&self) -> SdpaDType {
        match self {
            ValuesMut::F32(_) => SdpaDType::F32,
            ValuesMut::BF16(_) => SdpaDType::BF16,
            ValuesMut::F16(_) => SdpaDType::F16,
        }
    }

    fn len(&self) -> usize {
        match self {
            ValuesMut::F32(v) => v.len(),
            ValuesMut::BF16(v) => v.len(),
            ValuesMut::F16(v) => v.len(),
        }
    }

    fn arg(&mut self) -> Arg<'_> {
        match self {
            ValuesMut::F32(v) => Arg::WriteF32(v),
            ValuesMut::BF16(v) => Arg::WriteBF16(v),
            ValuesMut::F16(v) => Arg::WriteF16(v),
        }
    }
}

/// An element type [`Sdpa::run`] takes q, k, v and the output in: `f32`, `bf16` or `f16`
/// (sealed: exactly the [`SdpaDType`]s).
pub trait SdpaElement: Copy + sealed::Sealed {
    /// Its [`SdpaDType`].
    const DTYPE: SdpaDType;
    /// The slice as [`Values`].
    fn values(x: &[Self]) -> Values<'_>;
    /// The slice as [`ValuesMut`].
    fn values_mut(x: &mut [Self]) -> ValuesMut<'_>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

impl SdpaElement for f32 {
    const DTYPE: SdpaDType = SdpaDType::F32;
    fn values(x: &[Self]) -> Values<'_> {
        Values::F32(x)
    }
    fn values_mut(x: &mut [Self]) -> ValuesMut<'_> {
        ValuesMut::F32(x)
    }
}

impl SdpaElement for bf16 {
    const DTYPE: SdpaDType = SdpaDType::BF16;
    fn values(x: &[Self]) -> Values<'_> {
        Values::BF16(x)
    }
    fn values_mut(x: &mut [Self]) -> ValuesMut<'_> {
        ValuesMut::BF16(x)
    }
}

impl SdpaElement for f16 {
    const DTYPE: SdpaDType = SdpaDType::F16;
    fn values(x: &[Self]) -> Values<'_> {
        Values::F16(x)
    }
    fn values_mut(x: &mut [Self]) -> ValuesMut<'_> {
        ValuesMut::F16(x)
    }
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
    /// The causal mask, aligned to the end of the keys (see the module docs).
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

    /// Elements of q (and of the output).
    pub fn q_len(&self) -> usize {
        self.batch * self.heads * self.n_q * self.d
    }

    /// Elements of k (and of v).
    pub fn kv_len(&self) -> usize {
        self.batch * self.kv_heads * self.n_k * self.d
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
    fn mask_strides(shape: [usize; 4]) -> [usize; 4] {
        let mut strides = [0; 4];
        let mut acc = 1;
        for a in (0..4).rev() {
            strides[a] = if shape[a] == 1 { 0 } else { acc };
            acc *= shape[a];
        }
        strides
    }

    /// The configuration's own consistency: sizes, head grouping, mask shape.
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
    fn key(&self) -> impl std::hash::Hash + Eq + use<> {
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

/// What is wrong with a configuration or with the arguments of a run; each names the argument.
#[derive(Debug, Error)]
pub enum SdpaError {
    /// A size is zero.
    #[error("sdpa: `{what}` must be positive")]
    Empty {
        /// The field.
        what: &'static str,
    },
    /// `heads` is not a multiple of `kv_heads`.
    #[error("sdpa: heads ({heads}) must be a multiple of kv_heads ({kv_heads})")]
    HeadGrouping {
        /// Query heads.
        heads: usize,
        /// Key/value heads.
        kv_heads: usize,
    },
    /// A mask dimension is neither 1 nor the full size.
    #[error("sdpa: mask dimension {axis} of (B, H, n_q, n_k) is {got}; it must be 1 or {full}")]
    MaskShape {
        /// Axis 0..4 of `(B, H, n_q, n_k)`.
        axis: usize,
        /// The given size.
        got: usize,
        /// The full size.
        full: usize,
    },
    /// The scale is NaN or infinite.
    #[error("sdpa: scale {0} is not finite")]
    Scale(f32),
    /// An argument's element type is not the configuration's.
    #[error("sdpa: `{arg}` holds {got} values; the configuration's dtype is {expected}")]
    DType {
        /// The argument.
        arg: &'static str,
        /// The configuration's element type.
        expected: SdpaDType,
        /// The argument's.
        got: SdpaDType,
    },
    /// A slice has the wrong length.
    #[error("sdpa: `{arg}` has {got} elements; the configuration needs {expected}")]
    Length {
        /// The argument.
        arg: &'static str,
        /// Its required length.
        expected: usize,
        /// Its length.
        got: usize,
    },
    /// An extra argument is missing or was given although the configuration has no use for it.
    #[error("sdpa: `{arg}` {}", if *.expected { "is required by the configuration" } else { "was given but the configuration has none" })]
    Extra {
        /// The argument.
        arg: &'static str,
        /// Whether the configuration needs it.
        expected: bool,
    },
    /// A key length is negative or above `n_k`.
    #[error("sdpa: key_lengths[{item}] = {len} is outside 0..={n_k}")]
    KeyLength {
        /// Batch item.
        item: usize,
        /// Its length.
        len: i32,
        /// Keys per head.
        n_k: usize,
    },
    /// A tensor argument's shape or dtype does not fit (the tensor entry point).
    #[error("sdpa: `{arg}` {msg}")]
    Shape {
        /// The argument.
        arg: &'static str,
        /// What does not fit.
        msg: String,
    },
    /// The current KV length is above the capacity `n_k`.
    #[error("sdpa: kv_length {len} is above the capacity n_k = {capacity}")]
    KvLength {
        /// The given length.
        len: usize,
        /// The configuration's `n_k`.
        capacity: usize,
    },
    /// The JIT refused the program.
    #[error("sdpa: {0}")]
    Jit(#[from] JitError),
}

/// The optional inputs of [`Sdpa::run`]; which ones must be given follows the configuration.
#[derive(Clone, Copy, Debug, Default)]
pub struct Extras<'a> {
    /// The bool mask, for [`MaskKind::Bool`].
    pub mask: Option<&'a [bool]>,
    /// The additive bias, for [`MaskKind::Bias`].
    pub bias: Option<&'a [f32]>,
    /// `batch` key lengths, when [`SdpaConfig::key_lengths`] is set.
    pub key_lengths: Option<&'a [i32]>,
    /// The current KV length, when [`SdpaConfig::runtime_kv_length`] is set.
    pub kv_length: Option<usize>,
}

/// A compiled attention for one [`SdpaConfig`]; `Sync`, so one compile serves every thread.
#[derive(Debug)]
pub struct Sdpa {
    config: SdpaConfig,
    blocking: Blocking,
    program: Program,
    /// The merge of split-K partial states ([`sdpa_merge_ir`]), when the keys are split.
    merge: Option<Program>,
}

impl Sdpa {
    /// Validates `config`, chooses block sizes for this machine and compiles the kernel. At
    /// `UOPC_DEBUG` level 1 or more it prints its choice (the [`Display`](fmt::Display) line)
    /// and the compile time to stderr.
    pub fn compile(config: &SdpaConfig) -> Result<Sdpa, SdpaError> {
        // Validated first: the block choice divides by the head grouping.
        config.validate()?;
        Self::compile_with(config, Blocking::choose(config, cores()))
    }

    /// [`Sdpa::compile`] with the given block sizes (for experiments and tests; the library's
    /// own choice is [`Blocking::choose`]).
    pub fn compile_with(config: &SdpaConfig, blocking: Blocking) -> Result<Sdpa, SdpaError> {
        config.validate()?;
        let full_blocks = config.n_k / blocking.keys.max(1);
        let valid = blocking.heads_per_task >= 1
            && (config.heads / config.kv_heads).is_multiple_of(blocking.heads_per_task)
            && (1..=config.n_q).contains(&blocking.queries)
            && (1..=config.n_k).contains(&blocking.keys)
            && (blocking.splits == 1
                || (blocking.queries == config.n_q
                    && (2..=full_blocks).contains(&blocking.splits)
                    && blocking.chunk_blocks(config.n_k) * (blocking.splits - 1) < full_blocks));
        if !valid {
            return Err(JitError::Unsupported(format!(
                "sdpa: blocking {blocking:?} does not fit {config:?}"
            ))
            .into());
        }
        let program = Program::compile(&sdpa_ir(config, &blocking), "sdpa_flash_tile_ops")?;
        let merge = if blocking.splits > 1 {
            Some(Program::compile(&sdpa_merge_ir(config, &blocking), "sdpa_split_merge")?)
        } else {
            None
        };
        let sdpa = Sdpa { config: *config, blocking, program, merge };
        if uopc_tensor::debug_level() >= 1 {
            eprintln!("{sdpa}; compiled in {:.1} ms", sdpa.compile_seconds() * 1e3);
        }
        Ok(sdpa)
    }

    /// `out = softmax(scale * q k^T + bias, masked) v`, into the caller's `out` (q's length),
    /// with q, k, v and the output in the configuration's [`SdpaDType`] (`f32`, `bf16` or
    /// `f16`). Every length and the element type are checked, and `extras` must hold exactly
    /// what the configuration needs.
    pub fn run<T: SdpaElement>(
        &self,
        q: &[T],
        k: &[T],
        v: &[T],
        extras: Extras<'_>,
        out: &mut [T],
    ) -> Result<(), SdpaError> {
        self.run_values(T::values(q), T::values(k), T::values(v), extras, T::values_mut(out))
    }

    /// [`Sdpa::run`] with each argument's element type chosen at run time: an argument whose
    /// type is not the configuration's is an [`SdpaError::DType`] naming it.
    pub fn run_values(
        &self,
        q: Values<'_>,
        k: Values<'_>,
        v: Values<'_>,
        extras: Extras<'_>,
        mut out: ValuesMut<'_>,
    ) -> Result<(), SdpaError> {
        let c = &self.config;
        for (arg, got) in [("q", q.dtype()), ("k", k.dtype()), ("v", v.dtype()), ("out", out.dtype())] {
            if got != c.dtype {
                return Err(SdpaError::DType { arg, expected: c.dtype, got });
            }
        }
        check("q", c.q_len(), q.len())?;
        check("k", c.kv_len(), k.len())?;
        check("v", c.kv_len(), v.len())?;
        check("out", c.q_len(), out.len())?;
        let b = &self.blocking;
        // Split-K: the tasks' partial states, merged into `out` after the kernel.
        let states = if self.merge.is_some() { b.tasks(c) * b.heads_per_task * b.queries } else { 0 };
        let (mut part_m, mut part_l, mut part_o) =
            (vec![0.0f32; states], vec![0.0f32; states], vec![0.0f32; states * c.d]);
        let mut args: Vec<Arg<'_>> = if self.merge.is_some() {
            vec![
                q.arg(),
                k.arg(),
                v.arg(),
                Arg::WriteF32(&mut part_o),
                Arg::WriteF32(&mut part_m),
                Arg::WriteF32(&mut part_l),
            ]
        } else {
            vec![q.arg(), k.arg(), v.arg(), out.arg()]
        };
        push_extras(c, extras, &mut args)?;
        if c.runtime_kv_length != extras.kv_length.is_some() {
            return Err(SdpaError::Extra { arg: "kv_length", expected: c.runtime_kv_length });
        }
        if let Some(len) = extras.kv_length
            && len > c.n_k
        {
            return Err(SdpaError::KvLength { len, capacity: c.n_k });
        }
        let vars: Vec<i64> = extras.kv_length.map(|l| l as i64).into_iter().collect();
        self.program.run_with_vars(&mut args, &vars)?;
        drop(args);
        if let Some(merge) = &self.merge {
            merge.run(&mut [(&part_m[..]).into(), (&part_l[..]).into(), (&part_o[..]).into(), out.arg()])?;
        }
        Ok(())
    }

    /// Seconds spent compiling its kernels.
    pub fn compile_seconds(&self) -> f64 {
        self.program.compile_seconds() + self.merge.as_ref().map_or(0.0, Program::compile_seconds)
    }

    /// The merge kernel of split-K attention, when the keys are split.
    pub fn merge_program(&self) -> Option<&Program> {
        self.merge.as_ref()
    }

    /// The configuration it was compiled for.
    pub fn config(&self) -> &SdpaConfig {
        &self.config
    }

    /// The block sizes it uses.
    pub fn blocking(&self) -> Blocking {
        self.blocking
    }

    /// The compiled kernel (loop IR, estimates, compile time).
    pub fn program(&self) -> &Program {
        &self.program
    }
}

impl fmt::Display for Sdpa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        let b = &self.blocking;
        write!(
            f,
            "sdpa flash_tile_ops: B={} H={} H_kv={} n_q={} n_k={} D={}{}{}; tasks of {} head(s) x {} queries, keys in blocks of {}{}{}",
            c.batch,
            c.heads,
            c.kv_heads,
            c.n_q,
            c.n_k,
            c.d,
            if c.dtype == SdpaDType::F32 { String::new() } else { format!(" {}", c.dtype) },
            if c.causal { " causal" } else { "" },
            b.heads_per_task,
            b.queries,
            b.keys,
            match b.causal_sub_tile_rows(c) {
                Some(rows) => format!(", the diagonal band in sub-tiles of {rows} rows"),
                None => String::new(),
            },
            if b.splits > 1 {
                format!(", split into {} chunks merged by a second kernel", b.splits)
            } else {
                String::new()
            }
        )
    }
}

/// The process-wide caches' key: a configuration compared by value, the scale by its bits.
#[derive(Clone, Copy)]
struct Key(SdpaConfig);

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.0.key() == other.0.key()
    }
}
impl Eq for Key {}
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.key().hash(state);
    }
}

/// A process-wide cache of compiled programs, one per configuration (configurations are
/// few, so it is not bounded).
type ConfigCache<T> = OnceLock<Mutex<HashMap<Key, Arc<T>>>>;

/// The entry of `config` in `cache`, compiled by `compile` on first use; `true` with a
/// program this call compiled.
fn cached<T>(
    cache: &ConfigCache<T>,
    config: &SdpaConfig,
    compile: impl FnOnce(&SdpaConfig) -> Result<T, SdpaError>,
) -> Result<(Arc<T>, bool), SdpaError> {
    let cache = cache.get_or_init(Default::default);
    let key = Key(*config);
    if let Some(hit) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok((Arc::clone(hit), false));
    }
    // Compile outside the lock, so other configurations are not held up; a racing compile of
    // the same configuration is harmless, the first one stored wins.
    let fresh = Arc::new(compile(config)?);
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    Ok((Arc::clone(map.entry(key).or_insert(fresh)), true))
}

static CACHE: ConfigCache<Sdpa> = OnceLock::new();
static COMPILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The compiled attention for `config`, compiled on first use and shared by every later call
/// in the process.
pub fn compiled(config: &SdpaConfig) -> Result<Arc<Sdpa>, SdpaError> {
    let (sdpa, fresh) = cached(&CACHE, config, Sdpa::compile)?;
    if fresh {
        COMPILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(sdpa)
}

/// How many programs [`compiled`] (and so [`attention`]) has compiled in this process.
pub fn compile_count() -> usize {
    COMPILES.load(std::sync::atomic::Ordering::Relaxed)
}

/// [`Sdpa::run`] of the cached compile of `config` (see [`compiled`]).
pub fn attention<T: SdpaElement>(
    config: &SdpaConfig,
    q: &[T],
    k: &[T],
    v: &[T],
    extras: Extras<'_>,
    out: &mut [T],
) -> Result<(), SdpaError> {
    compiled(config)?.run(q, k, v, extras, out)
}

/// `Ok` when a slice argument has the length the configuration needs.
fn check(arg: &'static str, expected: usize, got: usize) -> Result<(), SdpaError> {
    if expected == got { Ok(()) } else { Err(SdpaError::Length { arg, expected, got }) }
}

/// Checks `extras` against the configuration and appends the mask or bias and the key
/// lengths, in the programs' buffer order.
fn push_extras<'a>(c: &SdpaConfig, extras: Extras<'a>, args: &mut Vec<Arg<'a>>) -> Result<(), SdpaError> {
    let extra = |arg, expected: bool, given: bool| {
        if expected == given { Ok(()) } else { Err(SdpaError::Extra { arg, expected }) }
    };
    extra("mask", matches!(c.mask, MaskKind::Bool(_)), extras.mask.is_some())?;
    extra("bias", matches!(c.mask, MaskKind::Bias(_)), extras.bias.is_some())?;
    extra("key_lengths", c.key_lengths, extras.key_lengths.is_some())?;
    let mask_len = match c.mask {
        MaskKind::Bool(s) | MaskKind::Bias(s) => s.iter().product(),
        MaskKind::None => 0,
    };
    if let Some(m) = extras.mask {
        check("mask", mask_len, m.len())?;
        args.push(Arg::Read(BufRef::Bool(m)));
    }
    if let Some(b) = extras.bias {
        check("bias", mask_len, b.len())?;
        args.push(Arg::Read(BufRef::F32(b)));
    }
    if let Some(lens) = extras.key_lengths {
        check("key_lengths", c.batch, lens.len())?;
        if let Some((item, &len)) =
            lens.iter().enumerate().find(|(_, l)| !(0..=c.n_k as i64).contains(&i64::from(**l)))
        {
            return Err(SdpaError::KeyLength { item, len, n_k: c.n_k });
        }
        args.push(Arg::Read(BufRef::I32(lens)));
    }
    Ok(())
}

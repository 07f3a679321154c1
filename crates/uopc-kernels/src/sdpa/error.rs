//! [`SdpaError`]: what is wrong with a configuration or with a run's arguments.

use super::SdpaDType;
use thiserror::Error;
use uopc_jit::JitError;

/// What is wrong with a configuration or with the arguments of a run; each names the argument.
#[derive(Debug, Error)]
pub enum SdpaError {
    /// A size is zero.
    #[error("sdpa: `{what}` must be positive")]
    Empty {
        /// The field.
        what: &'static str,
    },
    /// A size makes one of the configuration's tensors hold more than 2^40 elements (so no
    /// length or index computed from the sizes can overflow).
    #[error("sdpa: `{what}` makes {tensor} hold more than 2^40 elements")]
    TooLarge {
        /// The field at which the element count passes the limit.
        what: &'static str,
        /// The tensor: `q`, `k` or `mask`.
        tensor: &'static str,
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
    /// Attention mods whose functions or captured tensors are wrong: `name` the capture (empty
    /// when the fault is not one capture's), `reason` what is wrong.
    #[error("sdpa mods: {}{reason}", if name.is_empty() { String::new() } else { format!("capture `{name}`: ") })]
    Capture {
        /// The captured tensor at fault, or empty.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The JIT refused the program.
    #[error("sdpa: {0}")]
    Jit(#[from] JitError),
}

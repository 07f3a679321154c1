//! The element types of q, k, v and the output, and the slices a run takes in them.

use half::{bf16, f16};
use std::fmt;
use uopc_ir::DType;
use uopc_jit::Arg;

/// The element type of q, k, v and the output (masks, biases, key lengths and the split-K
/// partial states are the same for every one).
///
/// With `BF16` or `F16` both GEMMs of a key block run on 16-bit tile GEMMs with f32
/// accumulation (k and v read as stored, f32 scores), the softmax is computed in f32 and the
/// output is rounded once at the end. Where the machine's bf16 GEMM takes both operands in
/// bf16 (natively, on AMX and `vdpbf16ps`), `BF16` keeps its query and P tiles in bf16, so its
/// probabilities are rounded to bf16 in the softmax step's pass and the row sum adds those
/// rounded weights. Elsewhere, and always for `F16`, P stays f32 over the scores, which the
/// `P · V` GEMM (f32 A, 16-bit or f32-panel B) reads in place: no operand needs it rounded,
/// so rounding would only add error and a pass over every score. The two differ by at most
/// P's bf16 rounding (a relative 2^-9 per weight), inside a bf16 output's own rounding.
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

/// The read-only values of one argument of [`Sdpa::run_values`](super::Sdpa::run_values), in
/// any of the supported element types (the run checks it against the configuration's).
#[derive(Clone, Copy, Debug)]
pub enum Values<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// bf16 values.
    BF16(&'a [bf16]),
    /// f16 values.
    F16(&'a [f16]),
}

/// The writable output of [`Sdpa::run_values`](super::Sdpa::run_values).
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
    pub(super) fn dtype(&self) -> SdpaDType {
        match self {
            Values::F32(_) => SdpaDType::F32,
            Values::BF16(_) => SdpaDType::BF16,
            Values::F16(_) => SdpaDType::F16,
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::BF16(v) => v.len(),
            Values::F16(v) => v.len(),
        }
    }

    pub(super) fn arg(self) -> Arg<'a> {
        match self {
            Values::F32(v) => v.into(),
            Values::BF16(v) => v.into(),
            Values::F16(v) => v.into(),
        }
    }
}

impl ValuesMut<'_> {
    pub(super) fn dtype(&self) -> SdpaDType {
        match self {
            ValuesMut::F32(_) => SdpaDType::F32,
            ValuesMut::BF16(_) => SdpaDType::BF16,
            ValuesMut::F16(_) => SdpaDType::F16,
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            ValuesMut::F32(v) => v.len(),
            ValuesMut::BF16(v) => v.len(),
            ValuesMut::F16(v) => v.len(),
        }
    }

    pub(super) fn arg(&mut self) -> Arg<'_> {
        match self {
            ValuesMut::F32(v) => Arg::WriteF32(v),
            ValuesMut::BF16(v) => Arg::WriteBF16(v),
            ValuesMut::F16(v) => Arg::WriteF16(v),
        }
    }
}

/// An element type [`Sdpa::run`](super::Sdpa::run) takes q, k, v and the output in: `f32`, `bf16` or `f16`
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

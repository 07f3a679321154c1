//! The arguments of one run: borrowed host memory, read-only or writable.

use half::{bf16, f16};
use uopc_ir::{DType, HostBuffer};

/// A read-only argument.
pub enum BufRef<'a> {
    /// Bools.
    Bool(&'a [bool]),
    /// i32s.
    I32(&'a [i32]),
    /// i64s.
    I64(&'a [i64]),
    /// f32s.
    F32(&'a [f32]),
    /// f64s.
    F64(&'a [f64]),
    /// bfloat16s.
    BF16(&'a [bf16]),
    /// IEEE half-precision floats.
    F16(&'a [f16]),
}

/// One argument of [`crate::Program::run`]: read-only or writable memory.
pub enum Arg<'a> {
    /// Memory the program may only read.
    Read(BufRef<'a>),
    /// Memory the program may write (and read).
    Write(&'a mut HostBuffer),
    /// Writable f32 memory.
    WriteF32(&'a mut [f32]),
    /// Writable bfloat16 memory (a caller's slice, without moving it into a [`HostBuffer`]).
    WriteBF16(&'a mut [bf16]),
    /// Writable IEEE half-precision memory.
    WriteF16(&'a mut [f16]),
    /// Uninitialized f32 memory for a slot the program writes whole and never reads (see
    /// [`crate::Program::writes_whole`]): after a successful run every element is initialized,
    /// so a caller can skip zeroing a large output. [`crate::Program::run`] refuses it for any
    /// other slot.
    WriteF32Uninit(&'a mut [std::mem::MaybeUninit<f32>]),
    /// [`Arg::WriteF32Uninit`] for a bfloat16 slot.
    WriteBF16Uninit(&'a mut [std::mem::MaybeUninit<bf16>]),
    /// [`Arg::WriteF32Uninit`] for an IEEE half-precision slot.
    WriteF16Uninit(&'a mut [std::mem::MaybeUninit<f16>]),
}

impl<'a> From<&'a [f32]> for Arg<'a> {
    fn from(v: &'a [f32]) -> Self {
        Arg::Read(BufRef::F32(v))
    }
}
impl<'a> From<&'a mut [f32]> for Arg<'a> {
    fn from(v: &'a mut [f32]) -> Self {
        Arg::WriteF32(v)
    }
}
impl<'a> From<&'a mut [bf16]> for Arg<'a> {
    fn from(v: &'a mut [bf16]) -> Self {
        Arg::WriteBF16(v)
    }
}
impl<'a> From<&'a mut [f16]> for Arg<'a> {
    fn from(v: &'a mut [f16]) -> Self {
        Arg::WriteF16(v)
    }
}
impl<'a> From<&'a [bf16]> for Arg<'a> {
    fn from(v: &'a [bf16]) -> Self {
        Arg::Read(BufRef::BF16(v))
    }
}
impl<'a> From<&'a [f16]> for Arg<'a> {
    fn from(v: &'a [f16]) -> Self {
        Arg::Read(BufRef::F16(v))
    }
}
impl<'a> From<&'a HostBuffer> for Arg<'a> {
    fn from(b: &'a HostBuffer) -> Self {
        Arg::Read(match b {
            HostBuffer::Bool(v) => BufRef::Bool(v),
            HostBuffer::I32(v) => BufRef::I32(v),
            HostBuffer::I64(v) => BufRef::I64(v),
            HostBuffer::F32(v) => BufRef::F32(v),
            HostBuffer::F64(v) => BufRef::F64(v),
            HostBuffer::BF16(v) => BufRef::BF16(v),
            HostBuffer::F16(v) => BufRef::F16(v),
        })
    }
}
impl<'a> From<&'a mut HostBuffer> for Arg<'a> {
    fn from(b: &'a mut HostBuffer) -> Self {
        Arg::Write(b)
    }
}

/// What [`Arg::describe`] reports of one argument.
pub(crate) struct ArgMemory {
    /// Whether the memory may be uninitialized ([`Arg::WriteF32Uninit`] and its 16-bit twins).
    pub uninit: bool,
    pub dtype: DType,
    pub len: usize,
    pub writable: bool,
    /// The first element (valid for `len` elements of `dtype`).
    pub ptr: *mut u8,
}

impl Arg<'_> {
    pub(crate) fn describe(&self) -> ArgMemory {
        let (dtype, len, writable, ptr) = match self {
            Arg::Read(r) => match r {
                BufRef::Bool(v) => (DType::Bool, v.len(), false, v.as_ptr() as *mut u8),
                BufRef::I32(v) => (DType::I32, v.len(), false, v.as_ptr() as *mut u8),
                BufRef::I64(v) => (DType::I64, v.len(), false, v.as_ptr() as *mut u8),
                BufRef::F32(v) => (DType::F32, v.len(), false, v.as_ptr() as *mut u8),
                BufRef::F64(v) => (DType::F64, v.len(), false, v.as_ptr() as *mut u8),
                BufRef::BF16(v) => (DType::BF16, v.len(), false, v.as_ptr() as *mut u8),
                BufRef::F16(v) => (DType::F16, v.len(), false, v.as_ptr() as *mut u8),
            },
            Arg::WriteF32(v) => (DType::F32, v.len(), true, v.as_ptr() as *mut u8),
            Arg::WriteBF16(v) => (DType::BF16, v.len(), true, v.as_ptr() as *mut u8),
            Arg::WriteF16(v) => (DType::F16, v.len(), true, v.as_ptr() as *mut u8),
            Arg::WriteF32Uninit(v) => (DType::F32, v.len(), true, v.as_ptr() as *mut u8),
            Arg::WriteBF16Uninit(v) => (DType::BF16, v.len(), true, v.as_ptr() as *mut u8),
            Arg::WriteF16Uninit(v) => (DType::F16, v.len(), true, v.as_ptr() as *mut u8),
            Arg::Write(b) => {
                let p = match &**b {
                    HostBuffer::Bool(v) => v.as_ptr() as *mut u8,
                    HostBuffer::I32(v) => v.as_ptr() as *mut u8,
                    HostBuffer::I64(v) => v.as_ptr() as *mut u8,
                    HostBuffer::F32(v) => v.as_ptr() as *mut u8,
                    HostBuffer::F64(v) => v.as_ptr() as *mut u8,
                    HostBuffer::BF16(v) => v.as_ptr() as *mut u8,
                    HostBuffer::F16(v) => v.as_ptr() as *mut u8,
                };
                (b.dtype(), b.len(), true, p)
            }
        };
        let uninit =
            matches!(self, Arg::WriteF32Uninit(_) | Arg::WriteBF16Uninit(_) | Arg::WriteF16Uninit(_));
        ArgMemory { uninit, dtype, len, writable, ptr }
    }
}

//! Host-side typed buffers, shared by the interpreter, the JIT runtime and tensors.

use crate::dtype::DType;
use half::{bf16, f16};
use uopc_tile::memory::{keep_16bit, keep_f32, zeroed, zeroed_f32};

/// An owned, typed array of elements on the host.
#[derive(Clone, Debug, PartialEq)]
pub enum HostBuffer {
    /// Bools, one byte each.
    Bool(Vec<bool>),
    /// 32-bit integers.
    I32(Vec<i32>),
    /// 64-bit integers.
    I64(Vec<i64>),
    /// 32-bit floats.
    F32(Vec<f32>),
    /// 64-bit floats.
    F64(Vec<f64>),
    /// bfloat16s (the `half` crate's type, so ndarray and other crates' data passes as is).
    BF16(Vec<bf16>),
    /// IEEE half-precision floats.
    F16(Vec<f16>),
}

/// A large f32 or 16-bit buffer is kept for the next one of its length (see
/// [`uopc_tile::memory::keep_f32`]): fresh pages cost more than reusing them.
impl Drop for HostBuffer {
    fn drop(&mut self) {
        match self {
            HostBuffer::F32(v) => keep_f32(std::mem::take(v)),
            HostBuffer::BF16(v) => keep_16bit(std::mem::take(v)),
            HostBuffer::F16(v) => keep_16bit(std::mem::take(v)),
            _ => {}
        }
    }
}

impl HostBuffer {
    /// `len` zero elements of `dtype`.
    pub fn zeros(dtype: DType, len: usize) -> Self {
        match dtype {
            DType::Bool => HostBuffer::Bool(zeroed(len)),
            DType::I32 => HostBuffer::I32(zeroed(len)),
            DType::I64 => HostBuffer::I64(zeroed(len)),
            DType::F32 => HostBuffer::F32(zeroed_f32(len)),
            DType::F64 => HostBuffer::F64(zeroed(len)),
            DType::BF16 => HostBuffer::BF16(zeroed(len)),
            DType::F16 => HostBuffer::F16(zeroed(len)),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            HostBuffer::Bool(_) => DType::Bool,
            HostBuffer::I32(_) => DType::I32,
            HostBuffer::I64(_) => DType::I64,
            HostBuffer::F32(_) => DType::F32,
            HostBuffer::F64(_) => DType::F64,
            HostBuffer::BF16(_) => DType::BF16,
            HostBuffer::F16(_) => DType::F16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostBuffer::Bool(v) => v.len(),
            HostBuffer::I32(v) => v.len(),
            HostBuffer::I64(v) => v.len(),
            HostBuffer::F32(v) => v.len(),
            HostBuffer::F64(v) => v.len(),
            HostBuffer::BF16(v) => v.len(),
            HostBuffer::F16(v) => v.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` widened to f64 (bools as 0/1).
    ///
    /// # Panics
    ///
    /// If `i` is not below [`HostBuffer::len`].
    ///
    /// # Examples
    ///
    /// ```rust
    /// use uopc_ir::HostBuffer;
    ///
    /// let b = HostBuffer::I32(vec![7, -2]);
    /// assert_eq!(b.get_f64(1), -2.0);
    /// assert_eq!(HostBuffer::Bool(vec![true]).get_f64(0), 1.0);
    /// ```
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            HostBuffer::Bool(v) => v[i] as i64 as f64,
            HostBuffer::I32(v) => v[i] as f64,
            HostBuffer::I64(v) => v[i] as f64,
            HostBuffer::F32(v) => v[i] as f64,
            HostBuffer::F64(v) => v[i],
            HostBuffer::BF16(v) => v[i].to_f64(),
            HostBuffer::F16(v) => v[i].to_f64(),
        }
    }

    /// All elements widened to f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.len()).map(|i| self.get_f64(i)).collect()
    }
}

//! Element types of UOps and buffers.

use std::fmt;

/// The element type of a value or buffer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum DType {
    /// A truth value (comparison results, WHERE conditions); 1 byte in buffers.
    Bool,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer; also the type of every index expression.
    I64,
    /// 32-bit IEEE float.
    F32,
    /// 64-bit IEEE float.
    F64,
    /// bfloat16 (8 exponent bits, 7 mantissa bits: the top half of an f32), a storage type.
    ///
    /// A LOAD from a BF16 buffer is a BF16 value, and a STORE into one takes a BF16 value: the
    /// IR keeps the 16-bit dtype on values and converts with explicit CASTs, so every
    /// conversion is a node the verifier, simplify and the backends see. A BF16 value is
    /// carried as the f32 it widens to exactly; the only ops defined on it are LOAD, STORE,
    /// CAST (to and from F32 and F64, or the other 16-bit type), WHERE and constants, so
    /// arithmetic happens in f32 after an explicit widening CAST. A CAST to BF16 rounds to
    /// nearest, ties to even (from F64 through f32, as torch converts); a NaN stays a quiet NaN
    /// and an infinity stays infinite.
    BF16,
    /// IEEE binary16 (5 exponent bits, 10 mantissa bits), a storage type with the same rules
    /// as [`DType::BF16`]: values carried as their exact f32, arithmetic only after a CAST,
    /// rounding to nearest even on the CAST to F16 (subnormals kept, overflow to infinity).
    F16,
}

impl DType {
    /// The dtype of index expressions and RANGE variables.
    pub const INDEX: DType = DType::I64;

    /// Size in bytes of one element.
    pub fn size(self) -> usize {
        match self {
            DType::Bool => 1,
            DType::BF16 | DType::F16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// True for F32 and F64, the float types arithmetic is defined on.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }

    /// True for the 16-bit storage floats BF16 and F16 (not [`DType::is_float`]: no arithmetic
    /// is defined on them, so code that computes on floats never meets one unawares).
    pub fn is_half(self) -> bool {
        matches!(self, DType::BF16 | DType::F16)
    }

    /// True for I32 and I64.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// Short lowercase name, as printed (`f32`, `i64`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<uopc_tile::ops::Half> for DType {
    fn from(h: uopc_tile::ops::Half) -> DType {
        match h {
            uopc_tile::ops::Half::Bf16 => DType::BF16,
            uopc_tile::ops::Half::F16 => DType::F16,
        }
    }
}

impl DType {
    /// The 16-bit floating-point type this is, if it is one.
    pub fn half(self) -> Option<uopc_tile::ops::Half> {
        match self {
            DType::BF16 => Some(uopc_tile::ops::Half::Bf16),
            DType::F16 => Some(uopc_tile::ops::Half::F16),
            _ => None,
        }
    }

    /// The tile operand type of a block of this dtype: F32, BF16 and F16 are themselves; the
    /// verifier allows no other dtype as a tile operand.
    pub fn tile_elem(self) -> uopc_tile::ops::Elem {
        match self {
            DType::BF16 => uopc_tile::ops::Elem::Bf16,
            DType::F16 => uopc_tile::ops::Elem::F16,
            _ => uopc_tile::ops::Elem::F32,
        }
    }
}

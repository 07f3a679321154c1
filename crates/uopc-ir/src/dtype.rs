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
}

impl DType {
    /// The dtype of index expressions and RANGE variables.
    pub const INDEX: DType = DType::I64;

    /// Size in bytes of one element.
    pub fn size(self) -> usize {
        match self {
            DType::Bool => 1,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// True for F32 and F64.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
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
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

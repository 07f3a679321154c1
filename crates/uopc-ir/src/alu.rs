//! The semantics of the ALU ops on scalar values: the one definition that constant folding
//! (`simplify`) and the reference interpreter both evaluate, so a folded constant is exactly
//! the value the interpreter would compute at run time.
//!
//! Values carry their representation ([`Scalar`]): an F32 value is computed in f32 (every
//! result rounded to f32), an F64 one in f64, integers of both widths as i64 wrapped to the
//! node's dtype, truth values as bool. Operands of mismatched representations have no value
//! (`None`); the verifier rejects such programs.

use crate::dtype::DType;
use crate::uop::{BinaryOp, ConstValue, UnaryOp};

/// Every [`UnaryOp`], in declaration order (for tables indexed by op).
pub const UNARY_OPS: [UnaryOp; 5] =
    [UnaryOp::Neg, UnaryOp::Exp2, UnaryOp::Log2, UnaryOp::Sqrt, UnaryOp::Recip];

/// Every [`BinaryOp`], in declaration order (for tables indexed by op).
pub const BINARY_OPS: [BinaryOp; 8] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Max,
    BinaryOp::CmpLt,
    BinaryOp::CmpNe,
    BinaryOp::IDiv,
    BinaryOp::Mod,
];

/// A scalar value in the representation it is computed in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// A truth value.
    Bool(bool),
    /// An integer; I32 values are held already wrapped to 32 bits.
    Int(i64),
    /// An f32, computed in f32.
    F32(f32),
    /// An f64.
    F64(f64),
}

impl Scalar {
    /// The value of a constant of `dtype` (the constant converted to `dtype` first, so an F32
    /// constant holds its f32 value even if it was stored with more precision).
    pub fn of_const(c: ConstValue, dtype: DType) -> Scalar {
        match c.cast(dtype) {
            ConstValue::Bool(b) => Scalar::Bool(b),
            ConstValue::Int(i) => Scalar::Int(i),
            // 16-bit values are carried as the f32 they widen to.
            ConstValue::Float(bits) if dtype == DType::F32 || dtype.is_half() => {
                Scalar::F32(f64::from_bits(bits) as f32)
            }
            ConstValue::Float(bits) => Scalar::F64(f64::from_bits(bits)),
        }
    }

    /// The constant of `dtype` holding this value (converted with the IR's CAST semantics).
    pub fn to_const(self, dtype: DType) -> ConstValue {
        match self {
            Scalar::Bool(b) => ConstValue::Bool(b),
            Scalar::Int(i) => ConstValue::Int(i),
            Scalar::F32(x) => ConstValue::float(x as f64),
            Scalar::F64(x) => ConstValue::float(x),
        }
        .cast(dtype)
    }
}

/// `x` wrapped to the width of `dtype` (I32 values wrap to 32 bits; I64 ones are unchanged).
pub fn wrap(dtype: DType, x: i64) -> i64 {
    if dtype == DType::I32 { x as i32 as i64 } else { x }
}

/// The IR's integer division: truncating, `x / 0 == 0`, wrapping on `MIN / -1`.
pub fn int_div(a: i64, b: i64) -> i64 {
    if b == 0 { 0 } else { a.wrapping_div(b) }
}

/// The IR's remainder: sign of the dividend, `x % 0 == 0`.
pub fn int_mod(a: i64, b: i64) -> i64 {
    if b == 0 { 0 } else { a.wrapping_rem(b) }
}

/// `op a` for a node of `dtype`; `None` when the op has no meaning on `a` (a float op on an
/// integer, any op on a bool or a 16-bit float). `exp2(-inf) == 0`, as `f32::exp2`/`f64::exp2`
/// give.
pub fn unary(op: UnaryOp, a: Scalar, dtype: DType) -> Option<Scalar> {
    // 16-bit floats are storage types: arithmetic on them is a CAST to F32 away.
    if dtype.is_half() {
        return None;
    }
    macro_rules! float {
        ($x:expr, $ctor:path) => {
            $ctor(match op {
                UnaryOp::Neg => -$x,
                UnaryOp::Exp2 => $x.exp2(),
                UnaryOp::Log2 => $x.log2(),
                UnaryOp::Sqrt => $x.sqrt(),
                UnaryOp::Recip => 1.0 / $x,
            })
        };
    }
    Some(match a {
        Scalar::F32(x) => float!(x, Scalar::F32),
        Scalar::F64(x) => float!(x, Scalar::F64),
        Scalar::Int(x) if op == UnaryOp::Neg => Scalar::Int(wrap(dtype, x.wrapping_neg())),
        _ => return None,
    })
}

/// `a op b` for a node of `dtype`; `None` when the operands' representations differ or the op
/// has no meaning on them (IDIV/MOD on floats, arithmetic on bools or 16-bit floats). MAX
/// propagates NaN (`a` when it is NaN, else `if a > b { a } else { b }`, which yields a NaN
/// `b`), as the JIT's compare-and-selects do.
pub fn binary(op: BinaryOp, a: Scalar, b: Scalar, dtype: DType) -> Option<Scalar> {
    if dtype.is_half() {
        return None;
    }
    macro_rules! float {
        ($x:expr, $y:expr, $ctor:path) => {
            match op {
                BinaryOp::Add => $ctor($x + $y),
                BinaryOp::Sub => $ctor($x - $y),
                BinaryOp::Mul => $ctor($x * $y),
                BinaryOp::Max => $ctor(if $x.is_nan() || $x > $y { $x } else { $y }),
                BinaryOp::CmpLt => Scalar::Bool($x < $y),
                BinaryOp::CmpNe => Scalar::Bool($x != $y),
                BinaryOp::IDiv | BinaryOp::Mod => return None,
            }
        };
    }
    Some(match (a, b) {
        (Scalar::F32(x), Scalar::F32(y)) => float!(x, y, Scalar::F32),
        (Scalar::F64(x), Scalar::F64(y)) => float!(x, y, Scalar::F64),
        (Scalar::Int(x), Scalar::Int(y)) => match op {
            BinaryOp::Add => Scalar::Int(wrap(dtype, x.wrapping_add(y))),
            BinaryOp::Sub => Scalar::Int(wrap(dtype, x.wrapping_sub(y))),
            BinaryOp::Mul => Scalar::Int(wrap(dtype, x.wrapping_mul(y))),
            BinaryOp::Max => Scalar::Int(if x > y { x } else { y }),
            BinaryOp::CmpLt => Scalar::Bool(x < y),
            BinaryOp::CmpNe => Scalar::Bool(x != y),
            BinaryOp::IDiv => Scalar::Int(wrap(dtype, int_div(x, y))),
            BinaryOp::Mod => Scalar::Int(wrap(dtype, int_mod(x, y))),
        },
        (Scalar::Bool(x), Scalar::Bool(y)) => match op {
            BinaryOp::CmpNe => Scalar::Bool(x != y),
            BinaryOp::CmpLt => Scalar::Bool(!x & y),
            _ => return None,
        },
        _ => return None,
    })
}

/// CAST to `to` with Rust `as` semantics: floats to ints saturate (NaN to 0), anything to Bool
/// is `x != 0`, I64 to I32 wraps, ints round to f32 once. A CAST to BF16 or F16 rounds to
/// nearest even and yields the rounded value as an f32 (how 16-bit values are carried); NaNs
/// come out quiet. From F64 it rounds to f32 first, as torch's conversion does (one extra
/// rounding, at most 2^-24 relative, that saves every backend a second conversion routine).
pub fn cast(a: Scalar, to: DType) -> Scalar {
    match to {
        DType::BF16 => Scalar::F32(half::bf16::from_f32(as_f32(a)).to_f32()),
        DType::F16 => Scalar::F32(half::f16::from_f32(as_f32(a)).to_f32()),
        DType::Bool => Scalar::Bool(match a {
            Scalar::Bool(b) => b,
            Scalar::Int(i) => i != 0,
            Scalar::F32(x) => x != 0.0,
            Scalar::F64(x) => x != 0.0,
        }),
        DType::I32 | DType::I64 => Scalar::Int(match (a, to) {
            (Scalar::Bool(b), _) => b as i64,
            (Scalar::Int(i), _) => wrap(to, i),
            (Scalar::F32(x), DType::I32) => x as i32 as i64,
            (Scalar::F32(x), _) => x as i64,
            (Scalar::F64(x), DType::I32) => x as i32 as i64,
            (Scalar::F64(x), _) => x as i64,
        }),
        DType::F32 => Scalar::F32(as_f32(a)),
        DType::F64 => Scalar::F64(match a {
            Scalar::Bool(b) => b as u8 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::F32(x) => x as f64,
            Scalar::F64(x) => x,
        }),
    }
}

/// The CAST to F32.
fn as_f32(a: Scalar) -> f32 {
    match a {
        Scalar::Bool(b) => b as u8 as f32,
        Scalar::Int(i) => i as f32,
        Scalar::F32(x) => x,
        Scalar::F64(x) => x as f32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_ops_round_to_f32_and_f64_ops_do_not() {
        let third = binary(BinaryOp::Mul, Scalar::F32(1.0 / 3.0), Scalar::F32(3.0), DType::F32);
        assert_eq!(third, Some(Scalar::F32((1.0f32 / 3.0) * 3.0)));
        let r = unary(UnaryOp::Recip, Scalar::F64(3.0), DType::F64);
        assert_eq!(r, Some(Scalar::F64(1.0 / 3.0)));
        assert_eq!(unary(UnaryOp::Exp2, Scalar::F32(f32::NEG_INFINITY), DType::F32), Some(Scalar::F32(0.0)));
    }

    #[test]
    fn integer_ops_wrap_to_the_dtype_and_divide_toward_zero() {
        let big = Scalar::Int(i32::MAX as i64);
        assert_eq!(
            binary(BinaryOp::Add, big, Scalar::Int(1), DType::I32),
            Some(Scalar::Int(i32::MIN as i64))
        );
        assert_eq!(binary(BinaryOp::Add, big, Scalar::Int(1), DType::I64), Some(Scalar::Int(1 << 31)));
        assert_eq!(
            binary(BinaryOp::IDiv, Scalar::Int(-7), Scalar::Int(2), DType::I64),
            Some(Scalar::Int(-3))
        );
        assert_eq!(binary(BinaryOp::Mod, Scalar::Int(-7), Scalar::Int(2), DType::I64), Some(Scalar::Int(-1)));
        assert_eq!(binary(BinaryOp::IDiv, Scalar::Int(5), Scalar::Int(0), DType::I64), Some(Scalar::Int(0)));
        assert_eq!(int_div(i64::MIN, -1), i64::MIN);
    }

    #[test]
    fn max_propagates_a_nan_from_either_side() {
        let m = binary(BinaryOp::Max, Scalar::F32(f32::NAN), Scalar::F32(2.0), DType::F32);
        assert!(matches!(m, Some(Scalar::F32(x)) if x.is_nan()));
        let m = binary(BinaryOp::Max, Scalar::F64(2.0), Scalar::F64(f64::NAN), DType::F64);
        assert!(matches!(m, Some(Scalar::F64(x)) if x.is_nan()));
        let m = binary(BinaryOp::Max, Scalar::F32(f32::NEG_INFINITY), Scalar::F32(-1.0), DType::F32);
        assert_eq!(m, Some(Scalar::F32(-1.0)));
        // Of two equal zeros, the right one.
        let m = binary(BinaryOp::Max, Scalar::F64(0.0), Scalar::F64(-0.0), DType::F64);
        assert!(matches!(m, Some(Scalar::F64(x)) if x == 0.0 && x.is_sign_negative()));
    }

    #[test]
    fn mismatched_or_meaningless_operands_have_no_value() {
        assert_eq!(binary(BinaryOp::Add, Scalar::F32(1.0), Scalar::F64(1.0), DType::F32), None);
        assert_eq!(binary(BinaryOp::IDiv, Scalar::F64(1.0), Scalar::F64(1.0), DType::F64), None);
        assert_eq!(binary(BinaryOp::Add, Scalar::Bool(true), Scalar::Bool(true), DType::Bool), None);
        assert_eq!(unary(UnaryOp::Sqrt, Scalar::Int(4), DType::I64), None);
        assert_eq!(
            binary(BinaryOp::CmpLt, Scalar::Bool(false), Scalar::Bool(true), DType::Bool),
            Some(Scalar::Bool(true))
        );
    }

    #[test]
    fn casts_saturate_wrap_and_round_once() {
        assert_eq!(cast(Scalar::F64(f64::NAN), DType::I64), Scalar::Int(0));
        assert_eq!(cast(Scalar::F64(1e300), DType::I32), Scalar::Int(i32::MAX as i64));
        assert_eq!(cast(Scalar::Int(1 << 32 | 5), DType::I32), Scalar::Int(5));
        let odd = (1i64 << 53) + 1;
        assert_eq!(cast(Scalar::Int(odd), DType::F32), Scalar::F32(odd as f32));
        assert_eq!(cast(Scalar::F32(0.5), DType::Bool), Scalar::Bool(true));
    }

    #[test]
    fn constants_take_their_dtype_s_value() {
        let c = ConstValue::float(0.1);
        assert_eq!(Scalar::of_const(c, DType::F32), Scalar::F32(0.1f32));
        assert_eq!(Scalar::of_const(ConstValue::Int(1 << 32), DType::I32), Scalar::Int(0));
        assert_eq!(Scalar::F32(0.1).to_const(DType::F32), ConstValue::float(0.1f32 as f64));
        assert_eq!(Scalar::Int(3).to_const(DType::Bool), ConstValue::Bool(true));
    }
}

//! The activation functions of [`crate::activate`]: which one, its code for generated code,
//! and the constants its formula takes (the vector kernels and the IR read them here).

/// `0.044715`, the cubic coefficient of GELU's tanh form, as an f32.
pub const GELU_CUBIC: f32 = 0.044_715;
/// `2 sqrt(2 / pi)`, as an f32: `(1 + tanh u) / 2 = sigmoid(2u)`, so the tanh form is
/// `x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))`.
pub const GELU_TWICE_SQRT_2_OVER_PI: f32 = 1.595_769_2;

/// Which function [`crate::activate`] applies to each element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `x sigmoid(z)` with `z = GELU_TWICE_SQRT_2_OVER_PI (x + GELU_CUBIC x^3)`: GELU's tanh
    /// form (torch's `gelu(approximate="tanh")`).
    GeluTanh,
    /// `x sigmoid(x)` (SiLU, swish).
    Silu,
}

impl Activation {
    /// The code the flat entry point takes.
    pub fn code(self) -> i64 {
        match self {
            Activation::GeluTanh => 0,
            Activation::Silu => 1,
        }
    }

    /// The activation of a flat entry point's code; `None` for an unknown one.
    pub fn from_code(code: i64) -> Option<Activation> {
        match code {
            0 => Some(Activation::GeluTanh),
            1 => Some(Activation::Silu),
            _ => None,
        }
    }
}

//! The activation functions of [`crate::activate`]: which one, its code for generated code,
//! and the constants its formula takes (the vector kernels, the IR and the tensor graph's
//! `erf` read them here).

/// `0.044715`, the cubic coefficient of GELU's tanh form, as an f32.
pub const GELU_CUBIC: f32 = 0.044_715;
/// `2 sqrt(2 / pi)`, as an f32: `(1 + tanh u) / 2 = sigmoid(2u)`, so the tanh form is
/// `x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))`.
pub const GELU_TWICE_SQRT_2_OVER_PI: f32 = 1.595_769_2;

/// Below this |x| the f32 `erf` is an odd polynomial; from it on, `1 - erfc(|x|)` (where
/// `erfc <= 0.16`, so the subtraction loses nothing).
pub const ERF_POLYNOMIAL_BOUND: f64 = 1.0;

/// `erf(x) / x` on `0 <= x <= 1` as a polynomial in `x^2`, lowest power first: a weighted
/// least-squares fit that reweights toward the largest relative errors (near minimax), max
/// relative error 4e-8 (the Maclaurin series needs twice the terms for the same).
pub const ERF_NEAR_ZERO_FIT: [f64; 6] = [
    1.128_379_122_171_028_4,
    -0.376_123_245_063_018_03,
    0.112_801_661_078_381_91,
    -0.026_710_903_627_697_645,
    0.004_917_068_323_791_873,
    -0.000_562_942_414_494_326_4,
];

/// |x| from which the f32 `erf` is exactly ±1: it rounds to 1 there.
pub const ERF_SATURATION: f64 = 4.0;

/// `ln(erfc(x)) + x^2` on `1 <= x <= 4` as a polynomial in `u = 12 / (2 + x) - 3` (the
/// interval mapped onto `[-1, 1]`), lowest power first: a weighted least-squares fit that
/// reweights toward the largest errors (near minimax), max error 3e-8 in that logarithm, i.e.
/// the relative error of `erfc`.
pub const ERF_LOG_ERFC_FIT: [f64; 9] = [
    -1.364_941_273_418_221_1,
    0.557_547_488_474_006_5,
    -0.050_294_831_222_974_57,
    0.010_612_122_344_383_421,
    -0.003_210_702_833_618_446_6,
    0.000_847_713_111_890_159_7,
    -0.000_220_476_914_908_356_13,
    0.000_079_048_276_911_087_4,
    -0.000_024_626_507_901_829_993,
];

/// Exact GELU's `Phi(x)` near zero as `1/2 + s P(s^2)`, `s = x / sqrt 2`: [`ERF_NEAR_ZERO_FIT`]
/// halved, as f32s (`Phi(x) = (1 + erf(s)) / 2`).
pub const GELU_NEAR_ZERO: [f32; 6] = scaled_f32(ERF_NEAR_ZERO_FIT, 0.5, 0.0);

/// Exact GELU's lower tail `Phi(-|x|) = erfc(t) / 2`, `t = |x| / sqrt 2`, as
/// `exp2(Q(u) - t^2 log2 e)` with `u = 12 / (2 + t) - 3`: [`ERF_LOG_ERFC_FIT`] times `log2 e`,
/// its constant term lowered by 1 for the halving, as f32s.
pub const GELU_LOG2_TAIL: [f32; 9] = scaled_f32(ERF_LOG_ERFC_FIT, std::f64::consts::LOG2_E, -1.0);

/// `1 / sqrt(2 pi)`, the normal density's factor, as an f32.
pub const GELU_DENSITY: f32 = 0.398_942_3;

/// `c[i] * factor` rounded to f32, with `shift` added to the constant term first.
const fn scaled_f32<const N: usize>(c: [f64; N], factor: f64, shift: f64) -> [f32; N] {
    let mut out = [0.0f32; N];
    let mut i = 0;
    while i < N {
        let term = if i == 0 { c[i] * factor + shift } else { c[i] * factor };
        out[i] = term as f32;
        i += 1;
    }
    out
}

/// Which function [`crate::activate`] applies to each element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `x sigmoid(z)` with `z = GELU_TWICE_SQRT_2_OVER_PI (x + GELU_CUBIC x^3)`: GELU's tanh
    /// form (torch's `gelu(approximate="tanh")`).
    GeluTanh,
    /// `x sigmoid(x)` (SiLU, swish).
    Silu,
    /// `x Phi(x)`, `Phi` the standard normal distribution function, `(1 + erf(x / sqrt 2)) / 2`:
    /// exact GELU (torch's `gelu`), through the f32 `erf`'s fits ([`GELU_NEAR_ZERO`] below
    /// `|x| / sqrt 2 = 1`, [`GELU_LOG2_TAIL`] up to 4, then 0 or 1).
    Gelu,
}

impl Activation {
    /// Every activation, in code order.
    pub const ALL: [Activation; 3] = [Activation::GeluTanh, Activation::Silu, Activation::Gelu];

    /// The code the flat entry point takes.
    pub fn code(self) -> i64 {
        match self {
            Activation::GeluTanh => 0,
            Activation::Silu => 1,
            Activation::Gelu => 2,
        }
    }

    /// The activation of a flat entry point's code; `None` for an unknown one.
    pub fn from_code(code: i64) -> Option<Activation> {
        match code {
            0 => Some(Activation::GeluTanh),
            1 => Some(Activation::Silu),
            2 => Some(Activation::Gelu),
            _ => None,
        }
    }
}

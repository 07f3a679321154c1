//! Score functions recognized by their expression and run as a tile op instead of generated
//! code: instruction selection for the score tile.
//!
//! The mask loop evaluates a score function on every score of a block in JIT code four lanes
//! wide. Logit soft-capping, `c tanh(s / c)` (Gemma 2, Grok), costs a tanh per score there;
//! the soft-capping tile op runs the same function on the AVX2 (or wider) vectors of the score
//! tile. A score function is recognized when its expression over the score `s` alone is
//! [`tanh`] of a multiple of `s`, times a constant ([`Softcap`]), or when it adds to `s` a
//! slope times `kv - q`, the slope a constant or a capture read at the head alone (ALiBi,
//! [`Ramp`], run by the score-ramp tile op); anything else keeps the mask loop.

use std::f64::consts::LOG2_E;

use uopc_ir::{BinaryOp, ConstValue, Op, UOp, UnaryOp};

use super::flex::{AttentionMods, ScoreFunction};

/// `tanh(x)` as a score or mask function can build it, `1 - 2 / (exp2(2 log2(e) x) + 1)`: the
/// form the soft-capping tile op is recognized by (a score function `tanh(&(s * k)) * c` runs
/// as that op, see [`AttentionMods::score`]). `±inf` gives `±1`; large positive `x` overflows
/// the exponential to `inf`, whose reciprocal makes the result exactly 1.
pub fn tanh(x: &UOp) -> UOp {
    let e = (x * (2.0 * LOG2_E) as f32).exp2();
    ((e + 1.0f32).recip() * -2.0f32) + 1.0f32
}

/// A score function `outer * tanh(inner * s)` of the scaled score `s` alone.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Softcap {
    /// The factor of `s` inside the tanh.
    pub inner: f64,
    /// The factor of the tanh.
    pub outer: f64,
}

impl Softcap {
    /// The score function of `mods` when it is a soft-cap; `None` without a score function or
    /// for any other one.
    pub(crate) fn of(mods: &AttentionMods) -> Option<Softcap> {
        // A function that loads a capture (the only source of build problems) never matches.
        let ScoreFunction { f, score, .. } = ScoreFunction::of(mods)?;
        Softcap::matching(&f, &score)
    }

    /// `score` as `outer * tanh(inner * s)`: a product with a constant (or none) around
    /// [`tanh`]'s form, whose argument is `s` times constants.
    fn matching(score: &UOp, s: &UOp) -> Option<Softcap> {
        let (tanh_of, outer) = match product_with_constant(score) {
            Some((rest, c)) => (rest, c),
            None => (score.clone(), 1.0),
        };
        let exponent = tanh_exponent(&tanh_of)?;
        // `exp2(a s) = exp(2 (a / (2 log2 e)) s)`.
        let inner = multiple_of(&exponent, s)? / (2.0 * LOG2_E);
        (inner.is_finite() && outer.is_finite()).then_some(Softcap { inner, outer })
    }
}

/// The slope of a score function `s + a (kv - q)` ([`Ramp::slope`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum RampSlope {
    /// A float constant.
    Constant(f64),
    /// A capture's f32 element: the INDEX node the function loads it from.
    Read(UOp),
}

/// A score function `s + a (kv - q)` of the scaled score `s`, the query and key positions
/// and a slope `a` free of both positions and of `s` (ALiBi: `a` a capture read at the head).
pub(crate) struct Ramp;

impl Ramp {
    /// Whether `mods`' score function is a ramp (see [`Ramp::slope`]).
    pub(crate) fn of(mods: &AttentionMods) -> bool {
        let ScoreFunction { f, score, .. } = match ScoreFunction::of(mods) {
            Some(sf) => sf,
            None => return false,
        };
        let [_, _, q, kv] = super::flex::placeholders();
        Ramp::slope(&f, &score, &q, &kv).is_some()
    }

    /// The slope `a` of `f` as `s + a (kv - q)` (either operand order of the sum and the
    /// product), `kv - q` an INDEX expression cast to f32; `None` for any other form.
    pub(crate) fn slope(f: &UOp, s: &UOp, q: &UOp, kv: &UOp) -> Option<RampSlope> {
        let (Op::Binary(BinaryOp::Add), [x, y]) = (f.op(), f.src()) else { return None };
        let term = if x == s {
            y
        } else if y == s {
            x
        } else {
            return None;
        };
        let (Op::Binary(BinaryOp::Mul), [x, y]) = (term.op(), term.src()) else { return None };
        let (a, position) = if is_key_less_query(y, q, kv) { (x, y) } else { (y, x) };
        if !is_key_less_query(position, q, kv) {
            return None;
        }
        if let Some(c) = float(a) {
            return c.is_finite().then_some(RampSlope::Constant(c));
        }
        let free = !UOp::toposort(std::slice::from_ref(a)).iter().any(|u| u == q || u == kv || u == s);
        match (a.op(), a.src()) {
            (Op::Load, [at]) if free && a.dtype() == uopc_ir::DType::F32 => Some(RampSlope::Read(at.clone())),
            _ => None,
        }
    }
}

/// Whether `p` is `kv - q` cast to f32: an INDEX expression linear in both, with coefficients
/// 1 and -1 and nothing else.
fn is_key_less_query(p: &UOp, q: &UOp, kv: &UOp) -> bool {
    let (Op::Cast, [e]) = (p.op(), p.src()) else { return false };
    if p.dtype() != uopc_ir::DType::F32 {
        return false;
    }
    let Some((-1, rest)) = uopc_ir::linear_in(e, q) else { return false };
    let Some((1, zero)) = uopc_ir::linear_in(&rest, kv) else { return false };
    // What is left is a constant expression (the leftovers of taking both terms out).
    uopc_ir::IndexFormula::over_ranges(&zero, &[]).and_then(|f| f.eval(&[])) == Some(0)
}

/// The float value of a constant node.
fn float(u: &UOp) -> Option<f64> {
    match u.const_value()? {
        ConstValue::Float(bits) => Some(f64::from_bits(bits)),
        _ => None,
    }
}

/// `x * c` or `c * x` with `c` a float constant: `(x, c)`.
fn product_with_constant(u: &UOp) -> Option<(UOp, f64)> {
    match (u.op(), u.src()) {
        (Op::Binary(BinaryOp::Mul), [a, b]) => match (float(a), float(b)) {
            (None, Some(c)) => Some((a.clone(), c)),
            (Some(c), None) => Some((b.clone(), c)),
            _ => None,
        },
        _ => None,
    }
}

/// `x + c` or `c + x` with `c` the float constant `want`: `x`.
fn plus(u: &UOp, want: f64) -> Option<UOp> {
    match (u.op(), u.src()) {
        (Op::Binary(BinaryOp::Add), [a, b]) if float(b) == Some(want) => Some(a.clone()),
        (Op::Binary(BinaryOp::Add), [a, b]) if float(a) == Some(want) => Some(b.clone()),
        _ => None,
    }
}

/// The exponent `z` of `1 - 2 / (exp2(z) + 1)` as [`tanh`] builds it (operands of the sums
/// and products in either order).
fn tanh_exponent(u: &UOp) -> Option<UOp> {
    let (reciprocal, minus_two) = product_with_constant(&plus(u, 1.0)?)?;
    if minus_two != -2.0 || *reciprocal.op() != Op::Unary(UnaryOp::Recip) {
        return None;
    }
    let e = plus(&reciprocal.src()[0], 1.0)?;
    (*e.op() == Op::Unary(UnaryOp::Exp2)).then(|| e.src()[0].clone())
}

/// `u` as `s` times a product of float constants: the product.
fn multiple_of(u: &UOp, s: &UOp) -> Option<f64> {
    let mut factor = 1.0;
    let mut at = u.clone();
    while at != *s {
        let (rest, c) = product_with_constant(&at)?;
        factor *= c;
        at = rest;
    }
    Some(factor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use uopc_ir::DType;

    fn softcap_mods(f: impl Fn(&UOp) -> UOp + Send + Sync + 'static) -> AttentionMods {
        AttentionMods::new().score(move |_, s| f(s))
    }

    #[test]
    fn a_cap_built_with_tanh_is_recognized_in_any_operand_order() {
        let got = Softcap::of(&softcap_mods(|s| tanh(&(s * (1.0f32 / 30.0))) * 30.0f32)).unwrap();
        assert!((got.inner - 1.0 / 30.0).abs() < 1e-8 && got.outer == 30.0, "{got:?}");
        // The constant first, a chain of factors, no outer factor.
        let got = Softcap::of(&softcap_mods(|s| tanh(&(&(s * 0.5f32) * 0.1f32)))).unwrap();
        assert!((got.inner - 0.05).abs() < 1e-8 && got.outer == 1.0, "{got:?}");
        let got = Softcap::of(&softcap_mods(|s| uopc_ir::f32c(-4.0) * tanh(s))).unwrap();
        assert!((got.inner - 1.0).abs() < 1e-7 && got.outer == -4.0, "{got:?}");
    }

    #[test]
    fn other_functions_are_not() {
        // No score function, a bias, a tanh of something else than a multiple of the score,
        // a near miss of the form.
        assert_eq!(Softcap::of(&AttentionMods::new()), None);
        assert_eq!(Softcap::of(&softcap_mods(|s| s + 1.0f32)), None);
        let by_key = AttentionMods::new().score(|x, s| tanh(&(s * x.kv.cast(DType::F32))) * 3.0f32);
        assert_eq!(Softcap::of(&by_key), None);
        let shifted = softcap_mods(|s| tanh(&(s + 1.0f32)) * 3.0f32);
        assert_eq!(Softcap::of(&shifted), None);
        let not_tanh =
            softcap_mods(|s| ((((s * 2.0f32).exp2() + 1.0f32).recip() * -3.0f32) + 1.0f32) * 3.0f32);
        assert_eq!(Softcap::of(&not_tanh), None);
    }

    fn ramp(mods: &AttentionMods) -> Option<RampSlope> {
        let ScoreFunction { f, score, .. } = ScoreFunction::of(mods)?;
        let [_, _, q, kv] = crate::sdpa::flex::placeholders();
        Ramp::slope(&f, &score, &q, &kv)
    }

    #[test]
    fn alibi_is_a_ramp_with_its_slope_read_at_the_head() {
        let mut m = AttentionMods::new();
        let slopes = m.capture("slopes", &[8], DType::F32);
        let m = m.score(move |x, s| s + x.load(slopes, &[x.h.clone()]) * (&x.kv - &x.q).cast(DType::F32));
        assert!(matches!(ramp(&m), Some(RampSlope::Read(_))) && Ramp::of(&m));
        // Operands the other way round, and a constant slope.
        let m = AttentionMods::new().score(|x, s| (&x.kv - &x.q).cast(DType::F32) * -0.25f32 + s);
        assert_eq!(ramp(&m), Some(RampSlope::Constant(-0.25)));
    }

    #[test]
    fn other_biases_are_not_ramps() {
        // q - kv (the other sign is no ramp of kv - q), its square, a slope read at the key, a
        // scaled score, an offset.
        let m = AttentionMods::new().score(|x, s| s + (&x.q - &x.kv).cast(DType::F32) * 0.5f32);
        assert_eq!(ramp(&m), None);
        let m = AttentionMods::new().score(|x, s| {
            let p = (&x.kv - &x.q).cast(DType::F32);
            s + &p * &p
        });
        assert_eq!(ramp(&m), None);
        let mut m = AttentionMods::new();
        let t = m.capture("t", &[64], DType::F32);
        let m = m.score(move |x, s| s + x.load(t, &[x.kv.clone()]) * (&x.kv - &x.q).cast(DType::F32));
        assert_eq!(ramp(&m), None);
        let m = AttentionMods::new().score(|x, s| s * 2.0f32 + (&x.kv - &x.q).cast(DType::F32) * 0.5f32);
        assert_eq!(ramp(&m), None);
        let m = AttentionMods::new().score(|x, s| s + (&x.kv - &x.q + 1).cast(DType::F32) * 0.5f32);
        assert_eq!(ramp(&m), None);
    }
}

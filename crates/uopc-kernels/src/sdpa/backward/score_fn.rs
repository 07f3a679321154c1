//! What the backward reads off a score function before building anything: that it can be
//! differentiated, the captures it loads, and the stack tiles its derivative needs.

use crate::sdpa::flex::ScoreFunction;
use crate::sdpa::{AttentionMods, SdpaError};
use uopc_ir::{DType, Op, UOp, derivative};

/// The score function differentiated once over placeholders, with respect to the score and
/// to every capture it loads, so that a kernel's build cannot meet an op without a rule.
pub(super) fn check_differentiable(mods: &AttentionMods) -> Result<(), SdpaError> {
    let Some(ScoreFunction { f, score, buffers }) = ScoreFunction::of(mods) else { return Ok(()) };
    let fault = |e: uopc_ir::IrError| SdpaError::Capture {
        name: String::new(),
        reason: format!("the score function cannot be differentiated: {e}"),
    };
    derivative(&f, &score).map_err(fault)?;
    for load in capture_loads(&f, &buffers) {
        derivative(&f, &load.0).map_err(fault)?;
    }
    Ok(())
}

/// What a score function needs in the backward besides the score and gradient tiles.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ScoreTiles {
    /// Its derivative with respect to the score, when that is a constant (ALiBi's 1): no tile.
    pub constant: Option<f64>,
    /// A tile of its derivative at each score, when that is not a constant.
    pub slope: bool,
    /// A tile of the scores before it, when it reads a float capture whose gradient may be
    /// asked for.
    pub raw: bool,
}

impl ScoreTiles {
    /// The tiles of `mods`' score function, read off it over placeholders.
    pub fn of(mods: &AttentionMods) -> ScoreTiles {
        let Some(ScoreFunction { f, score, buffers }) = ScoreFunction::of(mods) else {
            return ScoreTiles { constant: Some(1.0), ..ScoreTiles::default() };
        };
        let f = f.cast(DType::F32);
        let constant = match derivative(&f, &score) {
            Ok(Some(d)) => uopc_ir::simplify(&d).const_value().map(|c| c.as_f64()),
            Ok(None) => Some(0.0),
            Err(_) => None,
        };
        let raw = capture_loads(&f, &buffers)
            .iter()
            .any(|(_, position, _)| mods.captures()[*position].dtype == DType::F32);
        ScoreTiles { constant, slope: constant.is_none(), raw }
    }

    /// How many tiles.
    pub fn count(self) -> usize {
        usize::from(self.slope) + usize::from(self.raw)
    }
}

/// The loads of captures in `f`: each load, its capture's position and its flat index.
pub(super) fn capture_loads(f: &UOp, buffers: &[UOp]) -> Vec<(UOp, usize, UOp)> {
    UOp::toposort(std::slice::from_ref(f))
        .into_iter()
        .filter(|u| matches!(u.op(), Op::Load))
        .filter_map(|load| {
            let at = load.src().first()?.clone();
            let (buf, flat) = (at.src().first()?, at.src().get(1)?.clone());
            let position = buffers.iter().position(|b| b == buf)?;
            Some((load, position, flat))
        })
        .collect()
}

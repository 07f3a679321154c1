//! The optional inputs of a run (mask, bias, key lengths, KV length) and the checks of every
//! argument against the configuration.

use super::{MaskKind, SdpaConfig, SdpaError};
use uopc_jit::{Arg, BufRef};

/// The optional inputs of [`Sdpa::run`](super::Sdpa::run); which ones must be given follows the
/// configuration.
#[derive(Clone, Copy, Debug, Default)]
pub struct Extras<'a> {
    /// The bool mask, for [`MaskKind::Bool`].
    pub mask: Option<&'a [bool]>,
    /// The additive bias, for [`MaskKind::Bias`].
    pub bias: Option<&'a [f32]>,
    /// `batch` key lengths, when [`SdpaConfig::key_lengths`] is set.
    pub key_lengths: Option<&'a [i32]>,
    /// The current KV length, when [`SdpaConfig::runtime_kv_length`] is set.
    pub kv_length: Option<usize>,
    /// The values of an [`AttentionMods`](super::AttentionMods)' captured tensors, in their
    /// order of declaration (one slice each, of the declared length and dtype); empty for
    /// attention without mods.
    pub captures: &'a [CaptureValues<'a>],
}

/// The values of one captured tensor.
#[derive(Clone, Copy, Debug)]
pub enum CaptureValues<'a> {
    /// For an F32 capture.
    F32(&'a [f32]),
    /// For an I32 capture.
    I32(&'a [i32]),
}

impl<'a> From<&'a [f32]> for CaptureValues<'a> {
    fn from(v: &'a [f32]) -> Self {
        CaptureValues::F32(v)
    }
}

impl<'a> From<&'a [i32]> for CaptureValues<'a> {
    fn from(v: &'a [i32]) -> Self {
        CaptureValues::I32(v)
    }
}

/// Checks `captures` against the mods' declarations and appends those a program reads (`used`,
/// see `AttentionMods::captures_read`) in its buffer order (after the key lengths).
pub(super) fn push_captures<'a>(
    specs: &[super::CaptureSpec],
    captures: &'a [CaptureValues<'a>],
    used: &[bool],
    args: &mut Vec<Arg<'a>>,
) -> Result<(), SdpaError> {
    if captures.len() != specs.len() {
        return Err(SdpaError::Capture {
            name: String::new(),
            reason: format!("{} captured tensor(s) given, the mods declare {}", captures.len(), specs.len()),
        });
    }
    for ((spec, values), &read) in specs.iter().zip(captures).zip(used) {
        let (len, dtype, arg) = match *values {
            CaptureValues::F32(v) => (v.len(), uopc_ir::DType::F32, Arg::Read(BufRef::F32(v))),
            CaptureValues::I32(v) => (v.len(), uopc_ir::DType::I32, Arg::Read(BufRef::I32(v))),
        };
        if dtype != spec.dtype || len != spec.len() {
            return Err(SdpaError::Capture {
                name: spec.name.clone(),
                reason: format!(
                    "given {len} {dtype} value(s), declared {} of shape {:?}",
                    spec.dtype, spec.shape
                ),
            });
        }
        if read {
            args.push(arg);
        }
    }
    Ok(())
}

/// `Ok` when a slice argument has the length the configuration needs.
pub(super) fn check(arg: &'static str, expected: usize, got: usize) -> Result<(), SdpaError> {
    if expected == got { Ok(()) } else { Err(SdpaError::Length { arg, expected, got }) }
}

/// Checks `extras` against the configuration and appends the mask or bias and the key
/// lengths, in the programs' buffer order.
pub(super) fn push_extras<'a>(
    c: &SdpaConfig,
    extras: Extras<'a>,
    args: &mut Vec<Arg<'a>>,
) -> Result<(), SdpaError> {
    let extra = |arg, expected: bool, given: bool| {
        if expected == given { Ok(()) } else { Err(SdpaError::Extra { arg, expected }) }
    };
    extra("mask", matches!(c.mask, MaskKind::Bool(_)), extras.mask.is_some())?;
    extra("bias", matches!(c.mask, MaskKind::Bias(_)), extras.bias.is_some())?;
    extra("key_lengths", c.key_lengths, extras.key_lengths.is_some())?;
    let mask_len = match c.mask {
        MaskKind::Bool(s) | MaskKind::Bias(s) => s.iter().product(),
        MaskKind::None => 0,
    };
    if let Some(m) = extras.mask {
        check("mask", mask_len, m.len())?;
        args.push(Arg::Read(BufRef::Bool(m)));
    }
    if let Some(b) = extras.bias {
        check("bias", mask_len, b.len())?;
        args.push(Arg::Read(BufRef::F32(b)));
    }
    if let Some(lens) = extras.key_lengths {
        check("key_lengths", c.batch, lens.len())?;
        if let Some((item, &len)) =
            lens.iter().enumerate().find(|(_, l)| !(0..=c.n_k as i64).contains(&i64::from(**l)))
        {
            return Err(SdpaError::KeyLength { item, len, n_k: c.n_k });
        }
        args.push(Arg::Read(BufRef::I32(lens)));
    }
    Ok(())
}

//! The backward of 16-bit attention: q, k, v and dO widened exactly to f32, the f32
//! FlashAttention-2 backward ([`SdpaBackward`]) run on them, and dq, dk and dv rounded once to
//! the input dtype, the way PyTorch's CPU backward of bf16 attention also computes in f32.
//!
//! Widening is exact, so the gradients are those of the f32 backward at the 16-bit inputs,
//! with one rounding to nearest even at the end: at most half a unit in the last place of the
//! 16-bit type (a relative `2^-8` for bf16, `2^-11` for f16) on top of the f32 backward's own
//! error. The forward is recomputed in f32 for the output and log-sum-exp the backward needs
//! (rather than reading back a 16-bit output, whose rounding would make `Delta = dO · O`
//! disagree with the recomputed probabilities). Attention with a score function, a mask
//! function and sinks ([`SdpaBackwardHalf::compile_flex`]) runs the f32 flex backward the same
//! way, and its float captures' gradients stay f32.

use half::{bf16, f16};
use uopc_jit::JitError;

use super::{
    AttentionMods, Extras, ForwardSaved, SdpaBackward, SdpaConfig, SdpaDType, SdpaElement, SdpaError, Values,
    ValuesMut,
};

/// A compiled backward for a bf16 or f16 [`SdpaConfig`]: its f32 twin (the same configuration
/// with `dtype` f32, forward-with-lse and backward) behind an entry point that takes and
/// returns 16-bit values. `Sync`, so one compile serves every thread.
#[derive(Debug)]
pub struct SdpaBackwardHalf {
    config: SdpaConfig,
    wide: SdpaBackward,
}

impl SdpaBackwardHalf {
    /// Validates `config` and compiles the f32 twin's programs.
    ///
    /// # Errors
    ///
    /// [`SdpaError::Jit`] when `config.dtype` is f32 (that is [`SdpaBackward`]'s); the errors of
    /// [`SdpaBackward::compile`] for the twin.
    pub fn compile(config: &SdpaConfig) -> Result<SdpaBackwardHalf, SdpaError> {
        let wide = SdpaBackward::compile(&f32_twin(config)?)?;
        Ok(SdpaBackwardHalf { config: *config, wide })
    }

    /// [`SdpaBackwardHalf::compile`] for attention with a score function, a mask function
    /// and sinks: the f32 twin is [`SdpaBackward::compile_flex`]'s, and
    /// [`SdpaBackwardHalf::gradients_with_capture_grads`] also gives the float captures'
    /// gradients.
    ///
    /// # Errors
    ///
    /// As [`SdpaBackwardHalf::compile`], with the errors of [`SdpaBackward::compile_flex`].
    pub fn compile_flex(config: &SdpaConfig, mods: &AttentionMods) -> Result<SdpaBackwardHalf, SdpaError> {
        let wide = SdpaBackward::compile_flex(&f32_twin(config)?, mods)?;
        Ok(SdpaBackwardHalf { config: *config, wide })
    }

    /// The configuration it was compiled for (with its 16-bit dtype).
    pub fn config(&self) -> &SdpaConfig {
        &self.config
    }

    /// The f32 backward that does the work.
    pub fn f32_backward(&self) -> &SdpaBackward {
        &self.wide
    }

    /// The gradients of the attention of `[q, k, v]` (with the forward's `extras`) for the
    /// output gradient `d_o`, into `dq` (q's length) and `dk`, `dv` (k's), all of the
    /// configuration's dtype; `dbias`, when given, gets the f32 gradient of the f32 bias (see
    /// [`SdpaBackward::run_with_bias_grad`]). The forward is recomputed in f32 (see the module
    /// docs), so this takes no saved state.
    ///
    /// # Errors
    ///
    /// [`SdpaError::DType`] naming `q` when `T` is not the configuration's dtype;
    /// [`SdpaError::Length`] naming the first slice of the wrong length; the errors of
    /// [`SdpaBackward::run_with_bias_grad`] (`dbias` given without a bias, say). Nothing is
    /// written when one is returned.
    pub fn gradients<T: SdpaElement>(
        &self,
        qkv: [&[T]; 3],
        d_o: &[T],
        extras: Extras<'_>,
        grads: [&mut [T]; 3],
        dbias: Option<&mut [f32]>,
    ) -> Result<(), SdpaError> {
        let extra = match dbias {
            Some(d) => Extra::Bias(d),
            None => Extra::None,
        };
        self.gradients_inner(qkv, d_o, extras, grads, extra)
    }

    /// [`SdpaBackwardHalf::gradients`] of attention with mods ([`SdpaBackwardHalf::compile_flex`])
    /// that also writes the f32 gradients of the float captures into `dcaptures`, as
    /// [`SdpaBackward::run_with_capture_grads`] takes them.
    ///
    /// # Errors
    ///
    /// As [`SdpaBackwardHalf::gradients`]; the errors of
    /// [`SdpaBackward::run_with_capture_grads`] (a backward without mods, a slice of the wrong
    /// length).
    pub fn gradients_with_capture_grads<T: SdpaElement>(
        &self,
        qkv: [&[T]; 3],
        d_o: &[T],
        extras: Extras<'_>,
        grads: [&mut [T]; 3],
        dcaptures: &mut [&mut [f32]],
    ) -> Result<(), SdpaError> {
        self.gradients_inner(qkv, d_o, extras, grads, Extra::Captures(dcaptures))
    }

    fn gradients_inner<T: SdpaElement>(
        &self,
        [q, k, v]: [&[T]; 3],
        d_o: &[T],
        extras: Extras<'_>,
        [dq, dk, dv]: [&mut [T]; 3],
        extra: Extra<'_, '_>,
    ) -> Result<(), SdpaError> {
        let c = &self.config;
        if T::DTYPE != c.dtype {
            return Err(SdpaError::DType { arg: "q", expected: c.dtype, got: T::DTYPE });
        }
        let (q_len, kv_len) = (c.q_len(), c.kv_len());
        for (arg, expected, got) in [
            ("q", q_len, q.len()),
            ("k", kv_len, k.len()),
            ("v", kv_len, v.len()),
            ("d_o", q_len, d_o.len()),
            ("dq", q_len, dq.len()),
            ("dk", kv_len, dk.len()),
            ("dv", kv_len, dv.len()),
        ] {
            if expected != got {
                return Err(SdpaError::Length { arg, expected, got });
            }
        }
        let (q, k, v, d_o) =
            (widen(T::values(q)), widen(T::values(k)), widen(T::values(v)), widen(T::values(d_o)));
        let mut o = vec![0.0f32; q_len];
        let mut lse = vec![0.0f32; self.wide.lse_len()];
        self.wide.forward(&q, &k, &v, extras, &mut o, &mut lse)?;
        let saved = ForwardSaved { q: &q, k: &k, v: &v, o: &o, lse: &lse };
        let (mut gq, mut gk, mut gv) = (vec![0.0f32; q_len], vec![0.0f32; kv_len], vec![0.0f32; kv_len]);
        let targets = [&mut gq[..], &mut gk[..], &mut gv[..]];
        match extra {
            Extra::Bias(dbias) => self.wide.run_with_bias_grad(saved, &d_o, extras, targets, dbias)?,
            Extra::Captures(d) => self.wide.run_with_capture_grads(saved, &d_o, extras, targets, d)?,
            Extra::None => {
                let [gq, gk, gv] = targets;
                self.wide.run(saved, &d_o, extras, gq, gk, gv)?
            }
        }
        round_into(&gq, T::values_mut(dq));
        round_into(&gk, T::values_mut(dk));
        round_into(&gv, T::values_mut(dv));
        Ok(())
    }
}

/// What a run writes besides dq, dk and dv.
enum Extra<'a, 'b> {
    None,
    /// The f32 bias's gradient.
    Bias(&'a mut [f32]),
    /// The float captures' gradients.
    Captures(&'a mut [&'b mut [f32]]),
}

/// `config` with dtype f32, for a 16-bit `config`.
fn f32_twin(config: &SdpaConfig) -> Result<SdpaConfig, SdpaError> {
    if config.dtype == SdpaDType::F32 {
        return Err(JitError::Unsupported(
            "sdpa backward: SdpaBackwardHalf takes bf16 or f16 configurations; an f32 one is \
             SdpaBackward's"
                .into(),
        )
        .into());
    }
    Ok(SdpaConfig { dtype: SdpaDType::F32, ..*config })
}

/// The values as f32, exactly.
fn widen(x: Values<'_>) -> Vec<f32> {
    match x {
        Values::F32(x) => x.to_vec(),
        Values::BF16(x) => x.iter().map(|h| h.to_f32()).collect(),
        Values::F16(x) => x.iter().map(|h| h.to_f32()).collect(),
    }
}

/// `out[i] = g[i]` rounded to nearest even in `out`'s type (`g` and `out` have one length).
fn round_into(g: &[f32], out: ValuesMut<'_>) {
    match out {
        ValuesMut::F32(out) => out.copy_from_slice(g),
        ValuesMut::BF16(out) => out.iter_mut().zip(g).for_each(|(o, &x)| *o = bf16::from_f32(x)),
        ValuesMut::F16(out) => out.iter_mut().zip(g).for_each(|(o, &x)| *o = f16::from_f32(x)),
    }
}

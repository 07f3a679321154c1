//! [`SdpaBackward`] of attention with mods: its compile, the run that also gives the float
//! captures' gradients, and the host sums that finish them (the tasks' regions, the sinks).

use super::parts::{ExtraGrads, FlexParts};
use super::program::plan_blocking;
use super::score_fn::ScoreTiles;
use super::{BackwardBlocking, ForwardSaved, Geometry, SdpaBackward, sdpa_flex_backward_ir};
use crate::LOG2E;
use crate::sdpa::blocking::cores;
use crate::sdpa::flex::CaptureReads;
use crate::sdpa::forward::{causal_equivalent, check_flex};
use crate::sdpa::kernel::PlanMode;
use crate::sdpa::kernel::count_pairs;
use crate::sdpa::sdpa_flex_plan_ir;
use crate::sdpa::{AttentionMods, CaptureValues, Extras, Sdpa, SdpaConfig, SdpaDType, SdpaError};
use std::sync::{Mutex, OnceLock};
use uopc_ir::{DType, UOp};
use uopc_jit::{JitError, Program};

impl SdpaBackward {
    /// The per-run counts of the pairs each (query block, key block) of the backward sees,
    /// for a mask without exact key bounds (see [`plan_blocking`]); `None` otherwise.
    pub(super) fn flex_counts(&self, extras: Extras<'_>) -> Result<Option<Vec<f32>>, SdpaError> {
        let Some(FlexParts { mods, plan: Some(program), reads, .. }) = &self.flex else { return Ok(None) };
        let len = counts_len(&self.config, &self.blocking, mods);
        // The backward has no runtime KV length: its counting kernel takes no variable.
        let extras = Extras { kv_length: None, ..extras };
        Ok(Some(count_pairs(program, (mods, &reads.mask), extras, len)?))
    }

    /// The backward of [`Sdpa::compile_flex`]'s attention: [`SdpaBackward::forward`] runs the
    /// flex forward and saves each row's log-sum-exp (sinks included), [`SdpaBackward::run`]
    /// gives dq, dk and dv through the score function (its derivative by the chain rule, see
    /// [`sdpa_flex_backward_ir`]) and the mask, and [`SdpaBackward::run_with_capture_grads`]
    /// also the gradients of the float captures (slopes, bias tables, sink logits). The
    /// (query block, key block) pairs the mask's key bounds exclude are skipped; a mask that
    /// is exactly the causal mask runs as the causal backward.
    ///
    /// # Errors
    ///
    /// The errors of [`Sdpa::compile_flex`]; [`SdpaError::Capture`] for a score function
    /// without a derivative; [`JitError::Unsupported`] for a 16-bit configuration (whose
    /// backward is [`SdpaBackwardHalf::compile_flex`](crate::sdpa::SdpaBackwardHalf::compile_flex))
    /// or a runtime KV length (decode has no backward).
    pub fn compile_flex(config: &SdpaConfig, mods: &AttentionMods) -> Result<SdpaBackward, SdpaError> {
        let (config, mods) = checked_and_rewritten(config, mods)?;
        let blocking = flex_backward_blocking(&config, &mods, cores());
        Self::compile_flex_prepared(&config, &mods, blocking)
    }

    /// [`SdpaBackward::compile_flex`] with the backward's block sizes given (for experiments
    /// and tests); the forward's are chosen as [`Sdpa::compile_flex`] chooses them.
    ///
    /// # Errors
    ///
    /// As [`SdpaBackward::compile_flex`]; [`JitError::Unsupported`] when `blocking` does not
    /// fit the configuration or its tiles do not fit the stack.
    pub fn compile_flex_with(
        config: &SdpaConfig,
        mods: &AttentionMods,
        blocking: BackwardBlocking,
    ) -> Result<SdpaBackward, SdpaError> {
        let (config, mods) = checked_and_rewritten(config, mods)?;
        if !blocking.valid(&config) || !blocking.fits(config.d, flex_tiles(&mods)) {
            return Err(JitError::Unsupported(format!(
                "sdpa flex backward: blocking {blocking:?} does not fit {config:?}"
            ))
            .into());
        }
        Self::compile_flex_prepared(&config, &mods, blocking)
    }

    /// Compiles the flex forward and backward of a configuration the causal rewrite has seen.
    fn compile_flex_prepared(
        config: &SdpaConfig,
        mods: &AttentionMods,
        blocking: BackwardBlocking,
    ) -> Result<SdpaBackward, SdpaError> {
        if config.runtime_kv_length || config.dtype != SdpaDType::F32 {
            return Err(JitError::Unsupported(format!(
                "sdpa flex backward: takes f32 configurations with a fixed n_k, and this one is {} with \
                 runtime_kv_length {}",
                config.dtype, config.runtime_kv_length
            ))
            .into());
        }
        let (config, mods) = (*config, mods.clone());
        let forward = Sdpa::compile_flex_inner(&config, &mods, true)?;
        let ir = sdpa_flex_backward_ir(&config, &blocking, &mods, false)?;
        let plan = match counting_ir(&config, &blocking, &mods) {
            None => None,
            Some(ir) => Some(Program::compile(&ir, "sdpa_flex_backward_plan")?),
        };
        let program = Program::compile(&ir, "sdpa_flex_backward")?;
        let b = SdpaBackward {
            config,
            forward_blocking: forward.blocking(),
            blocking,
            forward: None,
            program,
            extra_grads: OnceLock::new(),
            flex: Some(FlexParts { reads: CaptureReads::of(&mods), mods, forward: Box::new(forward), plan }),
            scratch: Mutex::new(Vec::new()),
            panels: None,
        };
        if uopc_tensor::debug_level() >= 1 {
            eprintln!("{b}; compiled in {:.1} ms", b.program.compile_seconds() * 1e3);
        }
        Ok(b)
    }

    /// [`SdpaBackward::run`] of a flex backward that also writes the gradients of the float
    /// captures: `dcaptures` holds one slice per capture in declaration order, of the
    /// capture's length for an F32 capture and empty for an I32 one (ids have no gradient).
    /// A capture's gradient sums `dS * df/dc` over every score that read it; the sink
    /// logits' adds `-sum_rows P_sink * Delta` (with `P_sink = exp(z - lse)`, `Delta = dO · O`).
    ///
    /// # Errors
    ///
    /// As [`SdpaBackward::run`]; [`SdpaError::Extra`] naming `dcaptures` for a backward
    /// without mods, [`SdpaError::Capture`] naming a capture whose slice has the wrong length.
    pub fn run_with_capture_grads(
        &self,
        saved: ForwardSaved<'_>,
        d_o: &[f32],
        extras: Extras<'_>,
        grads: [&mut [f32]; 3],
        dcaptures: &mut [&mut [f32]],
    ) -> Result<(), SdpaError> {
        let Some(FlexParts { mods, .. }) = &self.flex else {
            return Err(SdpaError::Extra { arg: "dcaptures", expected: false });
        };
        if dcaptures.len() != mods.captures().len() {
            return Err(SdpaError::Capture {
                name: String::new(),
                reason: format!(
                    "{} gradient slice(s) given, the mods declare {} capture(s)",
                    dcaptures.len(),
                    mods.captures().len()
                ),
            });
        }
        for (spec, target) in mods.captures().iter().zip(dcaptures.iter()) {
            let want = if spec.dtype == DType::F32 { spec.len() } else { 0 };
            if target.len() != want {
                return Err(SdpaError::Capture {
                    name: spec.name.clone(),
                    reason: format!("its gradient slice holds {}, want {want}", target.len()),
                });
            }
        }
        self.run_inner(saved, d_o, extras, grads, ExtraGrads::Captures(dcaptures))
    }

    /// The task-major targets of the float captures' gradients (one region per task), when
    /// `wanted`; `None` in place of an I32 capture.
    pub(super) fn capture_partials(&self, g: &Geometry, wanted: bool) -> Vec<Option<Vec<f32>>> {
        match &self.flex {
            Some(FlexParts { mods, reads, .. }) if wanted => mods
                .captures()
                .iter()
                .zip(&reads.with_gradient)
                .map(|(spec, &differentiated)| differentiated.then(|| vec![0.0f32; g.tasks * spec.len()]))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Sets each capture's gradient to the sum of the tasks' regions (zero for a capture the
    /// backward kernel does not read).
    pub(super) fn sum_capture_partials(&self, partials: &[Option<Vec<f32>>], targets: &mut [&mut [f32]]) {
        for target in targets.iter_mut() {
            target.fill(0.0);
        }
        for (partial, target) in partials.iter().zip(targets.iter_mut()) {
            let Some(partial) = partial else { continue };
            if target.is_empty() {
                continue;
            }
            for region in partial.chunks_exact(target.len()) {
                for (t, &x) in target.iter_mut().zip(region) {
                    *t += x;
                }
            }
        }
    }

    /// Adds the sink logits' gradient into their capture's slice: `dz_h = -sum P_sink Delta`
    /// over the rows of head `h`, from the saved base-2 lse and `delta` (`scale * Delta`).
    pub(super) fn add_sink_grads(
        &self,
        (lse, delta): (&[f32], &[f32]),
        extras: Extras<'_>,
        targets: &mut [&mut [f32]],
    ) {
        let Some(FlexParts { mods, .. }) = &self.flex else { return };
        let Some(sinks) = mods.sink_logits() else { return };
        let Some(CaptureValues::F32(values)) = extras.captures.get(sinks.position()) else { return };
        let c = &self.config;
        let unscale = 1.0 / f64::from(c.effective_scale());
        let target = &mut targets[sinks.position()];
        for (row, (&l, &dl)) in lse.iter().zip(delta).enumerate() {
            let h = (row / c.n_q) % c.heads;
            let z = f64::from(values[h]);
            if z == f64::NEG_INFINITY {
                continue;
            }
            let p = (z * LOG2E - f64::from(l)).exp2();
            target[h] -= (p * f64::from(dl) * unscale) as f32;
        }
    }
}

/// The backward's block sizes for attention with `mods` on `cores` cores: a mask that bounds
/// the keys gets the causal shape's blocks, as the forward does, and the query blocks are
/// short enough for the score function's tiles beside the score and gradient tiles.
pub(super) fn flex_backward_blocking(
    config: &SdpaConfig,
    mods: &AttentionMods,
    cores: usize,
) -> BackwardBlocking {
    let bounded = mods.mask_analysis().is_some_and(|m| m.bounds.is_bounded());
    let shape = SdpaConfig { causal: config.causal || bounded, ..*config };
    BackwardBlocking::choose(&shape, cores).with_tiles(config.d, flex_tiles(mods))
}

/// The `queries x keys` tiles of a flex backward task: the score and gradient tiles, and the
/// score function's.
pub(super) fn flex_tiles(mods: &AttentionMods) -> usize {
    2 + ScoreTiles::of(mods).count()
}

/// The counting kernel the backward of `mods` with `blocking` reads (per (query block, key
/// block) pair, see [`plan_blocking`]) when the mask has no exact key bounds; `None` otherwise.
pub(super) fn counting_ir(
    config: &SdpaConfig,
    blocking: &BackwardBlocking,
    mods: &AttentionMods,
) -> Option<UOp> {
    match PlanMode::of(mods) {
        PlanMode::Static => None,
        PlanMode::Runtime { .. } => Some(sdpa_flex_plan_ir(config, &plan_blocking(config, blocking), mods)),
    }
}

/// The counts [`counting_ir`]'s kernel writes: one per (query block, full key block) pair.
pub(super) fn counts_len(config: &SdpaConfig, blocking: &BackwardBlocking, mods: &AttentionMods) -> usize {
    PlanMode::of(mods).units(config, &plan_blocking(config, blocking)) * (config.n_k / blocking.keys)
}

/// `config` and `mods` checked ([`check_flex`]), and the causal configuration with the mods
/// without their mask when that mask is exactly the causal mask ([`causal_equivalent`]).
fn checked_and_rewritten(
    config: &SdpaConfig,
    mods: &AttentionMods,
) -> Result<(SdpaConfig, AttentionMods), SdpaError> {
    config.validate()?;
    check_flex(config, mods)?;
    Ok(match causal_equivalent(config, mods) {
        Some(causal) => (causal, mods.without_mask()),
        None => (*config, mods.clone()),
    })
}

/// What a flex backward runs, for its `Display`: the score function's chain rule, which
/// captures get gradients, and which block pairs the mask lets it skip.
pub(super) fn describe(mods: &AttentionMods) -> String {
    let mut parts = Vec::new();
    if mods.has_score() {
        let floats = mods.captures_with_gradient().into_iter().filter(|&d| d).count();
        parts.push(format!(
            "a score function, its derivative applied to dS (the chain rule), {floats} float capture(s) it reads \
             differentiated on request"
        ));
    }
    if mods.has_sink_logits() {
        parts.push("sinks, whose gradient is summed on the host from the lse".to_string());
    }
    parts.push(match mods.mask_analysis() {
        Some(m) if m.bounds.exact => "a mask function whose key bounds are the whole mask: block pairs outside every \
                                      row's bounds are skipped, those inside them run unmasked"
            .to_string(),
        Some(_) => "a mask function whose key bounds are not the whole mask: a plan counted once per run over every \
                    (query block, key block) pair skips the pairs it hides and runs unmasked those it shows whole"
            .to_string(),
        None => "no mask function".to_string(),
    });
    format!("mods: {}", parts.join(", "))
}

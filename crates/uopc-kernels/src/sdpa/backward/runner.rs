//! [`SdpaBackward`]: the compiled forward-with-lse and backward, their compile and their runs.

use super::parts::{ExtraGrads, FlexParts};
use super::{BackwardBlocking, Geometry, sdpa_backward_ir, sdpa_backward_ir_with_bias_grad};
use crate::sdpa::blocking::{Blocking, cores};
use crate::sdpa::kernel::sdpa_ir_with_lse;
use crate::sdpa::panels::KvPanels;
use crate::sdpa::{
    ConfigCache, Extras, MaskKind, SdpaConfig, SdpaError, Values, ValuesMut, cached, check, push_captures,
    push_extras,
};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use uopc_jit::{Arg, BufRef, JitError, Program};

/// What the forward pass keeps for the backward: its inputs, its output and the per-row lse.
#[derive(Clone, Copy, Debug)]
pub struct ForwardSaved<'a> {
    /// q, as given to the forward.
    pub q: &'a [f32],
    /// k.
    pub k: &'a [f32],
    /// v.
    pub v: &'a [f32],
    /// The forward's output.
    pub o: &'a [f32],
    /// The forward's base-2 log-sum-exp, `(batch, head, row)` ([`SdpaBackward::lse_len`]).
    pub lse: &'a [f32],
}

/// A compiled forward-with-lse and FlashAttention-2 backward for one [`SdpaConfig`]; `Sync`,
/// so one compile serves every thread. The pair a vector-Jacobian product needs: run
/// [`SdpaBackward::forward`] (which keeps the lse), then [`SdpaBackward::run`] with the
/// output's gradient.
#[derive(Debug)]
pub struct SdpaBackward {
    pub(super) config: SdpaConfig,
    pub(super) forward_blocking: Blocking,
    pub(super) blocking: BackwardBlocking,
    /// The forward-with-lse (`None` with mods: `flex` holds theirs).
    pub(super) forward: Option<Program>,
    pub(super) program: Program,
    /// The backward that also writes dbias ([`sdpa_backward_ir_with_bias_grad`]) or the
    /// captures' gradients ([`sdpa_flex_backward_ir`](super::sdpa_flex_backward_ir)), compiled
    /// on the first run that asks for them, so that inputs without a gradient cost neither its
    /// compile nor its writes.
    pub(super) extra_grads: OnceLock<Program>,
    /// With attention mods: the mods, and the flex forward that saves the lse (which then
    /// runs instead of `forward`).
    pub(super) flex: Option<FlexParts>,
    /// The dq partials and task-major dk and dv of chunked or BHND-strided runs, reused.
    pub(super) scratch: Mutex<Vec<f32>>,
    /// Where the forward's K and V are packed into panels, with
    /// [`Blocking::kv_panel_width`] (see [`Sdpa::run`](crate::sdpa::Sdpa::run)).
    pub(super) panels: Option<KvPanels>,
}

impl SdpaBackward {
    /// Validates `config`, chooses block sizes for this machine and compiles both programs.
    /// At `UOPC_DEBUG` level 1 or more it prints its choice (the [`Display`](fmt::Display)
    /// line) and the compile time to stderr.
    pub fn compile(config: &SdpaConfig) -> Result<SdpaBackward, SdpaError> {
        config.validate()?;
        let cores = cores();
        // The forward runs unsplit: split-K tasks write partial states, not the rows' lse.
        let forward = Blocking { splits: 1, ..Blocking::choose(config, cores) };
        Self::compile_with(config, forward, BackwardBlocking::choose(config, cores))
    }

    /// [`SdpaBackward::compile`] with the given block sizes (for experiments and tests).
    pub fn compile_with(
        config: &SdpaConfig,
        forward: Blocking,
        blocking: BackwardBlocking,
    ) -> Result<SdpaBackward, SdpaError> {
        config.validate()?;
        let fwd_valid = forward.heads_per_task >= 1
            && (config.heads / config.kv_heads).is_multiple_of(forward.heads_per_task)
            && (1..=config.n_q).contains(&forward.queries)
            && (1..=config.n_k).contains(&forward.keys)
            && forward.splits == 1
            && forward.kv_panels_valid(config);
        if config.runtime_kv_length {
            return Err(JitError::Unsupported(
                "sdpa backward: a runtime KV length (decode) has no backward; use a fixed n_k".into(),
            )
            .into());
        }
        if config.dtype != crate::sdpa::SdpaDType::F32 {
            return Err(JitError::Unsupported(format!(
                "sdpa backward: SdpaBackward takes f32 configurations, and this one's dtype is {}; \
                 SdpaBackwardHalf is the backward of 16-bit attention",
                config.dtype
            ))
            .into());
        }
        if !fwd_valid || !blocking.valid(config) {
            return Err(JitError::Unsupported(format!(
                "sdpa backward: blocking {forward:?} / {blocking:?} does not fit {config:?}"
            ))
            .into());
        }
        let fwd = Program::compile(&sdpa_ir_with_lse(config, &forward), "sdpa_forward_lse")?;
        let program = Program::compile(&sdpa_backward_ir(config, &blocking), "sdpa_backward_tile_ops")?;
        let b = SdpaBackward {
            config: *config,
            forward_blocking: forward,
            blocking,
            forward: Some(fwd),
            program,
            extra_grads: OnceLock::new(),
            flex: None,
            scratch: Mutex::new(Vec::new()),
            panels: forward.kv_panels(config),
        };
        if uopc_tensor::debug_level() >= 1 {
            eprintln!(
                "{b}; compiled in {:.1} ms",
                (b.forward_program().compile_seconds() + b.program.compile_seconds()) * 1e3
            );
        }
        Ok(b)
    }

    /// Elements of the lse buffer: `batch * heads * n_q`.
    pub fn lse_len(&self) -> usize {
        self.config.batch * self.config.heads * self.config.n_q
    }

    /// The attention forward (as [`Sdpa::run`](crate::sdpa::Sdpa::run)) that also stores each query row's
    /// base-2 log-sum-exp into `lse` ([`SdpaBackward::lse_len`] elements, `(batch, head, row)`;
    /// see [`sdpa_ir_with_lse`]), which [`SdpaBackward::run`] needs.
    pub fn forward(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        extras: Extras<'_>,
        out: &mut [f32],
        lse: &mut [f32],
    ) -> Result<(), SdpaError> {
        let c = &self.config;
        check("q", c.q_len(), q.len())?;
        check("k", c.kv_len(), k.len())?;
        check("v", c.kv_len(), v.len())?;
        check("out", c.q_len(), out.len())?;
        check("lse", self.lse_len(), lse.len())?;
        if let Some(FlexParts { forward: sdpa, .. }) = &self.flex {
            let (q, k, v) = (Values::F32(q), Values::F32(k), Values::F32(v));
            return sdpa.run_with_lse(q, k, v, extras, ValuesMut::F32(out), Some(lse));
        }
        let packed = self.panels.as_ref().map(|panels| panels.pack_into(k, v));
        let (k, v) = packed.as_ref().map_or((k, v), |p| p.panels());
        let mut args: Vec<Arg<'_>> = vec![q.into(), k.into(), v.into(), Arg::WriteF32(out)];
        push_extras(c, extras, &mut args)?;
        args.push(Arg::WriteF32(lse));
        let Some(forward) = &self.forward else { unreachable!("a backward without mods has its forward") };
        forward.run(&mut args)?;
        Ok(())
    }

    /// The gradients of the attention at `saved` (what [`SdpaBackward::forward`] read and
    /// produced) for the output gradient `d_o`, into `dq` (q's length) and `dk`, `dv` (k's).
    /// `extras` must be the forward's. Every length is checked, each error naming its
    /// argument. Rows that saw no key get zero gradients. The bias gets no gradient (see
    /// [`SdpaBackward::run_with_bias_grad`]).
    pub fn run(
        &self,
        saved: ForwardSaved<'_>,
        d_o: &[f32],
        extras: Extras<'_>,
        dq: &mut [f32],
        dk: &mut [f32],
        dv: &mut [f32],
    ) -> Result<(), SdpaError> {
        self.run_inner(saved, d_o, extras, [dq, dk, dv], ExtraGrads::None)
    }

    /// [`SdpaBackward::run`] into `[dq, dk, dv]` that also writes the gradient of the
    /// additive bias into `dbias` (the bias's shape and length): `dS = P * (dP - Delta)`
    /// summed over the axes the bias broadcasts along, zero where no row sees the key. The
    /// first call compiles the program that writes it (then kept in `self`), so a bias
    /// without a gradient costs nothing.
    ///
    /// # Errors
    ///
    /// As [`SdpaBackward::run`]; [`SdpaError::Extra`] naming `dbias` when the configuration has
    /// no bias, [`SdpaError::Length`] naming it when its length is not the bias's.
    pub fn run_with_bias_grad(
        &self,
        saved: ForwardSaved<'_>,
        d_o: &[f32],
        extras: Extras<'_>,
        [dq, dk, dv]: [&mut [f32]; 3],
        dbias: &mut [f32],
    ) -> Result<(), SdpaError> {
        let MaskKind::Bias(shape) = self.config.mask else {
            return Err(SdpaError::Extra { arg: "dbias", expected: false });
        };
        check("dbias", shape.iter().product(), dbias.len())?;
        self.run_inner(saved, d_o, extras, [dq, dk, dv], ExtraGrads::Bias(dbias))
    }

    /// The compiled backward that also writes dbias, or with mods the captures' gradients,
    /// compiled on first use.
    pub(super) fn extra_grads_program(&self) -> Result<&Program, SdpaError> {
        if let Some(p) = self.extra_grads.get() {
            return Ok(p);
        }
        let program = match &self.flex {
            Some(FlexParts { mods, .. }) => Program::compile(
                &super::sdpa_flex_backward_ir(&self.config, &self.blocking, mods, true)?,
                "sdpa_flex_backward_capture_grads",
            )?,
            None => Program::compile(
                &sdpa_backward_ir_with_bias_grad(&self.config, &self.blocking)?,
                "sdpa_backward_bias_grad_tile_ops",
            )?,
        };
        // A racing compile is harmless: the first one stored is used.
        Ok(self.extra_grads.get_or_init(|| program))
    }

    pub(super) fn run_inner(
        &self,
        saved: ForwardSaved<'_>,
        d_o: &[f32],
        extras: Extras<'_>,
        [dq, dk, dv]: [&mut [f32]; 3],
        grads: ExtraGrads<'_, '_>,
    ) -> Result<(), SdpaError> {
        let c = &self.config;
        check("q", c.q_len(), saved.q.len())?;
        check("k", c.kv_len(), saved.k.len())?;
        check("v", c.kv_len(), saved.v.len())?;
        check("o", c.q_len(), saved.o.len())?;
        check("lse", self.lse_len(), saved.lse.len())?;
        check("d_o", c.q_len(), d_o.len())?;
        check("dq", c.q_len(), dq.len())?;
        check("dk", c.kv_len(), dk.len())?;
        check("dv", c.kv_len(), dv.len())?;
        let g = Geometry::new(c, &self.blocking);
        let delta = self.delta(saved.o, d_o);
        let counts = self.flex_counts(extras)?;
        let mut extra_args = Vec::new();
        push_extras(c, extras, &mut extra_args)?;
        match &self.flex {
            Some(FlexParts { mods, reads, .. }) => {
                push_captures(mods.captures(), extras.captures, &reads.backward, &mut extra_args)?;
                if let Some(counts) = &counts {
                    extra_args.push(Arg::Read(BufRef::F32(counts)));
                }
            }
            None if !extras.captures.is_empty() => {
                return Err(SdpaError::Extra { arg: "captures", expected: false });
            }
            None => {}
        }
        let (dbias, dcaptures) = match grads {
            ExtraGrads::None => (None, None),
            ExtraGrads::Bias(d) => (Some(d), None),
            ExtraGrads::Captures(d) => (None, Some(d)),
        };
        let program =
            if dbias.is_some() || dcaptures.is_some() { self.extra_grads_program()? } else { &self.program };
        // The float captures' task-major targets, summed into the caller's after the kernel.
        let mut capture_partials = self.capture_partials(&g, dcaptures.is_some());
        for p in capture_partials.iter_mut().flatten() {
            extra_args.push(Arg::WriteF32(p));
        }
        // The dbias target: the caller's dbias when no two tasks share an element, else the
        // tasks' partials, added into dbias after the kernel.
        let mut dbias_partials = match &dbias {
            Some(_) if !g.bias_direct => vec![0.0f32; g.dbias_len()],
            _ => Vec::new(),
        };
        let (dbias_direct, dbias_sum) = match dbias {
            Some(out) if g.bias_direct => (Some(out), None),
            other => (None, other),
        };
        if let Some(target) = dbias_direct {
            extra_args.push(Arg::WriteF32(target));
        } else if dbias_sum.is_some() {
            extra_args.push(Arg::WriteF32(&mut dbias_partials));
        }
        let run = |dq_t: &mut [f32], dk_t: &mut [f32], dv_t: &mut [f32], extra: Vec<Arg<'_>>| {
            let mut args: Vec<Arg<'_>> = vec![
                saved.q.into(),
                saved.k.into(),
                saved.v.into(),
                d_o.into(),
                saved.lse.into(),
                delta.as_slice().into(),
                Arg::WriteF32(dq_t),
                Arg::WriteF32(dk_t),
                Arg::WriteF32(dv_t),
            ];
            args.extend(extra);
            program.run(&mut args)
        };
        if g.direct {
            run(dq, dk, dv, extra_args)?;
        } else {
            // The chunks' targets, kept between runs: each task zeroes its dq rows and writes
            // all of its dk and dv rows, so nothing needs clearing here, and a fresh (zeroed,
            // page-faulted) allocation per run is avoided. A run that finds the buffer taken
            // by a concurrent run allocates its own.
            let mut scratch = std::mem::take(&mut *self.scratch.lock().unwrap_or_else(|e| e.into_inner()));
            let (dq_len, dkv_len) = (g.dq_len(c), g.dkv_len(c));
            scratch.resize(dq_len + 2 * dkv_len, 0.0);
            let (dq_t, dkv_t) = scratch.split_at_mut(dq_len);
            let (dk_t, dv_t) = dkv_t.split_at_mut(dkv_len);
            run(dq_t, dk_t, dv_t, extra_args)?;
            self.gather(&g, [dq_t, dk_t, dv_t], [dq, dk, dv]);
            *self.scratch.lock().unwrap_or_else(|e| e.into_inner()) = scratch;
        }
        if let Some(out) = dbias_sum {
            self.sum_bias_partials(&g, &dbias_partials, out);
        }
        if let Some(targets) = dcaptures {
            self.sum_capture_partials(&capture_partials, targets);
            self.add_sink_grads((saved.lse, &delta), extras, targets);
        }
        Ok(())
    }

    /// Bytes of the buffers one [`SdpaBackward::run`] allocates besides its arguments: Delta,
    /// and the chunked dq partials and task-major dk and dv when not written in place.
    pub fn temporary_bytes(&self) -> usize {
        let c = &self.config;
        let g = Geometry::new(c, &self.blocking);
        let delta = self.lse_len();
        let targets = if g.direct { 0 } else { g.dq_len(c) + 2 * g.dkv_len(c) };
        4 * (delta + targets)
    }

    /// The configuration it was compiled for.
    pub fn config(&self) -> &SdpaConfig {
        &self.config
    }

    /// The backward's block sizes.
    pub fn blocking(&self) -> BackwardBlocking {
        self.blocking
    }

    /// The forward-with-lse's block sizes.
    pub fn forward_blocking(&self) -> Blocking {
        self.forward_blocking
    }

    /// The compiled forward-with-lse.
    pub fn forward_program(&self) -> &Program {
        match (&self.forward, &self.flex) {
            (Some(program), _) => program,
            (None, Some(FlexParts { forward, .. })) => forward.program(),
            (None, None) => unreachable!("a backward has a forward or mods"),
        }
    }

    /// The compiled backward kernel (loop IR, estimates, compile time).
    pub fn program(&self) -> &Program {
        &self.program
    }
}

impl fmt::Display for SdpaBackward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        let b = &self.blocking;
        write!(
            f,
            "sdpa backward flash_tile_ops: {c}; key blocks of {} in {} chunk(s) per head, query blocks of {}, dQ accumulated in place{}{}",
            b.keys,
            b.chunks,
            b.queries,
            if b.chunks > 1 { " per chunk, partials summed" } else { "" },
            match self.forward_blocking.kv_panel_width {
                0 => String::new(),
                w => format!("; the forward packs K and V once per run into panels of {w}"),
            }
        )?;
        match &self.flex {
            Some(FlexParts { mods, .. }) => write!(f, "; {}", super::flex_runner::describe(mods)),
            None => Ok(()),
        }
    }
}

static CACHE: ConfigCache<SdpaBackward> = OnceLock::new();

/// The compiled backward (with its forward-with-lse) for `config`, compiled on first use and
/// shared by every later call in the process, like [`compiled`](crate::sdpa::compiled).
pub fn compiled_backward(config: &SdpaConfig) -> Result<Arc<SdpaBackward>, SdpaError> {
    Ok(cached(&CACHE, config, SdpaBackward::compile)?.0)
}

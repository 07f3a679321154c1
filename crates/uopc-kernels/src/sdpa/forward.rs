//! [`Sdpa`]: one compiled attention forward, its compile and its run.

use super::blocking::cores;
use super::flex::{CaptureReads, Reads};
use super::kernel::{PlanMode, count_pairs, plan_from_counts};
use super::panels::KvPanels;
use super::score_forms::{Ramp, Softcap};
use super::{
    AttentionMods, Blocking, Extras, MaskKind, SdpaConfig, SdpaElement, SdpaError, Values, ValuesMut, check,
    push_captures, push_extras, sdpa_flex_ir, sdpa_flex_ir_with_lse, sdpa_flex_plan_ir, sdpa_ir,
    sdpa_merge_ir,
};
use std::fmt;
use uopc_ir::linear_in;
use uopc_jit::{Arg, BufRef, JitError, Program};

/// A compiled attention for one [`SdpaConfig`]; `Sync`, so one compile serves every thread.
#[derive(Debug)]
pub struct Sdpa {
    config: SdpaConfig,
    blocking: Blocking,
    program: Program,
    /// The merge of split-K partial states ([`sdpa_merge_ir`]), when the keys are split.
    merge: Option<Program>,
    /// Where K and V are packed into panels, with [`Blocking::kv_panel_width`].
    panels: Option<KvPanels>,
    /// The score and mask functions and sinks compiled in, and how the mask bounds the keys.
    mods: Option<(AttentionMods, String)>,
    /// The counting kernel of a per-run block plan, and its mode.
    plan: Option<(Program, PlanMode)>,
    /// Whether the kernel also stores the rows' log-sum-exp (the last buffer).
    saves_lse: bool,
    /// Which captures its kernels read (empty without mods).
    reads: CaptureReads,
}

impl Sdpa {
    /// Validates `config`, chooses block sizes for this machine and compiles the kernel. At
    /// `UOPC_DEBUG` level 1 or more it prints its choice (the [`Display`](fmt::Display) line)
    /// and the compile time to stderr.
    pub fn compile(config: &SdpaConfig) -> Result<Sdpa, SdpaError> {
        // Validated first: the block choice divides by the head grouping.
        config.validate()?;
        Self::compile_with(config, Blocking::choose(config, cores()))
    }

    /// [`Sdpa::compile`] with the given block sizes (for experiments and tests; the library's
    /// own choice is [`Blocking::choose`]).
    pub fn compile_with(config: &SdpaConfig, blocking: Blocking) -> Result<Sdpa, SdpaError> {
        config.validate()?;
        let full_blocks = config.n_k / blocking.keys.max(1);
        let valid = blocking.heads_per_task >= 1
            && (config.heads / config.kv_heads).is_multiple_of(blocking.heads_per_task)
            && (1..=config.n_q).contains(&blocking.queries)
            && (1..=config.n_k).contains(&blocking.keys)
            && (blocking.splits == 1
                || (blocking.queries == config.n_q
                    && (2..=full_blocks).contains(&blocking.splits)
                    && blocking.chunk_blocks(config.n_k) * (blocking.splits - 1) < full_blocks))
            && (1..=blocking.keys).contains(&blocking.diagonal_parts)
            && blocking.kv_panels_valid(config);
        if !valid {
            return Err(JitError::Unsupported(format!(
                "sdpa: blocking {blocking:?} does not fit {config:?}"
            ))
            .into());
        }
        let program = Program::compile(&sdpa_ir(config, &blocking), "sdpa_flash_tile_ops")?;
        let merge = if blocking.splits > 1 {
            Some(Program::compile(&sdpa_merge_ir(config, &blocking), "sdpa_split_merge")?)
        } else {
            None
        };
        let sdpa = Sdpa {
            config: *config,
            blocking,
            program,
            merge,
            panels: blocking.kv_panels(config),
            mods: None,
            plan: None,
            saves_lse: false,
            reads: CaptureReads::default(),
        };
        if uopc_tensor::debug_level() >= 1 {
            eprintln!("{sdpa}; compiled in {:.1} ms", sdpa.compile_seconds() * 1e3);
        }
        Ok(sdpa)
    }

    /// Attention with a score function, a mask function and sinks ([`AttentionMods`]) compiled
    /// into the kernel: `out = softmax(score(scale * q k^T) masked, with the sinks in the
    /// denominator) v`. Blocks are chosen as for [`Sdpa::compile`], in one chunk of keys. The
    /// configuration's causal flag, key lengths and runtime KV length still apply; a bool mask
    /// or bias is written in the functions instead.
    ///
    /// # Errors
    ///
    /// [`SdpaError::Capture`] for a configuration with a bool mask or bias, a score function
    /// that does not give a float or a mask function that does not give a Bool, a capture read
    /// with the wrong number of indices (naming it), sinks that are not F32 of shape
    /// `[heads]`, and a capture read out of its bounds (naming it); the errors of
    /// [`Sdpa::compile`].
    pub fn compile_flex(config: &SdpaConfig, mods: &AttentionMods) -> Result<Sdpa, SdpaError> {
        Self::compile_flex_inner(config, mods, false)
    }

    /// [`Sdpa::compile_flex`] whose kernel also stores each query row's base-2 log-sum-exp
    /// (sinks included) after every other buffer, for the backward.
    pub(crate) fn compile_flex_inner(
        config: &SdpaConfig,
        mods: &AttentionMods,
        saves_lse: bool,
    ) -> Result<Sdpa, SdpaError> {
        config.validate()?;
        check_flex(config, mods)?;
        if let Some(causal) = causal_equivalent(config, mods) {
            let mut sdpa = Self::compile_flex_inner(&causal, &mods.without_mask(), saves_lse)?;
            if let Some((_, text)) = &mut sdpa.mods {
                text.push_str(", and the mask function is the causal mask: the causal kernel runs it");
            }
            return Ok(sdpa);
        }
        let blocking = flex_blocking(config, mods);
        let ir = if saves_lse {
            sdpa_flex_ir_with_lse(config, &blocking, mods)
        } else {
            sdpa_flex_ir(config, &blocking, mods)
        };
        let program =
            Program::compile(&ir, "sdpa_flex").map_err(|e| capture_bounds_error(e, config, mods))?;
        let plan = match PlanMode::of(mods) {
            PlanMode::Static => None,
            mode => {
                Some((Program::compile(&sdpa_flex_plan_ir(config, &blocking, mods), "sdpa_flex_plan")?, mode))
            }
        };
        let sdpa = Sdpa {
            config: *config,
            blocking,
            program,
            merge: None,
            panels: blocking.kv_panels(config),
            mods: Some((mods.clone(), describe_mods(mods))),
            plan,
            saves_lse,
            reads: CaptureReads::of(mods),
        };
        if uopc_tensor::debug_level() >= 1 {
            eprintln!("{sdpa}; compiled in {:.1} ms", sdpa.compile_seconds() * 1e3);
        }
        Ok(sdpa)
    }

    /// `out = softmax(scale * q k^T + bias, masked) v`, into the caller's `out` (q's length),
    /// with q, k, v and the output in the configuration's [`SdpaDType`](super::SdpaDType) (`f32`, `bf16` or
    /// `f16`). Every length and the element type are checked, and `extras` must hold exactly
    /// what the configuration needs.
    ///
    /// With [`Blocking::kv_panel_width`] set, the run first packs k and v into panels (on the
    /// calling rayon pool), into a buffer of about k's and v's size that the calling thread
    /// keeps for its next run (one per thread, as large as the largest K and V it packed).
    pub fn run<T: SdpaElement>(
        &self,
        q: &[T],
        k: &[T],
        v: &[T],
        extras: Extras<'_>,
        out: &mut [T],
    ) -> Result<(), SdpaError> {
        self.run_values(T::values(q), T::values(k), T::values(v), extras, T::values_mut(out))
    }

    /// [`Sdpa::run`] with each argument's element type chosen at run time: an argument whose
    /// type is not the configuration's is an [`SdpaError::DType`] naming it.
    pub fn run_values(
        &self,
        q: Values<'_>,
        k: Values<'_>,
        v: Values<'_>,
        extras: Extras<'_>,
        out: ValuesMut<'_>,
    ) -> Result<(), SdpaError> {
        self.run_with_lse(q, k, v, extras, out, None)
    }

    /// [`Sdpa::run_values`] that also stores the rows' base-2 log-sum-exp into `lse`
    /// (`batch * heads * n_q`), which it must be given exactly when the kernel saves it.
    pub(crate) fn run_with_lse(
        &self,
        q: Values<'_>,
        k: Values<'_>,
        v: Values<'_>,
        extras: Extras<'_>,
        mut out: ValuesMut<'_>,
        lse: Option<&mut [f32]>,
    ) -> Result<(), SdpaError> {
        let c = &self.config;
        if lse.is_some() != self.saves_lse {
            return Err(SdpaError::Extra { arg: "lse", expected: self.saves_lse });
        }
        for (arg, got) in [("q", q.dtype()), ("k", k.dtype()), ("v", v.dtype()), ("out", out.dtype())] {
            if got != c.dtype {
                return Err(SdpaError::DType { arg, expected: c.dtype, got });
            }
        }
        check("q", c.q_len(), q.len())?;
        check("k", c.kv_len(), k.len())?;
        check("v", c.kv_len(), v.len())?;
        check("out", c.q_len(), out.len())?;
        let b = &self.blocking;
        // Split-K: the tasks' partial states, merged into `out` after the kernel.
        let states = if self.merge.is_some() { b.tasks(c) * b.rows() } else { 0 };
        let (mut part_m, mut part_l, mut part_o) =
            (vec![0.0f32; states], vec![0.0f32; states], vec![0.0f32; states * c.d]);
        // K and V packed into panels, in the calling thread's kept buffer.
        let packed = self.panels.as_ref().and_then(|panels| panels.pack_values(k, v));
        let (k, v) = packed.as_ref().map_or_else(|| (k.arg(), v.arg()), |p| p.args());
        let mut args: Vec<Arg<'_>> = if self.merge.is_some() {
            vec![
                q.arg(),
                k,
                v,
                Arg::WriteF32(&mut part_o),
                Arg::WriteF32(&mut part_m),
                Arg::WriteF32(&mut part_l),
            ]
        } else {
            vec![q.arg(), k, v, out.arg()]
        };
        push_extras(c, extras, &mut args)?;
        match &self.mods {
            Some((mods, _)) => push_captures(mods.captures(), extras.captures, &self.reads.all, &mut args)?,
            None if !extras.captures.is_empty() => {
                return Err(SdpaError::Extra { arg: "captures", expected: false });
            }
            None => {}
        }
        let plan = self.runtime_plan(extras)?;
        if let Some(plan) = &plan {
            args.push(Arg::Read(BufRef::I32(plan)));
        }
        if let Some(lse) = lse {
            check("lse", c.batch * c.heads * c.n_q, lse.len())?;
            args.push(Arg::WriteF32(lse));
        }
        if c.runtime_kv_length != extras.kv_length.is_some() {
            return Err(SdpaError::Extra { arg: "kv_length", expected: c.runtime_kv_length });
        }
        if let Some(len) = extras.kv_length
            && len > c.n_k
        {
            return Err(SdpaError::KvLength { len, capacity: c.n_k });
        }
        let vars: Vec<i64> = extras.kv_length.map(|l| l as i64).into_iter().collect();
        self.program.run_with_vars(&mut args, &vars)?;
        drop(args);
        if let Some(merge) = &self.merge {
            merge.run(&mut [(&part_m[..]).into(), (&part_l[..]).into(), (&part_o[..]).into(), out.arg()])?;
        }
        Ok(())
    }

    /// Seconds spent compiling its kernels.
    pub fn compile_seconds(&self) -> f64 {
        self.program.compile_seconds() + self.merge.as_ref().map_or(0.0, Program::compile_seconds)
    }

    /// The merge kernel of split-K attention, when the keys are split.
    pub fn merge_program(&self) -> Option<&Program> {
        self.merge.as_ref()
    }

    /// The configuration it was compiled for.
    pub fn config(&self) -> &SdpaConfig {
        &self.config
    }

    /// The block sizes it uses.
    pub fn blocking(&self) -> Blocking {
        self.blocking
    }

    /// The compiled kernel (loop IR, estimates, compile time).
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The fraction of key blocks (query block x key block pairs, the narrow last block
    /// counted) that its kernel computes for a run with `extras`: 1 without mods; from
    /// [`flex_block_plan`](super::flex_block_plan), or from the per-run plan (counted from
    /// `extras`' captures) for a mask whose bounds are not read off at compile time. `None`
    /// when a compile-time plan reads run-time values (key lengths, a runtime KV length).
    ///
    /// # Errors
    ///
    /// The errors of [`Sdpa::run`] for `extras` and of the plan's kernel.
    pub fn blocks_computed(&self, extras: Extras<'_>) -> Result<Option<f64>, SdpaError> {
        let Some((mods, _)) = &self.mods else { return Ok(Some(1.0)) };
        let (c, b) = (&self.config, &self.blocking);
        let spans: Vec<usize> = match self.runtime_plan(extras)? {
            Some(plan) => plan.chunks(4).map(|p| (p[3] - p[0]) as usize).collect(),
            None => match super::flex_block_plan(c, b, mods) {
                Some(plan) => plan.iter().map(|[t0, _, _, t1]| t1 - t0).collect(),
                None => return Ok(None),
            },
        };
        let narrow = usize::from(!c.n_k.is_multiple_of(b.keys));
        let computed: usize = spans.iter().map(|s| s + narrow).sum();
        Ok(Some(computed as f64 / (spans.len() * (c.n_k / b.keys + narrow)) as f64))
    }

    /// The per-run block plan (`[t0, c0, c1, t1]` per unit, see [`PlanMode`]) for `extras`,
    /// when the mods need one: the counting kernel's counts of the pairs each query block
    /// sees in each key block, turned into spans.
    fn runtime_plan(&self, extras: Extras<'_>) -> Result<Option<Vec<i32>>, SdpaError> {
        let (Some((program, mode)), Some((mods, _))) = (&self.plan, &self.mods) else { return Ok(None) };
        let (c, b) = (&self.config, &self.blocking);
        let full = c.n_k / b.keys;
        let counts = count_pairs(program, (mods, &self.reads.mask), extras, mode.units(c, b) * full)?;
        Ok(Some(plan_from_counts(&counts, full, mode.rows(b) * b.keys)))
    }
}

impl fmt::Display for Sdpa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        let b = &self.blocking;
        write!(
            f,
            "sdpa flash_tile_ops: {c}; tasks of {} head(s) x {} queries{}, keys in blocks of {}{}{}{}{}",
            b.heads_per_task,
            b.queries,
            if b.reads_queries_in_place(c) { " read in place" } else { "" },
            b.keys,
            match b.causal_sub_tile_rows(c) {
                Some(rows) => match b.causal_prefix_keys(c) {
                    wide if wide > b.keys => {
                        format!(
                            ", the blocks before the diagonal band {wide} keys wide, the band in sub-tiles of {rows} rows"
                        )
                    }
                    _ => format!(", the diagonal band in sub-tiles of {rows} rows"),
                },
                None => String::new(),
            },
            if b.diagonal_in_parts(c) {
                format!(
                    ", each diagonal block's GEMMs in {} parts skipping its upper triangle",
                    b.diagonal_parts
                )
            } else {
                String::new()
            },
            if b.splits > 1 {
                format!(", split into {} chunks merged by a second kernel", b.splits)
            } else {
                String::new()
            },
            match b.kv_panel_width {
                0 => String::new(),
                w if b.pair_panels(&self.config) => {
                    format!(", K and V packed once per run into bf16 pair panels of {w}")
                }
                w => format!(", K and V packed once per run into panels of {w}"),
            }
        )?;
        match &self.mods {
            Some((_, text)) => write!(f, "; {text}"),
            None => Ok(()),
        }
    }
}

/// The block sizes of a flex kernel for `config` (one chunk of keys): a mask that bounds the
/// keys (a causal limit, a window) gets the causal blocking, shorter tasks, so less of each
/// task's band of keys is masked work.
pub(crate) fn flex_blocking(config: &SdpaConfig, mods: &AttentionMods) -> Blocking {
    let kb = mods.mask_analysis().map(|m| m.bounds).unwrap_or_default();
    let shape = SdpaConfig { causal: config.causal || kb.is_bounded(), ..*config };
    let mut blocking = Blocking { splits: 1, ..Blocking::choose(&shape, cores()) };
    // A band (a start and an end bound: a sliding window) re-reads, per task, its rows' span
    // of keys plus the task's height: tasks one key block tall keep that overhang small.
    if !kb.start.is_empty() && !kb.end.is_empty() && blocking.heads_per_task == 1 {
        blocking.queries = blocking.queries.min(blocking.keys.max(BAND_ROWS));
    }
    blocking
}

/// Query rows per task under a banded mask (at least; a key block when wider).
const BAND_ROWS: usize = 64;

/// What mods compile into, for [`Sdpa`]'s `Display`: the functions, the sinks, and which key
/// blocks the mask lets the kernel skip or run unmasked, and why.
pub(crate) fn describe_mods(mods: &AttentionMods) -> String {
    let mut parts = Vec::new();
    let softcap = Softcap::of(mods);
    let ramp = softcap.is_none() && Ramp::of(mods);
    if mods.has_score() {
        let run_by = if softcap.is_some() {
            " (a soft-cap, `c tanh(s / c)`: run by the soft-capping tile op after each score GEMM)"
        } else if ramp {
            " (a ramp, `s + a (kv - q)` as ALiBi's: run by the score-ramp tile op after each score GEMM)"
        } else {
            ""
        };
        parts.push(format!("a score function{run_by}"));
    }
    if mods.has_sink_logits() {
        parts.push("sinks".to_string());
    }
    let blocks = if let Some(analysis) = mods.mask_analysis() {
        let kb = analysis.bounds;
        let (starts, ends) = (kb.start.len(), kb.end.len());
        let skipped = if kb.exact {
            // Without a score function (or with a soft-cap, a tile op before the mask) the
            // blocks across a bound only have each row's ends set to -inf
            // (`mask_outside_bounds`), never the mask evaluated per score.
            let across = if mods.has_score() && softcap.is_none() && !ramp {
                ""
            } else {
                ", blocks across them have each row's masked ends set without evaluating the mask"
            };
            format!(
                "{starts} start and {ends} end bound(s) on the keys read off its comparisons: blocks outside every row's bounds are skipped, blocks inside them run unmasked{across}"
            )
        } else {
            format!(
                "{starts} start and {ends} end bound(s) read off it, not the whole mask: a plan counted once per run over every query block x key block skips the blocks it hides and runs those it shows whole unmasked"
            )
        };
        format!("a mask function ({skipped})")
    } else {
        "no mask function".to_string()
    };
    parts.push(blocks);
    format!("mods: {}", parts.join(", "))
}

/// A compile error of a flex kernel; a load out of a capture's bounds names the capture.
fn capture_bounds_error(e: uopc_jit::JitError, config: &SdpaConfig, mods: &AttentionMods) -> SdpaError {
    capture_out_of_bounds(&e.to_string(), config, mods).unwrap_or_else(|| e.into())
}

/// The error naming the capture that the attention kernel's verifier message `text` finds
/// read out of its bounds, if it names one.
pub(crate) fn capture_out_of_bounds(
    text: &str,
    config: &SdpaConfig,
    mods: &AttentionMods,
) -> Option<SdpaError> {
    // The attention kernel's slots: q, k, v, out, the key lengths, then the captures it reads.
    let first = 4 + usize::from(config.key_lengths);
    let buffers = mods.buffers_used(first, &mods.captures_read(Reads::ALL));
    mods.captures().iter().zip(&buffers).find_map(|(spec, buf)| {
        let uopc_ir::Op::Buffer { slot, .. } = buf.op() else { return None };
        (text.contains("index may range")
            && text.contains(&format!("BUFFER {} slot={} ", spec.dtype, slot.index())))
        .then(|| SdpaError::Capture {
            name: spec.name.clone(),
            reason: format!("read out of its bounds ({text})"),
        })
    })
}

/// The checks of [`Sdpa::compile_flex`] before anything is built: no bool mask or bias in the
/// configuration, and the functions' own ([`AttentionMods::check`]).
pub(crate) fn check_flex(config: &SdpaConfig, mods: &AttentionMods) -> Result<(), SdpaError> {
    let fault = |reason: String| SdpaError::Capture { name: String::new(), reason };
    if config.mask != MaskKind::None {
        return Err(fault("a bool mask or bias goes into the mask or score function with mods".into()));
    }
    mods.check(config.heads).map_err(fault)
}

/// The causal configuration that runs `mods`' mask when that mask is exactly the causal mask
/// (`kv <= q + n_k - n_q`, and nothing else), to be compiled with the mods without their mask:
/// the causal kernels, their diagonal blocks in parts. `None` for any other mask.
pub(crate) fn causal_equivalent(config: &SdpaConfig, mods: &AttentionMods) -> Option<SdpaConfig> {
    let analysis = mods.mask_analysis()?;
    let kb = &analysis.bounds;
    let offset = config.causal_offset() + 1;
    let is_causal = kb.exact
        && kb.start.is_empty()
        && !kb.end.is_empty()
        && !config.runtime_kv_length
        && kb.end.iter().all(|e| {
            linear_in(e, &analysis.q)
                .is_some_and(|(a, r)| a == 1 && uopc_ir::simplify(&r).const_int() == Some(offset))
        });
    is_causal.then_some(SdpaConfig { causal: true, ..*config })
}

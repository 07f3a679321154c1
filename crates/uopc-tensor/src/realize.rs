//! Realize: plan (cached), run the kernels on host buffers, return data-backed tensors and a
//! report of where the time went.

use crate::debug;
use crate::error::{Result, TensorError};
use crate::kernelize::{BufRef, OutSpec, canonicalize, plan_for};
use crate::opt::{DefaultOpt, FlashOpt, Optimizer};
use crate::tensor::Tensor;
use std::sync::Arc;
use std::time::Instant;
use uopc_ir::{DataRef, HostBuffer, Op, UOp};

/// Options of one realize call (no global switches: everything that changes a plan is here).
#[derive(Clone, Debug)]
pub struct RealizeOptions {
    /// Do not cut at REDUCEs: reductions are recomputed inside their consumers' loops, and
    /// broadcast staging is skipped ("never write the big intermediate").
    pub fuse_reduce: bool,
    /// Chooses per-kernel opts and whether the layout pass runs.
    pub opt: Arc<dyn Optimizer>,
    /// Stage expensive broadcasts even when `fuse_reduce` is set (the chapter's first, accidental
    /// version of fused attention, which stored P): for the "upcast the head" exercise.
    pub stage_broadcasts_when_fused: bool,
    /// Simplify RESHAPE indices during rangeify. Always true in real use; false only shows
    /// (in tests) the O(N^3) accumulator placement that unsimplified indices cause.
    pub simplify_reshape: bool,
    /// Compile kernels as plain scalar code: no vectorization, no FMA contraction, no split
    /// sums. The "before" of every code-generation measurement (`bench attention --scalar`).
    pub scalar_codegen: bool,
}

impl Default for RealizeOptions {
    fn default() -> Self {
        RealizeOptions {
            fuse_reduce: false,
            opt: Arc::new(DefaultOpt::default()),
            simplify_reshape: true,
            stage_broadcasts_when_fused: false,
            scalar_codegen: false,
        }
    }
}

impl RealizeOptions {
    /// Fully fused: `fuse_reduce` with [`FlashOpt`].
    pub fn fused() -> Self {
        RealizeOptions { fuse_reduce: true, opt: Arc::new(FlashOpt::default()), ..Default::default() }
    }

    /// These options with another optimizer.
    pub fn with_opt(mut self, opt: impl Optimizer + 'static) -> Self {
        self.opt = Arc::new(opt);
        self
    }
}

/// Timing of one kernel run.
#[derive(Clone, Debug)]
pub struct KernelTiming {
    /// The kernel's name.
    pub name: String,
    /// Wall seconds of the run.
    pub seconds: f64,
    /// Static FLOPs of one run.
    pub flops: u64,
    /// Static bytes of one run.
    pub bytes: u64,
    /// At DEBUG >= 3: wall seconds of an immediate second run on the same memory.
    pub again_seconds: Option<f64>,
    /// The kernel calls tile ops (the micro-kernels) rather than running loops only.
    pub tile_ops: bool,
}

/// What one realize did and how long it took (data for a DEBUG layer; nothing is printed).
#[derive(Clone, Debug, Default)]
pub struct RealizeReport {
    /// Per kernel, in execution order.
    pub kernels: Vec<KernelTiming>,
    /// Seconds spent cutting and lowering (0 on a plan-cache hit).
    pub schedule_seconds: f64,
    /// Seconds spent compiling (0 on a plan-cache hit).
    pub compile_seconds: f64,
    /// Whether the plan came from the cache.
    pub cache_hit: bool,
    /// Wall seconds of the whole realize call.
    pub total_seconds: f64,
}

impl RealizeReport {
    /// Seconds spent inside kernels.
    pub fn run_seconds(&self) -> f64 {
        self.kernels.iter().map(|k| k.seconds).sum()
    }
}

fn data_of(leaf: &UOp) -> Arc<HostBuffer> {
    match leaf.op() {
        Op::Data { data, .. } => {
            let any: Arc<dyn std::any::Any + Send + Sync> = data.0.clone();
            any.downcast::<HostBuffer>().expect("tensor data is a HostBuffer")
        }
        _ => unreachable!("canonicalize returns DATA leaves"),
    }
}

fn host<'a>(
    r: BufRef,
    inputs: &'a [Arc<HostBuffer>],
    temps: &'a [HostBuffer],
    outs: &'a [HostBuffer],
) -> &'a HostBuffer {
    match r {
        BufRef::Input(k) => &inputs[k],
        BufRef::Temp(k) => &temps[k],
        BufRef::Output(k) => &outs[k],
    }
}

/// Realizes `tensors` together (shared subgraphs are computed once) and returns data-backed
/// tensors of the same shapes, plus a report.
pub fn realize(tensors: &[&Tensor], opts: &RealizeOptions) -> Result<(Vec<Tensor>, RealizeReport)> {
    let t0 = Instant::now();
    let roots: Vec<UOp> = tensors.iter().map(|t| t.uop().clone()).collect();
    let (canon, leaves) = canonicalize(&roots);
    if canon.iter().any(|r| r.shape().contains(&0)) {
        return Err(TensorError::Unsupported("tensors with a zero-sized axis".into()));
    }
    let (plan, cache_hit) = plan_for(&canon, &leaves, opts)?;
    let level = debug::debug_level();
    if level >= 4 && !cache_hit {
        debug::print_plan(&plan, level);
    }
    let inputs: Vec<Arc<HostBuffer>> = leaves.iter().map(data_of).collect();
    let mut temps = plan.take_temps();
    let mut outs: Vec<HostBuffer> = plan.outputs.iter().map(|&(d, n)| HostBuffer::zeros(d, n)).collect();
    let mut report = RealizeReport {
        cache_hit,
        schedule_seconds: if cache_hit { 0.0 } else { plan.schedule_seconds },
        compile_seconds: if cache_hit { 0.0 } else { plan.compile_seconds },
        ..Default::default()
    };
    let placeholder = || HostBuffer::F32(Vec::new());
    for k in &plan.kernels {
        let (out_ref, in_refs) = k.args.split_last().expect("a kernel has an output");
        // take the output out of its vector so the inputs can be borrowed alongside it
        let mut out = match *out_ref {
            BufRef::Temp(i) => std::mem::replace(&mut temps[i], placeholder()),
            BufRef::Output(i) => std::mem::replace(&mut outs[i], placeholder()),
            BufRef::Input(_) => unreachable!("kernels never write inputs"),
        };
        let ins: Vec<&HostBuffer> = in_refs.iter().map(|&r| host(r, &inputs, &temps, &outs)).collect();
        let t = Instant::now();
        let mut res = k.exe.run(&ins, &mut out);
        let seconds = t.elapsed().as_secs_f64();
        let mut again_seconds = None;
        if level >= 3 && res.is_ok() {
            let t = Instant::now();
            res = k.exe.run(&ins, &mut out);
            again_seconds = Some(t.elapsed().as_secs_f64());
        }
        match *out_ref {
            BufRef::Temp(i) => temps[i] = out,
            BufRef::Output(i) => outs[i] = out,
            BufRef::Input(_) => unreachable!(),
        }
        res?;
        let timing = KernelTiming {
            name: k.name.clone(),
            seconds,
            flops: k.flops,
            bytes: k.bytes,
            again_seconds,
            tile_ops: k.uses_tile_ops(),
        };
        if level >= 2 {
            eprintln!("{}", debug::kernel_line(&timing));
        }
        report.kernels.push(timing);
    }
    plan.return_temps(temps);
    let outs: Vec<Arc<HostBuffer>> = outs.into_iter().map(Arc::new).collect();
    let result = plan
        .outs
        .iter()
        .zip(&roots)
        .map(|(o, root)| match *o {
            OutSpec::Input(k) => Tensor::from_uop(leaves[k].clone()),
            OutSpec::Output(k) => {
                let data = DataRef(outs[k].clone());
                Tensor::from_uop(UOp::new(
                    Op::Data { data, shape: root.shape().to_vec() },
                    root.dtype(),
                    vec![],
                ))
            }
        })
        .collect();
    report.total_seconds = t0.elapsed().as_secs_f64();
    if level >= 1 {
        eprintln!("{}", debug::summary_line(&report));
    }
    Ok((result, report))
}

//! Realize: plan (cached), run the kernels on host buffers, return data-backed tensors and a
//! report of where the time went.

use crate::cache::{check_nonempty, plan_for, trim_pooled_temps};
use crate::debug;
use crate::error::Result;
use crate::exec::Written;
use crate::options::RealizeOptions;
use crate::passes::canonicalize;
use crate::plan::{ArgSource, OutSpec, Plan};
use crate::report::{KernelTiming, RealizeReport};
use crate::tensor::Tensor;
use std::sync::Arc;
use std::time::Instant;
use uopc_ir::{DType, DataRef, HostBuffer, Op, UOp};

fn placeholder() -> HostBuffer {
    HostBuffer::F32(Vec::new())
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
    r: ArgSource,
    inputs: &'a [Arc<HostBuffer>],
    temps: &'a [HostBuffer],
    outs: &'a [HostBuffer],
) -> &'a HostBuffer {
    match r {
        ArgSource::Input(k) => &inputs[k],
        ArgSource::Temp(k) => &temps[k],
        ArgSource::Output(k) => &outs[k],
    }
}

/// Realizes `tensors` together (shared subgraphs are computed once) and returns data-backed
/// tensors of the same shapes, plus a report.
///
/// ```rust
/// use uopc_tensor::{RealizeOptions, Tensor, realize};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
/// let (y, z) = (x.sum(0, false), x.sum(1, false));
/// let (out, report) = realize(&[&y, &z], &RealizeOptions::default())?;
/// assert_eq!(out[0].to_ndarray::<f32>()?.as_slice(), Some(&[4.0, 6.0][..]));
/// assert_eq!(out[1].to_ndarray::<f32>()?.as_slice(), Some(&[3.0, 7.0][..]));
/// assert_eq!(report.kernels.len(), 2);
/// # Ok::<(), uopc_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// As [`make_plan`](crate::make_plan), and [`TensorError::Backend`](crate::TensorError::Backend) when a
/// kernel fails to run.
pub fn realize(tensors: &[&Tensor], opts: &RealizeOptions) -> Result<(Vec<Tensor>, RealizeReport)> {
    if tensors.iter().any(|t| t.numel() == 0) {
        // Empty tensors have nothing to compute: they come back as empty data, the others
        // are realized together as usual.
        let nonempty: Vec<&Tensor> = tensors.iter().copied().filter(|t| t.numel() > 0).collect();
        let (done, report) = if nonempty.is_empty() {
            (Vec::new(), RealizeReport::default())
        } else {
            realize(&nonempty, opts)?
        };
        let mut done = done.into_iter();
        let out = tensors
            .iter()
            .map(|t| {
                if t.numel() == 0 {
                    Tensor::empty(t.shape(), t.dtype())
                } else {
                    done.next().expect("one result per non-empty tensor")
                }
            })
            .collect();
        return Ok((out, report));
    }
    let (out, report, _) = realize_impl(tensors, opts, None)?;
    Ok((out, report))
}

/// Whether `plan`'s only root can be computed straight into a caller's f32 buffer: it is an
/// output buffer that no kernel reads back and that each kernel writing it writes whole.
fn direct_output(plan: &Plan) -> Option<usize> {
    let [OutSpec::Output(o)] = plan.outs[..] else { return None };
    let target = ArgSource::Output(o);
    let fits = plan.outputs[o].0 == DType::F32
        && plan.kernels.iter().all(|k| {
            !k.read().contains(&target)
                && (!k.written().contains(&target) || (k.written().len() == 1 && k.exe.writes_one_output()))
        });
    fits.then_some(o)
}

/// [`realize`] of non-empty `tensors`; with `direct`, the one root is written into it when
/// [`direct_output`] allows (the third value says whether it was; the returned tensor is then
/// a placeholder the caller must not read).
pub(crate) fn realize_impl(
    tensors: &[&Tensor],
    opts: &RealizeOptions,
    direct: Option<&mut [f32]>,
) -> Result<(Vec<Tensor>, RealizeReport, bool)> {
    let t0 = Instant::now();
    let roots: Vec<UOp> = tensors.iter().map(|t| t.uop().clone()).collect();
    let (plan, leaves, cache_hit) = planned(&roots, opts)?;
    let level = debug::debug_level();
    if level >= 1 {
        static MACHINE_SHOWN: std::sync::Once = std::sync::Once::new();
        MACHINE_SHOWN.call_once(|| eprintln!("{}", uopc_tile::machine::Machine::get()));
    }
    if level >= 4 && !cache_hit {
        debug::print_plan(&plan, level);
    }
    let roots: Vec<(Vec<usize>, DType)> = roots.iter().map(|r| (r.shape().to_vec(), r.dtype())).collect();
    run_plan(&plan, cache_hit, &leaves, &roots, direct, t0)
}

/// The plan of `roots` (from the cache, or made and cached), the DATA leaves it reads in slot
/// order, and whether the cache held it.
pub(crate) fn planned(roots: &[UOp], opts: &RealizeOptions) -> Result<(Arc<Plan>, Vec<UOp>, bool)> {
    let (canon, leaves) = canonicalize(roots);
    check_nonempty(&canon)?;
    let (plan, cache_hit) = plan_for(&canon, &leaves, opts)?;
    Ok((plan, leaves, cache_hit))
}

/// Runs `plan` on the buffers of `leaves` (its DATA inputs, in slot order) and returns one
/// data-backed tensor of each root's shape and dtype, with the report (see [`realize_impl`]
/// for `direct`).
pub(crate) fn run_plan(
    plan: &Plan,
    cache_hit: bool,
    leaves: &[UOp],
    roots: &[(Vec<usize>, DType)],
    mut direct: Option<&mut [f32]>,
    t0: Instant,
) -> Result<(Vec<Tensor>, RealizeReport, bool)> {
    let level = debug::debug_level();
    let inputs: Vec<Arc<HostBuffer>> = leaves.iter().map(data_of).collect();
    let mut temps = plan.take_temps();
    let direct_slot = match &mut direct {
        Some(buf) if buf.len() == roots[0].0.iter().product::<usize>() => {
            // zeroed as the plan's own outputs are, unless its one writer fills it whole
            direct_output(plan).inspect(|&o| {
                if !plan.fresh_outputs[o] {
                    buf.fill(0.0);
                }
            })
        }
        _ => None,
    };
    // The caller's buffer stands in for the direct output: no allocation for it.
    // Outputs their one writer fills whole are left unzeroed until it runs.
    let mut fresh: Vec<Option<Written>> = (plan.outputs.iter().enumerate())
        .map(|(k, &(d, n))| {
            (plan.fresh_outputs[k] && Some(k) != direct_slot).then(|| Written::fresh(d, n)).flatten()
        })
        .collect();
    let mut outs: Vec<HostBuffer> = (plan.outputs.iter().enumerate())
        .map(|(k, &(d, n))| {
            if Some(k) == direct_slot || fresh[k].is_some() { placeholder() } else { HostBuffer::zeros(d, n) }
        })
        .collect();
    let mut report = RealizeReport {
        cache_hit,
        schedule_seconds: if cache_hit { 0.0 } else { plan.schedule_seconds },
        compile_seconds: if cache_hit { 0.0 } else { plan.compile_seconds },
        ..Default::default()
    };
    for k in &plan.kernels {
        // take the outputs out of their vectors so the inputs can be borrowed alongside them
        let mut written: Vec<Written> = (k.written().iter())
            .map(|&w| match w {
                ArgSource::Temp(i) => Written::Init(std::mem::replace(&mut temps[i], placeholder())),
                ArgSource::Output(i) => fresh[i]
                    .take()
                    .unwrap_or_else(|| Written::Init(std::mem::replace(&mut outs[i], placeholder()))),
                ArgSource::Input(_) => unreachable!("kernels never write inputs"),
            })
            .collect();
        let ins: Vec<&HostBuffer> = k.read().iter().map(|&r| host(r, &inputs, &temps, &outs)).collect();
        let into_caller = matches!(k.written(), [ArgSource::Output(i)] if Some(*i) == direct_slot);
        let mut run = |written: &mut [Written]| match (&mut direct, into_caller) {
            (Some(buf), true) => k.exe.run_into_f32(&ins, buf),
            _ => k.exe.run_written(&ins, written),
        };
        let t = Instant::now();
        // A failed run may have left fresh memory partly written: it is dropped unread.
        run(&mut written)?;
        let seconds = t.elapsed().as_secs_f64();
        let mut written: Vec<Written> = written.into_iter().map(|w| Written::Init(w.into_init())).collect();
        let mut again_seconds = None;
        let mut res = Ok(());
        if level >= 3 {
            let t = Instant::now();
            res = run(&mut written);
            again_seconds = Some(t.elapsed().as_secs_f64());
        }
        for (&w, out) in k.written().iter().zip(written) {
            match w {
                ArgSource::Temp(i) => temps[i] = out.into_init(),
                ArgSource::Output(i) => outs[i] = out.into_init(),
                ArgSource::Input(_) => unreachable!(),
            }
        }
        res?;
        let timing = KernelTiming {
            name: k.name.clone(),
            seconds,
            flops: k.flops,
            bytes: k.bytes,
            again_seconds,
            tile_ops: k.uses_tile_ops(),
            epilogue: k.has_epilogue(),
            kind: k.kind_label(),
        };
        if level >= 2 {
            eprintln!("{}", debug::kernel_line(&timing));
        }
        report.kernels.push(timing);
    }
    plan.return_temps(temps);
    trim_pooled_temps();
    let outs: Vec<Arc<HostBuffer>> = outs.into_iter().map(Arc::new).collect();
    let result = plan
        .outs
        .iter()
        .zip(roots)
        .map(|(o, root)| match *o {
            OutSpec::Input(k) => Tensor::from_uop(leaves[k].clone()),
            OutSpec::Output(k) => {
                let data = DataRef(outs[k].clone());
                Tensor::from_uop(UOp::new(Op::Data { data, shape: root.0.clone() }, root.1, vec![]))
            }
        })
        .collect();
    report.total_seconds = t0.elapsed().as_secs_f64();
    if level >= 1 {
        eprintln!("{}", debug::summary_line(&report));
    }
    Ok((result, report, direct_slot.is_some()))
}

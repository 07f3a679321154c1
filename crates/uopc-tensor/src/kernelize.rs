//! The kernelizer: cuts a canonical tensor graph into kernels at materialization points,
//! lowers each kernel to a loop program and compiles it, giving a [`Plan`].

use crate::error::{Result, TensorError};
use crate::exec::Exe;
use crate::lowerings::{Lowered, compact_slots, kernel_bodies, kernel_body, lower_point};
use crate::opt::Layout;
use crate::options::RealizeOptions;
use crate::passes::{materialize_points, stage_broadcast_compute};
use crate::plan::{ArgSource, Kernel, OutSpec, Plan};
use crate::util::numel;
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;
use std::time::Instant;
use uopc_ir::rewrite::RuleHits;
use uopc_ir::{DType, Op, RewriteStats, UOp, buffer};

/// Physical memory, from /proc/meminfo (None where unknown).
fn physical_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Refuses plans whose buffers cannot fit in memory, before anything is allocated.
fn check_memory(temps: &[(DType, usize)], outputs: &[(DType, usize)]) -> Result<()> {
    let bytes: u128 = temps.iter().chain(outputs).map(|(d, n)| d.size() as u128 * *n as u128).sum();
    let limit = physical_memory_bytes().unwrap_or(u64::MAX) as u128;
    if bytes > limit {
        return Err(TensorError::Unsupported(format!(
            "the plan needs {:.1} GB of buffers, more than this machine's {:.1} GB of memory",
            bytes as f64 / 1e9,
            limit as f64 / 1e9
        )));
    }
    Ok(())
}

/// The graph passes `opts` ask for, in order: broadcast staging, then the optimizer's layout.
fn prepare_graph(roots: &[UOp], opts: &RealizeOptions) -> Vec<UOp> {
    let mut graph = crate::passes::push_views_into_reduces(roots);
    // Only a fused plan computes a maximum and the sums that wait for it in one kernel.
    if opts.fuse_reduce && !opts.experiments.no_online_reductions {
        graph = crate::online::online_reductions(&graph);
    }
    // fuse_reduce asks for "never write the big intermediate", so don't stage broadcasts either
    if !opts.fuse_reduce || opts.experiments.stage_broadcasts_when_fused {
        graph = stage_broadcast_compute(&graph, 4);
    }
    let grouped = crate::online::grouped_reduces(&graph);
    match opts.opt.layout() {
        Layout::None => {}
        Layout::ReduceContiguous => {
            graph = crate::passes::layout_pass_except(&graph, |r| grouped.contains(r))
        }
        Layout::OutputContiguous => {
            // Only a reduce that is its own kernel becomes a tile GEMM.
            let tile_gemms = opts.opt.tile_ops() && !opts.fuse_reduce;
            graph = crate::passes::layout_pass_output_with(
                &graph,
                |r| (tile_gemms && crate::tilemap::reads_operands_in_place(r)) || grouped.contains(r),
                |r| if tile_gemms { crate::tilemap::operands_to_stage(r) } else { Vec::new() },
            );
        }
    }
    graph
}

/// Joins independent kernels that read the same online group over rows (a loss and its
/// gradient both need each row's maximum and sum of exponentials) into one program with an
/// output per kernel (see [`crate::online_rows::lower_online_rows_together`]), so their rows
/// are read from memory once. Kernel `j` joins an earlier kernel `i` when neither reads the
/// other's buffer and every buffer `j` reads is an input or written before `i`: the joined
/// kernel runs where `i` ran, after everything either of them reads.
fn join_row_siblings(
    points: &[UOp],
    mut lowered: Vec<Lowered>,
    buf_of: &HashMap<UOp, ArgSource>,
) -> Vec<Lowered> {
    let writer: HashMap<ArgSource, usize> = points.iter().enumerate().map(|(k, p)| (buf_of[p], k)).collect();
    let mut gone = vec![false; points.len()];
    for i in 0..points.len() {
        if gone[i] || !lowered[i].online_rows {
            continue;
        }
        for j in i + 1..points.len() {
            if gone[j] || !lowered[j].online_rows {
                continue;
            }
            let pair = [points[i].clone(), points[j].clone()];
            let (bodies, locals) = kernel_bodies(&pair, buf_of);
            let (own_i, own_j) = (buf_of[&points[i]], buf_of[&points[j]]);
            let ready =
                locals.iter().all(|a| *a != own_i && *a != own_j && writer.get(a).is_none_or(|&w| w < i));
            if !ready {
                continue;
            }
            let outs: Vec<UOp> = (bodies.iter().enumerate())
                .map(|(k, b)| buffer(locals.len() + k, b.dtype(), numel(b.shape())))
                .collect();
            let together: Vec<(UOp, UOp)> = bodies.iter().cloned().zip(outs).collect();
            // `None` also when the two read different groups
            let Some(program) = crate::online_rows::lower_online_rows_together(&together) else { continue };
            let mut args = locals;
            args.extend([own_i, own_j]);
            let (program, args) = compact_slots(program, args);
            let (a, b) = (&lowered[i], &lowered[j]);
            let derived = format!("{}, shared by {} outputs", a.derived, a.outputs + b.outputs);
            let joined = Lowered {
                outputs: a.outputs + b.outputs,
                lowering: "online_rows_joined",
                ..Lowered::new(format!("{}+{}", a.name, b.name), b.shape.clone(), program, args, derived)
            };
            lowered[i] = joined;
            gone[j] = true;
            break;
        }
    }
    lowered.into_iter().zip(gone).filter(|(_, g)| !g).map(|(l, _)| l).collect()
}

/// Cuts, lowers and compiles already canonical `roots` whose inputs are `inputs`.
pub(crate) fn build_plan(
    roots: &[UOp],
    inputs: Vec<(DType, Vec<usize>)>,
    opts: &RealizeOptions,
) -> Result<Plan> {
    let t0 = Instant::now();
    let rewrites_before = uopc_ir::rewrite_counts();
    let graph = prepare_graph(roots, opts);
    let points = materialize_points(&graph, opts.fuse_reduce);
    let epilogues = opts.opt.tile_ops() && !opts.fuse_reduce && !opts.experiments.unfused_gemm_epilogues;
    let (points, with_epilogue) = if epilogues {
        // Whether a reduce runs as a tile GEMM depends only on its own kernel body, which
        // fusing other kernels does not change: ask it of the body it has in this cut.
        let tentative: HashMap<UOp, ArgSource> =
            points.iter().enumerate().map(|(k, p)| (p.clone(), ArgSource::Temp(k))).collect();
        crate::epilogue::fuse_gemm_epilogues(&graph, points, |r, dtype, only_rounds| {
            let body = kernel_body(r, &tentative).0;
            crate::tilemap::reads_operands_in_place(&body)
                && crate::epilogue::epilogue_pays(&body, dtype, only_rounds)
        })
    } else {
        (points, HashSet::new())
    };
    let mut buf_of: HashMap<UOp, ArgSource> = HashMap::new();
    let mut outputs = Vec::new();
    let mut outs = Vec::new();
    for root in &graph {
        if let Op::Param { slot, .. } = root.op() {
            outs.push(OutSpec::Input(*slot));
        } else if let Some(ArgSource::Output(k)) = buf_of.get(root) {
            outs.push(OutSpec::Output(*k));
        } else {
            buf_of.insert(root.clone(), ArgSource::Output(outputs.len()));
            outs.push(OutSpec::Output(outputs.len()));
            outputs.push((root.dtype(), numel(root.shape())));
        }
    }
    let mut temps = Vec::new();
    for p in &points {
        buf_of.entry(p.clone()).or_insert_with(|| {
            temps.push((p.dtype(), numel(p.shape())));
            ArgSource::Temp(temps.len() - 1)
        });
    }
    let mut lowered = Vec::with_capacity(points.len());
    for p in &points {
        lowered.push(lower_point(p, &buf_of, opts, &with_epilogue, &mut temps)?);
    }
    check_memory(&temps, &outputs)?;
    if !opts.experiments.separate_row_siblings {
        lowered = join_row_siblings(&points, lowered, &buf_of);
    }
    let schedule_seconds = t0.elapsed().as_secs_f64();
    let mut rewrites = rewrites_since(&rewrites_before);
    let t1 = Instant::now();
    // Each kernel compiles on its own (Cranelift holds no shared state), so they compile on
    // every thread of the pool; each task's rule counts are its thread's, merged in order.
    let compiled: Vec<(Vec<Kernel>, Vec<RewriteStats>)> = lowered
        .into_par_iter()
        .map(|mut l| {
            let before = uopc_ir::rewrite_counts();
            let mut ks = Vec::with_capacity(2);
            if let Some(first) = l.before.take() {
                ks.push(compile_lowered(*first, opts)?);
            }
            ks.push(compile_lowered(l, opts)?);
            Ok((ks, rewrites_since(&before)))
        })
        .collect::<Result<_>>()?;
    let mut kernels = Vec::with_capacity(compiled.len());
    for (ks, counts) in compiled {
        kernels.extend(ks);
        merge_rewrites(&mut rewrites, counts);
    }
    let fresh_outputs = (0..outputs.len())
        .map(|o| {
            let target = ArgSource::Output(o);
            let writers: Vec<&Kernel> = kernels.iter().filter(|k| k.written().contains(&target)).collect();
            let readers = kernels.iter().filter(|k| k.read().contains(&target)).count();
            match writers[..] {
                [k] if matches!(outputs[o].0, DType::F32 | DType::BF16 | DType::F16) && readers == 0 => {
                    k.args.iter().position(|a| *a == target).is_some_and(|slot| k.exe.writes_whole(slot))
                }
                _ => false,
            }
        })
        .collect();
    Ok(Plan {
        kernels,
        temps,
        outputs,
        fresh_outputs,
        outs,
        inputs,
        schedule_seconds,
        compile_seconds: t1.elapsed().as_secs_f64(),
        rewrites,
        temp_pool: Mutex::new(None),
        temp_allocations: AtomicUsize::new(0),
    })
}

/// The compiled kernel of `l`.
fn compile_lowered(l: Lowered, opts: &RealizeOptions) -> Result<Kernel> {
    let Lowered { name, shape, program, args, output_parts, derived, epilogue, outputs, lowering, .. } = l;
    let exe = Exe::compile(&program, &name, opts.scalar_codegen)?.with_output_parts(output_parts);
    let kernel = Kernel::new(name, shape, program, args, exe).with_epilogue(epilogue).with_outputs(outputs);
    Ok(kernel.with_derived(derived).with_lowering(lowering))
}

/// `more`'s rule counts added to `into`'s, pass by pass and rule by rule.
fn merge_rewrites(into: &mut Vec<RewriteStats>, more: Vec<RewriteStats>) {
    for stats in more {
        let Some(known) = into.iter_mut().find(|s| s.pass == stats.pass) else {
            into.push(stats);
            continue;
        };
        for hit in stats.hits {
            match known.hits.iter_mut().find(|h| h.table == hit.table && h.rule == hit.rule) {
                Some(h) => h.count += hit.count,
                None => known.hits.push(hit),
            }
        }
    }
}

/// The rule counts of this thread's rewrite passes since `before` (an earlier
/// [`uopc_ir::rewrite_counts`]), passes and rules that did not fire since left out.
fn rewrites_since(before: &[RewriteStats]) -> Vec<RewriteStats> {
    let mut out = Vec::new();
    for now in uopc_ir::rewrite_counts() {
        let old = before.iter().find(|b| b.pass == now.pass);
        let hits: Vec<RuleHits> = now
            .hits
            .iter()
            .filter_map(|h| {
                let was = old
                    .and_then(|o| o.hits.iter().find(|x| x.table == h.table && x.rule == h.rule))
                    .map_or(0, |x| x.count);
                (h.count > was).then(|| RuleHits { count: h.count - was, ..h.clone() })
            })
            .collect();
        if !hits.is_empty() {
            out.push(RewriteStats { pass: now.pass, hits });
        }
    }
    out
}

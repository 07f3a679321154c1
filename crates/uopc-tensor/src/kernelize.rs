//! The kernelizer: cuts a canonical tensor graph into kernels at materialization points,
//! lowers each kernel to a loop program and compiles it, giving a [`Plan`].

use crate::error::{Result, TensorError};
use crate::exec::Exe;
use crate::opt::{Layout, has_reduce};
use crate::options::RealizeOptions;
use crate::passes::{materialize_points, run_pass, stage_broadcast_compute};
use crate::plan::{ArgSource, Kernel, OutSpec, Plan};
use crate::rangeify::{Ctx, lower};
use crate::util::numel;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicUsize;
use std::sync::{LazyLock, Mutex};
use std::time::Instant;
use uopc_ir::rewrite::{RuleCx, RuleHits};
use uopc_ir::{DType, Op, Pass, Pattern, Revisit, RewriteStats, Rule, RuleTable, UOp, buffer};

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

/// The kernel body of point `p`: its computation with other points and inputs replaced by
/// `Param`s numbered in first-use order; also returns the buffer behind each local slot.
fn kernel_body(p: &UOp, buf_of: &HashMap<UOp, ArgSource>) -> (UOp, Vec<ArgSource>) {
    let (mut bodies, locals) = kernel_bodies(std::slice::from_ref(p), buf_of);
    (bodies.remove(0), locals)
}

/// [`kernel_body`] of several points at once, their `Param`s numbered together (one slot per
/// buffer, whichever body reads it), so that the bodies can share one program.
fn kernel_bodies(points: &[UOp], buf_of: &HashMap<UOp, ArgSource>) -> (Vec<UOp>, Vec<ArgSource>) {
    let mut locals: Vec<ArgSource> = Vec::new();
    let mut bodies = Vec::with_capacity(points.len());
    for p in points {
        let start = p.unstaged().clone();
        let mut map: HashMap<UOp, UOp> = HashMap::new();
        let mut stack = vec![(start.clone(), false)];
        while let Some((u, ready)) = stack.pop() {
            if map.contains_key(&u) {
                continue;
            }
            let leaf = if u != *p && buf_of.contains_key(&u) {
                Some(buf_of[&u])
            } else if let Op::Param { slot, .. } = u.op() {
                Some(ArgSource::Input(*slot))
            } else {
                None
            };
            if let Some(b) = leaf {
                let slot = locals.iter().position(|x| *x == b).unwrap_or_else(|| {
                    locals.push(b);
                    locals.len() - 1
                });
                let param = UOp::new(Op::Param { slot, shape: u.shape().to_vec() }, u.dtype(), vec![]);
                map.insert(u, param);
                continue;
            }
            if ready {
                let src = u.src().iter().map(|s| map[s].clone()).collect();
                map.insert(u.clone(), u.with_src(src));
            } else {
                stack.push((u.clone(), true));
                for s in u.src().iter().rev() {
                    stack.push((s.clone(), false));
                }
            }
        }
        bodies.push(map[&start].clone());
    }
    (bodies, locals)
}

/// `r_` when the kernel has a reduce, `e_` otherwise, then the output shape.
fn kernel_name(body: &UOp) -> String {
    let shape = body.shape();
    let dims = if shape.is_empty() {
        "1".to_string()
    } else {
        shape.iter().map(usize::to_string).collect::<Vec<_>>().join("_")
    };
    format!("{}_{dims}", if has_reduce(body) { "r" } else { "e" })
}

/// Slot compaction: each BUFFER's slot becomes its position among the used slots (the state,
/// sorted).
static SLOTS: LazyLock<RuleTable<Vec<usize>>> = LazyLock::new(|| {
    let any_buffer = Op::Buffer { slot: uopc_ir::BufferSlot::new(0), len: 0 };
    RuleTable::new(
        "slots",
        vec![Rule::with_cx("renumber_buffer", Pattern::ops(&[any_buffer]), renumber_buffer)],
    )
});
static COMPACT_SLOTS: LazyLock<Pass<'static, Vec<usize>>> =
    LazyLock::new(|| Pass::new("compact_slots", vec![&*SLOTS], Revisit::Never));

fn renumber_buffer(u: &UOp, cx: &mut RuleCx<'_, Vec<usize>>) -> Option<UOp> {
    let Op::Buffer { slot, len } = u.op() else { return None };
    let k = cx.state.binary_search(&slot.index()).expect("every slot of the program is among the used ones");
    (k != slot.index()).then(|| buffer(k, u.dtype(), *len))
}

/// Renumbers BUFFER slots so the program's slots are `0..n` (an input rangeify never reached,
/// e.g. an unselected STACK source, would otherwise leave a hole in the argument list).
fn compact_slots(program: UOp, args: Vec<ArgSource>) -> (UOp, Vec<ArgSource>) {
    let mut used: Vec<usize> = UOp::toposort(std::slice::from_ref(&program))
        .iter()
        .filter_map(|u| match u.op() {
            Op::Buffer { slot, .. } => Some(slot.index()),
            _ => None,
        })
        .collect();
    used.sort_unstable();
    used.dedup();
    if used.len() == args.len() {
        return (program, args);
    }
    let new_args = used.iter().map(|&s| args[s]).collect();
    let prog = run_pass(&COMPACT_SLOTS, std::slice::from_ref(&program), &mut used);
    (prog.into_iter().next().expect("one root"), new_args)
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

/// A lowered, not yet compiled kernel.
struct Lowered {
    name: String,
    shape: Vec<usize>,
    program: UOp,
    args: Vec<ArgSource>,
    /// The output slots' lengths when the program writes several parts of its output.
    output_parts: Vec<usize>,
    /// What was derived for it (see [`Kernel::derived`]).
    derived: String,
    /// Whether the kernel is a tile GEMM with its consumer's elementwise ops fused in.
    epilogue: bool,
    /// How many of the last `args` the program writes.
    outputs: usize,
    /// Whether it was lowered onto the row tile ops of an online group (see
    /// [`crate::online_rows`]), so that an independent kernel of the same group may join it.
    online_rows: bool,
    /// A kernel that must run just before this one, writing a temporary this one reads (the
    /// partial states of the split form, [`crate::online_rows::lower_online_rows_split`]).
    before: Option<Box<Lowered>>,
}

impl Lowered {
    /// A kernel writing its one output in one part, with nothing fused, joined or run before
    /// it: what every lowering gives unless it says otherwise.
    fn new(name: String, shape: Vec<usize>, program: UOp, args: Vec<ArgSource>, derived: String) -> Lowered {
        Lowered {
            name,
            shape,
            program,
            args,
            output_parts: Vec::new(),
            derived,
            epilogue: false,
            outputs: 1,
            online_rows: false,
            before: None,
        }
    }
}

/// The loop program of the kernel that computes point `p`.
fn lower_point(
    p: &UOp,
    buf_of: &HashMap<UOp, ArgSource>,
    opts: &RealizeOptions,
    with_epilogue: &HashSet<UOp>,
    temps: &mut Vec<(DType, usize)>,
) -> Result<Lowered> {
    if let Op::Custom(custom) = p.op() {
        // The program is given; its slots are the sources, then the output.
        let mut args: Vec<ArgSource> = p
            .src()
            .iter()
            .map(|s| match s.op() {
                Op::Param { slot, .. } => ArgSource::Input(*slot),
                _ => buf_of[s],
            })
            .collect();
        args.push(buf_of[p]);
        let lowered = Lowered::new(
            custom.name.clone(),
            custom.shape.clone(),
            custom.program.clone(),
            args,
            String::new(),
        );
        return Ok(Lowered { output_parts: custom.output_parts.clone(), ..lowered });
    }
    let (body, mut args) = kernel_body(p, buf_of);
    let name = kernel_name(&body);
    let mut ctx = Ctx::new(opts.opt.opts(&body), !opts.experiments.reshape_without_divmod_folding);
    let out = buffer(args.len(), p.dtype(), numel(p.shape()));
    let online = crate::online::online_sums_in(&body);
    let tiled = if opts.opt.tile_ops() { crate::tilemap::lower_gemm(&body, &out) } else { None };
    // A kernel the cut gave a GEMM epilogue falls back to the generic lowering (the GEMM as a
    // loop nest) should its body not lower as one after all: slower, never wrong.
    let fused =
        if with_epilogue.contains(p) { crate::epilogue::lower_gemm_epilogue(&body, &out) } else { None };
    let epilogue = fused.is_some();
    let online_tiles = if opts.opt.tile_ops() && tiled.is_none() && fused.is_none() {
        crate::online_tiles::lower_online_attention(&body, &out)
    } else {
        None
    };
    let rows_ok = opts.opt.tile_ops() && tiled.is_none() && fused.is_none() && online_tiles.is_none();
    // Few long rows: their states in chunks by one kernel, merged by the next.
    let split_out = buffer(args.len() + 1, p.dtype(), numel(p.shape()));
    let split = rows_ok.then(|| crate::online_rows::lower_online_rows_split(&body, &split_out, args.len()));
    if let Some(split) = split.flatten() {
        temps.push((DType::F32, split.states));
        let states = ArgSource::Temp(temps.len() - 1);
        let name = kernel_name(&body);
        let mut partial_args = args.clone();
        partial_args.push(states);
        let (partials, partial_args) = compact_slots(split.partials, partial_args);
        let before = Lowered::new(
            format!("{name}_chunks"),
            vec![split.states],
            partials,
            partial_args,
            "the maximum and sum of exp of each chunk of a row, on tile ops".to_string(),
        );
        args.extend([states, buf_of[p]]);
        let (program, args) = compact_slots(split.body, args);
        let derived = format!("{online} online sums on tile ops: row max and sum of exp, merged from chunks");
        let lowered = Lowered::new(name, body.shape().to_vec(), program, args, derived);
        return Ok(Lowered { before: Some(Box::new(before)), ..lowered });
    }
    let online_rows = if rows_ok { crate::online_rows::lower_online_rows(&body, &out) } else { None };
    let derived = match (online, &online_tiles, &online_rows) {
        (0, _, _) => String::new(),
        (n, Some(_), _) => format!("{n} online sums on tile ops: score GEMM, softmax update, P.V GEMM"),
        (n, None, Some(_)) => format!("{n} online sums on tile ops: row max and sum of exp"),
        (n, None, None) => format!("{n} online sums in one loop"),
    };
    let on_rows = online_rows.is_some();
    let program = match (tiled.or(online_tiles).or(online_rows), fused) {
        (Some(program), _) => program,
        (None, Some(program)) => program?,
        (None, None) => lower(&body, &out, &mut ctx)?,
    };
    args.push(buf_of[p]);
    let (program, args) = compact_slots(program, args);
    let shape = body.shape().to_vec();
    Ok(Lowered { epilogue, online_rows: on_rows, ..Lowered::new(name, shape, program, args, derived) })
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
        crate::epilogue::fuse_gemm_epilogues(&graph, points, |r, dtype| {
            let body = kernel_body(r, &tentative).0;
            crate::tilemap::reads_operands_in_place(&body) && crate::epilogue::epilogue_pays(&body, dtype)
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
    let t1 = Instant::now();
    let mut kernels = Vec::with_capacity(lowered.len());
    for mut l in lowered {
        if let Some(before) = l.before.take() {
            kernels.push(compile_lowered(*before, opts)?);
        }
        kernels.push(compile_lowered(l, opts)?);
    }
    let fresh_outputs = (0..outputs.len())
        .map(|o| {
            let target = ArgSource::Output(o);
            let writers: Vec<&Kernel> = kernels.iter().filter(|k| k.written().contains(&target)).collect();
            let readers = kernels.iter().filter(|k| k.read().contains(&target)).count();
            match writers[..] {
                [k] if outputs[o].0 == DType::F32 && readers == 0 => {
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
        rewrites: rewrites_since(&rewrites_before),
        temp_pool: Mutex::new(None),
        temp_allocations: AtomicUsize::new(0),
    })
}

/// The compiled kernel of `l`.
fn compile_lowered(l: Lowered, opts: &RealizeOptions) -> Result<Kernel> {
    let Lowered { name, shape, program, args, output_parts, derived, epilogue, outputs, .. } = l;
    let exe = Exe::compile(&program, &name, opts.scalar_codegen)?.with_output_parts(output_parts);
    let kernel = Kernel::new(name, shape, program, args, exe).with_epilogue(epilogue).with_outputs(outputs);
    Ok(kernel.with_derived(derived))
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

//! Lowering one kernel: its body cut out of the graph over local `Param`s, then turned into a
//! loop program by the first of a named table of lowerings that applies ([`LOWERINGS`]): tile
//! GEMMs, a GEMM with its epilogue, online attention or online rows on tile ops, or rangeify.
//! The plan records and prints which one made each kernel.

use crate::error::Result;
use crate::opt::has_reduce;
use crate::options::RealizeOptions;
use crate::passes::run_pass;
use crate::plan::ArgSource;
use crate::rangeify::{Ctx, lower};
use crate::util::numel;
use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;
use uopc_ir::rewrite::RuleCx;
use uopc_ir::{DType, Op, Pass, Pattern, Revisit, Rule, RuleTable, UOp, buffer};

/// The kernel body of point `p`: its computation with other points and inputs replaced by
/// `Param`s numbered in first-use order; also returns the buffer behind each local slot.
pub(crate) fn kernel_body(p: &UOp, buf_of: &HashMap<UOp, ArgSource>) -> (UOp, Vec<ArgSource>) {
    let (mut bodies, locals) = kernel_bodies(std::slice::from_ref(p), buf_of);
    (bodies.remove(0), locals)
}

/// [`kernel_body`] of several points at once, their `Param`s numbered together (one slot per
/// buffer, whichever body reads it), so that the bodies can share one program.
pub(crate) fn kernel_bodies(points: &[UOp], buf_of: &HashMap<UOp, ArgSource>) -> (Vec<UOp>, Vec<ArgSource>) {
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
pub(crate) fn kernel_name(body: &UOp) -> String {
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
pub(crate) fn compact_slots(program: UOp, args: Vec<ArgSource>) -> (UOp, Vec<ArgSource>) {
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

/// A lowered, not yet compiled kernel.
pub(crate) struct Lowered {
    pub(crate) name: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) program: UOp,
    pub(crate) args: Vec<ArgSource>,
    /// The output slots' lengths when the program writes several parts of its output.
    pub(crate) output_parts: Vec<usize>,
    /// What was derived for it (see [`Kernel::derived`]).
    pub(crate) derived: String,
    /// Whether the kernel is a tile GEMM with its consumer's elementwise ops fused in.
    pub(crate) epilogue: bool,
    /// How many of the last `args` the program writes.
    pub(crate) outputs: usize,
    /// Whether it was lowered onto the row tile ops of an online group (see
    /// [`crate::online_rows`]), so that an independent kernel of the same group may join it.
    pub(crate) online_rows: bool,
    /// A kernel that must run just before this one, writing a temporary this one reads (the
    /// partial states of the split form, [`crate::online_rows::lower_online_rows_split`]).
    pub(crate) before: Option<Box<Lowered>>,
    /// The [`Lowering`] that made the program (`custom` for a given one, `online_rows_joined`
    /// for kernels joined after lowering).
    pub(crate) lowering: &'static str,
}

impl Lowered {
    /// A kernel writing its one output in one part, with nothing fused, joined or run before
    /// it: what every lowering gives unless it says otherwise.
    pub(crate) fn new(
        name: String,
        shape: Vec<usize>,
        program: UOp,
        args: Vec<ArgSource>,
        derived: String,
    ) -> Lowered {
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
            lowering: "",
        }
    }
}

/// One kernel to lower: its point, its body over local `Param`s and the buffers behind them,
/// and what the lowerings read about it.
pub(crate) struct Point<'a> {
    p: &'a UOp,
    body: UOp,
    /// The buffer behind each local slot of `body`.
    args: Vec<ArgSource>,
    buf_of: &'a HashMap<UOp, ArgSource>,
    opts: &'a RealizeOptions,
    /// Points the cut gave a GEMM epilogue.
    with_epilogue: &'a HashSet<UOp>,
    /// Online sums in the body (see [`crate::online::online_sums_in`]).
    online: usize,
    /// The kernel's name ([`kernel_name`]).
    name: String,
    /// Rangeify's context with the optimizer's opts for the body.
    ctx: Ctx,
    /// The output buffer of a program over the body's slots (the slot after them).
    out: UOp,
}

impl Point<'_> {
    /// The kernel of `program` (over the body's slots, then the output), with `derived`.
    fn finish(&self, program: UOp, derived: String) -> Lowered {
        let mut args = self.args.clone();
        args.push(self.buf_of[self.p]);
        let (program, args) = compact_slots(program, args);
        Lowered::new(self.name.clone(), self.body.shape().to_vec(), program, args, derived)
    }

    /// What a lowering that keeps the body's online sums as plain loops derived.
    fn loop_derived(&self) -> String {
        match self.online {
            0 => String::new(),
            n => format!("{n} online sums in one loop"),
        }
    }
}

/// A named way to lower a kernel body to a loop program.
pub(crate) struct Lowering {
    /// The name plans print for the kernels it made.
    pub(crate) name: &'static str,
    /// The lowered kernel, `None` when the body is not of this lowering's form, or the error of
    /// one that is but fails. It may add temporaries to the plan's list.
    apply: Apply,
}

/// The plan's temporaries (element type and length), to which a lowering may add.
type Temps = Vec<(DType, usize)>;

/// A lowering's function (see [`Lowering::apply`]).
type Apply = fn(&mut Point<'_>, &mut Temps) -> Option<Result<Lowered>>;

/// The lowerings, tried in this order on each kernel body; the first that applies makes the
/// kernel, and `rangeify` always applies. The tile-op forms need an optimizer that allows tile
/// ops; the GEMM epilogue only applies to the kernels the cut gave one, and falls back to
/// the next lowering (the GEMM as a loop nest) when its body does not lower as one after all.
pub(crate) const LOWERINGS: &[Lowering] = &[
    Lowering { name: "tile_gemm", apply: tile_gemm },
    Lowering { name: "rounded_gemm", apply: rounded_gemm },
    Lowering { name: "gemm_epilogue", apply: gemm_epilogue },
    Lowering { name: "online_attention", apply: online_attention },
    Lowering { name: "online_rows_split", apply: online_rows_split },
    Lowering { name: "online_rows", apply: online_rows },
    Lowering { name: "activation_rows", apply: activation_rows },
    Lowering { name: "gated_activation_rows", apply: gated_activation_rows },
    Lowering { name: "convert_rows", apply: convert_rows },
    Lowering { name: "rounded_rows", apply: rounded_rows },
    Lowering { name: "rangeify", apply: rangeify },
];

/// A GEMM-shaped body as tile GEMMs ([`crate::tilemap::lower_gemm`]).
fn tile_gemm(pt: &mut Point<'_>, _: &mut Temps) -> Option<Result<Lowered>> {
    let program = pt.opts.opt.tile_ops().then(|| crate::tilemap::lower_gemm(&pt.body, &pt.out))??;
    Some(Ok(pt.finish(program, pt.loop_derived())))
}

/// A 16-bit GEMM whose consumer only rounds it to its type, as tile GEMMs writing it rounded
/// ([`crate::tilemap::lower_rounded_gemm`]).
fn rounded_gemm(pt: &mut Point<'_>, _: &mut Temps) -> Option<Result<Lowered>> {
    if !pt.with_epilogue.contains(pt.p) || !pt.opts.opt.tile_ops() {
        return None;
    }
    let program = crate::tilemap::lower_rounded_gemm(&pt.body, &pt.out)?;
    Some(Ok(Lowered { epilogue: true, ..pt.finish(program, pt.loop_derived()) }))
}

/// A GEMM with its consumer's elementwise ops applied to each output block
/// ([`crate::epilogue::lower_gemm_epilogue`]).
fn gemm_epilogue(pt: &mut Point<'_>, _: &mut Temps) -> Option<Result<Lowered>> {
    if !pt.with_epilogue.contains(pt.p) {
        return None;
    }
    let program = crate::epilogue::lower_gemm_epilogue(&pt.body, &pt.out)?;
    Some(program.map(|program| Lowered { epilogue: true, ..pt.finish(program, pt.loop_derived()) }))
}

/// An online group over a matrix product (attention) on tile ops
/// ([`crate::online_tiles::lower_online_attention`]).
fn online_attention(pt: &mut Point<'_>, _: &mut Temps) -> Option<Result<Lowered>> {
    let program =
        pt.opts.opt.tile_ops().then(|| crate::online_tiles::lower_online_attention(&pt.body, &pt.out))??;
    let derived = match pt.online {
        0 => String::new(),
        n => format!("{n} online sums on tile ops: score GEMM, softmax update, P.V GEMM"),
    };
    Some(Ok(pt.finish(program, derived)))
}

/// Few long rows of an online group: their states in chunks by one kernel (run just before),
/// merged by this one ([`crate::online_rows::lower_online_rows_split`]).
fn online_rows_split(pt: &mut Point<'_>, temps: &mut Temps) -> Option<Result<Lowered>> {
    let n = pt.args.len();
    let split_out = buffer(n + 1, pt.p.dtype(), numel(pt.p.shape()));
    if !pt.opts.opt.tile_ops() {
        return None;
    }
    let split = crate::online_rows::lower_online_rows_split(&pt.body, &split_out, n)?;
    temps.push((DType::F32, split.states));
    let states = ArgSource::Temp(temps.len() - 1);
    let name = pt.name.clone();
    let mut partial_args = pt.args.clone();
    partial_args.push(states);
    let (partials, partial_args) = compact_slots(split.partials, partial_args);
    let before = Lowered::new(
        format!("{name}_chunks"),
        vec![split.states],
        partials,
        partial_args,
        "the maximum and sum of exp of each chunk of a row, on tile ops".to_string(),
    );
    let before = Lowered { lowering: "online_rows_split", ..before };
    let mut args = pt.args.clone();
    args.extend([states, pt.buf_of[pt.p]]);
    let (program, args) = compact_slots(split.body, args);
    let derived =
        format!("{} online sums on tile ops: row max and sum of exp, merged from chunks", pt.online);
    let lowered = Lowered::new(name, pt.body.shape().to_vec(), program, args, derived);
    Some(Ok(Lowered { before: Some(Box::new(before)), ..lowered }))
}

/// The rows of an online group on row tile ops ([`crate::online_rows::lower_online_rows`]).
fn online_rows(pt: &mut Point<'_>, _: &mut Temps) -> Option<Result<Lowered>> {
    let program =
        pt.opts.opt.tile_ops().then(|| crate::online_rows::lower_online_rows(&pt.body, &pt.out))??;
    let derived = match pt.online {
        0 => String::new(),
        n => format!("{n} online sums on tile ops: row max and sum of exp"),
    };
    Some(Ok(Lowered { online_rows: true, ..pt.finish(program, derived) }))
}

/// A row lowering of [`crate::activation_rows`] (an elementwise body lowered row by row around
/// a tile op), where the optimizer allows tile ops.
fn row_lowering(
    pt: &mut Point<'_>,
    lower_rows: fn(&UOp, &UOp, &mut crate::rangeify::Ctx) -> Option<Result<UOp>>,
) -> Option<Result<Lowered>> {
    if !pt.opts.opt.tile_ops() {
        return None;
    }
    let program = lower_rows(&pt.body, &pt.out, &mut pt.ctx)?;
    Some(program.map(|program| pt.finish(program, pt.loop_derived())))
}

/// An elementwise body ending in an activation, as loops over the activation's argument and
/// the activation's tile op per row ([`crate::activation_rows::lower_activation_rows`]).
fn activation_rows(pt: &mut Point<'_>, _: &mut Temps) -> Option<Result<Lowered>> {
    row_lowering(pt, crate::activation_rows::lower_activation_rows)
}

/// An elementwise body that is a gated activation (`silu(gate) * up`), as a loop writing the
/// activation's argument into a row buffer, the activation's tile op over it, and a loop
/// multiplying by the gate's other factor ([`crate::activation_rows::lower_gated_activation_rows`]).
fn gated_activation_rows(pt: &mut Point<'_>, _: &mut Temps) -> Option<Result<Lowered>> {
    row_lowering(pt, crate::activation_rows::lower_gated_activation_rows)
}

/// An elementwise body that only converts between f32 and a 16-bit float, row by row from
/// contiguous runs of its input, as one conversion tile op per row
/// ([`crate::activation_rows::lower_convert_rows`]).
fn convert_rows(pt: &mut Point<'_>, _: &mut Temps) -> Option<Result<Lowered>> {
    row_lowering(pt, crate::activation_rows::lower_convert_rows)
}

/// An elementwise body that rounds an f32 value to a 16-bit float, as a loop writing each
/// row's f32 values into a row buffer and one conversion tile op per row
/// ([`crate::activation_rows::lower_rounded_rows`]).
fn rounded_rows(pt: &mut Point<'_>, _: &mut Temps) -> Option<Result<Lowered>> {
    row_lowering(pt, crate::activation_rows::lower_rounded_rows)
}

/// Any body, as loops over its output with the optimizer's opts ([`crate::rangeify`]), each
/// loop its body tells apart by division split into those pieces
/// ([`uopc_ir::split_loops_at_divisors`]).
fn rangeify(pt: &mut Point<'_>, _: &mut Temps) -> Option<Result<Lowered>> {
    let program = lower(&pt.body, &pt.out, &mut pt.ctx).map(|p| uopc_ir::split_loops_at_divisors(&p));
    Some(program.map(|program| pt.finish(program, pt.loop_derived())))
}

/// The kernel that computes point `p`: its given program for a custom kernel, else the first
/// of [`LOWERINGS`] that applies to its body, named in [`Lowered::lowering`].
pub(crate) fn lower_point(
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
        return Ok(Lowered { output_parts: custom.output_parts.clone(), lowering: "custom", ..lowered });
    }
    let (body, args) = kernel_body(p, buf_of);
    let name = kernel_name(&body);
    let ctx = Ctx::new(opts.opt.opts(&body), !opts.experiments.reshape_without_divmod_folding);
    let out = buffer(args.len(), p.dtype(), numel(p.shape()));
    let online = crate::online::online_sums_in(&body);
    let mut point = Point { p, body, args, buf_of, opts, with_epilogue, online, name, ctx, out };
    for lowering in LOWERINGS {
        if let Some(lowered) = (lowering.apply)(&mut point, temps) {
            return lowered.map(|l| Lowered { lowering: lowering.name, ..l });
        }
    }
    unreachable!("rangeify lowers every body")
}

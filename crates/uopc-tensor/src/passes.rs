//! Graph passes of the kernelizer, run on the tensor-level graph before it is cut: the
//! canonical form (the plan-cache key), broadcast staging, the layout passes and the choice of
//! materialization points.

use crate::util::numel;
use crate::view::{movement_chain, strided_broadcast_views};
use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;
use uopc_ir::rewrite::RuleCx;
use uopc_ir::{Op, Pass, Pattern, Revisit, Rule, RuleTable, UOp};

/// Runs `pass` over the graph under `roots` (one memo for all roots, so shared nodes are
/// rewritten once) and returns the new roots. Rule counts go to the rewrite engine's per-thread
/// trace ([`uopc_ir::rewrite_counts`]).
pub(crate) fn run_pass<C>(pass: &Pass<'_, C>, roots: &[UOp], state: &mut C) -> Vec<UOp> {
    let mut memo = HashMap::new();
    roots.iter().map(|r| pass.run(r, state, &mut memo).0).collect()
}

/// Canonicalization: DATA leaves become numbered PARAMs (the state collects the leaves in slot
/// order), DETACH and GRADIENT_RULE disappear (they only matter to autograd, which has run).
static CANONICAL: LazyLock<RuleTable<Vec<UOp>>> = LazyLock::new(|| {
    // Only the op's variant matters to the pattern.
    let data = Op::Data { shape: Vec::new(), data: uopc_ir::DataRef(std::sync::Arc::new(())) };
    let gradient_rule = Op::GradientRule(uopc_ir::DataRef(std::sync::Arc::new(())));
    let custom = Op::Custom(uopc_ir::CustomKernel {
        name: String::new(),
        program: uopc_ir::sink(&[]),
        shape: Vec::new(),
        output_parts: Vec::new(),
        equivalent: None,
        vjp: None,
    });
    RuleTable::new(
        "canonical",
        vec![
            Rule::with_cx("data_to_param", Pattern::ops(&[data]), data_to_param),
            Rule::with_cx("drop_detach", Pattern::ops(&[Op::Detach]), |u, _| u.as_detach().cloned()),
            Rule::with_cx("drop_gradient_rule", Pattern::ops(&[gradient_rule]), |u, _| {
                u.as_gradient_rule_value().cloned()
            }),
            Rule::with_cx("drop_custom_autograd", Pattern::ops(&[custom]), drop_custom_autograd),
        ],
    )
});
static CANONICALIZE: LazyLock<Pass<'static, Vec<UOp>>> =
    LazyLock::new(|| Pass::new("canonicalize", vec![&*CANONICAL], Revisit::Never));

/// A custom kernel without what only autograd reads (its equivalent graph and gradient rule,
/// the rule compared by identity): two graphs with the same kernels then share one plan, as
/// two with the same shapes and new data do.
fn drop_custom_autograd(u: &UOp, _: &mut RuleCx<'_, Vec<UOp>>) -> Option<UOp> {
    let Op::Custom(c) = u.op() else { return None };
    if c.equivalent.is_none() && c.vjp.is_none() {
        return None;
    }
    let plain = uopc_ir::CustomKernel { equivalent: None, vjp: None, ..c.clone() };
    Some(UOp::new(Op::Custom(plain), u.dtype(), u.src().to_vec()))
}

fn data_to_param(u: &UOp, cx: &mut RuleCx<'_, Vec<UOp>>) -> Option<UOp> {
    let Op::Data { shape, .. } = u.op() else { return None };
    let leaves = &mut *cx.state;
    let p = UOp::new(Op::Param { slot: leaves.len(), shape: shape.clone() }, u.dtype(), vec![]);
    leaves.push(u.clone());
    Some(p)
}

/// Staging: the nodes in the state's set (by their original identity) are wrapped in a STAGE;
/// with `columns_last`, the staged copy also puts the second-to-last axis last (see
/// [`layout_pass_output`]).
struct StageMarked {
    todo: HashSet<UOp>,
    columns_last: bool,
}

static STAGING: LazyLock<RuleTable<StageMarked>> = LazyLock::new(|| {
    RuleTable::new("staging", vec![Rule::with_cx("stage_marked", Pattern::Any, stage_marked)])
});
static STAGE: LazyLock<Pass<'static, StageMarked>> =
    LazyLock::new(|| Pass::new("stage", vec![&*STAGING], Revisit::Never));

fn stage_marked(u: &UOp, cx: &mut RuleCx<'_, StageMarked>) -> Option<UOp> {
    if !cx.state.todo.contains(cx.original()) {
        return None;
    }
    if !cx.state.columns_last {
        return Some(stage(u.clone()));
    }
    // Stage the view with the column axis last, then permute back: same values, and the
    // column axis of the staged buffer has stride 1.
    let n = u.shape().len();
    let mut perm: Vec<usize> = (0..n).filter(|&a| a != n - 2).collect();
    perm.push(n - 2);
    let mut inverse = vec![0; n];
    for (k, &p) in perm.iter().enumerate() {
        inverse[p] = k;
    }
    let d = u.dtype();
    let moved = UOp::new(Op::Permute(perm), d, vec![u.clone()]);
    Some(UOp::new(Op::Permute(inverse), d, vec![stage(moved)]))
}

/// Views pushed into reduces: a chain of PERMUTEs and RESHAPEs over a REDUCE of the trailing
/// axis is the same reduce over the input moved by that chain with the reduced axis kept last
/// (the reduced axis is innermost, so reshaping the others and permuting them commutes with
/// summing it). A gradient's `dW` is the transpose of the product it sums; pushed in, the product
/// writes `dW`'s layout itself instead of a transposing copy running after it. Only chains whose
/// every node (the reduce included) has one user are moved, so nothing is computed twice.
struct PushViews {
    users: HashMap<UOp, usize>,
}

static VIEWS_INTO_REDUCES: LazyLock<RuleTable<PushViews>> = LazyLock::new(|| {
    RuleTable::new(
        "views_into_reduces",
        vec![Rule::with_cx(
            "permute_into_reduce",
            Pattern::ops(&[Op::Permute(Vec::new())]),
            permute_into_reduce,
        )],
    )
});
static PUSH_VIEWS: LazyLock<Pass<'static, PushViews>> =
    LazyLock::new(|| Pass::new("push_views", vec![&*VIEWS_INTO_REDUCES], Revisit::Never));

fn permute_into_reduce(u: &UOp, cx: &mut RuleCx<'_, PushViews>) -> Option<UOp> {
    // Use counts are of the graph as it was: walk the original chain to check them, and the
    // rewritten one (the same ops over rewritten sources) to build from.
    let users = &cx.state.users;
    let single = |x: &UOp| users.get(x).copied().unwrap_or(0) <= 1;
    let mut original = cx.original().as_movement()?.clone();
    let mut chain = vec![u.clone()];
    let mut below = u.as_movement()?.clone();
    while matches!(below.op(), Op::Permute(_) | Op::Reshape(_)) {
        if !single(&original) {
            return None;
        }
        chain.push(below.clone());
        below = below.as_movement()?.clone();
        original = original.as_movement()?.clone();
    }
    let reduce = below.as_reduce().filter(|r| r.axes == 1)?;
    if !single(&original) {
        return None;
    }
    let x = reduce.input;
    let r = *x.shape().last()?;
    let moved = chain.iter().rev().try_fold(x.clone(), |v, m| {
        let op = match m.op() {
            Op::Permute(p) => Op::Permute(p.iter().copied().chain([p.len()]).collect()),
            Op::Reshape(shape) => Op::Reshape(shape.iter().copied().chain([r]).collect()),
            _ => return None,
        };
        Some(UOp::new(op, v.dtype(), vec![v]))
    })?;
    Some(UOp::new(Op::Reduce { op: reduce.op, axes: 1 }, below.dtype(), vec![moved]))
}

/// `roots` with every PERMUTE (and the RESHAPEs under it) over a single-use REDUCE moved into
/// the reduce's input (see [`PushViews`]).
pub fn push_views_into_reduces(roots: &[UOp]) -> Vec<UOp> {
    let mut users: HashMap<UOp, usize> = HashMap::new();
    for u in UOp::toposort(roots) {
        for s in u.src() {
            *users.entry(s.clone()).or_default() += 1;
        }
    }
    for r in roots {
        *users.entry(r.clone()).or_default() += 1;
    }
    run_pass(&PUSH_VIEWS, roots, &mut PushViews { users })
}

/// The canonical form of a graph, its plan-cache key: DETACH removed and each distinct DATA
/// leaf replaced by `Param { slot, shape }` in first-use order. Returns the canonical roots
/// and the DATA leaves in slot order.
pub fn canonicalize(roots: &[UOp]) -> (Vec<UOp>, Vec<UOp>) {
    let mut leaves: Vec<UOp> = Vec::new();
    let canon = run_pass(&CANONICALIZE, roots, &mut leaves);
    (canon, leaves)
}

/// ALU ops times elements that recomputing `u` would cost, stopping at materialized nodes.
fn fused_work(u: &UOp) -> usize {
    let mut n = 0;
    let mut seen = HashSet::new();
    let mut stack = vec![u.clone()];
    while let Some(x) = stack.pop() {
        if matches!(x.op(), Op::Param { .. } | Op::Data { .. } | Op::Reduce { .. } | Op::Stage)
            || !seen.insert(x.clone())
        {
            continue;
        }
        if x.op().is_alu() {
            n += 1;
        }
        stack.extend(x.src().iter().cloned());
    }
    n * numel(u.shape())
}

fn stage(u: UOp) -> UOp {
    let d = u.dtype();
    UOp::new(Op::Stage, d, vec![u])
}

/// `roots` with every node of `todo` wrapped in a STAGE.
fn stage_all(roots: &[UOp], todo: HashSet<UOp>) -> Vec<UOp> {
    if todo.is_empty() {
        return roots.to_vec();
    }
    run_pass(&STAGE, roots, &mut StageMarked { todo, columns_last: false })
}

/// Fusing is only free if nothing is recomputed. A computed tensor EXPANDed by `factor` or more
/// (a LayerNorm output feeding a matmul) would be recomputed for every copy, so it is staged
/// when recomputing it costs at least 4096 ALU-op-elements.
///
/// The copy is taken in the layout its reader sees when only PERMUTEs and RESHAPEs, each with
/// one user, lie between the computed tensor and the broadcast: the same values and work, and a
/// GEMM reading the copy finds it row-major (the gradient of a fused QKV projection is
/// assembled as (3, B, H, T, D) and read as (B T, 3 H D)).
pub fn stage_broadcast_compute(roots: &[UOp], factor: usize) -> Vec<UOp> {
    let topo = UOp::toposort(roots);
    let mut users: HashMap<&UOp, usize> = HashMap::new();
    for u in &topo {
        for s in u.src() {
            *users.entry(s).or_default() += 1;
        }
    }
    let mut todo = HashSet::new();
    for u in &topo {
        let Some(broadcast) = u.as_expand() else { continue };
        if numel(u.shape()) < factor * numel(broadcast.shape()) {
            continue;
        }
        // The movement chain below the broadcast, top first, and the node under it.
        let (chain, base) = movement_chain(broadcast);
        if base.op().is_alu()
            && !matches!(base.op(), Op::Cast)
            && !base.shape().is_empty()
            && fused_work(&base) >= 4096
        {
            // The highest node of the chain reached from the base through single-user
            // PERMUTEs and RESHAPEs only.
            let mut staged = base.clone();
            let single = |x: &UOp| users.get(x).copied().unwrap_or(0) <= 1;
            // A RESHAPE that only adds or drops unit axes moves no element: the copy stops
            // below it, keeping its own shape.
            let moves_elements = |m: &UOp| {
                let non_unit = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
                match m.op() {
                    Op::Permute(_) => true,
                    Op::Reshape(_) => {
                        m.as_movement().is_some_and(|x| non_unit(m.shape()) != non_unit(x.shape()))
                    }
                    _ => false,
                }
            };
            for m in chain.iter().rev() {
                if !moves_elements(m) || !single(&staged) {
                    break;
                }
                staged = m.clone();
            }
            todo.insert(staged);
        }
    }
    stage_all(roots, todo)
}

/// The layout pass: a reduce whose input reads a broadcast buffer with a non-unit stride along
/// the (innermost) reduce axis gets a contiguous copy of that view, taken before the broadcast
/// so the copy is small and every re-read is contiguous (P V reads V transposed: the copy is
/// `e_1_64_1024` in attention).
pub fn layout_pass(roots: &[UOp]) -> Vec<UOp> {
    layout_pass_except(roots, |_| false)
}

/// [`layout_pass`] leaving the inputs of the reduces for which `in_place` holds as they are.
pub(crate) fn layout_pass_except(roots: &[UOp], in_place: impl Fn(&UOp) -> bool) -> Vec<UOp> {
    let mut todo = HashSet::new();
    for r in UOp::toposort(roots) {
        let Some(reduce) = r.as_reduce() else { continue };
        if in_place(&r) {
            continue;
        }
        let x = reduce.input;
        let n = x.shape().len();
        if n == 0 || x.shape()[n - 1] <= 1 {
            continue;
        }
        todo.extend(strided_broadcast_views(x, n - 1));
    }
    stage_all(roots, todo)
}

/// The layout pass for packed register tiles: a reduce over the last axis whose input reads a
/// broadcast buffer with a non-unit stride along the last output axis (the tile's columns)
/// gets a copy in which that axis is contiguous, taken before the broadcast (Q K^T reads K
/// transposed: the copy is `e_1_64_1024` in attention). Inputs already contiguous along it,
/// like V in P V, are read in place, and so are both operands of a reduce for which
/// `in_place` holds (a tile GEMM reads transposed operands itself).
pub fn layout_pass_output(roots: &[UOp], in_place: impl Fn(&UOp) -> bool) -> Vec<UOp> {
    layout_pass_output_with(roots, in_place, |_| Vec::new())
}

/// [`layout_pass_output`], also staging the nodes `stage_for(reduce)` names for each reduce
/// (the operands a tile GEMM cannot read in place, which it can once they are copied).
pub(crate) fn layout_pass_output_with(
    roots: &[UOp],
    in_place: impl Fn(&UOp) -> bool,
    stage_for: impl Fn(&UOp) -> Vec<UOp>,
) -> Vec<UOp> {
    let mut todo: HashSet<UOp> = HashSet::new();
    let mut plain: HashSet<UOp> = HashSet::new();
    for r in UOp::toposort(roots) {
        let Some(reduce) = r.as_reduce() else { continue };
        if in_place(&r) {
            continue;
        }
        let staged = stage_for(&r);
        if !staged.is_empty() {
            plain.extend(staged);
            continue;
        }
        let x = reduce.input;
        let n = x.shape().len();
        if n < 2 || reduce.axes != 1 || x.shape()[n - 2] <= 1 {
            continue;
        }
        todo.extend(strided_broadcast_views(x, n - 2));
    }
    let roots = stage_all(roots, plain);
    if todo.is_empty() {
        return roots;
    }
    run_pass(&STAGE, &roots, &mut StageMarked { todo, columns_last: true })
}

/// The nodes that get their own buffer: STAGEs, REDUCEs (unless `fuse_reduce`), and roots that
/// are not already an input buffer. In execution (topological) order.
pub fn materialize_points(roots: &[UOp], fuse_reduce: bool) -> Vec<UOp> {
    let root_set: HashSet<&UOp> = roots.iter().collect();
    let topo = UOp::toposort(roots);
    // A custom kernel reads whole buffers: its sources that are not inputs are materialized.
    let custom_sources: HashSet<&UOp> = topo
        .iter()
        .filter(|u| matches!(u.op(), Op::Custom(_)))
        .flat_map(|u| u.src().iter())
        .filter(|s| !matches!(s.op(), Op::Param { .. }))
        .collect();
    topo.iter()
        .filter(|u| {
            matches!(u.op(), Op::Stage | Op::Custom(_))
                || (matches!(u.op(), Op::Reduce { .. }) && !fuse_reduce)
                || (root_set.contains(u) && !matches!(u.op(), Op::Param { .. }))
                || custom_sources.contains(u)
        })
        .cloned()
        .collect()
}

//! The engine on small rule tables: order, fixed points, bounds, state, deep graphs, counts.

use super::*;
use crate::builder::idx;
use crate::dtype::DType;
use crate::ids::BufferSlot;
use crate::uop::{BinaryOp, ConstValue, Op, UOp};

fn int(u: &UOp) -> Option<i64> {
    u.const_int()
}

/// `a + b` of two constants becomes their sum.
fn add_consts(u: &UOp) -> Option<UOp> {
    let (_, a, b) = u.as_binary()?;
    Some(idx(int(a)? + int(b)?))
}

/// `x * 1` becomes `x`.
fn mul_one(u: &UOp) -> Option<UOp> {
    let (_, x, one) = u.as_binary()?;
    (int(one) == Some(1)).then(|| x.clone())
}

/// `x - y` becomes `x + (-1 * y)`: builds a node the pass has not seen.
fn sub_to_add(u: &UOp) -> Option<UOp> {
    let (_, x, y) = u.as_binary()?;
    Some(x.binary(BinaryOp::Add, y.binary(BinaryOp::Mul, idx(-1))))
}

/// `c * -1` of a constant becomes `-c`.
fn fold_neg(u: &UOp) -> Option<UOp> {
    let (_, a, b) = u.as_binary()?;
    Some(idx(int(a)?.checked_mul(int(b)?)?))
}

fn table() -> RuleTable {
    RuleTable::new(
        "arith",
        vec![
            Rule::new("add_consts", Pattern::ops(&[Op::Binary(BinaryOp::Add)]), add_consts),
            Rule::new("mul_one", Pattern::ops(&[Op::Binary(BinaryOp::Mul)]), mul_one),
            Rule::new("fold_mul", Pattern::ops(&[Op::Binary(BinaryOp::Mul)]), fold_neg),
            Rule::new("sub_to_add", Pattern::ops(&[Op::Binary(BinaryOp::Sub)]), sub_to_add),
        ],
    )
}

#[test]
fn rules_fire_bottom_up_to_a_fixed_point_and_are_counted() {
    let t = table();
    let pass = Pass::new("test", vec![&t], Revisit::Fixpoint { max_rounds: 8 });
    // (2 + 3) - 4: add_consts gives 5, sub_to_add builds 5 + (4 * -1), whose new product
    // folds to -4, and the sum folds to 1.
    let e = idx(2).binary(BinaryOp::Add, idx(3)).binary(BinaryOp::Sub, idx(4));
    let (out, stats) = pass.run(&e, &mut (), &mut HashMap::new());
    assert_eq!(out, idx(1));
    assert_eq!(stats.count("add_consts"), 2);
    assert_eq!(stats.count("sub_to_add"), 1);
    assert_eq!(stats.count("fold_mul"), 1);
    assert_eq!(stats.count("mul_one"), 0);
    assert_eq!(stats.total(), 4);
    assert_eq!(stats.to_string(), "rewrite test: arith/add_consts=2 arith/fold_mul=1 arith/sub_to_add=1");
}

#[test]
fn never_revisit_keeps_the_first_replacement() {
    let t = table();
    let pass = Pass::new("once", vec![&t], Revisit::Never);
    let e = idx(5).binary(BinaryOp::Sub, idx(4));
    let (out, stats) = pass.run(&e, &mut (), &mut HashMap::new());
    assert_eq!(out, idx(5).binary(BinaryOp::Add, idx(4).binary(BinaryOp::Mul, idx(-1))));
    assert_eq!(stats.total(), 1);
}

#[test]
fn the_round_bound_stops_a_cycling_rule() {
    fn swap(u: &UOp) -> Option<UOp> {
        let (_, a, b) = u.as_binary()?;
        Some(b.binary(BinaryOp::Max, a.clone()))
    }
    let t =
        RuleTable::new("cycle", vec![Rule::new("swap", Pattern::ops(&[Op::Binary(BinaryOp::Max)]), swap)]);
    let pass = Pass::new("cycle", vec![&t], Revisit::Fixpoint { max_rounds: 3 });
    let (a, b) = (idx(1), idx(2));
    let (out, stats) = pass.run(&a.binary(BinaryOp::Max, b.clone()), &mut (), &mut HashMap::new());
    assert_eq!(out, b.binary(BinaryOp::Max, a));
    assert_eq!(stats.total(), 3);
}

#[test]
fn earlier_tables_win_and_patterns_select_rules() {
    fn to_zero(_: &UOp) -> Option<UOp> {
        Some(idx(0))
    }
    let first = RuleTable::new("first", vec![Rule::new("zero_any", Pattern::Any, to_zero)])
        .with_guard(|u| u.op() == &Op::Binary(BinaryOp::Mul));
    let t = table();
    let pass = Pass::new("order", vec![&first, &t], Revisit::Fixpoint { max_rounds: 4 });
    let x = crate::builder::range(4, 0, crate::uop::AxisType::Loop);
    let e = (&x * 1).binary(BinaryOp::Add, idx(0));
    let (out, stats) = pass.run(&e, &mut (), &mut HashMap::new());
    // The guard admits only the product, which becomes 0 (not `x` by mul_one); then 0 + 0.
    assert_eq!(out, idx(0));
    assert_eq!(stats.count("zero_any"), 1);
    assert_eq!(stats.count("mul_one"), 0);
    assert_eq!(t.first_rewrite(&(&x * 1)), Some(("mul_one", x.clone())));
    assert_eq!(t.apply_rule("fold_mul", &(&x * 1)), None);
    assert!(t.rule("sub_to_add").is_some_and(|r| !r.matches_op(&x)));
}

#[test]
fn rules_with_state_see_the_original_node_and_the_rewrite_so_far() {
    struct Seen(Vec<(u64, bool)>);
    fn note(u: &UOp, cx: &mut RuleCx<'_, Seen>) -> Option<UOp> {
        let sources_done = u.src().iter().all(|s| cx.rewritten(s).is_some());
        let id = cx.original().id();
        cx.state.0.push((id, sources_done));
        None
    }
    let t = RuleTable::new("note", vec![Rule::with_cx("note", Pattern::Alu, note)]);
    let pass = Pass::new("note", vec![&t], Revisit::Fixpoint { max_rounds: 4 });
    let a = idx(7).binary(BinaryOp::Add, idx(8));
    let e = a.binary(BinaryOp::Mul, idx(2));
    let mut seen = Seen(Vec::new());
    let (out, _) = pass.run(&e, &mut seen, &mut HashMap::new());
    assert_eq!(out, e);
    assert_eq!(seen.0, vec![(a.id(), true), (e.id(), true)]);
}

#[test]
fn deep_graphs_rewrite_without_recursion_and_counts_accumulate_per_thread() {
    let t = table();
    let pass = Pass::new("deep", vec![&t], Revisit::Fixpoint { max_rounds: 4 });
    let mut e = idx(0);
    for _ in 0..100_000 {
        e = e.binary(BinaryOp::Mul, idx(1));
    }
    take_rewrite_counts();
    let (out, _) = pass.run(&e, &mut (), &mut HashMap::new());
    assert_eq!(out, idx(0));
    let counts = take_rewrite_counts();
    assert_eq!(counts.len(), 1);
    assert_eq!(counts[0].pass, "deep");
    assert_eq!(counts[0].count("mul_one") + counts[0].count("fold_mul"), 100_000);
    assert!(rewrite_counts().is_empty());
    let c = UOp::new(Op::Const(ConstValue::Int(3)), DType::I64, vec![]);
    assert_eq!(OpKey::of(c.op()), OpKey::of(&Op::Const(ConstValue::Int(0))));
}

/// A single-replacement pass that renames (slot k+1 becomes slot k) produces nodes the graph
/// already holds; those must still get their own replacement, not be taken as done.
#[test]
fn a_renaming_pass_rewrites_nodes_equal_to_earlier_results() {
    fn shift_down(u: &UOp) -> Option<UOp> {
        match u.op() {
            Op::Buffer { slot, len } if slot.index() > 0 => {
                Some(crate::buffer(slot.index() - 1, u.dtype(), *len))
            }
            _ => None,
        }
    }
    let rename = RuleTable::new(
        "slots",
        vec![Rule::new(
            "shift_down",
            Pattern::ops(&[Op::Buffer { slot: BufferSlot::new(0), len: 0 }]),
            shift_down,
        )],
    );
    let pass = Pass::new("rename", vec![&rename], Revisit::Never);
    let (b1, b2) = (crate::buffer(1, DType::F32, 4), crate::buffer(2, DType::F32, 4));
    // b2 is visited first (the store's index comes before its value), so its result, slot 1,
    // is built before b1, which is slot 1 already, is reached.
    let program = crate::sink(&[b2.index(0).store(b1.index(0).load())]);
    let (out, stats) = pass.run(&program, &mut (), &mut HashMap::new());
    let slots: Vec<usize> = UOp::toposort(std::slice::from_ref(&out))
        .iter()
        .filter_map(|u| match u.op() {
            Op::Buffer { slot, .. } => Some(slot.index()),
            _ => None,
        })
        .collect();
    assert_eq!(stats.count("shift_down"), 2, "{stats}");
    let mut sorted = slots.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, vec![0, 1], "{slots:?}");
    assert_eq!(slots.len(), 2);
}

//! One case per simplify rule: a node (with simplified sources) on which that rule is the first
//! of its table to fire, and the node it must become. Every rule of every table needs a case.

use super::tables;
use crate::builder::{boolc, buffer, f32c, idx, range};
use crate::dtype::DType;
use crate::rewrite::RuleTable;
use crate::uop::{AxisType, BinaryOp, Op, UOp, UnaryOp};
use std::collections::HashSet;

struct Case {
    rule: &'static str,
    input: UOp,
    expected: UOp,
}

fn neg(x: &UOp) -> UOp {
    UOp::new(Op::Unary(UnaryOp::Neg), x.dtype(), vec![x.clone()])
}

fn bin(op: BinaryOp, a: &UOp, b: &UOp) -> UOp {
    a.binary(op, b.clone())
}

/// Rules that the full pass never reaches because an earlier rule decides the same nodes: an
/// integer `x % 1` and `x // y` with `0 <= x < y` have bounds of one value (0), so
/// `fold_value_known_from_bounds` folds them first. They keep the divmod table complete on
/// its own.
const SHADOWED: [(&str, &str); 2] = [
    ("mod_by_one", "fold_value_known_from_bounds"),
    ("idiv_by_larger_divisor", "fold_value_known_from_bounds"),
];

fn cases() -> Vec<Case> {
    let i = range(8, 0, AxisType::Loop);
    let j = range(4, 1, AxisType::Loop);
    let k = range(64, 2, AxisType::Loop);
    let x = buffer(0, DType::F32, 8).index(&i).load();
    let n = buffer(1, DType::I64, 8).index(&i).load();
    let case = |rule, input, expected| Case { rule, input, expected };
    let (add, mul) = (BinaryOp::Add, BinaryOp::Mul);
    vec![
        case("fold_unary", neg(&f32c(2.5)), f32c(-2.5)),
        case("fold_binary", bin(add, &f32c(0.1), &f32c(0.2)), f32c(0.1f32 + 0.2f32)),
        case("fold_cast", idx(3).cast(DType::F32), f32c(3.0)),
        case("fold_where", UOp::new(Op::Where, DType::I64, vec![boolc(false), idx(1), idx(2)]), idx(2)),
        case("fold_value_known_from_bounds", i.lt(idx(8)), boolc(true)),
        case("neg_of_neg", neg(&neg(&x)), x.clone()),
        case("float_mul_by_one", bin(mul, &f32c(1.0), &x), x.clone()),
        case("float_add_negative_zero", bin(add, &x, &f32c(-0.0)), x.clone()),
        case("float_sub_positive_zero", bin(BinaryOp::Sub, &x, &f32c(0.0)), x.clone()),
        case(
            "where_of_equal_branches",
            UOp::new(Op::Where, DType::F32, vec![i.lt(&j), x.clone(), x.clone()]),
            x.clone(),
        ),
        case(
            "where_of_negated_condition",
            i.ne(&j).where_(boolc(false), boolc(true)).where_(&x, f32c(0.5)),
            i.ne(&j).where_(f32c(0.5), &x),
        ),
        case("max_of_ordered_operands", i.maximum(idx(-1)), i.clone()),
        // A flat offset split into rows of 8 and joined again.
        case(
            "div_mod_recombine",
            bin(add, &bin(mul, &k.idiv(idx(8)), &idx(24)), &bin(mul, &k.modulo(idx(8)), &idx(3))),
            bin(mul, &k, &idx(3)),
        ),
        case(
            "canonical_linear_sum",
            bin(add, &bin(add, &i, &idx(3)), &i),
            bin(add, &bin(mul, &i, &idx(2)), &idx(3)),
        ),
        case("idiv_by_one", n.idiv(idx(1)), n.clone()),
        case("mod_by_one", n.modulo(idx(1)), idx(0)),
        case("idiv_of_idiv", k.idiv(idx(2)).idiv(idx(3)), k.idiv(idx(6))),
        case("idiv_split_linear", bin(add, &bin(mul, &i, &idx(4)), &j).idiv(idx(4)), i.clone()),
        // A flat offset over rows of 4 divided by 4 rows of 4: the row over 4.
        case("idiv_common_factor", bin(add, &bin(mul, &i, &idx(4)), &j).idiv(idx(16)), i.idiv(idx(4))),
        case("mod_of_small_operand", j.modulo(idx(8)), j.clone()),
        case("mod_drop_multiples", bin(add, &bin(mul, &i, &idx(4)), &j).modulo(idx(4)), j.clone()),
        case(
            "mod_common_factor",
            bin(add, &bin(mul, &i, &idx(4)), &j).modulo(idx(16)),
            bin(add, &bin(mul, &i.modulo(idx(4)), &idx(4)), &j),
        ),
        case("idiv_by_larger_divisor", j.idiv(bin(add, &i, &idx(4))), idx(0)),
        case("mod_by_larger_divisor", j.modulo(bin(add, &i, &idx(4))), j.clone()),
    ]
}

fn table_of(rule: &str) -> &'static RuleTable {
    tables()
        .into_iter()
        .find(|t| t.rule(rule).is_some())
        .unwrap_or_else(|| panic!("no table has rule {rule}"))
}

/// The first rule of the whole simplify order to rewrite `u`, with its result.
fn first_in_pass(u: &UOp) -> Option<(&'static str, UOp)> {
    tables().into_iter().find_map(|t| t.first_rewrite(u))
}

#[test]
fn each_rule_rewrites_its_case_first_within_its_table() {
    for c in cases() {
        let table = table_of(c.rule);
        assert_eq!(table.apply_rule(c.rule, &c.input), Some(c.expected.clone()), "{} alone", c.rule);
        let first = table.first_rewrite(&c.input);
        assert_eq!(
            first,
            Some((c.rule, c.expected.clone())),
            "first rule of {} on {:?}",
            table.name(),
            c.input
        );
    }
}

#[test]
fn each_rule_is_the_first_of_the_whole_pass_on_its_case_unless_shadowed() {
    for c in cases() {
        let (winner, out) = first_in_pass(&c.input).unwrap_or_else(|| panic!("nothing rewrites {}", c.rule));
        let expected_winner = SHADOWED.iter().find(|s| s.0 == c.rule).map_or(c.rule, |s| s.1);
        assert_eq!(winner, expected_winner, "case of {}", c.rule);
        assert_eq!(out, c.expected, "case of {}", c.rule);
    }
}

#[test]
fn every_rule_of_every_table_has_a_case() {
    let covered: HashSet<&str> = cases().iter().map(|c| c.rule).collect();
    let mut names = HashSet::new();
    for t in tables() {
        for r in t.rules() {
            assert!(names.insert(r.name()), "rule name {} is not unique", r.name());
            assert!(covered.contains(r.name()), "rule {}/{} has no case", t.name(), r.name());
        }
    }
    assert_eq!(covered.len(), names.len(), "a case names a rule no table has");
}

#[test]
fn tables_run_in_their_documented_order() {
    let names: Vec<(&str, usize)> = tables().iter().map(|t| (t.name(), t.len())).collect();
    assert_eq!(
        names,
        [("constant_folding", 5), ("algebraic", 4), ("selection", 3), ("linear", 2), ("divmod", 10)]
    );
}

#[test]
fn rules_leave_alone_what_they_must_not_rewrite() {
    let i = range(8, 0, AxisType::Loop);
    let x = buffer(0, DType::F32, 8).index(&i).load();
    let none = |rule: &str, u: &UOp| assert_eq!(table_of(rule).apply_rule(rule, u), None, "{rule} on {u:?}");
    // Transcendentals are the backend's: not folded.
    none("fold_unary", &f32c(1.0).exp2());
    // x + 0.0 is not x (-0.0 + 0.0 == +0.0), and x - (-0.0) is not x either.
    none("float_add_negative_zero", &bin(BinaryOp::Add, &x, &f32c(0.0)));
    none("float_sub_positive_zero", &bin(BinaryOp::Sub, &x, &f32c(-0.0)));
    // Integer x * 1 is the linear table's (it keeps one canonical form), not float_mul_by_one's.
    none("float_mul_by_one", &bin(BinaryOp::Mul, &i, &idx(1)));
    // Already canonical.
    none("canonical_linear_sum", &bin(BinaryOp::Add, &i, &idx(3)));
    // A possibly negative dividend: truncating division does not split.
    let signed = bin(BinaryOp::Add, &i, &idx(-4));
    none("idiv_split_linear", &signed.idiv(idx(4)));
    none("mod_drop_multiples", &signed.modulo(idx(4)));
    none("idiv_common_factor", &bin(BinaryOp::Add, &bin(BinaryOp::Mul, &signed, &idx(4)), &i).idiv(idx(16)));
    // A remainder past the common factor (5j reaches 15 >= 4) keeps the division whole.
    let j4 = range(4, 3, AxisType::Loop);
    let spread = bin(BinaryOp::Add, &bin(BinaryOp::Mul, &i, &idx(4)), &bin(BinaryOp::Mul, &j4, &idx(5)));
    none("idiv_common_factor", &spread.idiv(idx(16)));
    none("mod_common_factor", &spread.modulo(idx(16)));
    // A quotient and remainder of different divisors, or weighted apart, stay.
    none(
        "div_mod_recombine",
        &bin(BinaryOp::Add, &bin(BinaryOp::Mul, &i.idiv(idx(4)), &idx(4)), &i.modulo(idx(2))),
    );
    none(
        "div_mod_recombine",
        &bin(BinaryOp::Add, &bin(BinaryOp::Mul, &i.idiv(idx(4)), &idx(3)), &i.modulo(idx(4))),
    );
    // Overlapping bounds decide nothing.
    let j = range(4, 1, AxisType::Loop);
    none("max_of_ordered_operands", &i.maximum(&j));
    // Malformed nodes are left to the verifier.
    let bad = UOp::new(Op::Binary(BinaryOp::Add), DType::I64, vec![idx(1)]);
    assert!(tables().iter().all(|t| t.first_rewrite(&bad).is_none()));
}

#[test]
fn folding_follows_the_interpreter_s_arithmetic() {
    let fold = |u: &UOp| first_in_pass(u).map(|(_, v)| v);
    // f32 operands are added in f32; I32 products wrap; IDIV truncates toward zero.
    assert_eq!(fold(&bin(BinaryOp::Add, &f32c(1e8), &f32c(1.0))), Some(f32c(1e8f32 + 1.0)));
    let big = UOp::new(Op::Const(crate::uop::ConstValue::Int(1 << 20)), DType::I32, vec![]);
    let wrapped = UOp::new(Op::Const(crate::uop::ConstValue::Int(0)), DType::I32, vec![]);
    assert_eq!(fold(&bin(BinaryOp::Mul, &big, &big)), Some(wrapped));
    assert_eq!(fold(&idx(-7).idiv(idx(2))), Some(idx(-3)));
    // MAX propagates NaN from either side.
    for max in [f32c(f32::NAN).maximum(f32c(2.0)), f32c(2.0).maximum(f32c(f32::NAN))] {
        let folded = fold(&max).and_then(|c| c.const_value());
        assert!(matches!(folded, Some(c) if c.as_f64().is_nan()), "{folded:?}");
    }
}

#[test]
fn a_multiple_of_the_divisor_in_the_constant_leaves_the_quotient() {
    // A head's columns inside the third third of a fused projection, once the loop over the
    // projection is split: `((k + 768) // 32) % 24` is `k // 32` for `0 <= k < 64`.
    let k = range(64, 2, AxisType::Loop);
    let (add, idiv, modulo) = (BinaryOp::Add, BinaryOp::IDiv, BinaryOp::Mod);
    let offset = bin(modulo, &bin(idiv, &bin(add, &k, &idx(768)), &idx(32)), &idx(24));
    assert_eq!(super::simplify(&offset), k.idiv(idx(32)));
    // The quotient of the constant alone stays beside the rest's: `(k + 96) // 32`.
    assert_eq!(
        super::simplify(&bin(idiv, &bin(add, &k, &idx(96)), &idx(32))),
        bin(add, &k.idiv(idx(32)), &idx(3))
    );
}

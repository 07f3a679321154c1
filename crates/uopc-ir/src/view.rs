//! Typed views of a node's sources: each accessor names the sources of one op, so code reads
//! `store.index` rather than `src()[0]`, and a wrong op is a `None` rather than a wrong operand.

use crate::ids::RangeId;
use crate::ops::{AxisType, BinaryOp, GemmShape, Op, ReduceOp, TileOp, UnaryOp};
use crate::uop::UOp;
use crate::verify::view_base;

/// The sources of a STORE.
#[derive(Clone, Copy, Debug)]
pub struct StoreView<'a> {
    /// The INDEX written through.
    pub index: &'a UOp,
    /// The value written.
    pub value: &'a UOp,
}

/// The sources of an INDEX.
#[derive(Clone, Copy, Debug)]
pub struct IndexView<'a> {
    /// The buffer view addressed: a BUFFER, an ALLOC, or an AFTER of one.
    pub base: &'a UOp,
    /// The element index into the view.
    pub offset: &'a UOp,
}

/// The arguments of a RANGE.
#[derive(Clone, Copy, Debug)]
pub struct RangeView<'a> {
    /// The loop's trip count (an index expression).
    pub end: &'a UOp,
    /// The range's id, unique within a program.
    pub id: RangeId,
    /// How the loop is executed.
    pub axis: AxisType,
}

/// The sources of an END.
#[derive(Clone, Copy, Debug)]
pub struct EndView<'a> {
    /// The effects the loop runs (stores, sinks).
    pub body: &'a UOp,
    /// The RANGE closed.
    pub range: &'a UOp,
}

/// The sources of an AFTER.
#[derive(Clone, Copy, Debug)]
pub struct AfterView<'a> {
    /// The view that is ordered.
    pub base: &'a UOp,
    /// What the view comes after: stores, ENDs, or RANGEs it lives inside.
    pub deps: &'a [UOp],
}

/// The sources of a WHERE.
#[derive(Clone, Copy, Debug)]
pub struct WhereView<'a> {
    /// The condition.
    pub cond: &'a UOp,
    /// The value where the condition holds.
    pub then: &'a UOp,
    /// The value where it does not.
    pub otherwise: &'a UOp,
}

/// The sources of a tensor-level REDUCE.
#[derive(Clone, Copy, Debug)]
pub struct ReduceView<'a> {
    /// How elements are combined.
    pub op: ReduceOp,
    /// How many trailing axes of `input` are reduced.
    pub axes: usize,
    /// The tensor reduced.
    pub input: &'a UOp,
    /// The rescaling sources of an online sum, `None` for a plain reduction.
    pub online: Option<OnlineSources<'a>>,
}

/// The three extra sources of a REDUCE marked as an online sum: they tell rangeify how to
/// rescale the accumulator as a running maximum grows (see uopc-tensor's `online` module).
#[derive(Clone, Copy, Debug)]
pub struct OnlineSources<'a> {
    /// The maximum whose running value the accumulator follows.
    pub max: &'a UOp,
    /// `g(max)`, the node the summand's exponent subtracts.
    pub shift: &'a UOp,
    /// `k` of the summand's `exp2(k * (t - g(max)))`.
    pub scale: &'a UOp,
}

/// The sources of a TILE GEMM, `C (+)= A * B`.
#[derive(Clone, Copy, Debug)]
pub struct GemmView<'a> {
    /// The shapes, strides and transposition flags.
    pub shape: GemmShape,
    /// The INDEX of A's first element.
    pub a: &'a UOp,
    /// The INDEX of B's first element.
    pub b: &'a UOp,
    /// The INDEX of C's first element.
    pub c: &'a UOp,
}

impl UOp {
    /// The index and value of a STORE; `None` for any other op.
    pub fn as_store(&self) -> Option<StoreView<'_>> {
        match (self.op(), self.src()) {
            (Op::Store, [index, value]) => Some(StoreView { index, value }),
            _ => None,
        }
    }

    /// The INDEX a LOAD reads; `None` for any other op.
    pub fn as_load(&self) -> Option<&UOp> {
        match (self.op(), self.src()) {
            (Op::Load, [index]) => Some(index),
            _ => None,
        }
    }

    /// The INDEX a LOAD reads or a STORE writes; `None` for any other op.
    pub fn memory_index(&self) -> Option<&UOp> {
        self.as_load().or(self.as_store().map(|s| s.index))
    }

    /// The base view and element index of an INDEX; `None` for any other op.
    pub fn as_index(&self) -> Option<IndexView<'_>> {
        match (self.op(), self.src()) {
            (Op::Index, [base, offset]) => Some(IndexView { base, offset }),
            _ => None,
        }
    }

    /// The end, id and axis of a RANGE; `None` for any other op.
    pub fn as_range(&self) -> Option<RangeView<'_>> {
        match (self.op(), self.src()) {
            (&Op::Range { id, axis }, [end]) => Some(RangeView { end, id, axis }),
            _ => None,
        }
    }

    /// The body and range of an END; `None` for any other op.
    pub fn as_end(&self) -> Option<EndView<'_>> {
        match (self.op(), self.src()) {
            (Op::End, [body, range]) => Some(EndView { body, range }),
            _ => None,
        }
    }

    /// The base view and dependencies of an AFTER; `None` for any other op.
    pub fn as_after(&self) -> Option<AfterView<'_>> {
        match (self.op(), self.src()) {
            (Op::After, [base, deps @ ..]) => Some(AfterView { base, deps }),
            _ => None,
        }
    }

    /// The op and operands of a two-input ALU node; `None` for any other op.
    pub fn as_binary(&self) -> Option<(BinaryOp, &UOp, &UOp)> {
        match (self.op(), self.src()) {
            (&Op::Binary(op), [a, b]) => Some((op, a, b)),
            _ => None,
        }
    }

    /// The op and operand of a one-input ALU node; `None` for any other op.
    pub fn as_unary(&self) -> Option<(UnaryOp, &UOp)> {
        match (self.op(), self.src()) {
            (&Op::Unary(op), [a]) => Some((op, a)),
            _ => None,
        }
    }

    /// The condition and the two values of a WHERE; `None` for any other op.
    pub fn as_where(&self) -> Option<WhereView<'_>> {
        match (self.op(), self.src()) {
            (Op::Where, [cond, then, otherwise]) => Some(WhereView { cond, then, otherwise }),
            _ => None,
        }
    }

    /// The operand a CAST converts; `None` for any other op.
    pub fn as_cast(&self) -> Option<&UOp> {
        match (self.op(), self.src()) {
            (Op::Cast, [x]) => Some(x),
            _ => None,
        }
    }

    /// The BUFFER or ALLOC an INDEX addresses, through AFTER chains; `None` for any other op
    /// or a base that is neither.
    pub fn indexed_base(&self) -> Option<&UOp> {
        self.as_index().and_then(|i| view_base(i.base))
    }

    /// The shape and operand INDEX nodes of a TILE GEMM; `None` for any other op.
    pub fn as_gemm(&self) -> Option<GemmView<'_>> {
        match (self.op(), self.src()) {
            (&Op::Tile(TileOp::Gemm(shape)), [a, b, c]) => Some(GemmView { shape, a, b, c }),
            _ => None,
        }
    }

    /// The op, reduced axis count, input and (for an online sum) rescaling sources of a REDUCE;
    /// `None` for any other op or a REDUCE with neither one nor four sources.
    pub fn as_reduce(&self) -> Option<ReduceView<'_>> {
        let &Op::Reduce { op, axes } = self.op() else { return None };
        match self.src() {
            [input] => Some(ReduceView { op, axes, input, online: None }),
            [input, max, shift, scale] => {
                Some(ReduceView { op, axes, input, online: Some(OnlineSources { max, shift, scale }) })
            }
            _ => None,
        }
    }

    /// The tensor a movement op (RESHAPE, EXPAND, PERMUTE, SHRINK) views; `None` for any
    /// other op, so a walk down a chain of views stops at the first node that computes.
    pub fn as_movement(&self) -> Option<&UOp> {
        match (self.op(), self.src()) {
            (Op::Reshape(_) | Op::Expand(_) | Op::Permute(_) | Op::Shrink(_), [x]) => Some(x),
            _ => None,
        }
    }

    /// The tensor an EXPAND broadcasts; `None` for any other op.
    pub fn as_expand(&self) -> Option<&UOp> {
        match (self.op(), self.src()) {
            (Op::Expand(_), [x]) => Some(x),
            _ => None,
        }
    }

    /// The tensor a STAGE marks for materializing; `None` for any other op.
    pub fn as_stage(&self) -> Option<&UOp> {
        match (self.op(), self.src()) {
            (Op::Stage, [x]) => Some(x),
            _ => None,
        }
    }

    /// The value of a GRADIENT_RULE (its `src[0]`); `None` for any other op.
    pub fn as_gradient_rule_value(&self) -> Option<&UOp> {
        match (self.op(), self.src()) {
            (Op::GradientRule(_), [value, _]) => Some(value),
            _ => None,
        }
    }

    /// The tensor a DETACH stops gradients at; `None` for any other op.
    pub fn as_detach(&self) -> Option<&UOp> {
        match (self.op(), self.src()) {
            (Op::Detach, [x]) => Some(x),
            _ => None,
        }
    }

    /// A STAGE's source, or the node itself when it is no STAGE: the value either way, for
    /// code that treats a staged tensor like the tensor it stages.
    pub fn unstaged(&self) -> &UOp {
        self.as_stage().unwrap_or(self)
    }

    /// The operation of a TILE and its operand INDEX nodes (in [`TileOp::operands`] order);
    /// `None` for any other op.
    pub fn as_tile(&self) -> Option<(TileOp, &[UOp])> {
        match self.op() {
            &Op::Tile(op) => Some((op, self.src())),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::builder::{alloc, buffer, range};
    use crate::dtype::DType;
    use crate::ops::{AxisType, BinaryOp, UnaryOp};
    use crate::uop::UOp;

    fn program() -> (UOp, UOp, UOp, UOp) {
        let r = range(8, 3, AxisType::Loop);
        let a = buffer(0, DType::F32, 8);
        let index = a.index(&r);
        let store = index.store(index.load());
        (r, a, index, store)
    }

    #[test]
    fn store_and_load_name_their_sources() {
        let (_, _, index, store) = program();
        let s = store.as_store().expect("a STORE");
        assert_eq!(s.index, &index);
        assert_eq!(s.value.as_load(), Some(&index));
        assert!(index.as_store().is_none());
        assert!(store.as_load().is_none());
        assert_eq!(store.memory_index(), Some(&index));
        assert_eq!(s.value.memory_index(), Some(&index));
        assert_eq!(index.memory_index(), None);
    }

    #[test]
    fn index_names_base_and_offset() {
        let (r, a, index, store) = program();
        let i = index.as_index().expect("an INDEX");
        assert_eq!((i.base, i.offset), (&a, &r));
        assert!(store.as_index().is_none());
        assert_eq!(index.indexed_base(), Some(&a));
        let acc = alloc(1, DType::F32, 1);
        assert_eq!(acc.after(std::slice::from_ref(&store)).index(0).indexed_base(), Some(&acc));
        assert_eq!(a.indexed_base(), None);
    }

    #[test]
    fn range_names_end_id_and_axis() {
        let (r, a, _, _) = program();
        let v = r.as_range().expect("a RANGE");
        assert_eq!((v.end.const_int(), v.id.index(), v.axis), (Some(8), 3, AxisType::Loop));
        assert!(a.as_range().is_none());
    }

    #[test]
    fn end_and_after_name_their_sources() {
        let (r, _, _, store) = program();
        let end = store.end(std::slice::from_ref(&r));
        let e = end.as_end().expect("an END");
        assert_eq!((e.body, e.range), (&store, &r));
        let acc = alloc(0, DType::F32, 1);
        let after = acc.after(&[end.clone()]);
        let v = after.as_after().expect("an AFTER");
        assert_eq!(v.base, &acc);
        assert_eq!(v.deps, std::slice::from_ref(&end));
        assert!(store.as_end().is_none());
        assert!(end.as_after().is_none());
    }

    #[test]
    fn alu_views_give_op_and_operands() {
        let (r, _, index, _) = program();
        let x = index.load();
        let sum = x.binary(BinaryOp::Add, x.clone());
        assert_eq!(
            sum.as_binary().map(|(op, a, b)| (op, a.clone(), b.clone())),
            Some((BinaryOp::Add, x.clone(), x.clone()))
        );
        let root = x.sqrt();
        assert_eq!(root.as_unary().map(|(op, a)| (op, a.clone())), Some((UnaryOp::Sqrt, x.clone())));
        let cond = r.lt(4);
        let w = cond.where_(&x, &sum);
        let v = w.as_where().expect("a WHERE");
        assert_eq!((v.cond, v.then, v.otherwise), (&cond, &x, &sum));
        let c = r.cast(DType::F32);
        assert_eq!(c.as_cast(), Some(&r));
        assert!(x.as_binary().is_none() && sum.as_unary().is_none());
        assert!(sum.as_where().is_none() && x.as_cast().is_none() && x.as_tile().is_none());
        assert!(x.as_gemm().is_none());
    }

    #[test]
    fn gemm_names_its_operands() {
        use crate::builder::tile;
        use crate::ops::{GemmShape, TileOp};
        let (a, b, c) = (buffer(0, DType::F32, 6), buffer(1, DType::F32, 6), buffer(2, DType::F32, 4));
        let (ia, ib, ic) = (a.index(0), b.index(0), c.index(0));
        let shape = GemmShape {
            m: 2,
            n: 2,
            k: 3,
            lda: 3,
            ldb: 2,
            ldc: 2,
            a_trans: false,
            b_trans: false,
            accumulate: false,
            b_panel_width: 0,
            b_pair_panels: false,
            parallel: false,
        };
        let gemm = tile(TileOp::Gemm(shape), &[ia.clone(), ib.clone(), ic.clone()]);
        let g = gemm.as_gemm().expect("a GEMM");
        assert_eq!((g.shape, g.a, g.b, g.c), (shape, &ia, &ib, &ic));
        let short = tile(TileOp::Gemm(shape), &[ia.clone(), ib.clone()]);
        assert!(short.as_gemm().is_none() && ia.as_gemm().is_none());
    }

    #[test]
    fn tensor_level_views_name_their_sources() {
        use crate::ops::{Op, ReduceOp};
        let x = UOp::new(Op::Param { slot: 0, shape: vec![2, 3] }, DType::F32, vec![]);
        let node = |op: Op, src: Vec<UOp>| UOp::new(op, DType::F32, src);
        let sum = node(Op::Reduce { op: ReduceOp::Add, axes: 1 }, vec![x.clone()]);
        let r = sum.as_reduce().expect("a REDUCE");
        assert_eq!((r.op, r.axes, r.input), (ReduceOp::Add, 1, &x));
        assert!(r.online.is_none());
        let max = node(Op::Reduce { op: ReduceOp::Max, axes: 1 }, vec![x.clone()]);
        let scale = UOp::new(Op::Const(crate::ConstValue::float(1.0)), DType::F32, vec![]);
        let online = node(
            Op::Reduce { op: ReduceOp::Add, axes: 1 },
            vec![x.clone(), max.clone(), max.clone(), scale.clone()],
        );
        let o = online.as_reduce().and_then(|r| r.online).expect("an online sum");
        assert_eq!((o.max, o.shift, o.scale), (&max, &max, &scale));
        let two = node(Op::Reduce { op: ReduceOp::Add, axes: 1 }, vec![x.clone(), max.clone()]);
        assert!(two.as_reduce().is_none() && x.as_reduce().is_none());

        let reshaped = node(Op::Reshape(vec![6]), vec![x.clone()]);
        let expanded = node(Op::Expand(vec![4, 2, 3]), vec![x.clone()]);
        let permuted = node(Op::Permute(vec![1, 0]), vec![x.clone()]);
        let shrunk = node(Op::Shrink(vec![(0, 1), (0, 3)]), vec![x.clone()]);
        for view in [&reshaped, &expanded, &permuted, &shrunk] {
            assert_eq!(view.as_movement(), Some(&x));
        }
        assert_eq!(expanded.as_expand(), Some(&x));
        assert!(reshaped.as_expand().is_none() && sum.as_movement().is_none());

        let staged = node(Op::Stage, vec![sum.clone()]);
        let detached = node(Op::Detach, vec![x.clone()]);
        assert_eq!(staged.as_stage(), Some(&sum));
        assert_eq!(detached.as_detach(), Some(&x));
        assert!(detached.as_stage().is_none() && staged.as_detach().is_none());
        assert_eq!(staged.unstaged(), &sum);
        assert_eq!(sum.unstaged(), &sum);
    }
}

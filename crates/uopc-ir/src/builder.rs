//! Builders that make loop programs read like the math: `range`, `after`, `index`, `load`,
//! `store`, `end`, `sink`, and arithmetic operators.
//!
//! Builders never panic on ill-typed input: they build the node, and [`crate::verify`] rejects
//! it with an error naming it.

use crate::dtype::DType;
use crate::ids::{AllocSlot, BufferSlot, RangeId, VarSlot};
use crate::uop::{AxisType, BinaryOp, ConstValue, Op, TileOp, UOp, UnaryOp};
use std::ops;

/// A constant of `dtype` from an f64 (integers truncate, bools are `v != 0`).
#[must_use]
pub fn const_of(v: f64, dtype: DType) -> UOp {
    UOp::new(Op::Const(ConstValue::float(v).cast(dtype)), dtype, vec![])
}

/// An index (i64) constant.
#[must_use]
pub fn idx(v: i64) -> UOp {
    UOp::new(Op::Const(ConstValue::Int(v)), DType::INDEX, vec![])
}

/// An f32 constant.
#[must_use]
pub fn f32c(v: f32) -> UOp {
    UOp::new(Op::Const(ConstValue::float(v as f64)), DType::F32, vec![])
}

/// A bool constant.
#[must_use]
pub fn boolc(v: bool) -> UOp {
    UOp::new(Op::Const(ConstValue::Bool(v)), DType::Bool, vec![])
}

/// A kernel parameter buffer of `len` elements of `dtype`, passed as argument `slot`.
///
/// Slots are the kernel's argument positions, so a program's buffers use slots `0..n`.
///
/// # Examples
///
/// `out[k] = 2 * a[k]`, run by the interpreter:
///
/// ```rust
/// use uopc_ir::interp::{Precision, run};
/// use uopc_ir::{AxisType, DType, HostBuffer, buffer, range, sink};
///
/// let a = buffer(0, DType::F32, 3);
/// let out = buffer(1, DType::F32, 3);
/// let k = range(3, 0, AxisType::Loop);
/// let program = sink(&[out.index(&k).store(a.index(&k).load() * 2.0f32).end(&[k])]);
///
/// let mut bufs = [HostBuffer::F32(vec![1.0, -2.0, 0.5]), HostBuffer::zeros(DType::F32, 3)];
/// run(&program, &mut bufs, Precision::Native)?;
/// assert_eq!(bufs[1], HostBuffer::F32(vec![2.0, -4.0, 1.0]));
/// # Ok::<(), uopc_ir::interp::InterpError>(())
/// ```
#[must_use]
pub fn buffer(slot: impl Into<BufferSlot>, dtype: DType, len: usize) -> UOp {
    UOp::new(Op::Buffer { slot: slot.into(), len }, dtype, vec![])
}

/// Kernel-local storage of `len` elements; `slot` distinguishes allocations.
///
/// # Examples
///
/// A one-element accumulator summing `a` (the ALLOC is written before the loop and read
/// after it; `after` orders each access behind the stores it must see):
///
/// ```rust
/// use uopc_ir::interp::{Precision, run};
/// use uopc_ir::{AxisType, DType, HostBuffer, alloc, buffer, range, sink};
///
/// let a = buffer(0, DType::F32, 4);
/// let out = buffer(1, DType::F32, 1);
/// let acc = alloc(0, DType::F32, 1);
/// let j = range(4, 0, AxisType::Reduce);
/// let init = acc.index(0).store(0.0f32);
/// let acc_j = acc.after(&[init, j.clone()]);
/// let add = acc_j.index(0).store(acc_j.index(0).load() + a.index(&j).load()).end(&[j]);
/// let program = sink(&[out.index(0).store(acc.after(&[add]).index(0).load())]);
///
/// let mut bufs = [HostBuffer::F32(vec![1.0, 2.0, 3.0, 4.0]), HostBuffer::zeros(DType::F32, 1)];
/// run(&program, &mut bufs, Precision::Native)?;
/// assert_eq!(bufs[1], HostBuffer::F32(vec![10.0]));
/// # Ok::<(), uopc_ir::interp::InterpError>(())
/// ```
#[must_use]
pub fn alloc(slot: impl Into<AllocSlot>, dtype: DType, len: usize) -> UOp {
    UOp::new(Op::Alloc { slot: slot.into(), len }, dtype, vec![])
}

/// A scalar INDEX argument in variable slot `slot`, whose value the caller passes at every run
/// and which is declared to lie in `lo..=hi` (see [`Op::Var`]).
///
/// Use it as a RANGE end (or anywhere in an index expression) where a size changes from call
/// to call: the program is compiled once, and the verifier proves every access in bounds for
/// every value in `lo..=hi`. Variable slots, like buffer slots, are argument positions: a
/// program's variables use slots `0..n`.
///
/// # Examples
///
/// `out[0] = sum of the first L elements of a`, for any L in `0..=8`, run by the interpreter
/// at L = 3:
///
/// ```rust
/// use uopc_ir::interp::{Precision, run_with_vars};
/// use uopc_ir::{AxisType, DType, HostBuffer, alloc, buffer, range, sink, var};
///
/// let (a, out, acc) = (buffer(0, DType::F32, 8), buffer(1, DType::F32, 1), alloc(0, DType::F32, 1));
/// let j = range(var(0, 0, 8), 0, AxisType::Reduce);
/// let init = acc.index(0).store(0.0f32);
/// let acc_j = acc.after(&[init.clone(), j.clone()]);
/// let add = acc_j.index(0).store(acc_j.index(0).load() + a.index(&j).load()).end(&[j]);
/// let program = sink(&[out.index(0).store(acc.after(&[init, add]).index(0).load())]);
///
/// let mut bufs = [HostBuffer::F32((1..=8).map(|x| x as f32).collect()), HostBuffer::zeros(DType::F32, 1)];
/// run_with_vars(&program, &mut bufs, &[3], Precision::Native)?;
/// assert_eq!(bufs[1], HostBuffer::F32(vec![6.0]));
/// // 9 is outside the declared 0..=8: an error, and nothing runs.
/// assert!(run_with_vars(&program, &mut bufs, &[9], Precision::Native).is_err());
/// # Ok::<(), uopc_ir::interp::InterpError>(())
/// ```
#[must_use]
pub fn var(slot: impl Into<VarSlot>, lo: i64, hi: i64) -> UOp {
    UOp::new(Op::Var { slot: slot.into(), lo, hi }, DType::INDEX, vec![])
}

/// A loop variable `0..end` with a program-unique `id`. Loops nest in `id` order where they nest.
///
/// Two calls with the same `end`, `id` and `axis` return the same node (hash-consing), so a
/// repeated id is one loop, not two; [`ProgramBuilder::range`] hands out ids so that cannot
/// happen by accident.
///
/// # Examples
///
/// A 2 x 3 loop nest writing `out[i * 3 + j] = i * 3 + j`:
///
/// ```rust
/// use uopc_ir::interp::{Precision, run};
/// use uopc_ir::{AxisType, DType, HostBuffer, buffer, range, sink};
///
/// let out = buffer(0, DType::I64, 6);
/// let i = range(2, 0, AxisType::Loop);
/// let j = range(3, 1, AxisType::Loop);
/// let flat = &i * 3 + &j;
/// let program = sink(&[out.index(&flat).store(&flat).end(&[j, i])]);
///
/// let mut bufs = [HostBuffer::zeros(DType::I64, 6)];
/// run(&program, &mut bufs, Precision::Native)?;
/// assert_eq!(bufs[0], HostBuffer::I64(vec![0, 1, 2, 3, 4, 5]));
/// assert_eq!(range(2, 0, AxisType::Loop), range(2, 0, AxisType::Loop));
/// # Ok::<(), uopc_ir::interp::InterpError>(())
/// ```
#[must_use]
pub fn range(end: impl IntoIndex, id: impl Into<RangeId>, axis: AxisType) -> UOp {
    UOp::new(Op::Range { id: id.into(), axis }, DType::INDEX, vec![end.into_index()])
}

/// Groups effects (stores, ENDs) into one node.
///
/// A program is the SINK of everything it writes: effects not reachable from it do not run.
///
/// # Examples
///
/// Two independent loops in one program:
///
/// ```rust
/// use uopc_ir::interp::{Precision, run};
/// use uopc_ir::{AxisType, DType, HostBuffer, ProgramBuilder, buffer, sink};
///
/// let mut b = ProgramBuilder::new();
/// let (x, y) = (buffer(0, DType::F32, 2), buffer(1, DType::F32, 3));
/// let i = b.range(2, AxisType::Loop);
/// let j = b.range(3, AxisType::Loop);
/// let program = sink(&[x.index(&i).store(1.0f32).end(&[i]), y.index(&j).store(-1.0f32).end(&[j])]);
///
/// let mut bufs = [HostBuffer::zeros(DType::F32, 2), HostBuffer::zeros(DType::F32, 3)];
/// run(&program, &mut bufs, Precision::Native)?;
/// assert_eq!(bufs[0], HostBuffer::F32(vec![1.0; 2]));
/// assert_eq!(bufs[1], HostBuffer::F32(vec![-1.0; 3]));
/// # Ok::<(), uopc_ir::interp::InterpError>(())
/// ```
#[must_use]
pub fn sink(effects: &[UOp]) -> UOp {
    UOp::new(Op::Sink, DType::Bool, effects.to_vec())
}

/// A tile operation on the operands `operands` (INDEX nodes, each the first element of one
/// operand, in [`TileOp`]'s source order): an effect, like a STORE.
#[must_use]
pub fn tile(op: TileOp, operands: &[UOp]) -> UOp {
    UOp::new(Op::Tile(op), DType::Bool, operands.to_vec())
}

/// Things usable as an index expression: UOps and integer literals.
pub trait IntoIndex {
    /// The value as an index-typed UOp.
    fn into_index(self) -> UOp;
}
impl IntoIndex for UOp {
    fn into_index(self) -> UOp {
        self
    }
}
impl IntoIndex for &UOp {
    fn into_index(self) -> UOp {
        self.clone()
    }
}
impl IntoIndex for usize {
    fn into_index(self) -> UOp {
        idx(self as i64)
    }
}
impl IntoIndex for i64 {
    fn into_index(self) -> UOp {
        idx(self)
    }
}
impl IntoIndex for i32 {
    fn into_index(self) -> UOp {
        idx(self as i64)
    }
}

impl UOp {
    /// A constant of this node's dtype.
    #[must_use]
    pub fn const_like(&self, v: f64) -> UOp {
        const_of(v, self.dtype())
    }

    /// This view ordered after `deps` (stores, ENDs) and living inside any RANGEs among them.
    #[must_use]
    pub fn after(&self, deps: &[UOp]) -> UOp {
        let mut src = vec![self.clone()];
        src.extend(deps.iter().cloned());
        UOp::new(Op::After, self.dtype(), src)
    }

    /// The address of element `i` of this buffer view.
    #[must_use]
    pub fn index(&self, i: impl IntoIndex) -> UOp {
        UOp::new(Op::Index, self.dtype(), vec![self.clone(), i.into_index()])
    }

    /// Reads this INDEX.
    #[must_use]
    pub fn load(&self) -> UOp {
        UOp::new(Op::Load, self.dtype(), vec![self.clone()])
    }

    /// Writes `value` to this INDEX.
    #[must_use]
    pub fn store(&self, value: impl Into<UOpOrConst>) -> UOp {
        let v = value.into().resolve(self.dtype());
        UOp::new(Op::Store, DType::Bool, vec![self.clone(), v])
    }

    /// Closes `ranges`, innermost first: `x.end(&[d, i])` is `END(END(x, d), i)`.
    #[must_use]
    pub fn end(&self, ranges: &[UOp]) -> UOp {
        ranges.iter().fold(self.clone(), |x, r| UOp::new(Op::End, DType::Bool, vec![x, r.clone()]))
    }

    fn unary(&self, op: UnaryOp) -> UOp {
        UOp::new(Op::Unary(op), self.dtype(), vec![self.clone()])
    }

    /// A binary ALU node; a literal right operand takes this node's dtype.
    #[must_use]
    pub fn binary(&self, op: BinaryOp, rhs: impl Into<UOpOrConst>) -> UOp {
        let r = rhs.into().resolve(self.dtype());
        let dtype = if matches!(op, BinaryOp::CmpLt | BinaryOp::CmpNe) { DType::Bool } else { self.dtype() };
        UOp::new(Op::Binary(op), dtype, vec![self.clone(), r])
    }

    /// `2^self`.
    #[must_use]
    pub fn exp2(&self) -> UOp {
        self.unary(UnaryOp::Exp2)
    }
    /// `log2(self)`.
    #[must_use]
    pub fn log2(&self) -> UOp {
        self.unary(UnaryOp::Log2)
    }
    /// `sqrt(self)`.
    #[must_use]
    pub fn sqrt(&self) -> UOp {
        self.unary(UnaryOp::Sqrt)
    }
    /// `1 / self`.
    #[must_use]
    pub fn recip(&self) -> UOp {
        self.unary(UnaryOp::Recip)
    }
    /// `max(self, rhs)` as `self > rhs ? self : rhs`.
    #[must_use]
    pub fn maximum(&self, rhs: impl Into<UOpOrConst>) -> UOp {
        self.binary(BinaryOp::Max, rhs)
    }
    /// `self < rhs` (Bool).
    #[must_use]
    pub fn lt(&self, rhs: impl Into<UOpOrConst>) -> UOp {
        self.binary(BinaryOp::CmpLt, rhs)
    }
    /// `self != rhs` (Bool).
    #[must_use]
    pub fn ne(&self, rhs: impl Into<UOpOrConst>) -> UOp {
        self.binary(BinaryOp::CmpNe, rhs)
    }
    /// Integer division truncating toward zero.
    #[must_use]
    pub fn idiv(&self, rhs: impl Into<UOpOrConst>) -> UOp {
        self.binary(BinaryOp::IDiv, rhs)
    }
    /// Integer remainder with the sign of the dividend.
    #[must_use]
    pub fn modulo(&self, rhs: impl Into<UOpOrConst>) -> UOp {
        self.binary(BinaryOp::Mod, rhs)
    }
    /// `self ? a : b` for a Bool `self`.
    #[must_use]
    pub fn where_(&self, a: impl Into<UOpOrConst>, b: impl Into<UOpOrConst>) -> UOp {
        let (a, b) = match (a.into(), b.into()) {
            (UOpOrConst::U(a), b) => {
                let d = a.dtype();
                (a, b.resolve(d))
            }
            (a, UOpOrConst::U(b)) => {
                let d = b.dtype();
                (a.resolve(d), b)
            }
            (a, b) => (a.resolve(DType::F32), b.resolve(DType::F32)),
        };
        UOp::new(Op::Where, a.dtype(), vec![self.clone(), a, b])
    }
    /// This value converted to `dtype`.
    #[must_use]
    pub fn cast(&self, dtype: DType) -> UOp {
        if dtype == self.dtype() {
            return self.clone();
        }
        UOp::new(Op::Cast, dtype, vec![self.clone()])
    }
}

/// A UOp or a literal whose dtype is taken from the other operand.
pub enum UOpOrConst {
    /// A node.
    U(UOp),
    /// A literal.
    C(f64),
}

impl UOpOrConst {
    fn resolve(self, dtype: DType) -> UOp {
        match self {
            UOpOrConst::U(u) => u,
            UOpOrConst::C(v) => const_of(v, dtype),
        }
    }
}

impl From<UOp> for UOpOrConst {
    fn from(u: UOp) -> Self {
        UOpOrConst::U(u)
    }
}
impl From<&UOp> for UOpOrConst {
    fn from(u: &UOp) -> Self {
        UOpOrConst::U(u.clone())
    }
}
macro_rules! literal_operand {
    ($($t:ty),*) => {$(
        impl From<$t> for UOpOrConst {
            fn from(v: $t) -> Self { UOpOrConst::C(v as f64) }
        }
    )*};
}
literal_operand!(f32, f64, i32, i64, usize);

macro_rules! binary_operator {
    ($trait:ident, $method:ident, $op:expr) => {
        impl<R: Into<UOpOrConst>> ops::$trait<R> for UOp {
            type Output = UOp;
            fn $method(self, rhs: R) -> UOp {
                self.binary($op, rhs)
            }
        }
        impl<R: Into<UOpOrConst>> ops::$trait<R> for &UOp {
            type Output = UOp;
            fn $method(self, rhs: R) -> UOp {
                self.binary($op, rhs)
            }
        }
    };
}
binary_operator!(Add, add, BinaryOp::Add);
binary_operator!(Sub, sub, BinaryOp::Sub);
binary_operator!(Mul, mul, BinaryOp::Mul);

impl<R: Into<UOpOrConst>> ops::Div<R> for UOp {
    type Output = UOp;
    /// Integer operands divide (truncating); float operands multiply by the reciprocal.
    fn div(self, rhs: R) -> UOp {
        (&self).div(rhs)
    }
}
impl<R: Into<UOpOrConst>> ops::Div<R> for &UOp {
    type Output = UOp;
    fn div(self, rhs: R) -> UOp {
        if self.dtype().is_float() {
            let r = rhs.into().resolve(self.dtype());
            self.binary(BinaryOp::Mul, r.recip())
        } else {
            self.binary(BinaryOp::IDiv, rhs)
        }
    }
}
impl<R: Into<UOpOrConst>> ops::Rem<R> for UOp {
    type Output = UOp;
    fn rem(self, rhs: R) -> UOp {
        self.binary(BinaryOp::Mod, rhs)
    }
}
impl<R: Into<UOpOrConst>> ops::Rem<R> for &UOp {
    type Output = UOp;
    fn rem(self, rhs: R) -> UOp {
        self.binary(BinaryOp::Mod, rhs)
    }
}
impl ops::Neg for UOp {
    type Output = UOp;
    fn neg(self) -> UOp {
        self.unary(UnaryOp::Neg)
    }
}
impl ops::Neg for &UOp {
    type Output = UOp;
    fn neg(self) -> UOp {
        self.unary(UnaryOp::Neg)
    }
}

/// Hands out a program's range ids and alloc slots in creation order.
///
/// Two RANGEs with the same end, axis and id are one hash-consed node, so a repeated id
/// silently merges two loops; numbering them by hand (`6 + 2 * br`) breaks whenever a kernel
/// gains a loop. A builder per program makes every [`ProgramBuilder::range`] a new loop and
/// every [`ProgramBuilder::alloc`] a new allocation. Buffer slots are not handed out: they are
/// the kernel's argument positions, part of its calling contract.
///
/// # Examples
///
/// ```rust
/// use uopc_ir::{AxisType, DType, Op, ProgramBuilder};
///
/// let mut b = ProgramBuilder::new();
/// let rows = b.range(4, AxisType::Loop);
/// let cols = b.range(4, AxisType::Loop);
/// // Same end and axis, yet two loops: the builder gave them ids 0 and 1.
/// assert_ne!(rows, cols);
/// assert!(matches!(cols.op(), Op::Range { id, .. } if id.index() == 1));
/// let acc = b.alloc(DType::F32, 1);
/// assert!(matches!(acc.op(), Op::Alloc { slot, len: 1 } if slot.index() == 0));
/// assert_eq!((b.ranges(), b.allocs()), (2, 1));
/// ```
#[derive(Debug, Default)]
pub struct ProgramBuilder {
    ranges: usize,
    allocs: usize,
}

impl ProgramBuilder {
    /// A builder whose first range id and first alloc slot are 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new loop variable `0..end` on `axis`, with the next unused range id.
    #[must_use]
    pub fn range(&mut self, end: impl IntoIndex, axis: AxisType) -> UOp {
        self.ranges += 1;
        range(end, self.ranges - 1, axis)
    }

    /// New kernel-local storage of `len` elements of `dtype`, in the next unused slot.
    #[must_use]
    pub fn alloc(&mut self, dtype: DType, len: usize) -> UOp {
        self.allocs += 1;
        alloc(self.allocs - 1, dtype, len)
    }

    /// How many ranges were handed out (the next range's id).
    pub fn ranges(&self) -> usize {
        self.ranges
    }

    /// How many allocs were handed out (the next alloc's slot).
    pub fn allocs(&self) -> usize {
        self.allocs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_builder_numbers_ranges_and_allocs_in_creation_order() {
        let mut b = ProgramBuilder::new();
        let r0 = b.range(4, AxisType::Thread);
        let r1 = b.range(4, AxisType::Thread);
        assert!(matches!(r0.op(), Op::Range { id, axis: AxisType::Thread } if id.index() == 0));
        assert!(matches!(r1.op(), Op::Range { id, .. } if id.index() == 1));
        // Same end and axis, yet two loops: the ids keep them apart.
        assert_ne!(r0, r1);
        let a0 = b.alloc(DType::F32, 1);
        let a1 = b.alloc(DType::F32, 1);
        assert!(matches!(a0.op(), Op::Alloc { slot, len: 1 } if slot.index() == 0));
        assert!(matches!(a1.op(), Op::Alloc { slot, len: 1 } if slot.index() == 1));
        assert_eq!((b.ranges(), b.allocs()), (2, 2));
    }
}

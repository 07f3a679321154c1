//! The reference interpreter for the loop IR: the oracle every lowering is tested against.
//!
//! [`run`] verifies a program, checks its arguments, and walks the linearized statement tree with
//! the JIT's semantics (IDIV/MOD rounding, EXP2 at -inf, MAX with NaN, WHERE, CAST). Unlike the
//! JIT it bounds-checks every access and refuses to read ALLOC elements that were never written,
//! so a lowering bug that the verifier misses shows up as an error here rather than as garbage.
//!
//! The interpreter never panics on a program: anything it cannot evaluate is an [`InterpError`].

use crate::alu::{self, Scalar, wrap};
use crate::dtype::DType;
use crate::error::IrError;
use crate::host::HostBuffer;
use crate::linearize::{Linear, Stmt};
use crate::uop::{BinaryOp, ConstValue, Op, UOp, UnaryOp};
use crate::verify::{verify, view_base};
use half::{bf16, f16};
use std::collections::HashMap;

mod tiles;

/// How float arithmetic is carried out.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Precision {
    /// Every value in its own dtype, exactly like the JIT: F32 ops are computed in f32, so each
    /// result is rounded to f32.
    #[default]
    Native,
    /// Every float op in f64: the accuracy reference. Loads from F32 (and BF16, F16) buffers
    /// widen, stores to them narrow (to BF16 and F16 through f32, as their CASTs round), F32
    /// constants keep their f32 value, and F32 ALLOCs (kernel-local registers) hold f64 so
    /// accumulators do not round between iterations. CAST to F32, BF16 or F16 keeps the f64
    /// value.
    F64,
}

/// Why a program could not be run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InterpError {
    /// The program is rejected by [`crate::verify`].
    #[error(transparent)]
    Ir(#[from] IrError),
    /// The number of buffers given differs from the program's BUFFER slots.
    #[error("{}", count_message(*expected, *given))]
    ArgCount {
        /// BUFFER slots in the program.
        expected: usize,
        /// Buffers passed.
        given: usize,
    },
    /// A buffer's element type differs from its BUFFER's.
    #[error("buffer slot {slot}: expected dtype {expected}, given {given}")]
    ArgDType {
        /// The argument position.
        slot: usize,
        /// The BUFFER's dtype.
        expected: DType,
        /// The passed buffer's dtype.
        given: DType,
    },
    /// A buffer's length differs from its BUFFER's.
    #[error("buffer slot {slot}: expected {expected} elements, given {given}")]
    ArgLen {
        /// The argument position.
        slot: usize,
        /// The BUFFER's length.
        expected: usize,
        /// The passed buffer's length.
        given: usize,
    },
    /// The program's BUFFER slots are not `0..n`, so arguments cannot be matched to them.
    #[error("buffer slot {slot}: no BUFFER has this slot, but the program uses slot {highest}")]
    SlotGap {
        /// The first missing slot.
        slot: usize,
        /// The highest slot the program uses.
        highest: usize,
    },
    /// The number of variable values given differs from the program's VAR slots.
    #[error("the program has {expected} variable(s) but {given} value(s) were given")]
    VarCount {
        /// VAR slots in the program.
        expected: usize,
        /// Values passed.
        given: usize,
    },
    /// A variable's value lies outside the bounds its VAR declares (every bounds proof of the
    /// program assumed them).
    #[error("variable {slot}: {given} is outside its declared bounds {lo}..={hi}")]
    VarOutOfBounds {
        /// The variable slot.
        slot: usize,
        /// The declared lower bound.
        lo: i64,
        /// The declared upper bound.
        hi: i64,
        /// The value passed.
        given: i64,
    },
    /// A load or store whose index is outside its buffer at run time.
    #[error("{node}: index {index} is outside {base}, which has {len} elements")]
    OutOfBounds {
        /// The LOAD or STORE, printed short.
        node: String,
        /// The BUFFER or ALLOC accessed, printed short.
        base: String,
        /// The offending index.
        index: i64,
        /// The storage's length.
        len: usize,
    },
    /// A load of an ALLOC element that no store has written during this run.
    #[error("{node}: reads element {index} of {base}, which no store has written")]
    Uninitialized {
        /// The LOAD, printed short.
        node: String,
        /// The ALLOC, printed short.
        base: String,
        /// The element read.
        index: i64,
    },
    /// A program the verifier accepts but that cannot be evaluated (e.g. an ALU op whose operand
    /// is a STORE or a BUFFER, or an oversized ALLOC).
    #[error("{node}: {reason}")]
    Malformed {
        /// The offending node, printed short.
        node: String,
        /// What is wrong, in words.
        reason: String,
    },
}

fn count_message(expected: usize, given: usize) -> String {
    // Name the first slot that is unmatched, whichever side is short.
    let detail = if given < expected {
        format!("buffer slot {given} is missing")
    } else {
        format!("buffer slot {expected} is not a BUFFER of the program")
    };
    format!("the program has {expected} buffer slot(s) but {given} buffer(s) were given: {detail}")
}

fn malformed(u: &UOp, reason: impl Into<String>) -> InterpError {
    InterpError::Malformed { node: u.short(), reason: reason.into() }
}

/// Total bytes of ALLOC storage the interpreter will create; larger requests are surely
/// malformed (the JIT keeps ALLOCs in registers and on the stack) and would abort on OOM.
const MAX_ALLOC_BYTES: usize = 1 << 30;

/// Runs `program` once over `bufs` (argument `k` is BUFFER slot `k`).
///
/// The program is verified first; every argument must have exactly its BUFFER's dtype and
/// length. THREAD ranges run sequentially. On a run-time error (out-of-bounds access, read of an
/// unwritten ALLOC element) the buffers may have been partly written.
///
/// # Errors
///
/// [`InterpError::Ir`] when [`verify`] rejects the program; [`InterpError::VarCount`] when it
/// has variables (run it with [`run_with_vars`]); [`InterpError::ArgCount`],
/// [`InterpError::ArgDType`], [`InterpError::ArgLen`] or [`InterpError::SlotGap`] when `bufs`
/// does not match its BUFFERs; [`InterpError::OutOfBounds`], [`InterpError::Uninitialized`] or
/// [`InterpError::Malformed`] for what only shows while running.
///
/// # Examples
///
/// `out[i] = a[i] < 0 ? 0 : a[i]`, then the same program given a buffer too short:
///
/// ```rust
/// use uopc_ir::interp::{InterpError, Precision, run};
/// use uopc_ir::{AxisType, DType, HostBuffer, buffer, range, sink};
///
/// let (a, out) = (buffer(0, DType::F32, 3), buffer(1, DType::F32, 3));
/// let i = range(3, 0, AxisType::Thread);
/// let x = a.index(&i).load();
/// let program = sink(&[out.index(&i).store(x.lt(0.0f32).where_(0.0f32, &x)).end(&[i])]);
///
/// let mut bufs = [HostBuffer::F32(vec![-1.0, 2.0, -3.0]), HostBuffer::zeros(DType::F32, 3)];
/// run(&program, &mut bufs, Precision::Native)?;
/// assert_eq!(bufs[1], HostBuffer::F32(vec![0.0, 2.0, 0.0]));
///
/// let mut short = [HostBuffer::zeros(DType::F32, 3), HostBuffer::zeros(DType::F32, 2)];
/// let err = run(&program, &mut short, Precision::Native).unwrap_err();
/// assert!(matches!(err, InterpError::ArgLen { slot: 1, expected: 3, given: 2 }));
/// # Ok::<(), InterpError>(())
/// ```
pub fn run(program: &UOp, bufs: &mut [HostBuffer], precision: Precision) -> Result<(), InterpError> {
    run_with_vars(program, bufs, &[], precision)
}

/// [`run`] for a program with variables ([`crate::var`]): `vars[k]` is the value of variable
/// slot `k`, one per slot, each inside its VAR's declared `lo..=hi`.
///
/// Values are checked before anything runs, so a value outside the bounds the verifier's
/// proofs assumed is an error, never an out-of-bounds access.
///
/// # Errors
///
/// As [`run`]; also [`InterpError::VarCount`] when `vars` does not have one value per
/// variable slot, and [`InterpError::VarOutOfBounds`] for a value outside its bounds.
pub fn run_with_vars(
    program: &UOp,
    bufs: &mut [HostBuffer],
    vars: &[i64],
    precision: Precision,
) -> Result<(), InterpError> {
    let linear = verify(program)?;
    check_args(&linear, bufs)?;
    check_vars(&linear, vars)?;
    let mut m = Machine::new(&linear, bufs, vars, precision)?;
    m.walk(&linear.root)
}

/// `vars` holds one in-bounds value per VAR slot (the verifier made the slots `0..n`).
fn check_vars(linear: &Linear, vars: &[i64]) -> Result<(), InterpError> {
    if vars.len() != linear.vars.len() {
        return Err(InterpError::VarCount { expected: linear.vars.len(), given: vars.len() });
    }
    for v in &linear.vars {
        let Op::Var { slot, lo, hi } = *v.op() else {
            return Err(malformed(v, "listed as a VAR but is not one"));
        };
        let given =
            *vars.get(slot.index()).ok_or_else(|| malformed(v, "variable slot beyond the values given"))?;
        if !(lo..=hi).contains(&given) {
            return Err(InterpError::VarOutOfBounds { slot: slot.index(), lo, hi, given });
        }
    }
    Ok(())
}

fn check_args(linear: &Linear, bufs: &[HostBuffer]) -> Result<(), InterpError> {
    // `Linear::buffers` is sorted by slot and the verifier rejects duplicate slots, so slot k
    // is missing exactly when position k holds another slot.
    let mut lens = Vec::with_capacity(linear.buffers.len());
    for (k, b) in linear.buffers.iter().enumerate() {
        match b.op() {
            Op::Buffer { slot, len } if slot.index() == k => lens.push(*len),
            Op::Buffer { slot, .. } => {
                let highest = match linear.buffers.last().map(UOp::op) {
                    Some(Op::Buffer { slot, .. }) => slot.index(),
                    _ => slot.index(),
                };
                return Err(InterpError::SlotGap { slot: k, highest });
            }
            _ => return Err(malformed(b, "listed as a BUFFER but is not one")),
        }
    }
    if bufs.len() != linear.buffers.len() {
        return Err(InterpError::ArgCount { expected: linear.buffers.len(), given: bufs.len() });
    }
    for (slot, ((b, len), given)) in linear.buffers.iter().zip(lens).zip(bufs).enumerate() {
        if given.dtype() != b.dtype() {
            return Err(InterpError::ArgDType { slot, expected: b.dtype(), given: given.dtype() });
        }
        if given.len() != len {
            return Err(InterpError::ArgLen { slot, expected: len, given: given.len() });
        }
    }
    Ok(())
}

/// Where an INDEX points: an argument buffer (by slot) or an ALLOC (by position in
/// `Linear::allocs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mem {
    Buffer(usize),
    Alloc(usize),
}

/// A runtime value. Integers of both widths are held as i64, I32 ones already wrapped.
#[derive(Clone, Copy, Debug)]
enum Val {
    /// Effects and structure (STORE, END, AFTER, SINK) evaluate to nothing.
    Unit,
    Bool(bool),
    Int(i64),
    F32(f32),
    F64(f64),
    /// An INDEX: storage and element index (bounds-checked when accessed).
    Addr(Mem, i64),
}

struct Machine<'a> {
    bufs: &'a mut [HostBuffer],
    buffer_nodes: &'a [UOp],
    allocs: Vec<HostBuffer>,
    written: Vec<Vec<bool>>,
    alloc_nodes: &'a [UOp],
    /// Variable values by slot (checked against their bounds).
    vars: &'a [i64],
    /// ALLOC node id -> position in `allocs`.
    alloc_index: HashMap<u64, usize>,
    /// Node id -> value. Ids are identities (UOps are interned), and unlike `UOp` keys they
    /// carry no interior-mutable caches.
    env: HashMap<u64, Val>,
    precision: Precision,
}

impl<'a> Machine<'a> {
    fn new(
        linear: &'a Linear,
        bufs: &'a mut [HostBuffer],
        vars: &'a [i64],
        precision: Precision,
    ) -> Result<Self, InterpError> {
        let mut allocs = Vec::with_capacity(linear.allocs.len());
        let mut written = Vec::with_capacity(linear.allocs.len());
        let mut alloc_index = HashMap::new();
        let mut total = 0usize;
        for (k, a) in linear.allocs.iter().enumerate() {
            let Op::Alloc { len, .. } = a.op() else {
                return Err(malformed(a, "listed as an ALLOC but is not one"));
            };
            let len = *len;
            // F32 kernel-local storage holds f64 in the f64 reference mode.
            let dtype =
                if precision == Precision::F64 && a.dtype() == DType::F32 { DType::F64 } else { a.dtype() };
            total = len
                .checked_mul(dtype.size() + 1)
                .and_then(|b| total.checked_add(b))
                .filter(|&t| t <= MAX_ALLOC_BYTES)
                .ok_or_else(|| malformed(a, format!("ALLOC storage beyond {MAX_ALLOC_BYTES} bytes")))?;
            allocs.push(HostBuffer::zeros(dtype, len));
            written.push(vec![false; len]);
            alloc_index.insert(a.id(), k);
        }
        Ok(Machine {
            bufs,
            buffer_nodes: &linear.buffers,
            allocs,
            written,
            alloc_nodes: &linear.allocs,
            vars,
            alloc_index,
            env: HashMap::new(),
            precision,
        })
    }

    /// Runs a statement list with an explicit stack, so deep loop nests cannot overflow.
    fn walk(&mut self, root: &[Stmt]) -> Result<(), InterpError> {
        struct Frame<'s> {
            body: &'s [Stmt],
            pos: usize,
            /// The loop's RANGE, current value and end (None for the root).
            lp: Option<(&'s UOp, i64, i64)>,
        }
        let mut stack = vec![Frame { body: root, pos: 0, lp: None }];
        while let Some(top) = stack.last_mut() {
            let body = top.body;
            if let Some(stmt) = body.get(top.pos) {
                top.pos += 1;
                match stmt {
                    Stmt::Op(u) => self.exec(u)?,
                    Stmt::Loop { range, body } => {
                        let end = self.loop_end(range)?;
                        if end > 0 {
                            self.env.insert(range.id(), Val::Int(wrap(range.dtype(), 0)));
                            stack.push(Frame { body, pos: 0, lp: Some((range, 0, end)) });
                        }
                    }
                }
                continue;
            }
            match &mut top.lp {
                Some((r, cur, end)) if *cur + 1 < *end => {
                    *cur += 1;
                    self.env.insert(r.id(), Val::Int(wrap(r.dtype(), *cur)));
                    top.pos = 0;
                }
                Some((r, ..)) => {
                    // A stale loop variable must not be readable after its loop.
                    self.env.remove(&r.id());
                    stack.pop();
                }
                None => {
                    stack.pop();
                }
            }
        }
        Ok(())
    }

    /// A loop's trip count, evaluated once at loop entry.
    fn loop_end(&self, range: &UOp) -> Result<i64, InterpError> {
        if !matches!(range.op(), Op::Range { .. }) || !range.dtype().is_int() {
            return Err(malformed(range, "a loop over something that is not an integer RANGE"));
        }
        match self.value(src(range, 0)?)? {
            Val::Int(e) => Ok(e),
            v => Err(malformed(range, format!("range end is {v:?}, not an integer"))),
        }
    }

    fn const_val(&self, c: ConstValue, dtype: DType) -> Val {
        match c.cast(dtype) {
            ConstValue::Bool(b) => Val::Bool(b),
            ConstValue::Int(i) => Val::Int(i),
            ConstValue::Float(bits) => {
                let v = f64::from_bits(bits);
                match (dtype, self.precision) {
                    // 16-bit constants are carried as the f32 they widen to (`cast` rounded them).
                    (DType::F32 | DType::BF16 | DType::F16, Precision::Native) => Val::F32(v as f32),
                    _ => Val::F64(v),
                }
            }
        }
    }

    /// Any evaluated node (constants on demand).
    fn lookup(&self, u: &UOp) -> Result<Val, InterpError> {
        match u.op() {
            Op::Const(c) => return Ok(self.const_val(*c, u.dtype())),
            Op::Var { slot, .. } => {
                return self
                    .vars
                    .get(slot.index())
                    .map(|&v| Val::Int(v))
                    .ok_or_else(|| malformed(u, "no value given"));
            }
            _ => {}
        }
        self.env.get(&u.id()).copied().ok_or_else(|| match u.op() {
            Op::Buffer { .. } | Op::Alloc { .. } => {
                malformed(u, "storage used as a value (it needs an INDEX and a LOAD)")
            }
            _ => malformed(u, "used before it is evaluated"),
        })
    }

    /// A scalar operand.
    fn value(&self, u: &UOp) -> Result<Val, InterpError> {
        match self.lookup(u)? {
            Val::Unit | Val::Addr(..) => Err(malformed(u, "used as a value but it has none")),
            v => Ok(v),
        }
    }

    fn addr(&self, u: &UOp) -> Result<(Mem, i64), InterpError> {
        match self.lookup(u)? {
            Val::Addr(m, i) => Ok((m, i)),
            _ => Err(malformed(u, "used as an address but it is not an INDEX")),
        }
    }

    /// Does `v` have the representation of a value of `dtype`?
    fn fits(&self, v: Val, dtype: DType) -> bool {
        match (dtype, v) {
            (DType::Bool, Val::Bool(_))
            | (DType::I32 | DType::I64, Val::Int(_))
            | (DType::F64, Val::F64(_)) => true,
            (DType::F32 | DType::BF16 | DType::F16, Val::F32(_)) => self.precision == Precision::Native,
            (DType::F32 | DType::BF16 | DType::F16, Val::F64(_)) => self.precision == Precision::F64,
            _ => false,
        }
    }

    fn base_name(&self, mem: Mem) -> String {
        let node = match mem {
            Mem::Buffer(k) => self.buffer_nodes.get(k),
            Mem::Alloc(k) => self.alloc_nodes.get(k),
        };
        node.map_or_else(|| "?".to_string(), UOp::short)
    }

    fn storage(&self, mem: Mem) -> Option<&HostBuffer> {
        match mem {
            Mem::Buffer(k) => self.bufs.get(k),
            Mem::Alloc(k) => self.allocs.get(k),
        }
    }

    /// The element position for `index`, or an out-of-bounds error naming `node`.
    fn checked(&self, node: &UOp, mem: Mem, index: i64) -> Result<usize, InterpError> {
        let len = self.storage(mem).map_or(0, HostBuffer::len);
        usize::try_from(index).ok().filter(|&k| k < len).ok_or_else(|| InterpError::OutOfBounds {
            node: node.short(),
            base: self.base_name(mem),
            index,
            len,
        })
    }

    fn load(&self, node: &UOp, mem: Mem, index: i64) -> Result<Val, InterpError> {
        let k = self.checked(node, mem, index)?;
        if let Mem::Alloc(a) = mem
            && !self.written.get(a).and_then(|w| w.get(k)).copied().unwrap_or(false)
        {
            return Err(InterpError::Uninitialized { node: node.short(), base: self.base_name(mem), index });
        }
        let widen = self.precision == Precision::F64;
        Ok(match self.storage(mem) {
            Some(HostBuffer::Bool(v)) => Val::Bool(v[k]),
            Some(HostBuffer::I32(v)) => Val::Int(v[k] as i64),
            Some(HostBuffer::I64(v)) => Val::Int(v[k]),
            Some(HostBuffer::F32(v)) if widen => Val::F64(v[k] as f64),
            Some(HostBuffer::F32(v)) => Val::F32(v[k]),
            Some(HostBuffer::F64(v)) => Val::F64(v[k]),
            Some(HostBuffer::BF16(v)) if widen => Val::F64(v[k].to_f64()),
            Some(HostBuffer::BF16(v)) => Val::F32(v[k].to_f32()),
            Some(HostBuffer::F16(v)) if widen => Val::F64(v[k].to_f64()),
            Some(HostBuffer::F16(v)) => Val::F32(v[k].to_f32()),
            None => return Err(malformed(node, "loads from storage that does not exist")),
        })
    }

    fn store(&mut self, node: &UOp, mem: Mem, index: i64, val: Val) -> Result<(), InterpError> {
        let k = self.checked(node, mem, index)?;
        let narrow = self.precision == Precision::F64;
        let buf = match mem {
            Mem::Buffer(b) => self.bufs.get_mut(b),
            Mem::Alloc(a) => self.allocs.get_mut(a),
        };
        match (buf, val) {
            (Some(HostBuffer::Bool(v)), Val::Bool(x)) => v[k] = x,
            (Some(HostBuffer::I32(v)), Val::Int(x)) => v[k] = x as i32,
            (Some(HostBuffer::I64(v)), Val::Int(x)) => v[k] = x,
            (Some(HostBuffer::F32(v)), Val::F32(x)) => v[k] = x,
            (Some(HostBuffer::F32(v)), Val::F64(x)) if narrow => v[k] = x as f32,
            (Some(HostBuffer::F64(v)), Val::F64(x)) => v[k] = x,
            // A native 16-bit value is exact, so this conversion only re-encodes it.
            (Some(HostBuffer::BF16(v)), Val::F32(x)) => v[k] = bf16::from_f32(x),
            // From f64 through f32, as the CAST from F64 rounds.
            (Some(HostBuffer::BF16(v)), Val::F64(x)) if narrow => v[k] = bf16::from_f32(x as f32),
            (Some(HostBuffer::F16(v)), Val::F32(x)) => v[k] = f16::from_f32(x),
            (Some(HostBuffer::F16(v)), Val::F64(x)) if narrow => v[k] = f16::from_f32(x as f32),
            (buf, val) => {
                let d = buf.map_or_else(|| "missing".to_string(), |b| b.dtype().to_string());
                return Err(malformed(node, format!("stores {val:?} into {d} storage")));
            }
        }
        if let Mem::Alloc(a) = mem
            && let Some(w) = self.written.get_mut(a).and_then(|w| w.get_mut(k))
        {
            *w = true;
        }
        Ok(())
    }

    /// Evaluates one statement node and records its value.
    fn exec(&mut self, u: &UOp) -> Result<(), InterpError> {
        let d = u.dtype();
        let v = match u.op() {
            // Not statements: constants are evaluated on demand, storage exists for the run.
            Op::Const(_) | Op::Var { .. } | Op::Buffer { .. } | Op::Alloc { .. } => return Ok(()),
            Op::Range { .. } => return Err(malformed(u, "a RANGE is a loop, not a statement")),
            Op::End | Op::After | Op::Sink => Val::Unit,
            Op::Index => {
                let base = view_base(src(u, 0)?)
                    .ok_or_else(|| malformed(u, "INDEX of something that is not a view"))?;
                let mem = match base.op() {
                    Op::Buffer { slot, .. } => Mem::Buffer(slot.index()),
                    _ => Mem::Alloc(
                        *self
                            .alloc_index
                            .get(&base.id())
                            .ok_or_else(|| malformed(u, "INDEX of an unknown ALLOC"))?,
                    ),
                };
                match self.value(src(u, 1)?)? {
                    Val::Int(i) => Val::Addr(mem, i),
                    v => return Err(malformed(u, format!("index is {v:?}, not an integer"))),
                }
            }
            Op::Load => {
                let (mem, i) = self.addr(src(u, 0)?)?;
                self.load(u, mem, i)?
            }
            Op::Store => {
                let (mem, i) = self.addr(src(u, 0)?)?;
                let val = self.value(src(u, 1)?)?;
                self.store(u, mem, i, val)?;
                Val::Unit
            }
            Op::Unary(op) => unary(*op, self.value(src(u, 0)?)?, d)
                .ok_or_else(|| malformed(u, "operand dtype does not fit"))?,
            Op::Binary(op) => {
                let (a, b) = (self.value(src(u, 0)?)?, self.value(src(u, 1)?)?);
                binary(*op, a, b, d).ok_or_else(|| malformed(u, "operand dtypes do not fit"))?
            }
            Op::Where => match self.value(src(u, 0)?)? {
                // Both branches are side-effect free and already evaluated.
                Val::Bool(c) => self.value(src(u, if c { 1 } else { 2 })?)?,
                v => return Err(malformed(u, format!("condition is {v:?}, not a bool"))),
            },
            Op::Cast => self.cast(self.value(src(u, 0)?)?, d),
            Op::Tile(t) => {
                let at: Vec<(Mem, i64)> = u.src().iter().map(|x| self.addr(x)).collect::<Result<_, _>>()?;
                self.tile(u, *t, &at)?;
                Val::Unit
            }
            _ => return Err(malformed(u, "tensor-level op in a loop program")),
        };
        if !matches!(v, Val::Unit | Val::Addr(..)) && !self.fits(v, d) {
            return Err(malformed(u, format!("evaluates to {v:?}, which is not a {d}")));
        }
        self.env.insert(u.id(), v);
        Ok(())
    }

    /// CAST with the semantics of [`alu::cast`]; in the f64 reference mode a CAST to F32, BF16
    /// or F16 keeps the f64 value (values of those dtypes are held in f64 there).
    fn cast(&self, v: Val, to: DType) -> Val {
        let narrow_float = to == DType::F32 || to.is_half();
        let to = if self.precision == Precision::F64 && narrow_float { DType::F64 } else { to };
        // Effects and addresses are never cast by a verified program; they read as zero.
        let v = v.scalar().unwrap_or(Scalar::Int(0));
        alu::cast(v, to).into()
    }
}

/// Source `k` of `u`, or an error instead of a panic on a wrong arity.
fn src(u: &UOp, k: usize) -> Result<&UOp, InterpError> {
    u.src().get(k).ok_or_else(|| malformed(u, format!("has no source {k}")))
}

impl Val {
    /// The scalar an ALU op computes on; effects and addresses have none.
    fn scalar(self) -> Option<Scalar> {
        Some(match self {
            Val::Bool(b) => Scalar::Bool(b),
            Val::Int(i) => Scalar::Int(i),
            Val::F32(x) => Scalar::F32(x),
            Val::F64(x) => Scalar::F64(x),
            Val::Unit | Val::Addr(..) => return None,
        })
    }
}

impl From<Scalar> for Val {
    fn from(s: Scalar) -> Val {
        match s {
            Scalar::Bool(b) => Val::Bool(b),
            Scalar::Int(i) => Val::Int(i),
            Scalar::F32(x) => Val::F32(x),
            Scalar::F64(x) => Val::F64(x),
        }
    }
}

fn unary(op: UnaryOp, a: Val, d: DType) -> Option<Val> {
    alu::unary(op, a.scalar()?, d).map(Val::from)
}

fn binary(op: BinaryOp, a: Val, b: Val, d: DType) -> Option<Val> {
    alu::binary(op, a.scalar()?, b.scalar()?, d).map(Val::from)
}

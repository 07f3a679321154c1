//! Hash-consed UOp nodes: the one graph type shared by the tensor level and the loop IR.
//!
//! Structurally equal nodes are the same allocation, so equality and hashing are O(1) pointer
//! operations. Nodes are interned in a global sharded table of weak references; a node lives as
//! long as some `UOp` (or a parent node) holds it.

use crate::dtype::DType;
use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, Weak};
pub use uopc_tile::GemmShape;

/// How a RANGE's loop is executed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AxisType {
    /// Iterations run in parallel: the runtime splits this range across rayon tasks.
    Thread,
    /// An ordinary sequential loop over an output axis.
    Loop,
    /// A sequential loop over a reduced axis.
    Reduce,
    /// An output axis expanded in registers (constant trip count, unrolled by the lowering).
    Upcast,
    /// A reduce axis expanded in registers.
    Unroll,
}

impl AxisType {
    /// Short lowercase name used by the printer.
    pub fn name(self) -> &'static str {
        match self {
            AxisType::Thread => "thread",
            AxisType::Loop => "loop",
            AxisType::Reduce => "reduce",
            AxisType::Upcast => "upcast",
            AxisType::Unroll => "unroll",
        }
    }
}

/// One-input ALU operations.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `2^x`; `exp2(-inf) == 0`.
    Exp2,
    /// `log2(x)`.
    Log2,
    /// `sqrt(x)`.
    Sqrt,
    /// `1 / x`.
    Recip,
}

/// Two-input ALU operations.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `if a > b { a } else { b }` (so a NaN `a` yields `b`).
    Max,
    /// `a < b`, a Bool.
    CmpLt,
    /// `a != b`, a Bool.
    CmpNe,
    /// Integer division truncating toward zero; division by zero yields 0.
    IDiv,
    /// Remainder with the sign of the dividend; modulo zero yields 0.
    Mod,
}

/// The combining operation of a REDUCE.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ReduceOp {
    /// Sum; identity 0.
    Add,
    /// Maximum; identity -inf (or the dtype's minimum).
    Max,
}

impl ReduceOp {
    /// The ALU op that combines two partial results.
    pub fn binary(self) -> BinaryOp {
        match self {
            ReduceOp::Add => BinaryOp::Add,
            ReduceOp::Max => BinaryOp::Max,
        }
    }

    /// The identity element for `dtype`.
    pub fn identity(self, dtype: DType) -> ConstValue {
        match (self, dtype.is_float()) {
            (ReduceOp::Add, true) => ConstValue::float(0.0),
            (ReduceOp::Add, false) => ConstValue::Int(0),
            (ReduceOp::Max, true) => ConstValue::float(f64::NEG_INFINITY),
            (ReduceOp::Max, false) if dtype == DType::I32 => ConstValue::Int(i32::MIN as i64),
            (ReduceOp::Max, false) => ConstValue::Int(i64::MIN),
        }
    }
}

/// A constant. Floats are stored as bits so that constants hash and compare structurally.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ConstValue {
    /// A truth value.
    Bool(bool),
    /// An integer (I32 constants are stored widened).
    Int(i64),
    /// A float, as the bits of an `f64`.
    Float(u64),
}

impl ConstValue {
    /// A float constant.
    pub fn float(v: f64) -> Self {
        ConstValue::Float(v.to_bits())
    }

    /// The value as an f64 (bools as 0/1).
    pub fn as_f64(self) -> f64 {
        match self {
            ConstValue::Bool(b) => b as i64 as f64,
            ConstValue::Int(i) => i as f64,
            ConstValue::Float(bits) => f64::from_bits(bits),
        }
    }

    /// The value as an i64 (floats truncated and saturated, NaN to 0, as Rust's `as`).
    pub fn as_i64(self) -> i64 {
        match self {
            ConstValue::Bool(b) => b as i64,
            ConstValue::Int(i) => i,
            ConstValue::Float(bits) => f64::from_bits(bits) as i64,
        }
    }

    /// The value converted to `dtype` with the IR's CAST semantics.
    pub fn cast(self, dtype: DType) -> ConstValue {
        match dtype {
            DType::Bool => ConstValue::Bool(match self {
                ConstValue::Bool(b) => b,
                ConstValue::Int(i) => i != 0,
                ConstValue::Float(bits) => f64::from_bits(bits) != 0.0,
            }),
            DType::I32 => ConstValue::Int(match self {
                ConstValue::Float(bits) => f64::from_bits(bits) as i32 as i64,
                other => other.as_i64() as i32 as i64,
            }),
            DType::I64 => ConstValue::Int(self.as_i64()),
            // Integers round to f32 once (through f64 they could round twice).
            DType::F32 => ConstValue::float(match self {
                ConstValue::Int(i) => i as f32 as f64,
                other => other.as_f64() as f32 as f64,
            }),
            DType::F64 => ConstValue::float(self.as_f64()),
        }
    }
}

impl fmt::Display for ConstValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ConstValue::Bool(b) => write!(f, "{b}"),
            ConstValue::Int(i) => write!(f, "{i}"),
            ConstValue::Float(bits) => {
                let v = f64::from_bits(bits);
                if v.is_infinite() {
                    f.write_str(if v > 0.0 { "inf" } else { "-inf" })
                } else if v == v.trunc() && v.abs() < 1e15 {
                    write!(f, "{v:.1}")
                } else {
                    write!(f, "{v}")
                }
            }
        }
    }
}

/// Host data held by a tensor-level DATA leaf. Compared by identity, never by contents.
#[derive(Clone)]
pub struct DataRef(pub Arc<dyn std::any::Any + Send + Sync>);

impl PartialEq for DataRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for DataRef {}
impl Hash for DataRef {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.0) as *const u8 as usize).hash(state)
    }
}
impl fmt::Debug for DataRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DataRef({:p})", Arc::as_ptr(&self.0) as *const u8)
    }
}

/// The operation of a node, with its non-UOp arguments.
///
/// Sources (`UOp` inputs) are listed in each variant's doc as `src[...]`.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum Op {
    /// A constant scalar. No sources.
    Const(ConstValue),
    /// A kernel parameter: caller-owned memory of `len` elements, passed in argument `slot`.
    Buffer { slot: usize, len: usize },
    /// Kernel-local storage of `len` elements (a register or a stack array).
    Alloc { slot: usize, len: usize },
    /// A loop variable taking values `0..end`; `src[0]` is the end (an index expression).
    Range { id: usize, axis: AxisType },
    /// Closes a range: `src[0]` is the body (stores, sinks), `src[1]` the RANGE.
    End,
    /// `src[0]` viewed after all of `src[1..]` (stores, ENDs, or RANGEs to live inside).
    After,
    /// An address: `src[0]` a buffer view (BUFFER, ALLOC or AFTER of one), `src[1]` the element index.
    Index,
    /// Reads `src[0]`, an INDEX.
    Load,
    /// Writes `src[1]` to `src[0]`, an INDEX.
    Store,
    /// Groups effects; no value.
    Sink,
    /// A one-input ALU op on `src[0]`.
    Unary(UnaryOp),
    /// A two-input ALU op on `src[0]`, `src[1]`.
    Binary(BinaryOp),
    /// `src[0] ? src[1] : src[2]`.
    Where,
    /// `src[0]` converted to this node's dtype.
    Cast,
    /// A dense tile operation on f32 memory: an effect like STORE, whose sources are INDEX
    /// nodes naming each operand's first element (see [`TileOp`]).
    Tile(TileOp),
    // ---- tensor level ----
    /// A tensor-level input placeholder with the given shape (filled from argument `slot`).
    Param { slot: usize, shape: Vec<usize> },
    /// A realized tensor's host data (identity-compared), with its shape.
    Data { data: DataRef, shape: Vec<usize> },
    /// `src[0]` viewed with a new shape of the same element count.
    Reshape(Vec<usize>),
    /// `src[0]` broadcast: axes of size 1 stretched to the given shape.
    Expand(Vec<usize>),
    /// `src[0]` with its axes reordered: output axis k is input axis `perm[k]`.
    Permute(Vec<usize>),
    /// `src[0]` restricted to `begin..end` on each axis.
    Shrink(Vec<(usize, usize)>),
    /// Reduction of the trailing `axes` axes of `src[0]`.
    Reduce { op: ReduceOp, axes: usize },
    /// Marks `src[0]` to be materialized into its own buffer.
    Stage,
    /// `src[0]`, through which gradients do not flow.
    Detach,
    /// The sources (all of one shape) stacked along a new leading axis.
    Stack,
}

impl Op {
    /// True for ALU ops (including WHERE and CAST).
    pub fn is_alu(&self) -> bool {
        matches!(self, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast)
    }

    /// True for tensor-level movement ops.
    pub fn is_movement(&self) -> bool {
        matches!(self, Op::Reshape(_) | Op::Expand(_) | Op::Permute(_) | Op::Shrink(_))
    }

    /// Upper-case name, as printed.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Const(_) => "CONST",
            Op::Buffer { .. } => "BUFFER",
            Op::Alloc { .. } => "ALLOC",
            Op::Range { .. } => "RANGE",
            Op::End => "END",
            Op::After => "AFTER",
            Op::Index => "INDEX",
            Op::Load => "LOAD",
            Op::Store => "STORE",
            Op::Sink => "SINK",
            Op::Unary(u) => match u {
                UnaryOp::Neg => "NEG",
                UnaryOp::Exp2 => "EXP2",
                UnaryOp::Log2 => "LOG2",
                UnaryOp::Sqrt => "SQRT",
                UnaryOp::Recip => "RECIP",
            },
            Op::Binary(b) => match b {
                BinaryOp::Add => "ADD",
                BinaryOp::Sub => "SUB",
                BinaryOp::Mul => "MUL",
                BinaryOp::Max => "MAX",
                BinaryOp::CmpLt => "CMPLT",
                BinaryOp::CmpNe => "CMPNE",
                BinaryOp::IDiv => "IDIV",
                BinaryOp::Mod => "MOD",
            },
            Op::Where => "WHERE",
            Op::Cast => "CAST",
            Op::Tile(TileOp::Gemm(_)) => "TILE_GEMM",
            Op::Tile(TileOp::SoftmaxUpdate { .. }) => "TILE_SOFTMAX",
            Op::Param { .. } => "PARAM",
            Op::Data { .. } => "DATA",
            Op::Reshape(_) => "RESHAPE",
            Op::Expand(_) => "EXPAND",
            Op::Permute(_) => "PERMUTE",
            Op::Shrink(_) => "SHRINK",
            Op::Reduce { .. } => "REDUCE",
            Op::Stage => "STAGE",
            Op::Detach => "DETACH",
            Op::Stack => "STACK",
        }
    }
}

/// A dense operation on row-major f32 tiles (the CPU's "tensor core"): each operand is a
/// `rows x cols` block starting at its INDEX, consecutive rows `ld` elements apart.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum TileOp {
    /// `C = A · B`, or `C += A · B` with `accumulate`. Sources `[A, B, C]`. A is `m x k`
    /// (stored `k x m` when `a_trans`), B is `k x n` (stored `n x k` when `b_trans`), C is `m x n`.
    /// The descriptor is the micro-kernel's own ([`GemmShape`]), so the IR, its reference
    /// expansion and the kernel it calls cannot disagree on a field.
    Gemm(GemmShape),
    /// One online-softmax step of FlashAttention-2 on a score tile. Sources
    /// `[S, row_max, row_sum, O]`: S is `rows x cols` (stride `lds`) of base-2 scores,
    /// row_max and row_sum hold `rows` values, O is `rows x d` (stride `ldo`). Per row:
    /// `m' = max(m, max_j S)`, `a = exp2(m - m')`, `S = exp2(S - m')` (S becomes P),
    /// `l = l a + sum_j P`, `O *= a`, `m = m'`. A row whose scores and max are all `-inf` keeps
    /// `l` and `O` and gets `P = 0`.
    SoftmaxUpdate {
        /// Rows of S and O.
        rows: usize,
        /// Keys in the tile.
        cols: usize,
        /// Row stride of S.
        lds: usize,
        /// Columns of O touched.
        d: usize,
        /// Row stride of O.
        ldo: usize,
    },
}

/// How a [`TileOp`] uses one of its operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileOperand {
    /// Elements from the operand's first one to one past the last it may touch.
    pub extent: usize,
    /// Read by the op.
    pub reads: bool,
    /// Written by the op.
    pub writes: bool,
}

/// Elements a `rows x cols` block with row stride `ld` spans (0 when empty).
pub fn block_extent(rows: usize, cols: usize, ld: usize) -> usize {
    if rows == 0 || cols == 0 { 0 } else { (rows - 1).saturating_mul(ld).saturating_add(cols) }
}

impl TileOp {
    /// The operands, in source order.
    pub fn operands(&self) -> Vec<TileOperand> {
        let op = |extent, reads, writes| TileOperand { extent, reads, writes };
        match *self {
            TileOp::Gemm(GemmShape { m, n, k, lda, ldb, ldc, a_trans, b_trans, accumulate }) => {
                let (ar, ac) = if a_trans { (k, m) } else { (m, k) };
                let (br, bc) = if b_trans { (n, k) } else { (k, n) };
                let none = m == 0 || n == 0 || k == 0;
                vec![
                    op(if none { 0 } else { block_extent(ar, ac, lda) }, true, false),
                    op(if none { 0 } else { block_extent(br, bc, ldb) }, true, false),
                    op(block_extent(m, n, ldc), accumulate, true),
                ]
            }
            TileOp::SoftmaxUpdate { rows, cols, lds, d, ldo } => vec![
                op(block_extent(rows, cols, lds), true, true),
                op(rows, true, true),
                op(rows, true, true),
                op(block_extent(rows, d, ldo), true, true),
            ],
        }
    }

    /// Rows and columns of each stored operand with its row stride, in source order.
    pub fn blocks(&self) -> Vec<(usize, usize, usize)> {
        match *self {
            TileOp::Gemm(GemmShape { m, n, k, lda, ldb, ldc, a_trans, b_trans, .. }) => vec![
                if a_trans { (k, m, lda) } else { (m, k, lda) },
                if b_trans { (n, k, ldb) } else { (k, n, ldb) },
                (m, n, ldc),
            ],
            TileOp::SoftmaxUpdate { rows, cols, lds, d, ldo } => {
                vec![(rows, cols, lds), (1, rows, rows), (1, rows, rows), (rows, d, ldo)]
            }
        }
    }

    /// Floating-point operations of one execution (an exp2 counted as one).
    pub fn flops(&self) -> u64 {
        match *self {
            TileOp::Gemm(GemmShape { m, n, k, .. }) => 2 * (m * n * k) as u64,
            TileOp::SoftmaxUpdate { rows, cols, d, .. } => (rows * (4 * cols + d + 4)) as u64,
        }
    }
}

/// The shared, immutable contents of a UOp.
pub struct Node {
    op: Op,
    dtype: DType,
    src: Vec<UOp>,
    id: u64,
    hash: u64,
    shape: OnceLock<Vec<usize>>,
    pub(crate) bounds: OnceLock<(i64, i64)>,
}

impl Drop for Node {
    // Deep chains would otherwise drop recursively and overflow the stack.
    fn drop(&mut self) {
        let mut stack = std::mem::take(&mut self.src);
        while let Some(u) = stack.pop() {
            if let Ok(mut node) = Arc::try_unwrap(u.0) {
                stack.append(&mut node.src);
            }
        }
    }
}

/// A handle to an interned node. Cloning is cheap; equality and hashing are by identity.
#[derive(Clone)]
pub struct UOp(Arc<Node>);

impl PartialEq for UOp {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for UOp {}
impl Hash for UOp {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.hash)
    }
}
impl PartialOrd for UOp {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for UOp {
    /// Creation order: deterministic and stable across runs of one program.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.id.cmp(&other.0.id)
    }
}

const SHARDS: usize = 32;

struct Shard {
    map: HashMap<u64, Vec<Weak<Node>>>,
    entries: usize,
    clean_at: usize,
}

static TABLE: LazyLock<Vec<Mutex<Shard>>> = LazyLock::new(|| {
    (0..SHARDS).map(|_| Mutex::new(Shard { map: HashMap::new(), entries: 0, clean_at: 1024 })).collect()
});
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn structural_hash(op: &Op, dtype: DType, src: &[UOp]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    op.hash(&mut h);
    dtype.hash(&mut h);
    for s in src {
        s.0.id.hash(&mut h);
    }
    h.finish()
}

impl UOp {
    /// The interned node for `(op, dtype, src)`: an existing one if structurally equal.
    pub fn new(op: Op, dtype: DType, src: Vec<UOp>) -> UOp {
        let hash = structural_hash(&op, dtype, &src);
        let shard = &TABLE[(hash as usize) % SHARDS];
        let mut guard = shard.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = guard.map.get(&hash) {
            for w in bucket {
                if let Some(n) = w.upgrade()
                    && n.op == op
                    && n.dtype == dtype
                    && n.src == src
                {
                    return UOp(n);
                }
            }
        }
        let node = Arc::new(Node {
            op,
            dtype,
            src,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            hash,
            shape: OnceLock::new(),
            bounds: OnceLock::new(),
        });
        let s = &mut *guard;
        s.map.entry(hash).or_default().push(Arc::downgrade(&node));
        s.entries += 1;
        if s.entries >= s.clean_at {
            // Drop dead weak entries; amortized O(1) per insertion.
            s.map.retain(|_, b| {
                b.retain(|w| w.strong_count() > 0);
                !b.is_empty()
            });
            s.entries = s.map.values().map(Vec::len).sum();
            s.clean_at = (s.entries * 2).max(1024);
        }
        UOp(node)
    }

    pub(crate) fn node(&self) -> &Node {
        &self.0
    }

    /// The node's operation.
    pub fn op(&self) -> &Op {
        &self.0.op
    }
    /// The node's dtype.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    /// The node's sources.
    pub fn src(&self) -> &[UOp] {
        &self.0.src
    }
    /// A process-unique id, increasing in creation order.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// This node with other sources (same op and dtype).
    pub fn with_src(&self, src: Vec<UOp>) -> UOp {
        if src == self.0.src { self.clone() } else { UOp::new(self.0.op.clone(), self.0.dtype, src) }
    }

    /// All nodes reachable from `roots`, each after its sources (explicit stack, no recursion).
    pub fn toposort(roots: &[UOp]) -> Vec<UOp> {
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<(UOp, bool)> = roots.iter().rev().map(|r| (r.clone(), false)).collect();
        while let Some((u, expanded)) = stack.pop() {
            if expanded {
                out.push(u);
                continue;
            }
            if !seen.insert(u.clone()) {
                continue;
            }
            stack.push((u.clone(), true));
            for s in u.src().iter().rev() {
                if !seen.contains(s) {
                    stack.push((s.clone(), false));
                }
            }
        }
        out
    }

    /// Tensor-level shape: empty for scalars and for every loop-IR node. Cached on the node.
    pub fn shape(&self) -> &[usize] {
        if let Some(s) = self.0.shape.get() {
            return s;
        }
        // Compute the shapes of sources first, iteratively, so deep graphs do not recurse.
        for u in UOp::toposort(std::slice::from_ref(self)) {
            if u.0.shape.get().is_none() {
                let s = u.compute_shape();
                let _ = u.0.shape.set(s);
            }
        }
        self.0.shape.get().expect("shape computed above")
    }

    fn compute_shape(&self) -> Vec<usize> {
        let src_shape = |k: usize| self.0.src.get(k).map(|s| s.0.shape.get().cloned().unwrap_or_default());
        match &self.0.op {
            Op::Param { shape, .. } | Op::Data { shape, .. } => shape.clone(),
            Op::Reshape(s) | Op::Expand(s) => s.clone(),
            Op::Permute(p) => {
                let s = src_shape(0).unwrap_or_default();
                p.iter().map(|&k| s.get(k).copied().unwrap_or(0)).collect()
            }
            Op::Shrink(b) => b.iter().map(|&(lo, hi)| hi.saturating_sub(lo)).collect(),
            Op::Reduce { axes, .. } => {
                let s = src_shape(0).unwrap_or_default();
                s[..s.len().saturating_sub(*axes)].to_vec()
            }
            Op::Stack => {
                let mut s = vec![self.0.src.len()];
                s.extend(src_shape(0).unwrap_or_default());
                s
            }
            Op::Stage | Op::Detach | Op::Cast | Op::Unary(_) => src_shape(0).unwrap_or_default(),
            Op::Binary(_) | Op::Where => {
                // Scalar constants broadcast: the shape is that of the highest-rank source.
                (0..self.0.src.len()).filter_map(src_shape).max_by_key(Vec::len).unwrap_or_default()
            }
            _ => Vec::new(),
        }
    }

    /// Every RANGE node this expression mentions, sorted by creation order.
    pub fn ranges_mentioned(&self) -> Vec<UOp> {
        let mut r: Vec<UOp> = UOp::toposort(std::slice::from_ref(self))
            .into_iter()
            .filter(|u| matches!(u.op(), Op::Range { .. }))
            .collect();
        r.sort();
        r
    }

    /// For a CONST node, its value.
    pub fn const_value(&self) -> Option<ConstValue> {
        match self.0.op {
            Op::Const(c) => Some(c),
            _ => None,
        }
    }

    /// For an integer CONST node, its value.
    pub fn const_int(&self) -> Option<i64> {
        match self.0.op {
            Op::Const(ConstValue::Int(i)) => Some(i),
            _ => None,
        }
    }

    /// Short one-line description naming the node: `%12 ADD f32`.
    pub fn short(&self) -> String {
        let extra = match &self.0.op {
            Op::Const(c) => format!(" {c}"),
            Op::Buffer { slot, len } => format!(" slot={slot} len={len}"),
            Op::Alloc { slot, len } => format!(" slot={slot} len={len}"),
            Op::Range { id, axis } => format!(" r{id} {}", axis.name()),
            _ => String::new(),
        };
        format!("%{} {} {}{}", self.0.id, self.0.op.name(), self.0.dtype, extra)
    }
}

impl fmt::Debug for UOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.short())?;
        if !self.0.src.is_empty() {
            f.write_str(" (")?;
            for (k, s) in self.0.src.iter().enumerate() {
                if k > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "%{}", s.0.id)?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structurally_equal_nodes_are_one_node() {
        let a = UOp::new(Op::Const(ConstValue::Int(3)), DType::I64, vec![]);
        let b = UOp::new(Op::Const(ConstValue::Int(3)), DType::I64, vec![]);
        assert_eq!(a, b);
        assert!(Arc::ptr_eq(&a.0, &b.0));
        let c = UOp::new(Op::Const(ConstValue::Int(3)), DType::I32, vec![]);
        assert_ne!(a, c);
        let s1 = UOp::new(Op::Binary(BinaryOp::Add), DType::I64, vec![a.clone(), a.clone()]);
        let s2 = UOp::new(Op::Binary(BinaryOp::Add), DType::I64, vec![b.clone(), b]);
        assert_eq!(s1, s2);
    }

    #[test]
    fn deep_chains_drop_and_sort_without_recursion() {
        let mut x = UOp::new(Op::Const(ConstValue::Int(1)), DType::I64, vec![]);
        let one = x.clone();
        for _ in 0..200_000 {
            x = UOp::new(Op::Binary(BinaryOp::Add), DType::I64, vec![x, one.clone()]);
        }
        assert_eq!(UOp::toposort(std::slice::from_ref(&x)).len(), 200_001);
        drop(x);
    }

    #[test]
    fn uop_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<UOp>();
    }
}

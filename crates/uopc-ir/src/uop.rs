//! Hash-consed UOp nodes: the one graph type shared by the tensor level and the loop IR.
//!
//! Structurally equal nodes are the same allocation, so equality and hashing are O(1) pointer
//! operations. Nodes are interned in a global sharded table of weak references; a node lives as
//! long as some `UOp` (or a parent node) holds it.

use crate::dtype::DType;
pub use crate::ops::{
    AxisType, BinaryOp, ConstValue, CustomKernel, DataRef, GemmShape, Half, Op, ReduceOp, TileOp,
    TileOperand, UnaryOp, block_extent,
};
use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, Weak};

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
        // The sources' shapes first, iteratively (deep graphs do not recurse), visiting only
        // nodes whose shape is not known yet: a node built on shaped sources costs its own
        // sources, not a walk of the whole graph below it.
        let mut stack = vec![(self.clone(), false)];
        while let Some((u, sources_done)) = stack.pop() {
            if u.0.shape.get().is_some() {
                continue;
            }
            if sources_done {
                let s = u.compute_shape();
                let _ = u.0.shape.set(s);
            } else {
                let pending: Vec<UOp> =
                    u.0.src.iter().filter(|s| s.0.shape.get().is_none()).cloned().collect();
                stack.push((u, true));
                stack.extend(pending.into_iter().map(|s| (s, false)));
            }
        }
        self.0.shape.get().expect("shape computed above")
    }

    fn compute_shape(&self) -> Vec<usize> {
        let src_shape = |k: usize| self.0.src.get(k).map(|s| s.0.shape.get().cloned().unwrap_or_default());
        match &self.0.op {
            Op::Param { shape, .. } | Op::Data { shape, .. } => shape.clone(),
            Op::Custom(c) => c.shape.clone(),
            Op::Arange(n) => vec![*n],
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
            Op::Stage | Op::Detach | Op::GradientRule(_) | Op::Cast | Op::Unary(_) => {
                src_shape(0).unwrap_or_default()
            }
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
            Op::Var { slot, lo, hi } => format!(" var{slot} [{lo}..={hi}]"),
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

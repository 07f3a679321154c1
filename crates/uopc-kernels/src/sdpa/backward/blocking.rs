//! The backward's block sizes ([`BackwardBlocking`]) and the sizes its program and host steps
//! agree on ([`Geometry`]).

use crate::sdpa::{Layout, MaskKind, SdpaConfig};
use uopc_jit::MAX_LOCAL_BYTES;

/// Block sizes and work split of one compiled backward pass (see [`BackwardBlocking::choose`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardBlocking {
    /// Query rows per block.
    pub queries: usize,
    /// Keys per block.
    pub keys: usize,
    /// Tasks sharing the key blocks of one (batch item, key/value head), round-robin.
    pub chunks: usize,
}

/// Stack the task's tiles may take: the JIT's limit less room for the kernel's own frame.
const TILE_BUDGET: usize = MAX_LOCAL_BYTES - 16 * 1024;

impl BackwardBlocking {
    /// Block sizes for `config` on `cores` cores.
    ///
    /// A task's stack holds `K^T`, `V^T` and the dK and dV accumulators (`keys x D` each) and
    /// the score and gradient tiles (`queries x keys` each); they must fit the JIT's stack
    /// limit less 16 KiB. Keys are 64 (32 at D > 128, where four 64-key panels would not fit):
    /// a 64-key block fills the micro-kernel's 32-wide panels twice and keeps the per-block
    /// copies of K and V small next to the work they serve. Query rows are 64, fewer when the
    /// stack is short. Chunks split the key blocks of a head when there are fewer (item, head)
    /// pairs than cores.
    pub fn choose(config: &SdpaConfig, cores: usize) -> BackwardBlocking {
        let &SdpaConfig { batch, kv_heads, n_q, n_k, d, .. } = config;
        let fits = |br: usize, bc: usize| 4 * (4 * bc * d + 2 * br * bc) <= TILE_BUDGET;
        let mut keys = if d > 128 { 32 } else { 64 }.min(n_k);
        while keys > 1 && !fits(1, keys) {
            keys /= 2;
        }
        let mut queries = 64.min(n_q);
        while queries > 1 && !fits(queries, keys) {
            queries /= 2;
        }
        let heads = batch * kv_heads;
        let full = n_k / keys;
        let chunks = if heads >= cores { 1 } else { cores.div_ceil(heads).min(full).max(1) };
        BackwardBlocking { queries, keys, chunks }
    }

    /// These blocks with fewer query rows where needed so that `tiles` tiles of `queries x
    /// keys` (the score and gradient tiles, and a score function's) fit the stack.
    pub(super) fn with_tiles(mut self, d: usize, tiles: usize) -> BackwardBlocking {
        while self.queries > 1 && !self.fits(d, tiles) {
            self.queries /= 2;
        }
        self
    }

    /// Whether the task's tiles fit the stack, with `tiles` of `queries x keys`.
    pub(super) fn fits(&self, d: usize, tiles: usize) -> bool {
        4 * (4 * self.keys * d + tiles * self.queries * self.keys) <= TILE_BUDGET
    }

    pub(super) fn valid(&self, c: &SdpaConfig) -> bool {
        let fits = self.fits(c.d, 2);
        (1..=c.n_q).contains(&self.queries) && (1..=c.n_k).contains(&self.keys) && self.chunks >= 1 && fits
    }
}

/// The sizes the backward program and its host steps agree on.
#[derive(Clone, Copy, Debug)]
pub(super) struct Geometry {
    pub(super) group: usize,
    pub(super) tasks: usize,
    /// Full key blocks, and the keys of the narrower last block (0: none).
    pub(super) full_kb: usize,
    pub(super) rest_k: usize,
    /// Full query blocks, and the rows of the narrower last block (0: none).
    pub(super) full_qb: usize,
    pub(super) rest_q: usize,
    /// Key-block slots per chunk (the most full blocks one chunk gets).
    pub(super) slots: usize,
    /// Key rows of one task's region of the dK / dV target.
    pub(super) task_rows: usize,
    /// Whether the program writes the caller's dq, dk and dv in place.
    pub(super) direct: bool,
    /// With an additive bias: the extents `[heads, rows, keys]` of one task's region of the
    /// dbias target, each 1 where the bias broadcasts (the task sums its terms there).
    pub(super) bias_region: Option<[usize; 3]>,
    /// Whether that target is exactly the caller's dbias (no two tasks share an element).
    pub(super) bias_direct: bool,
}

impl Geometry {
    pub(super) fn new(c: &SdpaConfig, b: &BackwardBlocking) -> Geometry {
        let full_kb = c.n_k / b.keys;
        let slots = full_kb.div_ceil(b.chunks);
        let rest_k = c.n_k % b.keys;
        Geometry {
            group: c.heads / c.kv_heads,
            tasks: c.batch * c.kv_heads * b.chunks,
            full_kb,
            rest_k,
            full_qb: c.n_q / b.queries,
            rest_q: c.n_q % b.queries,
            slots,
            task_rows: slots * b.keys + rest_k,
            direct: b.chunks == 1 && c.layout == Layout::Bhnd,
            bias_region: match c.mask {
                MaskKind::Bias(shape) => Some([
                    if shape[1] != 1 { c.heads / c.kv_heads } else { 1 },
                    if shape[2] != 1 { c.n_q } else { 1 },
                    if shape[3] != 1 { slots * b.keys + rest_k } else { 1 },
                ]),
                _ => None,
            },
            // Tasks differ in (item, key/value head, chunk): they share a bias element only
            // where the bias broadcasts over an axis that tells them apart.
            bias_direct: match c.mask {
                MaskKind::Bias(shape) => {
                    b.chunks == 1 && (c.batch == 1 || shape[0] != 1) && (c.kv_heads == 1 || shape[1] != 1)
                }
                _ => false,
            },
        }
    }

    /// Elements of one task's region of the dbias target (0 without a bias).
    pub(super) fn bias_task_len(&self) -> usize {
        self.bias_region.map_or(0, |r| r.iter().product())
    }

    /// Elements of the dbias target: one region per task.
    pub(super) fn dbias_len(&self) -> usize {
        self.tasks * self.bias_task_len()
    }

    /// The key of row `slot` of chunk `chunk`'s region (slot order, as dk and dv), if that
    /// slot holds a key block of the chunk.
    pub(super) fn slot_key(&self, b: &BackwardBlocking, chunk: usize, slot: usize) -> Option<usize> {
        let (sb, j) = (slot / b.keys, slot % b.keys);
        if sb < self.slots {
            let kb = chunk + sb * b.chunks;
            (kb < self.full_kb).then_some(kb * b.keys + j)
        } else {
            (chunk == 0 && j < self.rest_k).then_some(self.full_kb * b.keys + j)
        }
    }

    /// Elements of the dq target (the caller's dq when direct: `chunks == 1`).
    pub(super) fn dq_len(&self, c: &SdpaConfig) -> usize {
        self.tasks * self.group * c.n_q * c.d
    }

    /// Elements of each of the dk and dv targets.
    pub(super) fn dkv_len(&self, c: &SdpaConfig) -> usize {
        self.tasks * self.task_rows * c.d
    }
}

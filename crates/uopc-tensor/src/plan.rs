//! The plan: a graph cut into compiled kernels, with the temporaries and outputs they use.
//! What realize runs, and what tests and debug output read.

use crate::exec::Exe;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use uopc_ir::{DType, HostBuffer, IrError, Op, Stmt, UOp, linearize};

/// Where a kernel argument lives at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgSource {
    /// The plan's input `k` (the k-th distinct data leaf of the graph, in first-use order).
    Input(usize),
    /// The plan's temporary `k`.
    Temp(usize),
    /// The plan's output buffer `k`.
    Output(usize),
}

/// Where one root's value comes from after a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutSpec {
    /// The root is input `k` itself: nothing is computed or copied.
    Input(usize),
    /// The root is the plan's output buffer `k` (see [`Plan::outputs`]).
    Output(usize),
}

/// One compiled kernel of a plan.
pub struct Kernel {
    /// `r_` (has a reduce) or `e_`, then the output shape joined by `_`.
    pub name: String,
    /// The output shape.
    pub shape: Vec<usize>,
    /// The loop program that was compiled.
    pub program: UOp,
    /// Buffer of each BUFFER slot; the last [`Kernel::written`] ones are written (one output, or
    /// one per kernel a joined kernel stands for), the others are read.
    pub args: Vec<ArgSource>,
    /// Static FLOPs of one run, from the backend's estimate.
    pub flops: u64,
    /// Static bytes of one run, from the backend's estimate.
    pub bytes: u64,
    pub(crate) exe: Exe,
    tile_ops: bool,
    tile_gemm: bool,
    /// What the compiler derived for this kernel beyond plain lowering, for the plan's
    /// `Display` (empty when nothing): the online sums it accumulates and how they are lowered.
    pub derived: String,
    /// The lowering that made the program: `tile_gemm`, `gemm_epilogue`, `online_attention`,
    /// `online_rows_split`, `online_rows` or `rangeify` (tried in that order), `custom` for a
    /// given program, `online_rows_joined` for two kernels of one online group run as one.
    pub lowering: &'static str,
    epilogue: bool,
    outputs: usize,
}

impl Kernel {
    /// A kernel for `program` compiled as `exe`; whether it calls tile ops is read from the
    /// program once, here, because every realize reports it.
    pub(crate) fn new(
        name: String,
        shape: Vec<usize>,
        program: UOp,
        args: Vec<ArgSource>,
        exe: Exe,
    ) -> Kernel {
        let (flops, bytes) = exe.estimates();
        let nodes = UOp::toposort(std::slice::from_ref(&program));
        let tile_ops = nodes.iter().any(|u| matches!(u.op(), Op::Tile(_)));
        let tile_gemm = nodes.iter().any(|u| matches!(u.op(), Op::Tile(uopc_ir::TileOp::Gemm(_))));
        Kernel {
            name,
            shape,
            program,
            args,
            flops,
            bytes,
            exe,
            tile_ops,
            tile_gemm,
            derived: String::new(),
            lowering: "",
            epilogue: false,
            outputs: 1,
        }
    }

    /// This kernel with `lowering` named (see [`Kernel::lowering`]).
    pub(crate) fn with_lowering(self, lowering: &'static str) -> Kernel {
        Kernel { lowering, ..self }
    }

    /// This kernel writing its last `outputs` slots.
    pub(crate) fn with_outputs(self, outputs: usize) -> Kernel {
        Kernel { outputs, ..self }
    }

    /// The buffers the kernel reads, in slot order.
    pub fn read(&self) -> &[ArgSource] {
        &self.args[..self.args.len() - self.outputs]
    }

    /// The buffers the kernel writes, in slot order after the ones it reads: one, or one per
    /// kernel of an online group joined into this one.
    pub fn written(&self) -> &[ArgSource] {
        &self.args[self.args.len() - self.outputs..]
    }

    /// This kernel with `derived` set (see [`Kernel::derived`]).
    pub(crate) fn with_derived(mut self, derived: String) -> Kernel {
        self.derived = derived;
        self
    }

    /// This kernel, marked as a tile GEMM with a fused epilogue when `epilogue` holds.
    pub(crate) fn with_epilogue(self, epilogue: bool) -> Kernel {
        Kernel { epilogue, ..self }
    }

    /// Whether the program calls tile ops (a GEMM mapped onto the micro-kernels).
    pub fn uses_tile_ops(&self) -> bool {
        self.tile_ops
    }

    /// Whether the kernel is a tile GEMM that also computes its consumer's elementwise ops (a
    /// bias, an activation, a residual add, a cast) on each output block before storing it,
    /// where otherwise those would be a kernel of their own reading the GEMM output back.
    pub fn has_epilogue(&self) -> bool {
        self.epilogue
    }

    /// What the kernel runs on, for printed plans: `[tile gemm]`, `[tile gemm + epilogue]`,
    /// `[tile ops]` for tile ops other than GEMMs (the row ops of an online group), or
    /// nothing for a kernel of loops only.
    pub fn kind_label(&self) -> &'static str {
        match (self.tile_ops, self.tile_gemm, self.epilogue) {
            (true, _, true) => "[tile gemm + epilogue]",
            (true, true, false) => "[tile gemm]",
            (true, false, false) => "[tile ops]",
            _ => "",
        }
    }
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.name, self.args)
    }
}

/// A graph cut into kernels: what realize runs, and what tests and debug output read.
pub struct Plan {
    /// Kernels in execution order.
    pub kernels: Vec<Kernel>,
    /// Temporaries as `(dtype, elements)`.
    pub temps: Vec<(DType, usize)>,
    /// Freshly allocated output buffers as `(dtype, elements)`.
    pub outputs: Vec<(DType, usize)>,
    /// Per output buffer, whether it is allocated without zeroing: one kernel writes it, and
    /// that kernel's program stores every element of it without reading it.
    pub(crate) fresh_outputs: Vec<bool>,
    /// For each root, where its value ends up.
    pub outs: Vec<OutSpec>,
    /// The inputs the plan expects, as `(dtype, shape)`, in slot order.
    pub inputs: Vec<(DType, Vec<usize>)>,
    /// Seconds spent cutting and lowering (excluding compilation).
    pub schedule_seconds: f64,
    /// Seconds spent compiling kernels.
    pub compile_seconds: f64,
    /// How often each named rewrite rule fired while the plan was built, per pass: the graph
    /// passes after canonicalization, slot compaction, and each kernel's simplification when it
    /// was compiled.
    pub rewrites: Vec<uopc_ir::RewriteStats>,
    pub(crate) temp_pool: Mutex<Option<Vec<HostBuffer>>>,
    pub(crate) temp_allocations: AtomicUsize,
}

impl Plan {
    /// Output buffers allocated without being zeroed first, since the one kernel writing each
    /// stores every element of it (see [`uopc_ir::stores_every_element`]).
    pub fn unzeroed_outputs(&self) -> usize {
        self.fresh_outputs.iter().filter(|&&f| f).count()
    }

    /// Kernel names in execution order.
    pub fn kernel_names(&self) -> Vec<&str> {
        self.kernels.iter().map(|k| k.name.as_str()).collect()
    }

    /// Element counts of the temporaries.
    pub fn temp_sizes(&self) -> Vec<usize> {
        self.temps.iter().map(|t| t.1).collect()
    }

    /// How many times a full set of temporaries has been allocated (1 after any number of
    /// sequential runs; more only when runs overlapped).
    pub fn temp_allocations(&self) -> usize {
        self.temp_allocations.load(Ordering::Relaxed)
    }

    /// The cached temporaries, or a fresh set when they are in use by another run (or on the
    /// first run).
    pub(crate) fn take_temps(&self) -> Vec<HostBuffer> {
        let cached = self.temp_pool.lock().unwrap_or_else(|e| e.into_inner()).take();
        cached.unwrap_or_else(|| {
            self.temp_allocations.fetch_add(1, Ordering::Relaxed);
            self.temps.iter().map(|&(d, n)| HostBuffer::zeros(d, n)).collect()
        })
    }

    /// Returns temporaries for the next run (kept only if the pool is empty).
    pub(crate) fn return_temps(&self, temps: Vec<HostBuffer>) {
        let mut pool = self.temp_pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.is_none() {
            *pool = Some(temps);
        }
    }

    /// Bytes of one full set of temporaries.
    pub fn temp_bytes(&self) -> usize {
        self.temps.iter().map(|&(d, n)| d.size().saturating_mul(n)).fold(0, usize::saturating_add)
    }

    /// Bytes of temporaries kept for the next run (0 while none are pooled).
    pub fn pooled_temp_bytes(&self) -> usize {
        let pooled = self.temp_pool.lock().unwrap_or_else(|e| e.into_inner()).is_some();
        if pooled { self.temp_bytes() } else { 0 }
    }

    /// Drops the pooled temporaries (the next run allocates a fresh set); the bytes freed.
    pub(crate) fn drop_pooled_temps(&self) -> usize {
        let taken = self.temp_pool.lock().unwrap_or_else(|e| e.into_inner()).take();
        if taken.is_some() { self.temp_bytes() } else { 0 }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "plan: {} kernels", self.kernels.len())?;
        for k in &self.kernels {
            let label = k.kind_label();
            let sep = if label.is_empty() { "" } else { " " };
            write!(f, "  {:<24} args {:?}{sep}{label} by {}", k.name, k.args, k.lowering)?;
            if k.derived.is_empty() {
                writeln!(f)?;
            } else {
                writeln!(f, " [{}]", k.derived)?;
            }
        }
        writeln!(f, "  temps {:?}", self.temps)?;
        writeln!(f, "  outputs {:?}", self.outputs)?;
        write!(f, "  outs {:?}", self.outs)
    }
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Products of an element of input `a` by an element of input `b` one run of `plan` executes:
/// MULs of a load of one by a load of the other, and `m n k` per tile GEMM of a block of one
/// by a block of the other, each times the trip counts of the loops around it. For attention
/// with Q and K as inputs 0 and 1, `n_q n_k d` means each q.k product is computed once.
///
/// # Errors
///
/// The [`IrError`] of linearizing a kernel's program when it is not a well-formed loop program.
pub fn input_products(plan: &Plan, a: usize, b: usize) -> Result<u64, IrError> {
    fn slot(index: &UOp) -> Option<usize> {
        match uopc_ir::view_base(index.as_index()?.base)?.op() {
            Op::Buffer { slot, .. } => Some(slot.index()),
            _ => None,
        }
    }
    fn go(body: &[Stmt], mult: u64, pair: &dyn Fn([Option<usize>; 2]) -> bool) -> u64 {
        let load_slot = |u: &UOp| u.as_load().and_then(slot);
        body.iter()
            .map(|s| match s {
                Stmt::Loop { range, body } => {
                    let trip = range.as_range().and_then(|r| r.end.const_int()).unwrap_or(0).max(0) as u64;
                    go(body, mult * trip, pair)
                }
                Stmt::Op(u) => match u.op() {
                    Op::Binary(uopc_ir::BinaryOp::Mul)
                        if u.as_binary().is_some_and(|(_, a, b)| pair([load_slot(a), load_slot(b)])) =>
                    {
                        mult
                    }
                    Op::Tile(uopc_ir::TileOp::Gemm(_))
                        if u.as_gemm().is_some_and(|g| pair([slot(g.a), slot(g.b)])) =>
                    {
                        u.as_gemm().map_or(0, |g| mult * (g.shape.m * g.shape.n * g.shape.k) as u64)
                    }
                    _ => 0,
                },
            })
            .sum()
    }
    let mut total = 0;
    for kernel in &plan.kernels {
        let pos = |x| kernel.read().iter().position(|y| *y == ArgSource::Input(x));
        if let (Some(pa), Some(pb)) = (pos(a), pos(b)) {
            let pair = move |s: [Option<usize>; 2]| s == [Some(pa), Some(pb)] || s == [Some(pb), Some(pa)];
            total += go(&linearize(&kernel.program)?.root, 1, &pair);
        }
    }
    Ok(total)
}

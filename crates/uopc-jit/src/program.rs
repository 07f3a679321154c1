//! [`Program`]: a loop program compiled once, run many times.

use crate::translate::{KernelFn, compile};
use crate::{JitError, JitOptions};
use cranelift_codegen::ir::Function;
use cranelift_jit::JITModule;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;
use uopc_ir::{
    BufferSpec, Estimates, IndexFormula, PrepareError, PrepareOptions, PreparedKernel, UOp, VarSpec, prepare,
};

/// Stack bytes all ALLOCs of one program may use: rayon workers run on 2 MiB stacks.
pub const MAX_LOCAL_BYTES: usize = 256 * 1024;

/// A compiled loop program. Compile once, run many times, from any thread.
///
/// A Program holds no IR nodes: nodes are hash-consed and numbered in creation order, and a
/// node kept alive past its compile would be found again, with its old number, by later
/// compiles, whose statement order (ties broken by that number) would then depend on which
/// Programs happen to be alive. So the loop IR is kept as text, and the CLIF as Cranelift's
/// function, formatted when first asked for.
#[must_use = "a compiled program does nothing until it is run"]
pub struct Program {
    pub(crate) name: String,
    pub(crate) entry: KernelFn,
    // Kept only to free the code on drop; JITModule is Send but not Sync, hence the Mutex.
    module: Mutex<Option<JITModule>>,
    pub(crate) thread_extent: Option<ThreadExtent>,
    pub(crate) parallel: bool,
    /// `parallel`, and worth the pool's wake-up ([`Program::spreads_over_pool`]).
    pub(crate) spread: bool,
    specs: Vec<BufferSpec>,
    /// Per slot, whether the program writes every element and reads none.
    written_whole: Vec<bool>,
    vars: Vec<VarSpec>,
    function: Function,
    clif: OnceLock<String>,
    loop_ir: String,
    machine_code: Vec<u8>,
    estimates: Estimates,
    compile_seconds: f64,
}

/// The trip count of a THREAD range, known before the call: the runtime splits it into chunks.
#[derive(Clone, Debug)]
pub(crate) enum ThreadExtent {
    /// A constant.
    Fixed(usize),
    /// A formula of the variables, evaluated from each run's values.
    Formula(IndexFormula),
}

impl ThreadExtent {
    /// The trip count for `vars` (already checked against their bounds); a negative end runs
    /// no iteration.
    pub(crate) fn eval(&self, vars: &[i64]) -> Option<usize> {
        match self {
            ThreadExtent::Fixed(n) => Some(*n),
            ThreadExtent::Formula(f) => f.eval(vars).map(|n| usize::try_from(n.max(0)).unwrap_or(usize::MAX)),
        }
    }
}

/// The backend's limits on a prepared kernel: buffer slots without gaps (the kernel receives
/// its pointers by slot), a THREAD trip count known before the call (a constant, or a formula
/// of the variables: the runtime splits it into chunks), and ALLOCs that fit a worker's stack.
/// Returns the THREAD trip count.
fn check_supported(kernel: &PreparedKernel, name: &str) -> Result<Option<ThreadExtent>, JitError> {
    if let Some(k) = kernel.buffers.iter().enumerate().position(|(k, s)| s.slot != k) {
        return Err(JitError::Unsupported(format!(
            "buffer slots must be 0..n without gaps; missing slot {k}"
        )));
    }
    let extent = match &kernel.thread {
        Some(t) => Some(match (t.extent, &t.end) {
            (Some(n), _) => ThreadExtent::Fixed(n),
            (None, Some(f)) => ThreadExtent::Formula(f.clone()),
            (None, None) => {
                return Err(JitError::Unsupported(format!(
                    "{}: the THREAD range's end must be built of constants and variables only",
                    t.range.short()
                )));
            }
        }),
        None => None,
    };
    if kernel.local_bytes > MAX_LOCAL_BYTES {
        return Err(JitError::Unsupported(format!(
            "{name}: ALLOCs need {} bytes of stack; the limit is {MAX_LOCAL_BYTES} (worker threads have small stacks)",
            kernel.local_bytes
        )));
    }
    Ok(extent)
}

impl Program {
    /// Verifies, simplifies and compiles `program` with default options.
    ///
    /// ```rust
    /// use uopc_ir::{AxisType, DType, buffer, range, sink};
    /// use uopc_jit::Program;
    ///
    /// // out[i] = 2 * a[i] + 1 over 8 elements, one per THREAD iteration.
    /// let (a, out) = (buffer(0, DType::F32, 8), buffer(1, DType::F32, 8));
    /// let i = range(8, 0, AxisType::Thread);
    /// let program = sink(&[out.index(&i).store(a.index(&i).load() * 2.0f32 + 1.0f32).end(&[i])]);
    /// let prg = Program::compile(&program, "affine")?;
    /// assert_eq!(prg.buffers().len(), 2);
    ///
    /// // An index the compiler cannot prove inside its buffer is refused.
    /// let j = range(9, 0, AxisType::Loop);
    /// let bad = sink(&[out.index(&j).store(a.index(&j).load()).end(&[j])]);
    /// assert!(Program::compile(&bad, "out_of_bounds").is_err());
    /// # Ok::<(), uopc_jit::JitError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Program::compile_with`].
    pub fn compile(program: &UOp, name: &str) -> Result<Program, JitError> {
        Program::compile_with(program, name, &JitOptions::default())
    }

    /// Verifies, simplifies and compiles `program`: [`uopc_ir::prepare`] checks, rewrites,
    /// analyses and linearizes it, then its translation is compiled into machine code.
    ///
    /// # Errors
    ///
    /// [`JitError::Ir`] if the program is malformed or an index cannot be proven inside its
    /// buffer; [`JitError::Unsupported`] if its THREAD range's end is not built of constants
    /// and variables or its ALLOCs exceed [`MAX_LOCAL_BYTES`]; the other variants if Cranelift
    /// fails.
    pub fn compile_with(program: &UOp, name: &str, opts: &JitOptions) -> Result<Program, JitError> {
        let t0 = Instant::now();
        let kernel =
            prepare(program, &PrepareOptions { expand_tile_ops: !opts.tile_calls }).map_err(|e| match e {
                PrepareError::Invalid(e) => JitError::Ir(e),
                PrepareError::Expansion(source) => JitError::TileExpansion { name: name.to_string(), source },
            })?;
        let thread_extent = check_supported(&kernel, name)?;
        let compiled = compile(&kernel, opts.level_for(kernel.gemm_like), opts)?;
        let written_whole = kernel
            .buffers
            .iter()
            .map(|s| s.written && uopc_ir::stores_every_element_linear(&kernel.linear, s.slot))
            .collect();
        Ok(Program {
            name: name.to_string(),
            entry: compiled.entry,
            module: Mutex::new(Some(compiled.module)),
            thread_extent,
            parallel: kernel.thread.as_ref().is_some_and(|t| t.writes_disjoint),
            spread: kernel.thread.as_ref().is_some_and(|t| t.writes_disjoint)
                && worth_spreading(&kernel.estimates),
            estimates: kernel.estimates,
            loop_ir: kernel.loop_ir(),
            specs: kernel.buffers,
            written_whole,
            vars: kernel.vars,
            function: compiled.function,
            clif: OnceLock::new(),
            machine_code: compiled.machine_code,
            compile_seconds: t0.elapsed().as_secs_f64(),
        })
    }

    /// Whether the program, as compiled, stores every element of buffer `slot` and never reads
    /// it ([`uopc_ir::stores_every_element_linear`]: every loop around the covering store is
    /// proven to run at least once), so that the slot may be passed uninitialized
    /// ([`crate::Arg::WriteF32Uninit`]); `false` for a slot the program does not have.
    pub fn writes_whole(&self, slot: usize) -> bool {
        self.written_whole.get(slot).copied().unwrap_or(false)
    }

    /// The name given at compile time.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The arguments the program expects, by slot.
    pub fn buffers(&self) -> &[BufferSpec] {
        &self.specs
    }

    /// The variables the program expects, by slot: one value per slot is passed to
    /// [`Program::run_with_vars`], inside the slot's declared bounds.
    pub fn vars(&self) -> &[VarSpec] {
        &self.vars
    }

    /// The generated Cranelift IR, as text (formatted on first use).
    pub fn clif(&self) -> &str {
        self.clif.get_or_init(|| self.function.display().to_string())
    }

    /// The generated x86-64 (or host) machine code, for a disassembler
    /// (`objdump -D -b binary -m i386:x86-64` reads it as is).
    pub fn machine_code(&self) -> &[u8] {
        &self.machine_code
    }

    /// The (simplified) loop program, pretty-printed as nested loops.
    pub fn loop_ir(&self) -> &str {
        &self.loop_ir
    }

    /// Static FLOP and byte counts, from the loop structure.
    pub fn estimates(&self) -> Estimates {
        self.estimates
    }

    /// Wall time spent in `compile`.
    pub fn compile_seconds(&self) -> f64 {
        self.compile_seconds
    }

    /// Whether THREAD iterations run in parallel. False when the program has no THREAD range, or
    /// when the compiler cannot prove that different iterations write disjoint memory (then
    /// it runs them in order on the calling thread rather than risk a race).
    pub fn is_parallel(&self) -> bool {
        self.parallel
    }

    /// Whether a run spreads the THREAD iterations over the calling thread's rayon pool: when
    /// they may run in parallel ([`Program::is_parallel`]) and the program's estimated work
    /// ([`Program::estimates`]) reaches [`PARALLEL_MIN_FLOPS`] or
    /// [`PARALLEL_MIN_ACCESS_BYTES`]. A smaller kernel runs its iterations on the calling
    /// thread, in order: waking the pool would cost more than it saves.
    pub fn spreads_over_pool(&self) -> bool {
        self.spread
    }
}

/// Floating-point operations from which a program's THREAD iterations are spread over the
/// pool (with [`PARALLEL_MIN_ACCESS_BYTES`], the work of a few microseconds on one core, about
/// what waking another thread and joining it costs).
pub const PARALLEL_MIN_FLOPS: u64 = 1 << 15;

/// Bytes of memory accesses from which a program's THREAD iterations are spread over the pool
/// (see [`PARALLEL_MIN_FLOPS`]).
pub const PARALLEL_MIN_ACCESS_BYTES: u64 = 1 << 18;

/// Whether work of `e` pays for spreading over the pool.
fn worth_spreading(e: &Estimates) -> bool {
    e.flops >= PARALLEL_MIN_FLOPS || e.access_bytes >= PARALLEL_MIN_ACCESS_BYTES
}

impl Drop for Program {
    fn drop(&mut self) {
        let module = self.module.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(m) = module {
            // SAFETY: `entry` is no longer callable once the Program is dropped.
            unsafe { m.free_memory() };
        }
    }
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("name", &self.name)
            .field("buffers", &self.specs)
            .field("vars", &self.vars)
            .finish()
    }
}

//! uopc's backend: loop programs compiled straight to machine code with Cranelift, run on all
//! cores with rayon.
//!
//! ```
//! use uopc_ir::*;
//! // out[i] = 2 * a[i]
//! let a = buffer(0, DType::F32, 8);
//! let out = buffer(1, DType::F32, 8);
//! let i = range(8, 0, AxisType::Thread);
//! let program = sink(&[out.index(&i).store(a.index(&i).load() * 2.0f32).end(&[i])]);
//! let prg = uopc_jit::Program::compile(&program, "double").unwrap();
//! let input: Vec<f32> = (0..8).map(|x| x as f32).collect();
//! let mut result = vec![0.0f32; 8];
//! prg.run_f32(&[&input], &mut [&mut result]).unwrap();
//! assert_eq!(result[3], 6.0);
//! ```

mod estimate;
mod lower;
pub mod peak;

pub use estimate::Estimates;

use cranelift_codegen::ir::{AbiParam, InstBuilder, UserFuncName, types};
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module};
use rayon::prelude::*;
use std::sync::{LazyLock, Mutex};
use std::time::Instant;
use uopc_ir::{
    DType, HostBuffer, IrError, Linear, Op, UOp, simplify, split_linear, verify, verify_simplified, view_base,
};

/// Why compiling or running a program failed.
#[derive(Debug, thiserror::Error)]
pub enum JitError {
    /// The program is malformed (or an index cannot be proven in bounds).
    #[error("invalid program: {0}")]
    Ir(#[from] IrError),
    /// Cranelift rejected the generated code.
    #[error("code generation failed: {0}")]
    Codegen(String),
    /// The arguments of a run do not match the program's buffers.
    #[error("{0}")]
    Argument(String),
    /// A program shape the backend does not support.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A bug in the backend.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Cranelift optimization level for a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptLevel {
    /// Cranelift's `none`: keeps the emitted order; fastest to compile.
    None,
    /// Cranelift's `speed`: e-graph optimizations (GVN, LICM, constant folding).
    Speed,
    /// Chosen per kernel: `none` for GEMM-like kernels (register tiles, no transcendental
    /// math), `speed` for everything else. The e-graph places every pure op at its first use,
    /// which in a register tile's loop is the back edge: all loads of both unrolled steps are
    /// issued first and the accumulators spill. Kept in emitted order, the same tile reached
    /// 67-68% of the FMA peak against 39-43% at `speed` (single thread, `r_1024_1024`,
    /// `cargo xtask bench attention --kernels --threads 1`), while kernels with exp2 and
    /// other scalar work usually lose more to the missing GVN and LICM. (`flash_tiled`, whose
    /// two register tiles do most of its work, asks for `none` itself.)
    Auto,
}

/// Options of [`Program::compile_with`].
#[derive(Clone, Debug)]
pub struct JitOptions {
    /// Cranelift optimization level.
    pub opt_level: OptLevel,
    /// Run Cranelift's IR verifier (doubles compile time; on in debug builds).
    pub verify_clif: bool,
    /// Contract a float MUL feeding an ADD into one fused multiply-add (like
    /// `-ffp-contract=fast`; only where the CPU has FMA).
    pub contract_fma: bool,
    /// Vectorize innermost f32 loops over contiguous memory into F32X4 (their reductions
    /// are reassociated into lanes, whatever `reassociate` says).
    pub vectorize: bool,
    /// Reassociate float sums in reduction loops into independent partial sums (like
    /// `-fassociative-math`): results differ from in-order summation by rounding only.
    pub reassociate: bool,
    /// Lower tile ops to calls into the `uopc-tile` micro-kernels. When false, tile ops are
    /// first rewritten into their reference loops ([`uopc_ir::expand_tile_ops`]: f64
    /// accumulation, the interpreter's results bit for bit under strict options), and the
    /// program runs on the JIT's own code alone.
    pub tile_calls: bool,
    /// Reduce steps per trip of a register tile's loop at `opt_level=none` (at `speed` the
    /// e-graph reorders the steps, so there it is always one). Two let the accumulators
    /// alternate between two register sets with no copies at the back edge; more shorten the
    /// loop overhead but lengthen the code regalloc has to fit into 16 registers.
    pub tile_steps: usize,
}

impl Default for JitOptions {
    fn default() -> Self {
        JitOptions {
            opt_level: OptLevel::Auto,
            verify_clif: cfg!(debug_assertions),
            contract_fma: true,
            reassociate: true,
            vectorize: true,
            tile_calls: true,
            tile_steps: 2,
        }
    }
}

impl JitOptions {
    /// Plain scalar code: no vectorization, FMA contraction, split sums or micro-kernel calls
    /// (the baseline the code generator is measured against).
    pub fn scalar() -> Self {
        JitOptions {
            contract_fma: false,
            reassociate: false,
            vectorize: false,
            tile_calls: false,
            ..JitOptions::default()
        }
    }
}

/// What the program expects in one argument slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferSpec {
    /// Argument position.
    pub slot: usize,
    /// Element type.
    pub dtype: DType,
    /// Exact number of elements.
    pub len: usize,
    /// Whether the program stores to it (it must then be passed mutably).
    pub written: bool,
}

/// A read-only argument.
pub enum BufRef<'a> {
    /// Bools.
    Bool(&'a [bool]),
    /// i32s.
    I32(&'a [i32]),
    /// i64s.
    I64(&'a [i64]),
    /// f32s.
    F32(&'a [f32]),
    /// f64s.
    F64(&'a [f64]),
}

/// One argument of [`Program::run`]: read-only or writable memory.
pub enum Arg<'a> {
    /// Memory the program may only read.
    Read(BufRef<'a>),
    /// Memory the program may write (and read).
    Write(&'a mut HostBuffer),
    /// Writable f32 memory.
    WriteF32(&'a mut [f32]),
}

impl<'a> From<&'a [f32]> for Arg<'a> {
    fn from(v: &'a [f32]) -> Self {
        Arg::Read(BufRef::F32(v))
    }
}
impl<'a> From<&'a mut [f32]> for Arg<'a> {
    fn from(v: &'a mut [f32]) -> Self {
        Arg::WriteF32(v)
    }
}
impl<'a> From<&'a HostBuffer> for Arg<'a> {
    fn from(b: &'a HostBuffer) -> Self {
        Arg::Read(match b {
            HostBuffer::Bool(v) => BufRef::Bool(v),
            HostBuffer::I32(v) => BufRef::I32(v),
            HostBuffer::I64(v) => BufRef::I64(v),
            HostBuffer::F32(v) => BufRef::F32(v),
            HostBuffer::F64(v) => BufRef::F64(v),
        })
    }
}
impl<'a> From<&'a mut HostBuffer> for Arg<'a> {
    fn from(b: &'a mut HostBuffer) -> Self {
        Arg::Write(b)
    }
}

impl Arg<'_> {
    fn describe(&self) -> (DType, usize, bool, *mut u8) {
        match self {
            Arg::Read(r) => match r {
                BufRef::Bool(v) => (DType::Bool, v.len(), false, v.as_ptr() as *mut u8),
                BufRef::I32(v) => (DType::I32, v.len(), false, v.as_ptr() as *mut u8),
                BufRef::I64(v) => (DType::I64, v.len(), false, v.as_ptr() as *mut u8),
                BufRef::F32(v) => (DType::F32, v.len(), false, v.as_ptr() as *mut u8),
                BufRef::F64(v) => (DType::F64, v.len(), false, v.as_ptr() as *mut u8),
            },
            Arg::WriteF32(v) => (DType::F32, v.len(), true, v.as_ptr() as *mut u8),
            Arg::Write(b) => {
                let p = match &**b {
                    HostBuffer::Bool(v) => v.as_ptr() as *mut u8,
                    HostBuffer::I32(v) => v.as_ptr() as *mut u8,
                    HostBuffer::I64(v) => v.as_ptr() as *mut u8,
                    HostBuffer::F32(v) => v.as_ptr() as *mut u8,
                    HostBuffer::F64(v) => v.as_ptr() as *mut u8,
                };
                (b.dtype(), b.len(), true, p)
            }
        }
    }
}

/// Stack bytes all ALLOCs of one program may use: rayon workers run on 2 MiB stacks.
pub const MAX_LOCAL_BYTES: usize = 256 * 1024;

type KernelFn = extern "C" fn(*const *mut u8, i64, i64);

/// A compiled loop program. Compile once, run many times, from any thread.
pub struct Program {
    name: String,
    func: KernelFn,
    // Kept only to free the code on drop; JITModule is Send but not Sync, hence the Mutex.
    module: Mutex<Option<JITModule>>,
    specs: Vec<BufferSpec>,
    thread_extent: Option<usize>,
    parallel: bool,
    clif: String,
    machine_code: Vec<u8>,
    linear: String,
    estimates: Estimates,
    compile_seconds: f64,
}

static ISA: LazyLock<Result<(OwnedTargetIsa, OwnedTargetIsa), String>> = LazyLock::new(|| {
    let build = |opt: &str| -> Result<OwnedTargetIsa, String> {
        let mut fb = settings::builder();
        fb.set("opt_level", opt).map_err(|e| e.to_string())?;
        fb.set("use_colocated_libcalls", "false").map_err(|e| e.to_string())?;
        fb.set("is_pic", "false").map_err(|e| e.to_string())?;
        let ib = cranelift_native::builder().map_err(|e| e.to_string())?;
        ib.finish(settings::Flags::new(fb)).map_err(|e| e.to_string())
    };
    Ok((build("speed")?, build("none")?))
});

fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        true
    }
}

impl Program {
    /// Verifies, simplifies and compiles `program` with default options.
    pub fn compile(program: &UOp, name: &str) -> Result<Program, JitError> {
        Program::compile_with(program, name, &JitOptions::default())
    }

    /// Verifies, simplifies and compiles `program`.
    ///
    /// Fails if the program is malformed, if any index cannot be proven inside its buffer, or if
    /// its THREAD range does not have a constant trip count.
    pub fn compile_with(program: &UOp, name: &str, opts: &JitOptions) -> Result<Program, JitError> {
        let t0 = Instant::now();
        // The user's program is checked as written; the simplified one is what gets lowered.
        let original = verify(program)?;
        let specs = buffer_specs(program, &original)?;
        let expanded = if opts.tile_calls { program.clone() } else { uopc_ir::expand_tile_ops(program) };
        if expanded != *program {
            // The expansion must order its stores like any program; the lenient check of the
            // simplified program below does not look at store order.
            verify(&expanded).map_err(|e| {
                JitError::Unsupported(format!("{name}: the reference loops of its tile ops: {e}"))
            })?;
        }
        let program = simplify(&expanded);
        let lin = verify_simplified(&program)?;
        let thread_extent = match &lin.thread {
            Some(t) => Some(
                t.src()[0]
                    .const_int()
                    .ok_or_else(|| {
                        JitError::Unsupported(format!(
                            "{}: the THREAD range needs a constant trip count",
                            t.short()
                        ))
                    })?
                    .max(0) as usize,
            ),
            None => None,
        };
        let local_bytes: usize = lin
            .allocs
            .iter()
            .map(|a| match a.op() {
                Op::Alloc { len, .. } => len.saturating_mul(a.dtype().size()),
                _ => 0,
            })
            .fold(0usize, usize::saturating_add);
        if local_bytes > MAX_LOCAL_BYTES {
            return Err(JitError::Unsupported(format!(
                "{name}: ALLOCs need {local_bytes} bytes of stack; the limit is {MAX_LOCAL_BYTES} (worker threads have small stacks)"
            )));
        }
        let parallel = lin.thread.as_ref().is_some_and(|t| threads_write_disjoint(&program, t));

        let (speed, none) = ISA.as_ref().map_err(|e| JitError::Codegen(format!("no native ISA: {e}")))?;
        let level = match opts.opt_level {
            OptLevel::Auto if opts.vectorize && lower::gemm_like(&lin) => OptLevel::None,
            OptLevel::Auto => OptLevel::Speed,
            l => l,
        };
        let isa = match level {
            OptLevel::None => none.clone(),
            _ => speed.clone(),
        };
        let mut jb = JITBuilder::with_isa(isa, cranelift_module::default_libcall_names());
        for (sym, addr) in lower::EXTERN_SYMBOLS {
            jb.symbol(sym, addr);
        }
        let mut module = JITModule::new(jb);
        let mut ctx = module.make_context();
        ctx.set_disasm(false);
        let ptr = types::I64;
        ctx.func.signature.params.extend([
            AbiParam::new(ptr),
            AbiParam::new(types::I64),
            AbiParam::new(types::I64),
        ]);
        ctx.func.name = UserFuncName::user(0, 0);

        let mut ext_ids = Vec::new();
        for (k, (sym, _)) in lower::EXTERN_SYMBOLS.iter().enumerate() {
            let mut sig = module.make_signature();
            lower::extern_signature(k, &mut sig);
            let id = module
                .declare_function(sym, Linkage::Import, &sig)
                .map_err(|e| JitError::Codegen(format!("declaring {sym}: {e}")))?;
            ext_ids.push(id);
        }

        let mut fbc = FunctionBuilderContext::new();
        {
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fbc);
            let fr: Vec<_> = ext_ids.iter().map(|id| module.declare_func_in_func(*id, b.func)).collect();
            let externs = lower::Externs {
                exp2_f64: fr[0],
                log2_f32: fr[1],
                log2_f64: fr[2],
                tile_gemm: fr[3],
                tile_softmax: fr[4],
            };
            let entry = b.create_block();
            b.append_block_params_for_function_params(entry);
            b.switch_to_block(entry);
            let params = b.block_params(entry).to_vec();
            let flags = lower::Flags {
                fma: has_fma(),
                contract: opts.contract_fma,
                reassociate: opts.reassociate,
                vectorize: opts.vectorize,
                // Two reduce steps per trip only pay where the emitted order is kept.
                tile_unroll: if level == OptLevel::None { opts.tile_steps.max(1) as i64 } else { 1 },
                keeps_order: level == OptLevel::None,
            };
            let mut l = lower::Lowerer::new(&mut b, externs, flags, params[0], params[1], params[2]);
            l.lower(&lin)?;
            b.ins().return_(&[]);
            b.seal_all_blocks();
            b.finalize(module.target_config());
        }
        let clif = ctx.func.display().to_string();
        if opts.verify_clif {
            cranelift_codegen::verifier::verify_function(&ctx.func, module.isa())
                .map_err(|e| JitError::Codegen(format!("CLIF verifier: {e}")))?;
        }
        let id = module
            .declare_anonymous_function(&ctx.func.signature)
            .map_err(|e| JitError::Codegen(e.to_string()))?;
        module.define_function(id, &mut ctx).map_err(|e| JitError::Codegen(format!("{e:?}")))?;
        let machine_code = ctx.compiled_code().map(|c| c.code_buffer().to_vec()).unwrap_or_default();
        module.clear_context(&mut ctx);
        module.finalize_definitions().map_err(|e| JitError::Codegen(e.to_string()))?;
        let code = module.get_finalized_function(id);
        // SAFETY: the function was built with exactly this signature above, and its code lives
        // as long as `module`, which the Program owns and frees only on drop.
        let func: KernelFn = unsafe { std::mem::transmute::<*const u8, KernelFn>(code) };
        let estimates = estimate::estimate(&lin);
        Ok(Program {
            name: name.to_string(),
            func,
            module: Mutex::new(Some(module)),
            specs,
            thread_extent,
            parallel,
            clif,
            machine_code,
            linear: uopc_ir::print_linear(&lin),
            estimates,
            compile_seconds: t0.elapsed().as_secs_f64(),
        })
    }

    /// The name given at compile time.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The arguments the program expects, by slot.
    pub fn buffers(&self) -> &[BufferSpec] {
        &self.specs
    }

    /// The generated Cranelift IR, as text.
    pub fn clif(&self) -> &str {
        &self.clif
    }

    /// The generated x86-64 (or host) machine code, for a disassembler
    /// (`objdump -D -b binary -m i386:x86-64` reads it as is).
    pub fn machine_code(&self) -> &[u8] {
        &self.machine_code
    }

    /// The (simplified) loop program, pretty-printed as nested loops.
    pub fn loop_ir(&self) -> &str {
        &self.linear
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

    /// Runs the program on f32 buffers: `inputs` fill the read-only slots and `outputs` the
    /// written ones, each in slot order.
    pub fn run_f32(&self, inputs: &[&[f32]], outputs: &mut [&mut [f32]]) -> Result<(), JitError> {
        let n_in = self.specs.iter().filter(|s| !s.written).count();
        let n_out = self.specs.len() - n_in;
        if inputs.len() != n_in || outputs.len() != n_out {
            return Err(JitError::Argument(format!(
                "{}: expects {n_in} inputs and {n_out} outputs, got {} and {}",
                self.name,
                inputs.len(),
                outputs.len()
            )));
        }
        let mut ins = inputs.iter();
        let mut outs = outputs.iter_mut();
        let mut args: Vec<Arg<'_>> = Vec::with_capacity(self.specs.len());
        for s in &self.specs {
            if s.written {
                args.push(Arg::WriteF32(outs.next().expect("counted above")));
            } else {
                args.push(Arg::Read(BufRef::F32(ins.next().expect("counted above"))));
            }
        }
        self.run(&mut args)
    }

    /// Runs the program: one argument per BUFFER slot, in slot order, of the exact dtype and
    /// length the program declares; buffers the program writes must be passed as writable.
    pub fn run(&self, args: &mut [Arg<'_>]) -> Result<(), JitError> {
        if args.len() != self.specs.len() {
            return Err(JitError::Argument(format!(
                "{}: expects {} buffers, got {}",
                self.name,
                self.specs.len(),
                args.len()
            )));
        }
        let mut ptrs: Vec<*mut u8> = Vec::with_capacity(args.len());
        for (s, a) in self.specs.iter().zip(args.iter()) {
            let (dtype, len, writable, p) = a.describe();
            let who = format!("{}: buffer {}", self.name, s.slot);
            if dtype != s.dtype {
                return Err(JitError::Argument(format!("{who} must be {}, got {dtype}", s.dtype)));
            }
            if len != s.len {
                return Err(JitError::Argument(format!("{who} must have {} elements, got {len}", s.len)));
            }
            if s.written && !writable {
                return Err(JitError::Argument(format!(
                    "{who} is written by the program but was passed read-only"
                )));
            }
            ptrs.push(p);
        }
        // SAFETY (for every call below): each pointer is valid for its declared length and
        // dtype (checked above); the verifier proved every index in bounds; written buffers are
        // exclusive borrows, so nothing else reads or writes them during the call; parallel
        // chunks only run when the compiler proved THREAD iterations write disjoint memory.
        let ptrs = SendPtrs(ptrs);
        let f = self.func;
        match self.thread_extent {
            Some(n) if self.parallel && n > 1 => {
                let threads = rayon::current_num_threads().max(1);
                // Many more chunks than threads, handed out one at a time from the last: when
                // iterations grow in cost along the range (causal attention's query blocks
                // see more keys the further down they are), the longest start first and the
                // short ones fill in at the end (longest-processing-time-first scheduling);
                // for equal costs the order does not matter.
                let chunks = (threads * 16).min(n);
                let next = std::sync::atomic::AtomicUsize::new(0);
                let p = &ptrs;
                (0..threads.min(chunks)).into_par_iter().for_each(|_| {
                    loop {
                        let taken = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if taken >= chunks {
                            break;
                        }
                        let c = chunks - 1 - taken;
                        let lo = n * c / chunks;
                        let hi = n * (c + 1) / chunks;
                        f(p.0.as_ptr(), lo as i64, hi as i64);
                    }
                });
            }
            Some(n) => f(ptrs.0.as_ptr(), 0, n as i64),
            None => f(ptrs.0.as_ptr(), 0, 0),
        }
        Ok(())
    }
}

struct SendPtrs(Vec<*mut u8>);
// SAFETY: the pointers are only dereferenced by JIT code under the conditions stated in `run`.
unsafe impl Sync for SendPtrs {}
unsafe impl Send for SendPtrs {}

impl Drop for Program {
    fn drop(&mut self) {
        let module = self.module.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(m) = module {
            // SAFETY: `func` is no longer callable once the Program is dropped.
            unsafe { m.free_memory() };
        }
    }
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program").field("name", &self.name).field("buffers", &self.specs).finish()
    }
}

/// The BUFFERs and ALLOCs some STORE or tile op writes.
pub(crate) fn written_bases<'a>(nodes: impl IntoIterator<Item = &'a UOp>) -> Vec<UOp> {
    let mut out = Vec::new();
    for u in nodes {
        match u.op() {
            Op::Store => out.extend(view_base(&u.src()[0].src()[0]).cloned()),
            Op::Tile(t) => {
                for (x, o) in u.src().iter().zip(t.operands()) {
                    if o.writes {
                        out.extend(view_base(&x.src()[0]).cloned());
                    }
                }
            }
            _ => {}
        }
    }
    out
}

fn buffer_specs(program: &UOp, lin: &Linear) -> Result<Vec<BufferSpec>, JitError> {
    let written = written_bases(&UOp::toposort(std::slice::from_ref(program)));
    let mut specs = Vec::new();
    for (k, b) in lin.buffers.iter().enumerate() {
        let Op::Buffer { slot, len } = b.op() else { continue };
        if *slot != k {
            return Err(JitError::Unsupported(format!(
                "buffer slots must be 0..n without gaps; missing slot {k}"
            )));
        }
        specs.push(BufferSpec { slot: *slot, dtype: b.dtype(), len: *len, written: written.contains(b) });
    }
    Ok(specs)
}

/// True when every access to every written buffer is `c * t + r` with `0 <= r < c`, for one
/// stride `c` per buffer: then THREAD iteration `t` only touches `[c*t, c*t + c)`. A tile
/// operand covers `r .. r + extent`, which must stay below `c` too.
fn threads_write_disjoint(program: &UOp, thread: &UOp) -> bool {
    if thread.src()[0].vmax() <= 1 {
        return true; // one iteration cannot race with itself
    }
    let topo = UOp::toposort(std::slice::from_ref(program));
    let mut stride: std::collections::HashMap<UOp, i64> = std::collections::HashMap::new();
    // A tile operand touches a block of elements from its INDEX on, not one element.
    let mut extent: std::collections::HashMap<UOp, i64> = std::collections::HashMap::new();
    for u in &topo {
        if let Op::Tile(t) = u.op() {
            for (x, o) in u.src().iter().zip(t.operands()) {
                let e = extent.entry(x.clone()).or_insert(1);
                *e = (*e).max(o.extent as i64);
            }
        }
    }
    let written: Vec<UOp> =
        written_bases(&topo).into_iter().filter(|b| matches!(b.op(), Op::Buffer { .. })).collect();
    for u in &topo {
        let Op::Index = u.op() else { continue };
        let Some(base) = view_base(&u.src()[0]) else { continue };
        if !written.contains(base) {
            continue;
        }
        let Some((c, rest)) = split_linear(&u.src()[1], thread) else { return false };
        let span = extent.get(u).copied().unwrap_or(1).max(1);
        if c <= 0 || rest.vmin() < 0 || rest.vmax().saturating_add(span - 1) >= c {
            return false;
        }
        if *stride.entry(base.clone()).or_insert(c) != c {
            return false;
        }
    }
    true
}

//! Translation of a prepared kernel into machine code: declare the function and its callees,
//! emit its CLIF, finalize. Every question about the program was answered by
//! [`uopc_ir::prepare`]; nothing here inspects the IR beyond what the lowering walks.

use crate::externs::{DeclaredExterns, Extern};
use crate::isa::{has_fma, host_isas};
use crate::lower::{Flags, Lowerer};
use crate::{JitError, JitOptions, OptLevel};
use cranelift_codegen::Context;
use cranelift_codegen::ir::{AbiParam, Function, InstBuilder, UserFuncName, types};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::Module;
use uopc_ir::PreparedKernel;

/// The signature of every kernel: `(bufs, lo, hi, vars)` with `bufs` the buffer pointers by
/// slot, `lo..hi` the slice of the THREAD range one call runs (`0..0` without a THREAD range)
/// and `vars` the variables' values by slot.
///
/// Calling it is sound only with what [`crate::Program::run_with_vars`] checks: a pointer per
/// slot valid for the slot's declared dtype and length, written slots not aliased, a value per
/// variable slot inside its declared bounds (every bounds proof assumed them), and
/// `0 <= lo <= hi <=` the THREAD range's trip count for those values.
pub(crate) type KernelFn = unsafe extern "C" fn(*const *mut u8, i64, i64, *const i64);

/// A kernel in executable memory.
pub(crate) struct Compiled {
    /// Owns the code; freeing it invalidates `entry`.
    pub module: JITModule,
    pub entry: KernelFn,
    /// The function as translated, before Cranelift optimized it (its text is the CLIF).
    pub function: Function,
    pub machine_code: Vec<u8>,
}

/// Translates `kernel` at `level` into a function of its own JIT module.
pub(crate) fn compile(
    kernel: &PreparedKernel,
    level: OptLevel,
    opts: &JitOptions,
) -> Result<Compiled, JitError> {
    let isas = host_isas().map_err(JitError::Isa)?;
    let isa = match level {
        OptLevel::None => isas.none.clone(),
        _ => isas.speed.clone(),
    };
    let mut jb = JITBuilder::with_isa(isa, cranelift_module::default_libcall_names());
    Extern::register_all(&mut jb);
    let mut module = JITModule::new(jb);
    let externs = DeclaredExterns::declare(&mut module)?;
    let mut ctx = module.make_context();
    ctx.set_disasm(false);
    ctx.func.signature.params.extend([
        AbiParam::new(types::I64),
        AbiParam::new(types::I64),
        AbiParam::new(types::I64),
        AbiParam::new(types::I64),
    ]);
    ctx.func.name = UserFuncName::user(0, 0);
    let flags = Flags {
        fma: has_fma(),
        contract: opts.contract_fma,
        reassociate: opts.reassociate,
        vectorize: opts.vectorize,
        // Two reduce steps per trip only pay where the emitted order is kept.
        tile_unroll: if level == OptLevel::None { opts.tile_steps.max(1) as i64 } else { 1 },
        keeps_order: level == OptLevel::None,
    };
    translate(kernel, &mut module, &externs, flags, &mut ctx.func)?;
    let function = ctx.func.clone();
    if opts.verify_clif {
        cranelift_codegen::verifier::verify_function(&ctx.func, module.isa())?;
    }
    finalize(module, ctx, function)
}

/// Emits the CLIF of `kernel` into `func` (which has the kernel signature).
fn translate(
    kernel: &PreparedKernel,
    module: &mut JITModule,
    externs: &DeclaredExterns,
    flags: Flags,
    func: &mut Function,
) -> Result<(), JitError> {
    let mut fbc = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(func, &mut fbc);
    let callees = externs.in_function(module, b.func);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let params = b.block_params(entry).to_vec();
    let mut l = Lowerer::new(&mut b, callees, flags, params[0], params[1], params[2], params[3]);
    l.lower(kernel)?;
    b.ins().return_(&[]);
    b.seal_all_blocks();
    b.finalize(module.target_config());
    Ok(())
}

/// Compiles the function in `ctx` and makes it executable.
fn finalize(mut module: JITModule, mut ctx: Context, function: Function) -> Result<Compiled, JitError> {
    let id = module.declare_anonymous_function(&ctx.func.signature)?;
    module.define_function(id, &mut ctx)?;
    let machine_code = ctx.compiled_code().map(|c| c.code_buffer().to_vec()).unwrap_or_default();
    module.clear_context(&mut ctx);
    module.finalize_definitions()?;
    let code = module.get_finalized_function(id);
    // SAFETY: the function was declared with exactly the signature of `KernelFn` (four
    // pointer-sized integers, no result), and its code lives as long as `module`, which the
    // caller keeps beside the pointer and frees only when it is no longer called.
    let entry = unsafe { std::mem::transmute::<*const u8, KernelFn>(code) };
    Ok(Compiled { module, entry, function, machine_code })
}

//! Measures this machine's F32X4 FMA peak with JIT-compiled code: the ceiling every uopc
//! kernel is compared against (Cranelift lowers no vector wider than 128 bits on x86-64).

use crate::JitError;
use crate::isa::{has_fma, host_isas};
use cranelift_codegen::ir::{AbiParam, BlockArg, InstBuilder, UserFuncName, types};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::Module;
use rayon::prelude::*;
use std::time::Instant;

/// Independent accumulator chains: enough to cover FMA latency times throughput (4 x 2).
const CHAINS: usize = 12;
/// FLOPs of one loop iteration: every chain does one F32X4 FMA (2 flops x 4 lanes).
const FLOPS_PER_ITER: f64 = (CHAINS * 8) as f64;

type PeakFn = unsafe extern "C" fn(i64) -> f32;

/// Best GFLOP/s of `reps` runs of a JIT-compiled loop of independent F32X4 FMA chains on
/// every thread of the current rayon pool (`iters` loop iterations per thread per run).
pub fn fma_peak_gflops(iters: u64, reps: usize) -> Result<f64, JitError> {
    let isa = &host_isas().map_err(JitError::Isa)?.speed;
    if !has_fma() {
        return Err(JitError::Unsupported("the CPU has no FMA".into()));
    }
    let mut module =
        JITModule::new(JITBuilder::with_isa(isa.clone(), cranelift_module::default_libcall_names()));
    let mut ctx = module.make_context();
    ctx.func.signature.params.push(AbiParam::new(types::I64));
    ctx.func.signature.returns.push(AbiParam::new(types::F32));
    ctx.func.name = UserFuncName::user(0, 1);
    let mut fbc = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fbc);
        let entry = b.create_block();
        let body = b.create_block();
        let exit = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let n = b.block_params(entry)[0];
        let one = b.ins().f32const(1.0);
        let mul = b.ins().f32const(0.999_999);
        let add = b.ins().f32const(1e-7);
        let (one, mul, add) = (
            b.ins().splat(types::F32X4, one),
            b.ins().splat(types::F32X4, mul),
            b.ins().splat(types::F32X4, add),
        );
        let zero = b.ins().iconst(types::I64, 0);
        let mut args: Vec<BlockArg> = vec![zero.into()];
        args.extend((0..CHAINS).map(|_| BlockArg::from(one)));
        b.append_block_param(body, types::I64);
        for _ in 0..CHAINS {
            b.append_block_param(body, types::F32X4);
        }
        b.ins().jump(body, &args);
        b.switch_to_block(body);
        let params = b.block_params(body).to_vec();
        // acc = acc * mul + add: the accumulator is the tied first operand, used once.
        let mut next: Vec<BlockArg> = Vec::new();
        let i = b.ins().iadd_imm_s(params[0], 1);
        next.push(i.into());
        for acc in &params[1..] {
            next.push(b.ins().fma(*acc, mul, add).into());
        }
        let more = b.ins().icmp(cranelift_codegen::ir::condcodes::IntCC::SignedLessThan, i, n);
        // The exit gets the new values, so old and new accumulators are never live together.
        for _ in 0..CHAINS {
            b.append_block_param(exit, types::F32X4);
        }
        b.ins().brif(more, body, &next, exit, &next[1..]);
        b.switch_to_block(exit);
        // Sum the chains so none is dead code.
        let accs = b.block_params(exit).to_vec();
        let mut s = accs[0];
        for acc in &accs[1..] {
            s = b.ins().fadd(s, *acc);
        }
        let lane = b.ins().extractlane(s, 0);
        b.ins().return_(&[lane]);
        b.seal_all_blocks();
        b.finalize(module.target_config());
    }
    let id = module.declare_anonymous_function(&ctx.func.signature)?;
    module.define_function(id, &mut ctx)?;
    module.finalize_definitions()?;
    // SAFETY: built above with exactly this signature; the module outlives every call below.
    let f: PeakFn = unsafe { std::mem::transmute::<*const u8, PeakFn>(module.get_finalized_function(id)) };
    let threads = rayon::current_num_threads().max(1);
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        // SAFETY: the function reads no memory; it only loops `iters` times on registers.
        let sink: f32 = (0..threads).into_par_iter().map(|_| unsafe { f(iters as i64) }).sum();
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(sink);
    }
    // SAFETY: no call of `f` is running any more.
    unsafe { module.free_memory() };
    Ok(FLOPS_PER_ITER * iters as f64 * threads as f64 / best / 1e9)
}

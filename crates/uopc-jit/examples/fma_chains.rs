//! Probe: how fast do F32X4 FMA chains run when each FMA's tied operand is a fresh broadcast
//! load (the form register tiles take at `opt_level=none`)? Prints GFLOP/s on one thread for
//! several chain counts against the plain peak loop. `cargo run --release -p uopc-jit
//! --example fma_chains [iters]`; a column `CxS/V` is C chains, S reduce steps per loop trip
//! and V shared vectors per step. `VEC=1` makes the tied operand a fresh vector load instead
//! of a broadcast; `DUMP=dir` writes each loop's machine code to `dir` for `objdump`.
use cranelift_codegen::ir::{AbiParam, BlockArg, InstBuilder, MemFlagsData, UserFuncName, types};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::Module;
use std::time::Instant;

type Kernel = extern "C" fn(i64, *const f32) -> f32;

/// The environment switches, read once.
struct Switches {
    /// `VEC`: the tied operand is a fresh F32X4 load, not a broadcast load.
    vector_operand: bool,
    /// `DUMP`: where to write each loop's machine code.
    dump_dir: Option<String>,
}

/// A loop of `steps` reduce steps per trip; each step loads `shared_vectors` vectors and runs
/// `chains` FMAs `acc = splat(load) * shared + acc`, chain `c` using shared vector
/// `c % shared_vectors` and the broadcast of element `c / shared_vectors` (as in a tile of
/// `chains / shared_vectors` rows by `shared_vectors` vectors).
fn build(
    module: &mut JITModule,
    switches: &Switches,
    chains: usize,
    steps: usize,
    shared_vectors: usize,
) -> Kernel {
    let mut ctx = module.make_context();
    ctx.func.signature.params.push(AbiParam::new(types::I64));
    ctx.func.signature.params.push(AbiParam::new(types::I64));
    ctx.func.signature.returns.push(AbiParam::new(types::F32));
    ctx.func.name = UserFuncName::user(0, (chains * 100 + steps * 10 + shared_vectors) as u32);
    let mut fbc = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fbc);
        let entry = b.create_block();
        let head = b.create_block();
        let body = b.create_block();
        let exit = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let n = b.block_params(entry)[0];
        let ptr = b.block_params(entry)[1];
        let z = b.ins().f32const(0.0);
        let zero_v = b.ins().splat(types::F32X4, z);
        let zero = b.ins().iconst(types::I64, 0);
        let mut args: Vec<BlockArg> = vec![zero.into()];
        args.extend((0..chains).map(|_| BlockArg::from(zero_v)));
        b.append_block_param(head, types::I64);
        for _ in 0..chains {
            b.append_block_param(head, types::F32X4);
        }
        b.ins().jump(head, &args);
        b.switch_to_block(head);
        let params = b.block_params(head).to_vec();
        let more = b.ins().icmp(cranelift_codegen::ir::condcodes::IntCC::SignedLessThan, params[0], n);
        for _ in 0..chains {
            b.append_block_param(exit, types::F32X4);
        }
        let pass: Vec<BlockArg> = params[1..].iter().map(|v| (*v).into()).collect();
        b.ins().brif(more, body, &[], exit, &pass);
        b.switch_to_block(body);
        let flags = MemFlagsData::trusted();
        let mut accs = params[1..].to_vec();
        for s in 0..steps {
            let shared: Vec<_> = (0..shared_vectors)
                .map(|v| b.ins().load(types::F32X4, flags, ptr, ((s * shared_vectors + v) * 16) as i32))
                .collect();
            for (c, acc) in accs.iter_mut().enumerate() {
                let off = 1024 + ((s * chains + c / shared_vectors) * 4) as i32;
                let x = if switches.vector_operand {
                    b.ins().load(types::F32X4, flags, ptr, off)
                } else {
                    let x = b.ins().load(types::F32, flags, ptr, off);
                    b.ins().splat(types::F32X4, x)
                };
                *acc = b.ins().fma(x, shared[c % shared_vectors], *acc);
            }
        }
        let i = b.ins().iadd_imm_s(params[0], 1);
        let mut next: Vec<BlockArg> = vec![i.into()];
        next.extend(accs.iter().map(|v| BlockArg::from(*v)));
        b.ins().jump(head, &next);
        b.switch_to_block(exit);
        let accs = b.block_params(exit).to_vec();
        let mut s = accs[0];
        for a in &accs[1..] {
            s = b.ins().fadd(s, *a);
        }
        let lane = b.ins().extractlane(s, 0);
        b.ins().return_(&[lane]);
        b.seal_all_blocks();
        b.finalize(module.target_config());
    }
    let id = module.declare_anonymous_function(&ctx.func.signature).unwrap();
    module.define_function(id, &mut ctx).unwrap();
    if let Some(dir) = &switches.dump_dir {
        let code = ctx.compiled_code().unwrap().code_buffer().to_vec();
        std::fs::write(format!("{dir}/chains_{chains}x{steps}_{shared_vectors}.bin"), code).unwrap();
    }
    module.clear_context(&mut ctx);
    module.finalize_definitions().unwrap();
    // SAFETY: built above with this signature; the module lives to the end of main.
    unsafe { std::mem::transmute::<*const u8, Kernel>(module.get_finalized_function(id)) }
}

fn main() {
    let iters: i64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000_000);
    let mut fb = settings::builder();
    fb.set("opt_level", "none").unwrap();
    fb.set("enable_verifier", "false").unwrap();
    let isa = cranelift_native::builder().unwrap().finish(settings::Flags::new(fb)).unwrap();
    let mut module = JITModule::new(JITBuilder::with_isa(isa, cranelift_module::default_libcall_names()));
    let data: Vec<f32> = (0..4096).map(|i| 1.0 + (i % 7) as f32 * 1e-9).collect();
    let configs = [(8, 4, 1), (8, 4, 2), (10, 4, 2), (12, 4, 1), (12, 4, 2), (12, 4, 3), (8, 8, 1)];
    let switches =
        Switches { vector_operand: std::env::var("VEC").is_ok(), dump_dir: std::env::var("DUMP").ok() };
    let kernels: Vec<_> = configs.iter().map(|&(c, s, v)| build(&mut module, &switches, c, s, v)).collect();
    for round in 0..3 {
        let peak = uopc_jit::peak::fma_peak_gflops(iters as u64 / 4, 3).unwrap_or(0.0);
        print!("round {round}: peak {peak:.1}");
        for (k, &(c, s, v)) in kernels.iter().zip(&configs) {
            let trips = iters / (c * s) as i64;
            let mut best = f64::INFINITY;
            for _ in 0..3 {
                let t = Instant::now();
                std::hint::black_box(k(trips, data.as_ptr()));
                best = best.min(t.elapsed().as_secs_f64());
            }
            let gf = (trips * (c * s) as i64 * 8) as f64 / best / 1e9;
            print!(" | {c}x{s}/{v}: {gf:.1} ({:.0}%)", 100.0 * gf / peak);
        }
        println!();
    }
}

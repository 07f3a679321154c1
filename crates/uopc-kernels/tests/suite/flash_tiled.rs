//! `flash_tiled` (FlashAttention-2 tiling in loop IR) against an f64 reference, and the shape of
//! the code it compiles to.

use uopc_kernels::flash_tiled::{FlashTiled, FlashTiling};
use uopc_kernels::reference::{attention_f64, max_abs_err};
use uopc_testgen::rng::uniform_values as pseudo_random;

/// Outputs are convex combinations of V rows (|v| < 1): f32 sums over n keys plus exp2's
/// ~1e-7 relative error stay far below 1e-5; a missing rescale or a wrong mask is off by 1e-2.
const TOL: f64 = 1e-5;

fn run(n: usize, d: usize, tiling: FlashTiling, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
    let mut f = FlashTiled::compile(n, d, tiling).expect("compiles");
    let mut out = vec![0.0f32; n * d];
    f.run(q, k, v, &mut out).expect("runs");
    out
}

#[test]
fn flash_tiled_matches_f64_with_tails() {
    // n not a multiple of the key block (padded, masked keys) or of the query block (smaller
    // divisor), odd head dimensions (vector tails in the D loops)
    let shapes = [(1, 1), (3, 5), (7, 13), (8, 64), (33, 64), (100, 7), (257, 16), (512, 64)];
    for (n, d) in shapes {
        let (q, k, v) = (pseudo_random(n * d, 1), pseudo_random(n * d, 2), pseudo_random(n * d, 3));
        let want = attention_f64(&q, &k, &v, n, d);
        for tiling in [
            FlashTiling::default(),
            FlashTiling { query_block: 3, key_block: 12 },
            FlashTiling { query_block: 1, key_block: 4 },
        ] {
            let err = max_abs_err(&run(n, d, tiling, &q, &k, &v), &want);
            assert!(err <= TOL, "n={n} d={d} {tiling:?}: max abs err {err:e}");
        }
    }
}

#[test]
fn flash_tiled_rescales_when_the_max_arrives_late() {
    // scores grow along the keys: every key block raises the running max
    let (n, d) = (64, 8);
    let q = vec![1.0f32; n * d];
    let k: Vec<f32> = (0..n * d).map(|x| ((x / d) as f32) * 0.25).collect();
    let v = pseudo_random(n * d, 9);
    let err = max_abs_err(&run(n, d, FlashTiling::default(), &q, &k, &v), &attention_f64(&q, &k, &v, n, d));
    assert!(err <= TOL, "late max: {err:e}");
}

#[test]
fn flash_tiled_score_tile_is_packed_f32x4_fmas() {
    // The register tile is the IR's decision: 8 score accumulators per query block (plus the
    // output tile's), all kept in registers by the prepared kernel.
    let (n, d) = (256, 64);
    let program = uopc_kernels::flash_tiled::flash_tiled_ir(n, d, FlashTiling::default());
    let prepared = uopc_ir::prepare(&program, &uopc_ir::PrepareOptions::default()).unwrap();
    assert!(prepared.register_allocs.len() >= 8, "{} register ALLOCs", prepared.register_allocs.len());
    // Packing those accumulators into F32X4 FMAs and loads is decided only while lowering to
    // Cranelift, so it can only be seen in the CLIF.
    let f = FlashTiled::compile(n, d, FlashTiling::default()).unwrap();
    let clif = f.kernel().clif();
    assert!(!clif.contains("call"), "no per-element calls");
    // register tiles of 8 keys: 8 vector accumulators, each a broadcast k times the rows' vector of q
    let splat_fmas = clif.lines().filter(|l| l.contains("= fma")).count();
    assert!(splat_fmas >= 8, "{clif}");
    assert!(clif.contains("load.f32x4"), "vector loads of the rows' q");
    assert!(f.kernel().is_parallel(), "query blocks write disjoint rows");
}

#[test]
fn bad_sizes_are_errors() {
    assert!(FlashTiled::compile(0, 64, FlashTiling::default()).is_err());
    assert!(FlashTiled::compile(16, 64, FlashTiling { query_block: 4, key_block: 0 }).is_err());
    let mut f = FlashTiled::compile(16, 8, FlashTiling::default()).unwrap();
    let x = vec![0.0f32; 16 * 8];
    let mut short = vec![0.0f32; 16 * 8 - 1];
    assert!(f.run(&x, &x, &x, &mut short).is_err());
}

mod tile_ops {
    use super::*;
    use uopc_ir::HostBuffer;
    use uopc_ir::interp::{self, Precision};
    use uopc_kernels::flash_tile_ops::{FlashTileOps, TILE_OPS_TILING, flash_tile_ops_ir, scale_queries_ir};

    fn run_tile_ops(n: usize, d: usize, tiling: FlashTiling, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
        let mut f = FlashTileOps::compile(n, d, tiling).expect("compiles");
        let mut out = vec![0.0f32; n * d];
        f.run(q, k, v, &mut out).expect("runs");
        out
    }

    #[test]
    fn flash_on_tile_ops_matches_f64_with_tails() {
        // key counts that leave a narrower last block, query blocks that are not 64
        let shapes = [(1, 1), (3, 5), (7, 13), (33, 64), (100, 7), (257, 16), (300, 64)];
        for (n, d) in shapes {
            let (q, k, v) = (pseudo_random(n * d, 1), pseudo_random(n * d, 2), pseudo_random(n * d, 3));
            let want = attention_f64(&q, &k, &v, n, d);
            for tiling in [
                TILE_OPS_TILING,
                FlashTiling { query_block: 4, key_block: 8 },
                FlashTiling { query_block: 3, key_block: 5 },
            ] {
                let err = max_abs_err(&run_tile_ops(n, d, tiling, &q, &k, &v), &want);
                assert!(err <= TOL, "n={n} d={d} {tiling:?}: max abs err {err:e}");
            }
        }
    }

    #[test]
    fn tile_ops_program_agrees_with_the_interpreter() {
        // The interpreter runs the tile ops' reference semantics (plain loops, every access
        // bounds-checked), the JIT calls the micro-kernels.
        let (n, d) = (21, 6);
        let tiling = FlashTiling { query_block: 7, key_block: 8 };
        let (q, k, v) = (pseudo_random(n * d, 4), pseudo_random(n * d, 5), pseudo_random(n * d, 6));
        let mut qs = vec![HostBuffer::F32(q.clone()), HostBuffer::F32(vec![0.0; n * d])];
        interp::run(&scale_queries_ir(n, d), &mut qs, Precision::Native).unwrap();
        let mut bufs = vec![
            qs[1].clone(),
            HostBuffer::F32(k.clone()),
            HostBuffer::F32(v.clone()),
            HostBuffer::F32(vec![0.0; n * d]),
        ];
        interp::run(&flash_tile_ops_ir(n, d, tiling), &mut bufs, Precision::Native).unwrap();
        let HostBuffer::F32(reference) = &bufs[3] else { unreachable!() };
        let jit = run_tile_ops(n, d, tiling, &q, &k, &v);
        let diff = jit.iter().zip(reference).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(diff <= 1e-6, "JIT vs interpreter: {diff:e}");
    }

    #[test]
    fn l2_blocked_tile_ops_match_f64_and_the_interpreter() {
        use uopc_kernels::flash_tile_ops::{L2Blocking, flash_tile_ops_l2_ir};
        // (n, d, query block, key block, blocking): groups and super-blocks that divide
        // evenly, that must be rounded down, and one that does not fit (plain loop)
        let cases = [
            (64, 8, 8, 4, L2Blocking { query_blocks: 2, keys: 16 }),
            (96, 5, 8, 8, L2Blocking { query_blocks: 5, keys: 40 }),
            (40, 3, 4, 8, L2Blocking { query_blocks: 3, keys: 24 }),
            (30, 4, 5, 4, L2Blocking { query_blocks: 2, keys: 8 }),
        ];
        for (n, d, br, bc, l2) in cases {
            let tiling = FlashTiling { query_block: br, key_block: bc };
            let (q, k, v) = (pseudo_random(n * d, 7), pseudo_random(n * d, 8), pseudo_random(n * d, 9));
            let want = attention_f64(&q, &k, &v, n, d);
            let mut f = FlashTileOps::compile_l2(n, d, tiling, l2).expect("compiles");
            let mut out = vec![0.0f32; n * d];
            f.run(&q, &k, &v, &mut out).expect("runs");
            let err = max_abs_err(&out, &want);
            assert!(err <= TOL, "n={n} d={d} {tiling:?} {l2:?}: max abs err {err:e}");
            assert!(f.kernel().is_parallel(), "tasks own disjoint query rows");
            // the interpreter, running the tile ops' reference semantics with every access
            // bounds-checked, agrees
            let mut qs = vec![HostBuffer::F32(q.clone()), HostBuffer::F32(vec![0.0; n * d])];
            interp::run(&scale_queries_ir(n, d), &mut qs, Precision::Native).unwrap();
            let mut bufs = vec![
                qs[1].clone(),
                HostBuffer::F32(k),
                HostBuffer::F32(v),
                HostBuffer::F32(vec![0.0; n * d]),
            ];
            interp::run(&flash_tile_ops_l2_ir(n, d, tiling, l2), &mut bufs, Precision::Native).unwrap();
            let HostBuffer::F32(reference) = &bufs[3] else { unreachable!() };
            let diff = out.iter().zip(reference).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(diff <= 1e-6, "JIT vs interpreter: {diff:e}");
        }
        // structure: at n = 4096 two query blocks per task (8 tasks), keys in 4 super-blocks
        use uopc_kernels::flash_tile_ops::{TILE_OPS_L2, TILE_OPS_L2_TILING};
        let f = FlashTileOps::compile_l2(4096, 64, TILE_OPS_L2_TILING, TILE_OPS_L2).unwrap();
        let loops = f.kernel().loop_ir();
        assert!(loops.contains("0..8 (thread)"), "{loops}");
        assert!(loops.contains("0..4 (reduce)") && loops.contains("0..2 (loop)"), "{loops}");
        assert!(loops.contains("0..16 (reduce)"), "16 key blocks per super-block: {loops}");
    }

    #[test]
    fn tile_ops_are_calls_not_loops() {
        let f = FlashTileOps::compile(1024, 64, FlashTiling { query_block: 64, key_block: 128 }).unwrap();
        assert!(f.kernel().is_parallel(), "query blocks write disjoint output rows");
        // The loop IR of the compiled kernel is the prepared program, where tile ops stay
        // nodes unless they are expanded into loops; the JIT lowers each node to one call.
        // Three in the key loop: two GEMMs and the softmax update.
        let loops = f.kernel().loop_ir();
        assert_eq!(loops.matches("tile_gemm ").count(), 2, "{loops}");
        assert_eq!(loops.matches("tile_softmax ").count(), 1, "{loops}");
        assert!(loops.contains("tile_gemm 64x128x64 B^T"), "{loops}");
        assert!(loops.contains("tile_softmax 64x128 d=64"), "{loops}");
        assert!(loops.contains("tile_gemm 64x64x128 +="), "{loops}");
    }
}

mod causal_tile_ops {
    use super::*;
    use uopc_kernels::flash_tile_ops::FlashTileOps;

    /// Causal softmax(Q K^T / sqrt(D)) V in f64: row i sees keys 0..=i.
    fn causal_f64(q: &[f32], k: &[f32], v: &[f32], n: usize, d: usize) -> Vec<f64> {
        let mut out = vec![0.0f64; n * d];
        let scale = 1.0 / (d as f64).sqrt();
        for i in 0..n {
            let s: Vec<f64> = (0..=i)
                .map(|j| (0..d).map(|e| q[i * d + e] as f64 * k[j * d + e] as f64).sum::<f64>() * scale)
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = p.iter().sum();
            for (j, pj) in p.iter().enumerate() {
                for e in 0..d {
                    out[i * d + e] += pj / l * v[j * d + e] as f64;
                }
            }
        }
        out
    }

    #[test]
    fn causal_flash_on_tile_ops_matches_f64() {
        for (n, d) in [(1, 3), (8, 4), (40, 8), (96, 16), (256, 64)] {
            let (q, k, v) = (pseudo_random(n * d, 7), pseudo_random(n * d, 8), pseudo_random(n * d, 9));
            let want = causal_f64(&q, &k, &v, n, d);
            // query blocks smaller, equal and larger than key blocks; blocks the diagonal
            // crosses in the middle
            for (qb, kb) in [(64, 256), (8, 16), (16, 8), (5, 3), (256, 128), (96, 64)] {
                let tiling = FlashTiling { query_block: qb, key_block: kb };
                let mut f = FlashTileOps::compile_with(n, d, tiling, true).expect("compiles");
                let mut out = vec![0.0f32; n * d];
                f.run(&q, &k, &v, &mut out).expect("runs");
                let err = max_abs_err(&out, &want);
                assert!(err <= TOL, "n={n} d={d} {tiling:?}: max abs err {err:e}");
            }
        }
    }

    #[test]
    fn causal_skips_blocks_above_the_diagonal() {
        // Both key loops end where the query block does: their trip counts are expressions of
        // the THREAD variable r0, not the 16 blocks of the full kernel. Far keys go in blocks
        // of 128, near ones in blocks of 64, and one 64x64 block on the diagonal is masked.
        let tiling = FlashTiling { query_block: 64, key_block: 128 };
        let causal = FlashTileOps::compile_with(2048, 64, tiling, true).unwrap();
        let loops = causal.kernel().loop_ir();
        let key_loops = |ir: &str| -> Vec<String> {
            let reduce =
                ir.lines().map(str::trim_start).filter(|l| l.starts_with("for ") && l.contains("(reduce)"));
            reduce.map(String::from).collect()
        };
        let ragged = key_loops(loops);
        assert_eq!(ragged.len(), 2, "{loops}");
        assert!(ragged.iter().all(|h| h.contains("r0")), "{loops}");
        assert_eq!(loops.matches("tile_gemm 64x128x64 B^T").count(), 1, "{loops}");
        assert_eq!(loops.matches("tile_gemm 64x64x64 B^T").count(), 2, "{loops}");
        assert_eq!(loops.matches("-inf").count(), 2, "init and one mask: {loops}");
        let full = FlashTileOps::compile_with(2048, 64, tiling, false).unwrap();
        let full_loops = key_loops(full.kernel().loop_ir());
        assert!(full_loops.len() == 1 && full_loops[0].contains(" in 0..16 (reduce)"), "{full_loops:?}");
    }
}

#[test]
fn flash_tiled_output_update_is_whole_vectors() {
    // P · V is a register tile per 8 output columns; the rescale-and-add of the output tile
    // after it (`O = O * corr + tile`) is packed into F32X4 FMAs and stores instead of 32
    // scalar FMAs on extracted lanes per chunk. Store packing happens while lowering to
    // Cranelift (the loop IR has scalar stores), so the CLIF is where it shows.
    let f = FlashTiled::compile(256, 64, FlashTiling::default()).unwrap();
    let clif = f.kernel().clif();
    let scalar_fmas = clif.lines().filter(|l| l.contains("= fma.f32 ")).count();
    assert_eq!(scalar_fmas, 0, "{clif}");
    let vector_stores = clif
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            l.starts_with("store notrap v") || l.starts_with("store.f32x4 ")
        })
        .count();
    // 8 score-tile vectors + 8 output-tile vectors per chunk, at least
    assert!(vector_stores >= 16, "{vector_stores} vector stores:\n{clif}");
}

#[test]
fn flash_tiled_stores_each_probability_before_the_next_exponential() {
    // Every probability of the key block is stored (and added to the row sum) before the next
    // exponential starts: held until the end, the block's 32 vectors would spill.
    let f = FlashTiled::compile(256, 64, FlashTiling::default()).unwrap();
    let ir = f.kernel().loop_ir();
    let lines: Vec<&str> = ir.lines().map(str::trim).collect();
    let exps: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].contains("= exp2(")).collect();
    assert!(exps.len() > FlashTiling::default().key_block, "{ir}");
    for w in exps.windows(2) {
        let name = lines[w[0]].split_whitespace().nth(1).expect("`f32 vN = exp2(..)`");
        let stored = lines[w[0] + 1..w[1]].iter().any(|l| l.ends_with(&format!("= {name};")));
        // the rescale factor's exponential is used by the row sum's update, not stored at once
        let used = lines[w[0] + 1..w[1]].iter().any(|l| l.contains(name));
        assert!(stored || used, "{name} waits past the next exponential:\n{ir}");
    }
}

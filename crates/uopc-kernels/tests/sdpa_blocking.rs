//! The one attention entry point's choices and structure: which blockings the library picks
//! for a shape (key blocks, query rows, panels, queries read in place), what the compiled
//! program holds (its local tiles, its parallel tasks, its static FLOPs under the causal mask)
//! and how it names itself.

use uopc_kernels::sdpa::{Blocking, Sdpa, SdpaConfig};

fn config(b: usize, h: usize, hkv: usize, n_q: usize, n_k: usize, d: usize) -> SdpaConfig {
    SdpaConfig { kv_heads: hkv, ..SdpaConfig::new(b, h, n_q, n_k, d) }
}

#[test]
fn panels_are_chosen_for_many_readers_and_refused_where_they_do_not_fit() {
    // 16 query blocks read every key block of the head: packed once.
    let many = Sdpa::compile(&config(1, 1, 1, 4096, 4096, 64)).unwrap();
    assert!(many.blocking().kv_panel_width > 0 && many.to_string().contains("packed once per run"), "{many}");
    // Decode (streamed, unpacked) and few readers pack per task.
    for c in [config(1, 32, 8, 1, 4096, 128), config(4, 12, 12, 512, 512, 64)] {
        assert_eq!(Blocking::choose(&c, 2).kv_panel_width, 0, "{c:?}");
    }
    // Where its GEMM widens to f32 anyway, bf16 blocks as f16 does (the same f32 tiles, panels
    // where f16 takes them); where AMX or vdpbf16ps takes bf16 operands it packs bf16 pair
    // panels of 32 for as many readers, and keeps its bf16 tiles.
    let widens = uopc_jit::machine::Machine::get().choices().bf16.widens();
    for (shape, many_readers) in [
        (config(1, 1, 1, 4096, 4096, 64), true),
        (config(4, 8, 1, 333, 999, 80), true),
        (config(2, 8, 8, 1000, 1000, 80), false),
    ] {
        let bf16 = SdpaConfig { dtype: uopc_kernels::sdpa::SdpaDType::BF16, ..shape };
        let f16 = SdpaConfig { dtype: uopc_kernels::sdpa::SdpaDType::F16, ..shape };
        let b = Blocking::choose(&bf16, 2);
        if widens {
            assert_eq!(b, Blocking::choose(&f16, 2), "{bf16:?}");
            assert!(!b.pair_panels(&bf16));
        } else {
            assert_eq!(b.kv_panel_width, if many_readers { 32 } else { 0 }, "{bf16:?}");
            assert_eq!(b.pair_panels(&bf16), many_readers, "{bf16:?}");
            let sdpa = Sdpa::compile_with(&bf16, b).unwrap();
            assert_eq!(sdpa.to_string().contains("bf16 pair panels of 32"), many_readers, "{sdpa}");
        }
    }
    // f16 packs once too (widened as it packs). One head's queries are widened once per task
    // into an f32 tile where that fits beside the other tiles, and read in place otherwise
    // (the score GEMM then takes an f16 A with the f32 panels, widening A as it packs it): the
    // panels are taken at every D, as f32 takes them.
    for (shape, in_place) in
        [(config(4, 8, 1, 333, 999, 80), false), (config(1, 8, 1, 1009, 1009, 160), true)]
    {
        let f16 = SdpaConfig { dtype: uopc_kernels::sdpa::SdpaDType::F16, ..shape };
        let b = Blocking::choose(&f16, 2);
        assert_eq!(b.kv_panel_width, Blocking::choose(&shape, 2).kv_panel_width, "{b:?}");
        assert!(b.kv_panel_width > 0 && b.reads_queries_in_place(&f16) == in_place, "{b:?}");
        let sdpa = Sdpa::compile_with(&f16, b).unwrap();
        assert_eq!(sdpa.to_string().contains("read in place"), in_place, "{sdpa}");
    }
    // Panels with split-K or key blocks that do not start a panel are refused; bf16 reads them.
    let c = config(1, 1, 1, 64, 256, 16);
    let base = Blocking { kv_panel_width: 16, ..Blocking::new(1, 64, 32) };
    Sdpa::compile_with(&c, base).unwrap();
    for bad in [Blocking { kv_panel_width: 12, ..base }, Blocking { queries: 64, splits: 2, ..base }] {
        assert!(Sdpa::compile_with(&c, bad).is_err(), "{bad:?}");
    }
    // bf16 reads f32 panels of any width where its GEMM widens, pair panels of 32 only where
    // it multiplies bf16.
    let bf16 = SdpaConfig { dtype: uopc_kernels::sdpa::SdpaDType::BF16, ..c };
    assert_eq!(Sdpa::compile_with(&bf16, base).is_ok(), widens);
    Sdpa::compile_with(&bf16, Blocking { kv_panel_width: 32, ..base }).unwrap();
}

#[test]
fn display_names_the_kernel_and_blocks() {
    let sdpa = Sdpa::compile(&SdpaConfig { causal: true, ..config(1, 32, 8, 1, 4096, 128) }).unwrap();
    let text = sdpa.to_string();
    assert!(
        text.contains("flash_tile_ops")
            && text.contains("4 head(s) x 1 queries")
            && text.contains("blocks of 512"),
        "{text}"
    );
}

#[test]
fn no_buffer_scales_with_n_squared_and_causal_does_about_half_the_work() {
    let (n, d) = (1024, 64);
    let plain = Sdpa::compile(&config(1, 1, 1, n, n, d)).unwrap();
    let causal = Sdpa::compile(&SdpaConfig { causal: true, ..config(1, 1, 1, n, n, d) }).unwrap();
    for (s, causal) in [(&plain, false), (&causal, true)] {
        let locals = local_lengths(s);
        assert!(locals.len() >= 4, "{}", s.program().loop_ir());
        // Tiles are rows x D or rows x keys-per-block: the same at four times the length, and
        // within the JIT's 256 KiB stack.
        let longer = Sdpa::compile(&SdpaConfig { causal, ..config(1, 1, 1, 4 * n, 4 * n, d) }).unwrap();
        assert_eq!(local_lengths(&longer), locals, "a tile grows with N");
        assert!(locals.iter().sum::<usize>() * 4 <= 256 * 1024, "{locals:?}");
    }
    let (full, half) = (plain.program().estimates().flops, causal.program().estimates().flops);
    // Half the score matrix is n^2 / 2 + n / 2 pairs (0.5005 of it); the rest is the part of
    // the diagonal blocks above the diagonal that the staircase of row parts still computes.
    let ratio = half as f64 / full as f64;
    assert!((0.5..0.52).contains(&ratio), "causal / full static FLOPs = {ratio}");
    // Whole diagonal blocks compute all of each 64 x 64 diagonal block.
    let whole =
        Sdpa::compile_with(causal.config(), Blocking { diagonal_parts: 1, ..causal.blocking() }).unwrap();
    let whole_ratio = whole.program().estimates().flops as f64 / full as f64;
    assert!(whole_ratio > ratio + 0.01, "whole diagonal blocks: {whole_ratio}, staircase: {ratio}");
}

/// Locals of the loop program (`local accN: f32[len]`), by length.
fn local_lengths(sdpa: &Sdpa) -> Vec<usize> {
    sdpa.program()
        .loop_ir()
        .lines()
        .filter_map(|l| l.strip_prefix("local ")?.split('[').nth(1)?.trim_end_matches(']').parse().ok())
        .collect()
}

/// Without the causal mask keys come in blocks of 128 where a task keeps at least 128 rows
/// with them, and of 256, else 192, where those keep it as many rows as 128 do; under the
/// mask, or where the stack leaves fewer rows, in blocks of 64.
#[test]
fn wide_key_blocks_only_for_tall_unmasked_tasks() {
    let choose = |c: SdpaConfig| Blocking::choose(&c, 2);
    for (d, rows, keys) in [(64, 256, 128), (128, 128, 256), (256, 128, 192)] {
        let b = choose(config(1, 8, 8, 1024, 1024, d));
        assert!(b.keys == keys && b.queries == rows, "D = {d}: {b:?}");
        let b = choose(SdpaConfig { causal: true, ..config(1, 8, 8, 1024, 1024, d) });
        assert_eq!(b.keys, 64, "causal D = {d}: {b:?}");
    }
    // bf16 reads its queries in place too. On bf16 GEMMs it reads K and V from pair panels
    // (16 query blocks read each key block), in blocks of 256 keys: 128 rows at D = 64 and
    // the 64 that fit beside its tile of rounded probabilities at D = 128 and 256. Where its
    // GEMM widens it has f32's tiles and blocks: 256 rows of 128 keys at D = 64 (wider blocks
    // would cut the rows), 128 of 256 at D = 128 and of 192 at D = 256.
    let widens = uopc_jit::machine::Machine::get().choices().bf16.widens();
    for (d, native, widened) in
        [(64, (128, 256), (256, 128)), (128, (64, 256), (128, 256)), (256, (64, 256), (128, 192))]
    {
        let bf16 =
            SdpaConfig { dtype: uopc_kernels::sdpa::SdpaDType::BF16, ..config(1, 8, 8, 1024, 1024, d) };
        let b = choose(bf16);
        let (rows, keys) = if widens { widened } else { native };
        assert!(b.queries == rows && b.keys == keys, "D = {d}: {b:?}");
    }
    // Fewer keys than a wide block: one block of all of them; than a wider one: wide blocks.
    assert_eq!(choose(config(1, 8, 8, 1024, 100, 64)).keys, 64);
    assert_eq!(choose(config(1, 8, 8, 1024, 180, 128)).keys, 128);
    // Decode keeps its streamed 512-key blocks.
    assert_eq!(choose(config(1, 32, 8, 1, 4096, 128)).keys, 512);
}

/// An f32 task of one query head reads its queries in q (no `rows x D` query copy beside the
/// output tile), so the stack holds taller tiles: at D = 256, 128 rows where the copy allowed
/// 64. Stacked heads keep their query tile.
#[test]
fn one_head_f32_tasks_read_queries_in_place_and_take_taller_tiles() {
    let c = config(1, 8, 8, 1024, 1024, 256);
    let b = Blocking::choose(&c, 2);
    assert!(b.reads_queries_in_place(&c) && b.heads_per_task == 1 && b.queries == 128, "{b:?}");
    let sdpa = Sdpa::compile_with(&c, b).unwrap();
    assert!(sdpa.to_string().contains("128 queries read in place"), "{sdpa}");
    let row_tiles = local_lengths(&sdpa).iter().filter(|&&len| len == 128 * 256).count();
    assert_eq!(row_tiles, 1, "only the output tile is rows x D:\n{}", sdpa.program().loop_ir());

    let stacked = config(1, 32, 8, 1, 4096, 128);
    let b = Blocking::choose(&stacked, 2);
    assert!(b.heads_per_task == 4 && !b.reads_queries_in_place(&stacked), "{b:?}");
    let sdpa = Sdpa::compile_with(&stacked, Blocking { splits: 1, ..b }).unwrap();
    let row_tiles = local_lengths(&sdpa).iter().filter(|&&len| len == 4 * 128).count();
    assert_eq!(row_tiles, 2, "the query tile and the output tile:\n{}", sdpa.program().loop_ir());

    // f16 reads its queries in place too (the score GEMM widens them), and so does bf16,
    // whose GEMMs either widen them likewise or read them as their A; its compiled kernel
    // has no bf16 query tile either.
    let half = SdpaConfig { dtype: uopc_kernels::sdpa::SdpaDType::F16, ..c };
    let b = Blocking::choose(&half, 2);
    assert!(b.reads_queries_in_place(&half) && b.queries == 128, "{b:?}");
    // On bf16 GEMMs from pair panels, 64 rows of 256 keys (see the test above).
    let bf16 = SdpaConfig { dtype: uopc_kernels::sdpa::SdpaDType::BF16, ..c };
    let b = Blocking::choose(&bf16, 2);
    let rows = if uopc_jit::machine::Machine::get().choices().bf16.widens() { 128 } else { 64 };
    assert!(b.reads_queries_in_place(&bf16) && b.queries == rows, "{b:?}");
    let sdpa = Sdpa::compile_with(&bf16, b).unwrap();
    assert!(sdpa.to_string().contains(&format!("{rows} queries read in place")), "{sdpa}");
    let row_tiles = local_lengths(&sdpa).iter().filter(|&&len| len == rows * 256).count();
    // The score and probability tiles are as long where the key blocks are D wide.
    let as_wide = if b.keys == 256 { 2 } else { 0 };
    assert_eq!(row_tiles, 1 + as_wide, "only the output tile is rows x D:\n{}", sdpa.program().loop_ir());
}

/// Batched, multi-head, GQA and decode shapes whose query blocks divide n_q run their THREAD
/// tasks in parallel: the compiler proves from the output index that tasks write disjoint rows
/// (a serial run of the same kernel was half as fast on two cores).
#[test]
fn batched_heads_and_decode_run_tasks_in_parallel() {
    for (b, h, hkv, n_q, n_k, d) in [
        (4, 12, 12, 512, 512, 64),
        (1, 32, 8, 1024, 1024, 128),
        (2, 8, 8, 1000, 1000, 80),
        (8, 32, 32, 1, 2048, 128),
        (1, 32, 8, 1, 4096, 128),
    ] {
        let sdpa = Sdpa::compile(&config(b, h, hkv, n_q, n_k, d)).expect("compiles");
        assert!(sdpa.program().is_parallel(), "{sdpa}");
        assert_eq!(n_q % sdpa.blocking().queries, 0, "{sdpa}");
    }
}

/// Query lengths no tile height divides (primes among them) give each head a last query block
/// that starts early enough to be full and stores only the rows the block before it did not:
/// those tasks still run in parallel, in every dtype, with a causal mask, with stacked GQA
/// heads and in the strided layout (run serially they took twice as long on two cores).
#[test]
fn a_last_query_block_overlapping_the_one_before_still_runs_in_parallel() {
    use uopc_kernels::sdpa::{Layout, SdpaDType};
    for (b, h, hkv, n_q, n_k, d) in
        [(1, 8, 1, 1009, 1009, 160), (1, 12, 4, 257, 1031, 96), (2, 3, 3, 997, 300, 64)]
    {
        for dtype in [SdpaDType::F32, SdpaDType::F16, SdpaDType::BF16] {
            for causal in [false, true] {
                for layout in [Layout::Bhnd, Layout::Bnhd] {
                    let c = SdpaConfig { dtype, causal, layout, ..config(b, h, hkv, n_q, n_k, d) };
                    let sdpa = Sdpa::compile(&c).expect("compiles");
                    let rows = sdpa.blocking().queries;
                    assert!(!n_q.is_multiple_of(rows), "{sdpa}: the case needs an overlapping last block");
                    assert!(sdpa.program().is_parallel(), "{sdpa}");
                }
            }
        }
    }
}

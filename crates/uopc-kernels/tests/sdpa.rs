//! The one attention entry point against its f64 reference on many small shapes, masks and
//! layouts; bad inputs; NaN and inf; the compile cache. (The blockings it chooses and the
//! structure of its program are `sdpa_blocking.rs`'s.)

use uopc_kernels::sdpa::{
    Blocking, Extras, Layout, MaskKind, Sdpa, SdpaConfig, SdpaError, attention, compile_count, reference_f64,
};

mod support;
use support::Rng;

struct Case {
    config: SdpaConfig,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    mask: Option<Vec<bool>>,
    bias: Option<Vec<f32>>,
    lens: Option<Vec<i32>>,
}

impl Case {
    fn new(config: SdpaConfig, rng: &mut Rng) -> Case {
        let (q, k, v) =
            (rng.values(config.q_len()), rng.values(config.kv_len()), rng.values(config.kv_len()));
        let (mut mask, mut bias) = (None, None);
        match config.mask {
            MaskKind::Bool(s) => mask = Some((0..s.iter().product()).map(|_| rng.below(4) != 0).collect()),
            MaskKind::Bias(s) => {
                bias = Some(
                    (0..s.iter().product())
                        .map(|_| if rng.below(8) == 0 { f32::NEG_INFINITY } else { rng.values(1)[0] * 3.0 })
                        .collect(),
                )
            }
            MaskKind::None => {}
        }
        let lens =
            config.key_lengths.then(|| (0..config.batch).map(|_| rng.below(config.n_k + 1) as i32).collect());
        Case { config, q, k, v, mask, bias, lens }
    }
    fn extras(&self) -> Extras<'_> {
        Extras {
            mask: self.mask.as_deref(),
            bias: self.bias.as_deref(),
            key_lengths: self.lens.as_deref(),
            kv_length: None,
            captures: &[],
        }
    }
    fn reference(&self) -> Vec<f64> {
        reference_f64(&self.config, &self.q, &self.k, &self.v, self.extras())
    }
}

/// Largest error, with NaN required exactly where the reference is NaN.
fn error(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(&g, &w)| match (g.is_nan(), w.is_nan()) {
            (true, true) => 0.0,
            (false, false) => (f64::from(g) - w).abs(),
            _ => f64::INFINITY,
        })
        .fold(0.0, f64::max)
}

fn check(case: &Case, sdpa: &Sdpa) {
    let mut out = vec![f32::NAN; case.config.q_len()];
    sdpa.run(&case.q, &case.k, &case.v, case.extras(), &mut out).expect("run");
    let err = error(&out, &case.reference());
    assert!(err < 2e-5, "{sdpa} ({:?}): max error {err}", case.config);
}

fn check_config(config: SdpaConfig, rng: &mut Rng) {
    let case = Case::new(config, rng);
    check(&case, &Sdpa::compile(&config).expect("compile"));
}

fn config(b: usize, h: usize, hkv: usize, n_q: usize, n_k: usize, d: usize) -> SdpaConfig {
    SdpaConfig { kv_heads: hkv, ..SdpaConfig::new(b, h, n_q, n_k, d) }
}

#[test]
fn head_dims_and_gqa_ratios() {
    let mut rng = Rng(7);
    for (i, d) in [1, 3, 16, 64, 80, 96, 127, 128, 256].into_iter().enumerate() {
        let (h, hkv) = [(2, 2), (4, 2), (4, 1), (8, 1), (8, 8)][i % 5];
        check_config(config(2, h, hkv, 9, 13, d), &mut rng);
    }
    for (h, hkv) in [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (16, 2), (3, 3)] {
        check_config(config(1, h, hkv, 5, 70, 8), &mut rng);
        check_config(config(2, h, hkv, 1, 33, 16), &mut rng);
    }
}

/// Causal tasks taller than one key block run their diagonal band in 64-row sub-tiles: with
/// tasks of full, ragged (100 = 64 + 36 rows) and overlapping last query blocks, queries
/// behind and ahead of the keys, each alone and with key lengths, a bool mask or a bias.
#[test]
fn causal_sub_tiles_with_every_mask_kind() {
    let mut rng = Rng(17);
    for (n_q, n_k) in [(256, 256), (300, 301), (200, 500), (384, 200)] {
        for (mask, lens) in [
            (MaskKind::None, false),
            (MaskKind::None, true),
            (MaskKind::Bool([2, 1, n_q, n_k]), false),
            (MaskKind::Bias([1, 4, n_q, n_k]), true),
        ] {
            let c = SdpaConfig { causal: true, mask, key_lengths: lens, ..config(2, 4, 2, n_q, n_k, 16) };
            let sdpa = Sdpa::compile(&c).expect("compile");
            assert!(sdpa.to_string().contains("sub-tiles of 64 rows"), "{sdpa}");
            // Two full blocks or more: the blocks before the band go two at a time.
            assert_eq!(sdpa.to_string().contains("128 keys wide"), n_k >= 128, "{sdpa}");
            check(&Case::new(c, &mut rng), &sdpa);
        }
    }
}

/// A causal sub-tile whose masked keys are its diagonal block alone runs that block's GEMMs
/// as a staircase of parts (by key columns, or by rows from panels; and, with the keys at or
/// ahead of the queries, its whole blocks and the diagonal as one block): aligned offsets ahead of and behind the queries,
/// with and without panels, odd part counts; misaligned offsets, key lengths and masks run
/// the block whole.
#[test]
fn causal_diagonal_blocks_run_as_a_staircase_of_parts() {
    let mut rng = Rng(29);
    let native = uopc_tile::panel_width(uopc_tile::Isa::detect());
    for (n_q, n_k) in [(256, 256), (128, 384), (256, 128), (384, 448), (256, 200), (300, 300)] {
        for (parts, width, d) in [(2, 0, 16), (2, native, 24), (3, native, 16), (5, 0, 7)] {
            let layout = if rng.below(2) == 0 { Layout::Bhnd } else { Layout::Bnhd };
            let c = SdpaConfig { causal: true, layout, ..config(2, 4, 2, n_q, n_k, d) };
            let blocking =
                Blocking { kv_panel_width: width, diagonal_parts: parts, ..Blocking::new(1, 128, 64) };
            let sdpa = Sdpa::compile_with(&c, blocking).expect("compile");
            let aligned = (n_k as i64 - n_q as i64).rem_euclid(64) == 0 && n_q % 128 == 0;
            assert_eq!(sdpa.to_string().contains(&format!("in {parts} parts")), aligned, "{sdpa}");
            let case = Case::new(c, &mut rng);
            check(&case, &sdpa);
            // The same attention with the diagonal blocks whole.
            let whole = Sdpa::compile_with(&c, Blocking { diagonal_parts: 1, ..blocking }).unwrap();
            assert!(!whole.to_string().contains("upper triangle"), "{whole}");
            let (mut a, mut b) = (vec![0.0; c.q_len()], vec![0.0; c.q_len()]);
            sdpa.run(&case.q, &case.k, &case.v, case.extras(), &mut a).unwrap();
            whole.run(&case.q, &case.k, &case.v, case.extras(), &mut b).unwrap();
            let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            assert!(diff < 1e-5, "{sdpa}: {diff}");
        }
    }
    // K and V read in place go by key columns: each of the diagonal's 16-key quarters is
    // multiplied once, for the 64 - 16 c rows that see it (here c = 1), so no key is packed
    // twice; from panels the parts go by rows.
    let c = SdpaConfig { causal: true, ..config(1, 2, 1, 256, 256, 32) };
    let quarters = |width| Blocking { kv_panel_width: width, diagonal_parts: 4, ..Blocking::new(1, 128, 64) };
    let ir = Sdpa::compile_with(&c, quarters(0)).unwrap().program().loop_ir().to_string();
    assert!(ir.contains("tile_gemm 48x16x32 B^T") && ir.contains("tile_gemm 48x32x16 +="), "{ir}");
    let ir = Sdpa::compile_with(&c, quarters(native)).unwrap().program().loop_ir().to_string();
    assert!(!ir.contains("tile_gemm 48x") && ir.contains("tile_gemm 16x32x16 B in panels"), "{ir}");
    // Any other mask keeps the blocks whole; the library's own choice uses quarters.
    for (mask, lens) in [(MaskKind::None, true), (MaskKind::Bool([2, 1, 256, 256]), false)] {
        let c = SdpaConfig { causal: true, mask, key_lengths: lens, ..config(2, 4, 2, 256, 256, 16) };
        let sdpa = Sdpa::compile(&c).unwrap();
        assert!(!sdpa.to_string().contains("upper triangle"), "{sdpa}");
        check(&Case::new(c, &mut rng), &sdpa);
    }
    let c = SdpaConfig { causal: true, ..config(1, 2, 1, 1024, 1024, 64) };
    let sdpa = Sdpa::compile(&c).unwrap();
    assert!(sdpa.to_string().contains("each diagonal block's GEMMs in 4 parts"), "{sdpa}");
    // More parts than keys are refused.
    let bad = Blocking { diagonal_parts: 65, ..sdpa.blocking() };
    assert!(Sdpa::compile_with(&c, bad).is_err());
}

#[test]
fn odd_and_unequal_lengths_with_and_without_causal() {
    let mut rng = Rng(11);
    for (n_q, n_k) in
        [(1, 1), (1, 200), (7, 7), (33, 65), (65, 33), (130, 64), (64, 130), (300, 301), (257, 129), (5, 1)]
    {
        for causal in [false, true] {
            for layout in [Layout::Bhnd, Layout::Bnhd] {
                let c = SdpaConfig { causal, layout, ..config(2, 4, 2, n_q, n_k, 8) };
                check_config(c, &mut rng);
            }
        }
    }
}

#[test]
fn random_shapes_every_mask_kind_and_combination() {
    let mut rng = Rng(23);
    for _ in 0..40 {
        let hkv = 1 + rng.below(3);
        let h = hkv * [1, 2, 4][rng.below(3)];
        let (b, n_q, n_k, d) = (1 + rng.below(3), 1 + rng.below(90), 1 + rng.below(150), 1 + rng.below(40));
        let full = [b, h, n_q, n_k];
        let shape = full.map(|x| if rng.below(2) == 0 { 1 } else { x });
        let mask = match rng.below(3) {
            0 => MaskKind::None,
            1 => MaskKind::Bool(shape),
            _ => MaskKind::Bias(shape),
        };
        let c = SdpaConfig {
            causal: rng.below(2) == 0,
            key_lengths: rng.below(2) == 0,
            layout: if rng.below(2) == 0 { Layout::Bhnd } else { Layout::Bnhd },
            scale: (rng.below(3) == 0).then_some(0.3),
            mask,
            ..config(b, h, hkv, n_q, n_k, d)
        };
        check_config(c, &mut rng);
    }
}

#[test]
fn small_blockings_exercise_every_key_phase() {
    // Key blocks of 4 over 37 keys: full blocks, causal diagonal blocks and a remainder, with
    // several query blocks per head and an overlapping last one.
    let mut rng = Rng(5);
    for causal in [false, true] {
        for (n_q, n_k) in [(37, 37), (20, 37), (37, 20)] {
            let c = SdpaConfig { causal, key_lengths: true, ..config(2, 4, 2, n_q, n_k, 8) };
            let case = Case::new(c, &mut rng);
            for blocking in [Blocking::new(1, 6, 4), Blocking::new(2, 16, 7), Blocking::new(2, 1, 20)] {
                check(&case, &Sdpa::compile_with(&c, blocking).expect("compile"));
            }
        }
    }
}

/// K and V packed once per run into panels: the GEMMs' register-tile width (16 on AVX2, 32 on
/// AVX-512), twice it, and a width the GEMM leaves to plain loops; over narrow key blocks with
/// a ragged last one, every mask kind, causal rows, key lengths, GQA, odd head sizes and both
/// layouts.
#[test]
fn keys_and_values_packed_once_give_the_same_attention() {
    let mut rng = Rng(21);
    let native = uopc_tile::panel_width(uopc_tile::Isa::detect());
    for (width, keys) in [(native, 2 * native), (2 * native, 2 * native), (5, 10)] {
        for (n_q, n_k, d) in [(37, 70, 8), (20, 37, 3), (70, 70, 33), (9, 5, 16)] {
            for causal in [false, true] {
                for mask in [MaskKind::None, MaskKind::Bool([2, 1, 1, n_k]), MaskKind::Bias([1, 4, n_q, n_k])]
                {
                    let layout = if rng.below(2) == 0 { Layout::Bhnd } else { Layout::Bnhd };
                    let c = SdpaConfig {
                        causal,
                        mask,
                        layout,
                        key_lengths: rng.below(2) == 0,
                        ..config(2, 4, 2, n_q, n_k, d)
                    };
                    let blocking =
                        Blocking { kv_panel_width: width, ..Blocking::new(1, 16.min(n_q), keys.min(n_k)) };
                    let sdpa = Sdpa::compile_with(&c, blocking).expect("compile");
                    assert!(sdpa.to_string().contains(&format!("panels of {width}")), "{sdpa}");
                    let case = Case::new(c, &mut rng);
                    check(&case, &sdpa);
                    // Run again: the thread's kept panel buffer is packed afresh from new inputs.
                    check(&Case::new(c, &mut rng), &sdpa);
                }
            }
        }
    }
    // Causal tasks whose blocks before the band are two panel blocks wide.
    for (n_q, n_k) in [(256, 256), (200, 500), (300, 301)] {
        for lens in [false, true] {
            let c = SdpaConfig { causal: true, key_lengths: lens, ..config(1, 2, 1, n_q, n_k, 24) };
            let blocking = Blocking { kv_panel_width: native, ..Blocking::new(1, 128, 64) };
            let sdpa = Sdpa::compile_with(&c, blocking).expect("compile");
            assert!(sdpa.to_string().contains("128 keys wide"), "{sdpa}");
            check(&Case::new(c, &mut rng), &sdpa);
        }
    }
    // A NaN key that a row sees still makes the row NaN.
    let c = config(1, 2, 1, 32, 64, 16);
    let mut case = Case::new(c, &mut rng);
    case.k[5 * 16 + 3] = f32::NAN;
    let blocking = Blocking { kv_panel_width: native, ..Blocking::new(1, 16, 32) };
    check(&case, &Sdpa::compile_with(&c, blocking).unwrap());
}

#[test]
fn one_attention_with_panels_runs_from_many_threads_at_once() {
    // Each thread runs different inputs through one compiled attention, packing into its own
    // kept panel buffer, and every output is its own.
    let c = config(1, 4, 2, 64, 96, 16);
    let native = uopc_tile::panel_width(uopc_tile::Isa::detect());
    let blocking = Blocking { kv_panel_width: native, ..Blocking::new(1, 16, 2 * native) };
    let sdpa = Sdpa::compile_with(&c, blocking).unwrap();
    let cases: Vec<Case> = (0..4).map(|i| Case::new(c, &mut Rng(40 + i))).collect();
    std::thread::scope(|s| {
        for case in &cases {
            let sdpa = &sdpa;
            s.spawn(move || {
                for _ in 0..5 {
                    check(case, sdpa);
                }
            });
        }
    });
}

#[test]
fn split_keys_merge_to_the_same_attention() {
    // Split-K: the keys of each row in 2..5 chunks (4-key blocks; the last chunk also takes the
    // narrow block), with every mask kind, causal rows, key lengths that end a chunk early or
    // leave whole chunks empty, GQA rows stacked into one task, and the BNHD layout.
    let mut rng = Rng(11);
    for (n_q, n_k) in [(1, 37), (3, 40), (2, 33)] {
        for causal in [false, true] {
            for mask in [MaskKind::None, MaskKind::Bool([2, 1, 1, n_k]), MaskKind::Bias([1, 4, n_q, n_k])] {
                for layout in [Layout::Bhnd, Layout::Bnhd] {
                    let c = SdpaConfig {
                        causal,
                        mask,
                        layout,
                        key_lengths: true,
                        ..config(2, 4, 2, n_q, n_k, 8)
                    };
                    let mut case = Case::new(c, &mut rng);
                    case.lens = Some(vec![rng.below(n_k + 1) as i32, [0, 5, n_k][rng.below(3)] as i32]);
                    for (gs, want) in [(1, 2), (2, 3), (2, 5)] {
                        // Even chunks, none empty (as the library evens them).
                        let full = n_k / 4;
                        let splits = full.div_ceil(full.div_ceil(want));
                        let blocking = Blocking { splits, ..Blocking::new(gs, n_q, 4) };
                        let sdpa = Sdpa::compile_with(&c, blocking).expect("compile");
                        assert!(sdpa.merge_program().is_some());
                        check(&case, &sdpa);
                    }
                }
            }
        }
    }
    // The library splits the keys of a single long row, and the result is the same.
    let c = config(1, 1, 1, 1, 4096, 32);
    let sdpa = Sdpa::compile(&c).unwrap();
    assert!(sdpa.blocking().splits > 1 || std::thread::available_parallelism().map_or(1, |n| n.get()) == 1);
    assert!(sdpa.to_string().contains("split into") || sdpa.blocking().splits == 1, "{sdpa}");
    check(&Case::new(c, &mut rng), &sdpa);
    // A blocking whose last chunk would be empty is refused.
    let bad = Blocking { splits: 60, ..Blocking::new(1, 1, 64) };
    assert!(Sdpa::compile_with(&c, bad).is_err());
}

#[test]
fn key_lengths_skip_the_blocks_past_the_end() {
    // With key lengths the kernel loops over the blocks up to the item's length only, so a
    // short length costs little; checked on values here, on speed in `bench sdpa`.
    let mut rng = Rng(13);
    for causal in [false, true] {
        let c = SdpaConfig { causal, key_lengths: true, ..config(4, 2, 2, 16, 70, 8) };
        let mut case = Case::new(c, &mut rng);
        case.lens = Some(vec![70, 33, 4, 0]);
        for blocking in [Sdpa::compile(&c).unwrap().blocking(), Blocking::new(1, 5, 8)] {
            check(&case, &Sdpa::compile_with(&c, blocking).unwrap());
        }
    }
}

#[test]
fn key_lengths_zero_and_full_and_fully_masked_rows() {
    let mut rng = Rng(3);
    let c = SdpaConfig { key_lengths: true, ..config(3, 2, 1, 10, 50, 16) };
    let mut case = Case::new(c, &mut rng);
    case.lens = Some(vec![0, 50, 1]);
    let sdpa = Sdpa::compile(&c).unwrap();
    check(&case, &sdpa);
    let mut out = vec![1.0; c.q_len()];
    sdpa.run(&case.q, &case.k, &case.v, case.extras(), &mut out).unwrap();
    assert!(out[..2 * 10 * 16].iter().all(|&x| x == 0.0), "length 0 gives zeros");
    // n_q > n_k under the causal mask: the first n_q - n_k rows see no key and are zeros.
    let c = SdpaConfig { causal: true, ..config(1, 1, 1, 12, 5, 4) };
    let case = Case::new(c, &mut rng);
    let mut out = vec![1.0; c.q_len()];
    attention(&c, &case.q, &case.k, &case.v, Extras::default(), &mut out).unwrap();
    assert!(out[..7 * 4].iter().all(|&x| x == 0.0));
    assert!(error(&out, &case.reference()) < 2e-5);
    // A bool mask that hides everything.
    let c = SdpaConfig { mask: MaskKind::Bool([1, 1, 1, 1]), ..config(1, 2, 2, 3, 9, 4) };
    let case = Case { mask: Some(vec![false]), ..Case::new(c, &mut rng) };
    let mut out = vec![1.0; c.q_len()];
    attention(&c, &case.q, &case.k, &case.v, case.extras(), &mut out).unwrap();
    assert!(out.iter().all(|&x| x == 0.0));
}

#[test]
fn nan_and_inf_inputs_propagate_like_an_exact_softmax() {
    let mut rng = Rng(17);
    for causal in [false, true] {
        let c = SdpaConfig { causal, ..config(1, 2, 2, 20, 90, 8) };
        let mut case = Case::new(c, &mut rng);
        // Head 0: a NaN in key 70 (seen by every row without the causal mask, by the last rows
        // with it). Head 1: an inf in value row 3 (seen by all), an inf in query row 5.
        case.k[70 * 8 + 2] = f32::NAN;
        case.v[(90 + 3) * 8 + 1] = f32::INFINITY;
        case.q[(20 + 5) * 8] = f32::INFINITY;
        let mut out = vec![0.0; c.q_len()];
        Sdpa::compile(&c).unwrap().run(&case.q, &case.k, &case.v, case.extras(), &mut out).unwrap();
        let want = case.reference();
        assert!(want.iter().any(|x| x.is_nan()) && want.iter().any(|x| x.is_finite()));
        assert!(error(&out, &want) < 2e-5, "causal {causal}");
    }
}

#[test]
fn a_nan_key_that_a_row_sees_alone_makes_it_nan() {
    // Under the causal mask query 0 sees key 0 only: its score block holds the NaN and then
    // nothing but masked keys. Key lengths of 1 do the same for every query.
    let mut rng = Rng(19);
    for key_lengths in [false, true] {
        let c = SdpaConfig { causal: !key_lengths, key_lengths, ..config(2, 2, 1, 40, 40, 8) };
        let mut case = Case::new(c, &mut rng);
        if key_lengths {
            case.lens = Some(vec![1, 40]);
        }
        case.k[3] = f32::NAN;
        let mut out = vec![0.0; c.q_len()];
        Sdpa::compile(&c).unwrap().run(&case.q, &case.k, &case.v, case.extras(), &mut out).unwrap();
        assert!(out[..8].iter().all(|x| x.is_nan()), "key lengths {key_lengths}: row 0 {:?}", &out[..8]);
        assert!(error(&out, &case.reference()) < 2e-5, "key lengths {key_lengths}");
    }
}

#[test]
fn bad_inputs_are_errors_naming_the_argument() {
    let c = config(1, 4, 2, 8, 8, 4);
    let sdpa = Sdpa::compile(&c).unwrap();
    let (q, kv) = (vec![0.0; c.q_len()], vec![0.0; c.kv_len()]);
    let mut out = vec![0.0; c.q_len()];
    let e = sdpa.run(&q[1..], &kv, &kv, Extras::default(), &mut out).unwrap_err();
    assert!(matches!(e, SdpaError::Length { arg: "q", .. }), "{e}");
    let e = sdpa.run(&q, &kv, &kv[1..], Extras::default(), &mut out).unwrap_err();
    assert!(e.to_string().contains("`v`"), "{e}");
    let e = sdpa.run(&q, &kv, &kv, Extras::default(), &mut out[1..]).unwrap_err();
    assert!(matches!(e, SdpaError::Length { arg: "out", .. }));
    let e = sdpa
        .run(&q, &kv, &kv, Extras { key_lengths: Some(&[1]), ..Extras::default() }, &mut out)
        .unwrap_err();
    assert!(matches!(e, SdpaError::Extra { arg: "key_lengths", expected: false }));
    assert!(matches!(
        Sdpa::compile(&config(1, 3, 2, 8, 8, 4)),
        Err(SdpaError::HeadGrouping { heads: 3, kv_heads: 2 })
    ));
    assert!(matches!(Sdpa::compile(&config(1, 2, 2, 8, 8, 0)), Err(SdpaError::Empty { what: "d" })));
    let bad_mask = SdpaConfig { mask: MaskKind::Bias([1, 3, 1, 8]), ..c };
    assert!(matches!(Sdpa::compile(&bad_mask), Err(SdpaError::MaskShape { axis: 1, got: 3, full: 4 })));
    let lens = SdpaConfig { key_lengths: true, ..c };
    let sdpa = Sdpa::compile(&lens).unwrap();
    let e = sdpa
        .run(&q, &kv, &kv, Extras { key_lengths: Some(&[9]), ..Extras::default() }, &mut out)
        .unwrap_err();
    assert!(matches!(e, SdpaError::KeyLength { item: 0, len: 9, n_k: 8 }));
    let e = sdpa.run(&q, &kv, &kv, Extras::default(), &mut out).unwrap_err();
    assert!(matches!(e, SdpaError::Extra { arg: "key_lengths", expected: true }));
    let masked = SdpaConfig { mask: MaskKind::Bool([1, 1, 8, 8]), ..c };
    let sdpa = Sdpa::compile(&masked).unwrap();
    let e =
        sdpa.run(&q, &kv, &kv, Extras { mask: Some(&[true; 8]), ..Extras::default() }, &mut out).unwrap_err();
    assert!(matches!(e, SdpaError::Length { arg: "mask", expected: 64, got: 8 }));
}

/// Sizes whose element counts overflow (or pass the element cap) are configuration errors
/// naming the field that tips the count over, never a wrapped length.
#[test]
fn oversized_configurations_are_errors_naming_the_field() {
    // batch * heads * n_q * d = 2^64 wraps to 0 in usize; the running product passes 2^40 at n_q.
    let c = config(1 << 16, 1 << 16, 1 << 16, 1 << 16, 1, 1 << 16);
    assert_ne!(c.q_len(), 0, "an overflowing length saturates instead of wrapping");
    let e = Sdpa::compile(&c).unwrap_err().to_string();
    assert!(e.contains("`n_q`") && e.contains("2^40"), "{e}");
    // Only the keys are too many: the error names n_k.
    let e = Sdpa::compile(&config(1, 1, 1, 8, 1 << 41, 16)).unwrap_err().to_string();
    assert!(e.contains("`n_k`") && e.contains("2^40"), "{e}");
    // A full mask over (B, H, n_q, n_k) has more elements than q or k.
    let c =
        SdpaConfig { mask: MaskKind::Bias([1, 1, 1 << 21, 1 << 21]), ..config(1, 1, 1, 1 << 21, 1 << 21, 8) };
    let e = Sdpa::compile(&c).unwrap_err().to_string();
    assert!(e.contains("`mask`") && e.contains("2^40"), "{e}");
}

#[test]
fn the_cache_compiles_each_configuration_once_and_runs_from_threads() {
    let c = config(2, 4, 4, 33, 47, 12);
    let mut rng = Rng(29);
    let case = Case::new(c, &mut rng);
    let want = case.reference();
    let before = compile_count();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let mut out = vec![0.0; c.q_len()];
                for _ in 0..3 {
                    attention(&c, &case.q, &case.k, &case.v, Extras::default(), &mut out).unwrap();
                    assert!(error(&out, &want) < 2e-5);
                }
            });
        }
    });
    // Racing first calls may compile more than once, but only until one is stored.
    let after = compile_count();
    assert!((1..=4).contains(&(after - before)), "{before} -> {after}");
    let mut out = vec![0.0; c.q_len()];
    attention(&c, &case.q, &case.k, &case.v, Extras::default(), &mut out).unwrap();
    assert_eq!(compile_count(), after);
}

/// Queries read in place leave the scale to the softmax step, or to the mask loop where one
/// reads every score: a zero or negative scale, which would turn a masked `-inf` into NaN or
/// `+inf` there, must still mask, with every mask kind, causal rows and key lengths, against
/// tasks that scale a query tile (two stacked heads).
#[test]
fn zero_and_negative_scales_with_queries_read_in_place() {
    let mut rng = Rng(29);
    for scale in [0.0f32, -0.4, 0.25] {
        for (mask, causal, lens) in [
            (MaskKind::None, false, false),
            (MaskKind::None, true, true),
            (MaskKind::Bool([2, 1, 37, 37]), false, true),
            (MaskKind::Bias([1, 4, 37, 37]), true, false),
        ] {
            let c = SdpaConfig {
                scale: Some(scale),
                mask,
                causal,
                key_lengths: lens,
                ..config(2, 4, 2, 37, 37, 8)
            };
            let case = Case::new(c, &mut rng);
            for blocking in [Blocking::new(1, 6, 4), Blocking::new(2, 16, 8)] {
                let sdpa = Sdpa::compile_with(&c, blocking).unwrap();
                assert_eq!(sdpa.blocking().reads_queries_in_place(&c), blocking.heads_per_task == 1);
                check(&case, &sdpa);
            }
        }
    }
}

/// `case`'s keys and values cut to the first `len` rows of each head (BHND), for the f64
/// reference of a cache holding `len` keys.
fn first_keys(c: &SdpaConfig, x: &[f32], len: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(c.batch * c.kv_heads * len * c.d);
    for head in x.chunks(c.n_k * c.d) {
        out.extend_from_slice(&head[..len * c.d]);
    }
    out
}

#[test]
fn one_compiled_program_serves_every_kv_length() {
    let mut rng = Rng(23);
    let capacity = 70;
    for (n_q, causal, heads, kv_heads) in
        [(1, false, 4, 1), (1, true, 4, 2), (3, true, 2, 2), (2, false, 2, 2)]
    {
        let c =
            SdpaConfig { causal, runtime_kv_length: true, ..config(2, heads, kv_heads, n_q, capacity, 8) };
        let case = Case::new(c, &mut rng);
        let library = Sdpa::compile(&c).unwrap();
        let split = Sdpa::compile_with(&c, Blocking { splits: 3, ..Blocking::new(1, n_q, 8) }).unwrap();
        for sdpa in [&library, &split] {
            for len in [1, 2, capacity / 2 + 1, capacity] {
                let mut out = vec![f32::NAN; c.q_len()];
                let extras = Extras { kv_length: Some(len), ..Extras::default() };
                sdpa.run(&case.q, &case.k, &case.v, extras, &mut out).unwrap();
                // The reference: a configuration of exactly `len` keys.
                let cut = SdpaConfig { n_k: len, runtime_kv_length: false, ..c };
                let (k, v) = (first_keys(&c, &case.k, len), first_keys(&c, &case.v, len));
                let want = reference_f64(&cut, &case.q, &k, &v, Extras::default());
                assert!(error(&out, &want) < 2e-5, "L = {len}, {sdpa}: {}", error(&out, &want));
            }
            // L = 0: no key, zeros; L > capacity: an error, nothing run.
            let mut out = vec![1.0f32; c.q_len()];
            sdpa.run(&case.q, &case.k, &case.v, Extras { kv_length: Some(0), ..Extras::default() }, &mut out)
                .unwrap();
            assert!(out.iter().all(|&x| x == 0.0));
            let err = sdpa
                .run(
                    &case.q,
                    &case.k,
                    &case.v,
                    Extras { kv_length: Some(capacity + 1), ..Extras::default() },
                    &mut out,
                )
                .unwrap_err();
            assert!(matches!(err, SdpaError::KvLength { len: 71, capacity: 70 }), "{err}");
            let err = sdpa.run(&case.q, &case.k, &case.v, Extras::default(), &mut out).unwrap_err();
            assert!(err.to_string().contains("kv_length"), "{err}");
        }
    }
    // Through the cache: a growing cache compiles once.
    let c = SdpaConfig { runtime_kv_length: true, ..config(1, 2, 2, 1, 64, 4) };
    let case = Case::new(c, &mut rng);
    let before = compile_count();
    let mut out = vec![0.0f32; c.q_len()];
    for len in 1..=64 {
        attention(
            &c,
            &case.q,
            &case.k,
            &case.v,
            Extras { kv_length: Some(len), ..Extras::default() },
            &mut out,
        )
        .unwrap();
    }
    assert!(compile_count() - before <= 1);
}

#[test]
fn small_programs_agree_with_the_loop_ir_interpreter() {
    // The compiled kernel against the interpreter running the same loop program (tile ops by
    // their reference expansion), in f64: every key phase, masks, split-K and a variable length.
    use uopc_ir::HostBuffer;
    use uopc_ir::interp::{Precision, run_with_vars};
    use uopc_kernels::sdpa::{sdpa_ir, sdpa_merge_ir};
    let mut rng = Rng(29);
    for (c, blocking, kv) in [
        (
            SdpaConfig { causal: true, key_lengths: true, ..config(2, 2, 1, 7, 11, 4) },
            Blocking::new(2, 4, 4),
            None,
        ),
        (
            SdpaConfig { mask: MaskKind::Bias([1, 2, 1, 11]), ..config(1, 2, 2, 1, 11, 3) },
            Blocking { splits: 3, ..Blocking::new(1, 1, 2) },
            None,
        ),
        (
            SdpaConfig { causal: true, runtime_kv_length: true, ..config(1, 2, 2, 2, 12, 4) },
            Blocking::new(1, 2, 4),
            Some(7),
        ),
    ] {
        let mut case = Case::new(c, &mut rng);
        if let Some(l) = &mut case.lens {
            l[0] = 5;
        }
        let sdpa = Sdpa::compile_with(&c, blocking).unwrap();
        let mut out = vec![0.0f32; c.q_len()];
        let extras = Extras { kv_length: kv, ..case.extras() };
        sdpa.run(&case.q, &case.k, &case.v, extras, &mut out).unwrap();
        let states = blocking.tasks(&c) * blocking.heads_per_task * blocking.queries;
        let mut bufs = vec![
            HostBuffer::F32(case.q.clone()),
            HostBuffer::F32(case.k.clone()),
            HostBuffer::F32(case.v.clone()),
        ];
        if blocking.splits > 1 {
            bufs.extend([
                HostBuffer::zeros(uopc_ir::DType::F32, states * c.d),
                HostBuffer::zeros(uopc_ir::DType::F32, states),
                HostBuffer::zeros(uopc_ir::DType::F32, states),
            ]);
        } else {
            bufs.push(HostBuffer::zeros(uopc_ir::DType::F32, c.q_len()));
        }
        if let Some(b) = &case.bias {
            bufs.push(HostBuffer::F32(b.clone()));
        }
        if let Some(l) = &case.lens {
            bufs.push(HostBuffer::I32(l.clone()));
        }
        let vars: Vec<i64> = kv.map(|l| l as i64).into_iter().collect();
        run_with_vars(&sdpa_ir(&c, &blocking), &mut bufs, &vars, Precision::F64).unwrap();
        let interpreted = if blocking.splits > 1 {
            let mut merged = vec![
                bufs[4].clone(),
                bufs[5].clone(),
                bufs[3].clone(),
                HostBuffer::zeros(uopc_ir::DType::F32, c.q_len()),
            ];
            run_with_vars(&sdpa_merge_ir(&c, &blocking), &mut merged, &[], Precision::F64).unwrap();
            merged[3].to_f64_vec()
        } else {
            bufs[3].to_f64_vec()
        };
        assert!(error(&out, &interpreted) < 2e-5, "{sdpa}: {}", error(&out, &interpreted));
        assert!(interpreted.iter().any(|x| x.abs() > 1e-3));
    }
}

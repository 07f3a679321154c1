//! Attention with score and mask functions compiled in (`Sdpa::compile_flex`) against the f64
//! reference with the same functions written as Rust closures: ALiBi, softcap, sliding window,
//! document and prefix-LM masks, sinks; GQA, odd sizes, key lengths, stacked heads, rows that
//! see no key. Then the blocks the mask's bounds skip against a brute-force count, and bad
//! mods.

use uopc_ir::{DType, UOp, idx};
use uopc_kernels::sdpa::{
    AttentionMods, CaptureValues, Extras, FlexReference, Sdpa, SdpaConfig, SdpaError, and, eq,
    flex_block_plan, or, reference_flex_f64, tanh,
};

mod support;
use support::Rng;

fn config(b: usize, h: usize, hkv: usize, n_q: usize, n_k: usize, d: usize) -> SdpaConfig {
    SdpaConfig { kv_heads: hkv, ..SdpaConfig::new(b, h, n_q, n_k, d) }
}

/// `c * tanh(x / c)` from exp2, as a score function writes it.
fn softcap(x: &UOp, c: f32) -> UOp {
    let e = (x * (2.0 / c * std::f32::consts::LOG2_E)).exp2();
    (((e + 1.0f32).recip() * -2.0f32) + 1.0f32) * c
}

/// Runs `mods` on random q, k, v for `c` and compares with the reference: every output within
/// `2e-5 (1 + |want|)` (f32 sums of D products, an f32 exp2 within 1.2e-7, and the score
/// functions' own f32 rounding).
fn check(
    c: SdpaConfig,
    mods: &AttentionMods,
    captures: &[CaptureValues<'_>],
    f: FlexReference<'_>,
    rng: &mut Rng,
) -> Sdpa {
    check_with(c, mods, captures, f, rng, None)
}

fn check_with(
    c: SdpaConfig,
    mods: &AttentionMods,
    captures: &[CaptureValues<'_>],
    f: FlexReference<'_>,
    rng: &mut Rng,
    lens: Option<&[i32]>,
) -> Sdpa {
    let (q, k, v) = (rng.values(c.q_len()), rng.values(c.kv_len()), rng.values(c.kv_len()));
    let sdpa = Sdpa::compile_flex(&c, mods).unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let extras = Extras { captures, key_lengths: lens, ..Extras::default() };
    let mut out = vec![f32::NAN; c.q_len()];
    sdpa.run(&q, &k, &v, extras, &mut out).unwrap();
    assert_close(&format!("{c:?} {sdpa}"), &out, &reference_flex_f64(&c, &q, &k, &v, extras, f));
    sdpa
}

/// Every output within `2e-5 (1 + |want|)` of the reference (see [`check`]).
fn assert_close(what: &str, out: &[f32], want: &[f64]) {
    for (i, (&got, &want)) in out.iter().zip(want).enumerate() {
        assert!(
            (f64::from(got) - want).abs() <= 2e-5 * (1.0 + want.abs()),
            "{what}: out[{i}] = {got}, want {want}"
        );
    }
}

#[test]
fn alibi_and_softcap_score_functions_match_the_reference() {
    let mut rng = Rng(3);
    for c in [
        SdpaConfig { causal: true, ..config(2, 4, 2, 37, 37, 16) },
        config(1, 6, 3, 129, 200, 40),
        SdpaConfig { causal: true, ..config(1, 8, 8, 1, 70, 8) },
    ] {
        let mut mods = AttentionMods::new();
        let slopes = mods.capture("slopes", &[c.heads], DType::F32);
        let mods =
            mods.score(move |x, s| s + x.load(slopes, &[x.h.clone()]) * (&x.kv - &x.q).cast(DType::F32));
        let slope: Vec<f32> = (0..c.heads).map(|h| 0.5f32.powi(h as i32 + 1)).collect();
        let alibi = |s: f64, [_, h, i, j]: [usize; 4]| s + f64::from(slope[h]) * (j as f64 - i as f64);
        let f = FlexReference { score: Some(&alibi), ..FlexReference::default() };
        let sdpa = check(c, &mods, &[CaptureValues::F32(&slope)], f, &mut rng);
        assert!(sdpa.to_string().contains("a score function"), "{sdpa}");

        let capped = AttentionMods::new().score(|_, s| softcap(s, 0.3));
        let cap = |s: f64, _: [usize; 4]| 0.3 * (s / 0.3).tanh();
        check(c, &capped, &[], FlexReference { score: Some(&cap), ..FlexReference::default() }, &mut rng);
    }
}

/// A soft-cap built with `sdpa::tanh` (or spelled out from exp2, as above) runs as the
/// soft-capping tile op, and the plan says so: with queries read in place (the tile holds
/// unscaled scores) and copied scaled (stacked heads), under a mask read as key bounds and
/// under one evaluated per score, in decode against a runtime KV length, and in bf16.
#[test]
fn soft_caps_run_as_their_tile_op_wherever_the_kernel_reads_scores() {
    let mut rng = Rng(19);
    let capped = |cap: f32| AttentionMods::new().score(move |_, s| tanh(&(s * (1.0 / cap))) * cap);
    let cap = |s: f64, _: [usize; 4]| 2.5 * (s / 2.5).tanh();
    let says = |sdpa: &Sdpa| {
        let plan = sdpa.to_string();
        assert!(plan.contains("soft-capping tile op"), "{plan}");
    };
    for c in [
        SdpaConfig { causal: true, ..config(1, 4, 4, 150, 150, 24) },
        SdpaConfig { causal: true, ..config(2, 6, 2, 33, 90, 40) },
        config(1, 8, 1, 70, 129, 16),
    ] {
        let f = FlexReference { score: Some(&cap), ..FlexReference::default() };
        says(&check(c, &capped(2.5), &[], f, &mut rng));
        // A window (bounds) and a mask with no bounds (every block evaluates it).
        let windowed = capped(2.5).mask(|x| (&x.q - &x.kv).lt(40));
        let in_window = |[_, _, i, j]: [usize; 4]| i < j + 40;
        let f = FlexReference { score: Some(&cap), mask: Some(&in_window), ..FlexReference::default() };
        says(&check(c, &windowed, &[], f, &mut rng));
        let sparse = capped(2.5).mask(|x| x.kv.modulo(3).ne(1));
        let kept = |[_, _, _, j]: [usize; 4]| j % 3 != 1;
        let f = FlexReference { score: Some(&cap), mask: Some(&kept), ..FlexReference::default() };
        says(&check(c, &sparse, &[], f, &mut rng));
    }
    // Decode: one query per head against a cache of 64 holding 41.
    let c = SdpaConfig { runtime_kv_length: true, causal: true, ..config(1, 4, 2, 1, 64, 32) };
    let (q, k, v) = (rng.values(c.q_len()), rng.values(c.kv_len()), rng.values(c.kv_len()));
    let sdpa = Sdpa::compile_flex(&c, &capped(2.5)).unwrap();
    says(&sdpa);
    let extras = Extras { kv_length: Some(41), ..Extras::default() };
    let mut out = vec![f32::NAN; c.q_len()];
    sdpa.run(&q, &k, &v, extras, &mut out).unwrap();
    let f = FlexReference { score: Some(&cap), ..FlexReference::default() };
    assert_close("decode", &out, &reference_flex_f64(&c, &q, &k, &v, extras, f));
    says(&check_bf16(&capped(2.5), f, &mut rng));
}

/// Causal bf16 q, k, v and output at (1,4,2,77,77,32) under `mods` against the f64 reference
/// `f` on the widened inputs: within bf16's rounding of P and of the output (as in the 16-bit
/// cases above).
fn check_bf16(mods: &AttentionMods, f: FlexReference<'_>, rng: &mut Rng) -> Sdpa {
    use half::bf16;
    let c = SdpaConfig {
        causal: true,
        dtype: uopc_kernels::sdpa::SdpaDType::BF16,
        ..config(1, 4, 2, 77, 77, 32)
    };
    let half = |x: Vec<f32>| x.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
    let (q, k, v) = (half(rng.values(c.q_len())), half(rng.values(c.kv_len())), half(rng.values(c.kv_len())));
    let wide = |x: &[bf16]| x.iter().map(|h| h.to_f32()).collect::<Vec<_>>();
    let sdpa = Sdpa::compile_flex(&c, mods).unwrap();
    let mut out = vec![bf16::NAN; c.q_len()];
    sdpa.run(&q, &k, &v, Extras::default(), &mut out).unwrap();
    let want = reference_flex_f64(&c, &wide(&q), &wide(&k), &wide(&v), Extras::default(), f);
    for (i, (got, &want)) in out.iter().zip(&want).enumerate() {
        let got = got.to_f64();
        assert!((got - want).abs() <= (1.5 + want.abs()) / 256.0, "bf16 out[{i}] = {got}, want {want}");
    }
    sdpa
}

/// ALiBi, `s + slope[h] (kv - q)`, runs as the score-ramp tile op (the program calls it, once
/// per stacked head where a task's rows hold several) and matches the f64 reference: causal
/// and not, with queries read in place and stacked heads, in causal sub-tiles, under a window
/// (bounds) and a mask evaluated per score, with a constant slope, with key lengths, in bf16.
#[test]
fn alibi_runs_as_the_score_ramp_tile_op() {
    let mut rng = Rng(23);
    let ramp_calls = |sdpa: &Sdpa| sdpa.program().loop_ir().contains("tile_score_ramp");
    let mut stacked_seen = false;
    for c in [
        SdpaConfig { causal: true, ..config(1, 4, 4, 150, 150, 24) },
        config(1, 6, 3, 129, 200, 40),
        SdpaConfig { causal: true, ..config(2, 8, 2, 70, 300, 16) },
        // Few queries per head stack the group's heads into one task's rows.
        SdpaConfig { causal: true, ..config(1, 8, 2, 4, 90, 32) },
        config(2, 6, 2, 9, 40, 16),
    ] {
        let mut mods = AttentionMods::new();
        let slopes = mods.capture("slopes", &[c.heads], DType::F32);
        let alibi_mods =
            mods.score(move |x, s| s + x.load(slopes, &[x.h.clone()]) * (&x.kv - &x.q).cast(DType::F32));
        let slope: Vec<f32> = (0..c.heads).map(|h| 0.5f32.powi(h as i32 + 1)).collect();
        let alibi = |s: f64, [_, h, i, j]: [usize; 4]| s + f64::from(slope[h]) * (j as f64 - i as f64);
        let captures = [CaptureValues::F32(&slope)];
        let f = FlexReference { score: Some(&alibi), ..FlexReference::default() };
        let sdpa = check(c, &alibi_mods, &captures, f, &mut rng);
        // A call per stacked head (the op's one slope per call), one per piece otherwise.
        let calls = sdpa.program().loop_ir().matches("tile_score_ramp").count();
        let heads = sdpa.blocking().heads_per_task;
        assert!(calls >= heads && ramp_calls(&sdpa), "{c:?}: {calls} ramp call(s), {heads} head(s) per task");
        stacked_seen |= heads > 1;
        assert!(sdpa.to_string().contains("score-ramp tile op"), "{sdpa}");
        let windowed = alibi_mods.clone().mask(|x| (&x.q - &x.kv).lt(40));
        let in_window = |[_, _, i, j]: [usize; 4]| i < j + 40;
        let f = FlexReference { score: Some(&alibi), mask: Some(&in_window), ..FlexReference::default() };
        assert!(ramp_calls(&check(c, &windowed, &captures, f, &mut rng)));
        let sparse = alibi_mods.clone().mask(|x| x.kv.modulo(3).ne(1));
        let kept = |[_, _, _, j]: [usize; 4]| j % 3 != 1;
        let f = FlexReference { score: Some(&alibi), mask: Some(&kept), ..FlexReference::default() };
        assert!(ramp_calls(&check(c, &sparse, &captures, f, &mut rng)));
        let constant = AttentionMods::new().score(|x, s| (&x.kv - &x.q).cast(DType::F32) * -0.125f32 + s);
        let minus_eighth = |s: f64, [_, _, i, j]: [usize; 4]| s - 0.125 * (j as f64 - i as f64);
        let f = FlexReference { score: Some(&minus_eighth), ..FlexReference::default() };
        assert!(ramp_calls(&check(c, &constant, &[], f, &mut rng)));
    }
    assert!(stacked_seen, "no configuration stacked heads");
    // Key lengths per item, and bf16 q, k, v and output (within bf16's rounding of P and of
    // the output, as for the soft-cap above).
    let c = SdpaConfig { key_lengths: true, ..config(2, 2, 2, 65, 65, 16) };
    let constant = AttentionMods::new().score(|x, s| s + (&x.kv - &x.q).cast(DType::F32) * 0.25f32);
    let quarter = |s: f64, [_, _, i, j]: [usize; 4]| s + 0.25 * (j as f64 - i as f64);
    let f = FlexReference { score: Some(&quarter), ..FlexReference::default() };
    assert!(ramp_calls(&check_with(c, &constant, &[], f, &mut rng, Some(&[65, 20]))));
    assert!(ramp_calls(&check_bf16(&constant, f, &mut rng)));
}

#[test]
fn window_document_and_prefix_masks_match_the_reference() {
    let mut rng = Rng(5);
    for c in [config(1, 2, 1, 300, 300, 16), config(2, 3, 3, 77, 77, 24), config(1, 4, 2, 513, 513, 8)] {
        let w = 50;
        let window = AttentionMods::new().mask(move |x| and(&x.kv.lt(&x.q + 1), &(&x.q - &x.kv).lt(w)));
        let keep = |[_, _, i, j]: [usize; 4]| j <= i && i - j < w as usize;
        let sdpa =
            check(c, &window, &[], FlexReference { mask: Some(&keep), ..FlexReference::default() }, &mut rng);
        assert!(sdpa.to_string().contains("1 start and 1 end bound(s)"), "{sdpa}");
        assert!(sdpa.to_string().contains("inside them run unmasked"), "{sdpa}");
        assert!(sdpa.to_string().contains("without evaluating the mask"), "{sdpa}");

        let n = c.n_q;
        let mut docs = AttentionMods::new();
        let ids = docs.capture("doc_ids", &[c.batch, n], DType::I32);
        let docs = docs.mask(move |x| {
            eq(&x.load(ids, &[x.b.clone(), x.q.clone()]), &x.load(ids, &[x.b.clone(), x.kv.clone()]))
        });
        // Documents of 1 to 60 tokens.
        let mut doc = Vec::with_capacity(c.batch * n);
        for _ in 0..c.batch {
            let (mut id, mut left) = (0, 0);
            for _ in 0..n {
                if left == 0 {
                    id += 1;
                    left = 1 + rng.below(60);
                }
                left -= 1;
                doc.push(id);
            }
        }
        let same = |[b, _, i, j]: [usize; 4]| doc[b * n + i] == doc[b * n + j];
        let f = FlexReference { mask: Some(&same), ..FlexReference::default() };
        let sdpa = check(c, &docs, &[CaptureValues::I32(&doc)], f, &mut rng);
        assert!(sdpa.to_string().contains("counted once per run"), "{sdpa}");
        // The per-run plan computes exactly the key blocks some row of a query block sees
        // (and the narrow last block): counted by brute force.
        let b = sdpa.blocking();
        let (bq, bc, blocks, full) = (b.queries, b.keys, n.div_ceil(b.queries), n / b.keys);
        let narrow = usize::from(!n.is_multiple_of(bc));
        let mut seen = 0;
        for item in 0..c.batch {
            for qb in 0..blocks {
                let q0 = (qb * bq).min(n - bq);
                seen += (0..full)
                    .filter(|kb| {
                        (q0..q0 + bq).any(|i| (kb * bc..(kb + 1) * bc).any(|j| same([item, 0, i, j])))
                    })
                    .count()
                    + narrow;
            }
        }
        let want = seen as f64 / (c.batch * blocks * (full + narrow)) as f64;
        let captures = [CaptureValues::I32(&doc)];
        let got = sdpa.blocks_computed(Extras { captures: &captures, ..Extras::default() }).unwrap().unwrap();
        assert!((got - want).abs() < 1e-12, "{got} vs brute force {want}");

        let prefix = 20;
        let prefix_lm = AttentionMods::new().mask(move |x| or(&x.kv.lt(prefix), &x.kv.lt(&x.q + 1)));
        let keep = |[_, _, i, j]: [usize; 4]| j < prefix as usize || j <= i;
        check(c, &prefix_lm, &[], FlexReference { mask: Some(&keep), ..FlexReference::default() }, &mut rng);
    }
}

#[test]
fn sinks_join_every_rows_denominator() {
    let mut rng = Rng(7);
    for c in [
        SdpaConfig { causal: true, ..config(2, 4, 2, 45, 45, 16) },
        config(1, 8, 2, 1, 300, 32),
        SdpaConfig { causal: true, ..config(1, 2, 2, 200, 200, 8) },
    ] {
        let mut mods = AttentionMods::new();
        let logits = mods.capture("sinks", &[c.heads], DType::F32);
        let window = 30;
        let mods = mods.sinks(logits).mask(move |x| (&x.q - &x.kv).lt(window));
        let sink: Vec<f32> = (0..c.heads).map(|h| h as f32 - 1.5).collect();
        let keep = |[_, _, i, j]: [usize; 4]| (i as i64 - j as i64) < window;
        let f = FlexReference { mask: Some(&keep), sinks: Some(&sink), ..FlexReference::default() };
        let sdpa = check(c, &mods, &[CaptureValues::F32(&sink)], f, &mut rng);
        assert!(sdpa.to_string().contains("sinks"), "{sdpa}");
    }
}

#[test]
fn rows_that_see_no_key_give_zeros_and_key_lengths_still_apply() {
    let mut rng = Rng(9);
    let c = SdpaConfig { key_lengths: true, ..config(3, 4, 2, 40, 90, 16) };
    // Rows 0..=4 see nothing; the others keys from 3 on.
    let mods = AttentionMods::new().mask(|x| and(&idx(4).lt(&x.q), &idx(2).lt(&x.kv)));
    let keep = |[_, _, i, j]: [usize; 4]| i > 4 && j > 2;
    let lens = [0, 50, 90];
    let f = FlexReference { mask: Some(&keep), ..FlexReference::default() };
    check_with(c, &mods, &[], f, &mut rng, Some(&lens));
}

#[test]
fn bad_mods_are_errors_naming_what_is_wrong() {
    let c = config(1, 4, 4, 16, 16, 8);
    let mut mods = AttentionMods::new();
    let slopes = mods.capture("slopes", &[4], DType::F32);
    // Two indices into a vector.
    let wrong_arity = mods.clone().score(move |x, s| s + x.load(slopes, &[x.h.clone(), x.q.clone()]));
    let e = Sdpa::compile_flex(&c, &wrong_arity).unwrap_err().to_string();
    assert!(e.contains("slopes") && e.contains("2 index"), "{e}");
    // A mask that is not a Bool, a score that is not a float.
    let e = Sdpa::compile_flex(&c, &AttentionMods::new().mask(|x| x.q.clone())).unwrap_err().to_string();
    assert!(e.contains("mask function returns i64"), "{e}");
    let e = Sdpa::compile_flex(&c, &AttentionMods::new().score(|x, _| x.q.lt(3))).unwrap_err().to_string();
    assert!(e.contains("score function returns bool"), "{e}");
    // A read past the vector's end.
    let past = mods.clone().score(move |x, s| s + x.load(slopes, &[&x.h + 1]));
    let e = Sdpa::compile_flex(&c, &past).unwrap_err();
    assert!(matches!(&e, SdpaError::Capture { name, .. } if name == "slopes"), "{e}");
    // Sinks of the wrong shape.
    let mut sinky = AttentionMods::new();
    let short = sinky.capture("sink_logits", &[3], DType::F32);
    let e = Sdpa::compile_flex(&c, &sinky.sinks(short)).unwrap_err().to_string();
    assert!(e.contains("sink_logits") && e.contains("[4]"), "{e}");
    // Captures missing, of the wrong length or dtype at run time.
    let ok = mods.score(move |x, s| s + x.load(slopes, &[x.h.clone()]));
    let sdpa = Sdpa::compile_flex(&c, &ok).unwrap();
    let (q, mut out) = (vec![0.5f32; c.q_len()], vec![0.0f32; c.q_len()]);
    let run = |captures: &[CaptureValues<'_>], out: &mut [f32]| {
        sdpa.run(&q, &q, &q, Extras { captures, ..Extras::default() }, out).unwrap_err().to_string()
    };
    assert!(run(&[], &mut out).contains("0 captured tensor(s) given, the mods declare 1"));
    let e = run(&[CaptureValues::F32(&[1.0; 3])], &mut out);
    assert!(e.contains("slopes") && e.contains("given 3"), "{e}");
    let e = run(&[CaptureValues::I32(&[1; 4])], &mut out);
    assert!(e.contains("slopes") && e.contains("i32"), "{e}");
    // Captures given to attention without mods.
    let plain = Sdpa::compile(&c).unwrap();
    let e = plain
        .run(&q, &q, &q, Extras { captures: &[CaptureValues::F32(&[1.0; 4])], ..Extras::default() }, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("captures"), "{e}");
    // A bool mask or bias in the configuration with mods.
    let masked = SdpaConfig { mask: uopc_kernels::sdpa::MaskKind::Bias([1, 1, 16, 16]), ..c };
    assert!(Sdpa::compile_flex(&masked, &AttentionMods::new()).is_err());
}

#[test]
fn the_blocks_skipped_and_run_whole_match_the_mask_exactly() {
    // Sliding windows (with the causal limit in the mask, or in the configuration), and a
    // window that cuts no block: per task, a full key block runs exactly when some row sees
    // some key of it, and runs unmasked exactly when every row sees every key of it.
    // A prefix-LM mask (two prefixes: the later end bounds the keys) likewise.
    for (c, w, prefix) in [
        (config(1, 2, 1, 300, 300, 16), 50, None),
        (config(1, 4, 2, 1000, 1000, 64), 256, None),
        (SdpaConfig { causal: true, ..config(1, 2, 2, 500, 500, 32) }, 1000, None),
        (config(2, 2, 1, 700, 700, 16), 1000, Some(200)),
    ] {
        let window = match prefix {
            Some(p) => AttentionMods::new().mask(move |x| or(&x.kv.lt(p), &x.kv.lt(&x.q + 1))),
            None if c.causal => AttentionMods::new().mask(move |x| (&x.q - &x.kv).lt(w)),
            None => AttentionMods::new().mask(move |x| and(&x.kv.lt(&x.q + 1), &(&x.q - &x.kv).lt(w))),
        };
        let keep =
            |i: usize, j: usize| j <= i && i - j < w as usize || prefix.is_some_and(|p| j < p as usize);
        let sdpa = Sdpa::compile_flex(&c, &window).unwrap();
        let b = sdpa.blocking();
        let plan = flex_block_plan(&c, &b, &window).expect("bounds free of run-time values");
        assert_eq!(plan.len(), b.tasks(&c));
        let (bq, bc, blocks) = (b.queries, b.keys, c.n_q.div_ceil(b.queries));
        let mut skipped = 0;
        for (t, &[t0, c0, c1, t1]) in plan.iter().enumerate() {
            assert_eq!(b.heads_per_task, 1);
            let q0 = (t % blocks * bq).min(c.n_q - bq);
            for kb in 0..c.n_k / bc {
                let pairs = || (q0..q0 + bq).flat_map(|i| (kb * bc..(kb + 1) * bc).map(move |j| (i, j)));
                let any = pairs().any(|(i, j)| keep(i, j));
                let all = pairs().all(|(i, j)| keep(i, j));
                assert_eq!(any, (t0..t1).contains(&kb), "task {t} block {kb}: {:?}", plan[t]);
                assert_eq!(all, (c0..c1).contains(&kb), "task {t} block {kb}: {:?}", plan[t]);
                skipped += usize::from(!any);
            }
        }
        let computed = sdpa.blocks_computed(Extras::default()).unwrap().unwrap();
        assert_eq!(skipped > 0, computed < 1.0, "{computed} {skipped}");
        println!("{c:?} window {w}: {:.1}% of blocks computed", computed * 100.0);
    }
}

#[test]
fn decode_against_a_runtime_kv_length_and_16_bit_inputs_take_mods() {
    use half::bf16;
    let mut rng = Rng(11);
    // Decode: one query per head against a cache of 300 holding 177, causal (query i sees the
    // keys up to L - n_q + i), under ALiBi and a window of 50 keys read as bounds.
    let c = SdpaConfig { runtime_kv_length: true, causal: true, ..config(1, 8, 2, 1, 300, 32) };
    let mut mods = AttentionMods::new();
    let slopes = mods.capture("slopes", &[8], DType::F32);
    let mods = mods
        .score(move |x, s| s + x.load(slopes, &[x.h.clone()]) * (&x.kv - &x.q).cast(DType::F32))
        .mask(|x| (&x.q + 176 - &x.kv).lt(50));
    let slope: Vec<f32> = (0..8).map(|h| 0.5f32.powi(h + 1)).collect();
    let alibi = |s: f64, [_, h, i, j]: [usize; 4]| s + f64::from(slope[h]) * (j as f64 - i as f64);
    let keep = |[_, _, i, j]: [usize; 4]| (i as i64 + 176 - j as i64) < 50;
    let f = FlexReference { score: Some(&alibi), mask: Some(&keep), ..FlexReference::default() };
    let (q, k, v) = (rng.values(c.q_len()), rng.values(c.kv_len()), rng.values(c.kv_len()));
    let sdpa = Sdpa::compile_flex(&c, &mods).unwrap();
    let captures = [CaptureValues::F32(&slope)];
    let extras = Extras { captures: &captures, kv_length: Some(177), ..Extras::default() };
    let mut out = vec![f32::NAN; c.q_len()];
    sdpa.run(&q, &k, &v, extras, &mut out).unwrap();
    assert_close("decode", &out, &reference_flex_f64(&c, &q, &k, &v, extras, f));
    // bf16 q, k, v and output under a sliding window and a halving score function: against
    // the reference on the same bf16 values widened, within bf16's rounding of P (2^-8 of each
    // weight, so of the sum of |p v| <= 1) and of the output (2^-8 of it).
    let c = SdpaConfig { dtype: uopc_kernels::sdpa::SdpaDType::BF16, ..config(2, 4, 2, 70, 70, 16) };
    let mods = AttentionMods::new()
        .score(|_, s| s * 0.5f32)
        .mask(|x| and(&x.kv.lt(&x.q + 1), &(&x.q - &x.kv).lt(20)));
    let half = |x: Vec<f32>| x.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
    let (q, k, v) = (half(rng.values(c.q_len())), half(rng.values(c.kv_len())), half(rng.values(c.kv_len())));
    let wide = |x: &[bf16]| x.iter().map(|h| h.to_f32()).collect::<Vec<_>>();
    let sdpa = Sdpa::compile_flex(&c, &mods).unwrap();
    let mut out = vec![bf16::NAN; c.q_len()];
    sdpa.run(&q, &k, &v, Extras::default(), &mut out).unwrap();
    let halved = |s: f64, _: [usize; 4]| s * 0.5;
    let keep = |[_, _, i, j]: [usize; 4]| j <= i && i - j < 20;
    let f = FlexReference { score: Some(&halved), mask: Some(&keep), ..FlexReference::default() };
    let want = reference_flex_f64(&c, &wide(&q), &wide(&k), &wide(&v), Extras::default(), f);
    for (i, (got, &want)) in out.iter().zip(&want).enumerate() {
        let got = got.to_f64();
        assert!((got - want).abs() <= (1.5 + want.abs()) / 256.0, "bf16 out[{i}] = {got}, want {want}");
    }
}

/// One comparison of a random mask: over the key `kv`, the query `q` and constants.
#[derive(Clone, Copy, Debug)]
enum Term {
    /// `kv < q + c` (an end that moves with the row).
    EndAtRow(i64),
    /// `q - kv < c` (a start: a window).
    StartAtRow(i64),
    /// `kv < c`.
    End(i64),
    /// `c < kv`.
    Start(i64),
    /// `kv + c < 2 q` (an end moving two keys a row).
    EndAtTwiceRow(i64),
    /// `kv % m != 0` (no bound: every block masked).
    NotMultiple(i64),
}

impl Term {
    fn ir(self, x: &uopc_kernels::sdpa::ScoreArgs<'_>) -> UOp {
        match self {
            Term::EndAtRow(c) => x.kv.lt(&x.q + c),
            Term::StartAtRow(c) => (&x.q - &x.kv).lt(c),
            Term::End(c) => x.kv.lt(c),
            Term::Start(c) => idx(c).lt(&x.kv),
            Term::EndAtTwiceRow(c) => (&x.kv + c).lt(&x.q * 2),
            Term::NotMultiple(m) => x.kv.modulo(m).ne(0),
        }
    }

    fn holds(self, q: i64, kv: i64) -> bool {
        match self {
            Term::EndAtRow(c) => kv < q + c,
            Term::StartAtRow(c) => q - kv < c,
            Term::End(c) => kv < c,
            Term::Start(c) => c < kv,
            Term::EndAtTwiceRow(c) => kv + c < 2 * q,
            Term::NotMultiple(m) => kv % m != 0,
        }
    }

    fn random(rng: &mut Rng, n: i64) -> Term {
        let c = rng.below(n as usize + 40) as i64 - 20;
        match rng.below(6) {
            0 => Term::EndAtRow(c),
            1 => Term::StartAtRow(c.abs() + 1),
            2 => Term::End(c),
            3 => Term::Start(c),
            4 => Term::EndAtTwiceRow(c),
            _ => Term::NotMultiple(2 + rng.below(5) as i64),
        }
    }
}

/// Random masks (conjunctions of one to three comparisons, or a union of two) on random shapes,
/// causal or not, with and without a score function: whatever bounds the compile reads off the
/// mask, and whatever plan the run counts, the output is the reference's, and rows that see no
/// key are zeros.
#[test]
fn random_masks_give_the_reference_whatever_blocks_they_skip() {
    let mut rng = Rng(101);
    for case in 0..40 {
        let (hkv, group) = (1 + rng.below(2), 1 + rng.below(3));
        let (n_q, n_k) = (1 + rng.below(200), 1 + rng.below(260));
        let c = SdpaConfig {
            causal: rng.below(3) == 0,
            ..config(1 + rng.below(2), hkv * group, hkv, n_q, n_k, [8, 16][rng.below(2)])
        };
        let n = n_k.max(n_q) as i64;
        let terms: Vec<Term> = (0..1 + rng.below(3)).map(|_| Term::random(&mut rng, n)).collect();
        let union = terms.len() == 2 && rng.below(3) == 0;
        let scored = rng.below(2) == 0;
        let ir_terms = terms.clone();
        let mut mods = AttentionMods::new().mask(move |x| {
            let conds: Vec<UOp> = ir_terms.iter().map(|t| t.ir(x)).collect();
            if union {
                or(&conds[0], &conds[1])
            } else {
                conds.iter().skip(1).fold(conds[0].clone(), |a, b| and(&a, b))
            }
        });
        if scored {
            mods = mods.score(|x, s| s * 0.5f32 + (&x.kv - &x.q).cast(DType::F32) * 0.01f32);
        }
        let keep = |[_, _, i, j]: [usize; 4]| {
            let holds = terms.iter().map(|t| t.holds(i as i64, j as i64));
            if union { holds.into_iter().any(|h| h) } else { holds.into_iter().all(|h| h) }
        };
        let score = |s: f64, [_, _, i, j]: [usize; 4]| s * 0.5 + (j as f64 - i as f64) * 0.01;
        let f = FlexReference {
            mask: Some(&keep),
            score: scored.then_some(&score as _),
            ..FlexReference::default()
        };
        let sdpa = check(c, &mods, &[], f, &mut rng);
        println!("case {case}: {c:?} {terms:?} union {union}: {sdpa}");
    }
}

#[test]
fn a_mask_that_is_the_causal_mask_runs_the_causal_kernel() {
    // `kv <= q + n_k - n_q` alone, with a score function and sinks: the causal kernel runs it
    // (its diagonal blocks in parts), with the functions on its blocks; another offset stays a
    // flex mask.
    let mut rng = Rng(13);
    for (c, offset) in [
        (config(1, 4, 2, 300, 300, 16), 0i64),
        (config(2, 2, 1, 37, 170, 8), 133),
        (config(1, 2, 2, 64, 64, 8), 5),
    ] {
        let mut mods = AttentionMods::new();
        let logits = mods.capture("sinks", &[c.heads], DType::F32);
        let mods = mods
            .sinks(logits)
            .score(|x, s| s + (&x.kv - &x.q).cast(DType::F32) * 0.05f32)
            .mask(move |x| x.kv.lt(&x.q + offset + 1));
        let sink: Vec<f32> = (0..c.heads).map(|h| h as f32 * 0.5).collect();
        let keep = |[_, _, i, j]: [usize; 4]| j as i64 <= i as i64 + offset;
        let score = |s: f64, [_, _, i, j]: [usize; 4]| s + (j as f64 - i as f64) * 0.05;
        let f = FlexReference { score: Some(&score), mask: Some(&keep), sinks: Some(&sink) };
        let sdpa = check(c, &mods, &[CaptureValues::F32(&sink)], f, &mut rng);
        let causal = offset == c.causal_offset();
        assert_eq!(sdpa.to_string().contains("the causal kernel runs it"), causal, "{sdpa}");
        assert_eq!(sdpa.config().causal, causal, "{sdpa}");
    }
}

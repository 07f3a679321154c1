//! The backward of attention with score and mask functions (`SdpaBackward::compile_flex`)
//! against central differences of the f64 reference with the same functions written as Rust
//! closures: dq, dk, dv and the gradients of the float captures (ALiBi slopes, a relative
//! position bias table, sink logits), through the causal rewrite, a sliding window whose block
//! pairs are skipped and run whole, a document mask, a prefix-LM mask with key lengths, GQA,
//! odd sizes and rows that see no key.

use uopc_ir::{DType, UOp, idx};
use uopc_kernels::sdpa::{
    AttentionMods, BackwardBlocking, CaptureValues, Extras, FlexReference, ForwardSaved, SdpaBackward,
    SdpaConfig, and, or, reference_flex_f64,
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

/// The reference output for the inputs `[q, k, v, float captures in declaration order ..]`.
type Reference<'a> = dyn Fn(&[Vec<f32>]) -> Vec<f64> + 'a;

/// One case: the mods, their captures (floats among the inputs, ids fixed), the reference.
struct Case<'a> {
    name: &'static str,
    config: SdpaConfig,
    mods: AttentionMods,
    /// Which captures are floats (inputs 3, 4, ..) and the ids of the others, in order.
    captures: Vec<Result<Vec<f32>, Vec<i32>>>,
    key_lengths: Option<Vec<i32>>,
    blocking: Option<BackwardBlocking>,
    reference: Box<Reference<'a>>,
}

/// Runs the case's forward and backward and compares every gradient with central differences
/// of `loss = sum(out * dO)` over the reference: within `2e-4 (1 + |want|)` (the kernel's f32
/// sums against differences of an f64 function, whose own error is about `h^2 = 1e-6` times
/// its third derivative).
fn check(case: &Case<'_>, rng: &mut Rng) -> SdpaBackward {
    let c = case.config;
    let b = match case.blocking {
        Some(blocking) => SdpaBackward::compile_flex_with(&c, &case.mods, blocking),
        None => SdpaBackward::compile_flex(&c, &case.mods),
    }
    .unwrap_or_else(|e| panic!("{}: {e}", case.name));
    let mut inputs = vec![rng.values(c.q_len()), rng.values(c.kv_len()), rng.values(c.kv_len())];
    inputs.extend(case.captures.iter().filter_map(|cap| cap.as_ref().ok().cloned()));
    let d_o = rng.values(c.q_len());
    let captures = capture_values(&case.captures, &inputs[3..]);
    let extras =
        Extras { captures: &captures, key_lengths: case.key_lengths.as_deref(), ..Extras::default() };
    let (mut out, mut lse) = (vec![f32::NAN; c.q_len()], vec![f32::NAN; b.lse_len()]);
    b.forward(&inputs[0], &inputs[1], &inputs[2], extras, &mut out, &mut lse).unwrap();
    let want_out = (case.reference)(&inputs);
    for (i, (&got, want)) in out.iter().zip(&want_out).enumerate() {
        assert!((f64::from(got) - want).abs() <= 2e-5 * (1.0 + want.abs()), "{}: out[{i}]", case.name);
    }
    let (mut dq, mut dk, mut dv) =
        (vec![f32::NAN; c.q_len()], vec![f32::NAN; c.kv_len()], vec![f32::NAN; c.kv_len()]);
    let mut dcap: Vec<Vec<f32>> = case
        .captures
        .iter()
        .map(|cap| cap.as_ref().map_or(Vec::new(), |v| vec![f32::NAN; v.len()]))
        .collect();
    let mut targets: Vec<&mut [f32]> = dcap.iter_mut().map(|v| v.as_mut_slice()).collect();
    let saved = ForwardSaved { q: &inputs[0], k: &inputs[1], v: &inputs[2], o: &out, lse: &lse };
    b.run_with_capture_grads(saved, &d_o, extras, [&mut dq, &mut dk, &mut dv], &mut targets).unwrap();
    let got: Vec<&[f32]> = [&dq[..], &dk[..], &dv[..]]
        .into_iter()
        .chain(dcap.iter().filter(|v| !v.is_empty()).map(|v| &v[..]))
        .collect();
    let loss = |x: &[Vec<f32>]| -> f64 {
        (case.reference)(x).iter().zip(&d_o).map(|(o, g)| o * f64::from(*g)).sum()
    };
    let names = ["dq", "dk", "dv", "dcapture"];
    for (which, grad) in got.iter().enumerate() {
        let mut x = inputs.clone();
        for (j, &g) in grad.iter().enumerate() {
            let x0 = x[which][j];
            let (up, down) = (x0 + 1e-3, x0 - 1e-3);
            x[which][j] = up;
            let l_up = loss(&x);
            x[which][j] = down;
            let l_down = loss(&x);
            x[which][j] = x0;
            let want = (l_up - l_down) / (f64::from(up) - f64::from(down));
            assert!(
                g.is_finite() && (f64::from(g) - want).abs() <= 2e-4 * (1.0 + want.abs()),
                "{} ({b}): {}[{j}] = {g}, central difference {want}",
                case.name,
                names[which.min(3)]
            );
        }
    }
    b
}

/// The captures' values for a run: the float ones from `floats` (in order), the ids as given.
fn capture_values<'a>(
    caps: &'a [Result<Vec<f32>, Vec<i32>>],
    floats: &'a [Vec<f32>],
) -> Vec<CaptureValues<'a>> {
    let mut next = floats.iter();
    caps.iter()
        .map(|cap| match cap {
            Ok(_) => CaptureValues::F32(next.next().expect("one input per float capture")),
            Err(ids) => CaptureValues::I32(ids),
        })
        .collect()
}

#[test]
fn alibi_through_the_causal_rewrite_and_a_plain_score_function() {
    let mut rng = Rng(21);
    let c = config(2, 4, 2, 13, 21, 8);
    let off = c.causal_offset();
    let mods = support::alibi_causal(4, off);
    let reference = move |x: &[Vec<f32>]| {
        let slope = &x[3];
        let score = |s: f64, [_, h, i, j]: [usize; 4]| s + f64::from(slope[h]) * (j as f64 - i as f64);
        let keep = |[_, _, i, j]: [usize; 4]| j as i64 <= i as i64 + off;
        let f = FlexReference { score: Some(&score), mask: Some(&keep), sinks: None };
        reference_flex_f64(&c, &x[0], &x[1], &x[2], Extras::default(), f)
    };
    let case = Case {
        name: "alibi, causal",
        config: c,
        mods,
        captures: vec![Ok(vec![0.5, -0.25, 0.125, 0.3])],
        key_lengths: None,
        blocking: None,
        reference: Box::new(reference),
    };
    let b = check(&case, &mut rng);
    assert!(b.config().causal, "the mask is the causal mask: {b}");

    // A constant derivative other than 1 (no slope tile): 0.7 s.
    let c = config(1, 3, 1, 9, 14, 8);
    let scaled = AttentionMods::new().score(|_, s| s * 0.7f32);
    let reference = move |x: &[Vec<f32>]| {
        let score = |s: f64, _: [usize; 4]| 0.7 * s;
        let f = FlexReference { score: Some(&score), ..FlexReference::default() };
        reference_flex_f64(&c, &x[0], &x[1], &x[2], Extras::default(), f)
    };
    let case = Case {
        name: "0.7 s",
        config: c,
        mods: scaled,
        captures: vec![],
        key_lengths: None,
        blocking: None,
        reference: Box::new(reference),
    };
    check(&case, &mut rng);

    // No mask, the causal flag, a score function of the score alone (s + s^2 / 4).
    let c = SdpaConfig { causal: true, ..config(1, 2, 2, 11, 11, 8) };
    let square = AttentionMods::new().score(|_, s| s + &(s * s) * 0.25f32);
    let reference = move |x: &[Vec<f32>]| {
        let score = |s: f64, _: [usize; 4]| s + s * s * 0.25;
        let f = FlexReference { score: Some(&score), ..FlexReference::default() };
        reference_flex_f64(&c, &x[0], &x[1], &x[2], Extras::default(), f)
    };
    let case = Case {
        name: "s + s^2 / 4, causal flag",
        config: c,
        mods: square,
        captures: vec![],
        key_lengths: None,
        blocking: None,
        reference: Box::new(reference),
    };
    check(&case, &mut rng);
}

/// A sliding window of `w` keys up to each row's own, with `c * tanh(s / c)` as the score
/// function when `cap` gives `c`, on `config` under `blocking`, against its f64 reference.
fn window_case(
    name: &'static str,
    config: SdpaConfig,
    (w, cap): (i64, Option<f32>),
    blocking: BackwardBlocking,
) -> Case<'static> {
    let mods = match cap {
        Some(c) => AttentionMods::new().score(move |_, s| softcap(s, c)),
        None => AttentionMods::new(),
    };
    let mods = mods.mask(move |x| and(&x.kv.lt(&x.q + 1), &(&x.q - &x.kv).lt(w)));
    let reference = move |x: &[Vec<f32>]| {
        let score = move |s: f64, _: [usize; 4]| cap.map_or(s, |c| f64::from(c) * (s / f64::from(c)).tanh());
        let keep = |[_, _, i, j]: [usize; 4]| j <= i && i - j < w as usize;
        let f = FlexReference { score: cap.map(|_| &score as _), mask: Some(&keep), sinks: None };
        reference_flex_f64(&config, &x[0], &x[1], &x[2], Extras::default(), f)
    };
    Case {
        name,
        config,
        mods,
        captures: vec![],
        key_lengths: None,
        blocking: Some(blocking),
        reference: Box::new(reference),
    }
}

#[test]
fn softcap_in_a_sliding_window_skips_and_runs_whole_block_pairs() {
    let mut rng = Rng(22);
    // Blocks of 4 queries and 4 keys, two chunks: most pairs are skipped, some (4 rows at
    // distance 4..8 from a 4-key block) are inside the window whole.
    for blocking in [
        BackwardBlocking { queries: 4, keys: 4, chunks: 2 },
        BackwardBlocking { queries: 8, keys: 3, chunks: 1 },
    ] {
        let case =
            window_case("softcap, sliding window", config(1, 2, 1, 29, 29, 8), (9, Some(0.8)), blocking);
        let b = check(&case, &mut rng);
        assert!(b.to_string().contains("outside every row's bounds are skipped"), "{b}");
    }
}

/// A sliding window alone (no score function): the pairs across its bounds have only each
/// row's masked ends set, never the mask evaluated; rows near a block's start see none of it.
#[test]
fn a_sliding_window_alone_masks_by_its_bounds() {
    let mut rng = Rng(23);
    for blocking in [
        BackwardBlocking { queries: 8, keys: 8, chunks: 1 },
        BackwardBlocking { queries: 4, keys: 5, chunks: 2 },
    ] {
        check(&window_case("sliding window", config(1, 3, 1, 37, 37, 8), (6, None), blocking), &mut rng);
    }
}

#[test]
fn a_relative_position_table_inside_documents_gets_its_gradient() {
    let mut rng = Rng(23);
    let (n, heads) = (19, 2);
    let c = config(2, heads, 2, n, n, 4);
    let mods = support::relative_table_in_documents(heads, 2, n);
    // Item 0: documents of 8, 9 and 2 tokens (its 8 x 8 block pairs on the diagonal are seen
    // whole, the others partly or not at all); item 1: 3, 13 and 3.
    let ids = support::document_ids(&[&[8, 9, 2], &[3, 13, 3]]);
    let ids_ref = ids.clone();
    let reference = move |x: &[Vec<f32>]| {
        let t = &x[3];
        let score = |s: f64, [_, h, i, j]: [usize; 4]| s + f64::from(t[h * (2 * n - 1) + j + n - 1 - i]);
        let keep = |[b, _, i, j]: [usize; 4]| ids_ref[b * n + i] == ids_ref[b * n + j];
        let f = FlexReference { score: Some(&score), mask: Some(&keep), sinks: None };
        reference_flex_f64(&c, &x[0], &x[1], &x[2], Extras::default(), f)
    };
    let values: Vec<f32> = (0..heads * (2 * n - 1)).map(|i| ((i * 7) % 11) as f32 * 0.1 - 0.5).collect();
    let case = Case {
        name: "relative bias table, documents",
        config: c,
        mods,
        captures: vec![Ok(values), Err(ids)],
        key_lengths: None,
        blocking: Some(BackwardBlocking { queries: 8, keys: 8, chunks: 1 }),
        reference: Box::new(reference),
    };
    let b = check(&case, &mut rng);
    assert!(b.to_string().contains("1 float capture(s)"), "{b}");
    assert!(b.to_string().contains("a plan counted once per run"), "{b}");
}

#[test]
fn sinks_with_a_prefix_lm_mask_and_key_lengths() {
    let mut rng = Rng(24);
    let c = SdpaConfig { key_lengths: true, ..config(2, 4, 1, 17, 17, 8) };
    let prefix = 5;
    let mut mods = AttentionMods::new();
    let logits = mods.capture("sinks", &[4], DType::F32);
    let mods = mods.sinks(logits).mask(move |x| or(&x.kv.lt(prefix), &x.kv.lt(&x.q + 1)));
    let lens = vec![17, 11];
    let lens_ref = lens.clone();
    let reference = move |x: &[Vec<f32>]| {
        let keep = |[_, _, i, j]: [usize; 4]| j < prefix as usize || j <= i;
        let f = FlexReference { score: None, mask: Some(&keep), sinks: Some(&x[3]) };
        let extras = Extras { key_lengths: Some(&lens_ref), ..Extras::default() };
        reference_flex_f64(&c, &x[0], &x[1], &x[2], extras, f)
    };
    let case = Case {
        name: "sinks, prefix-LM, key lengths",
        config: c,
        mods,
        captures: vec![Ok(vec![-0.5, 0.0, 0.7, 1.5])],
        key_lengths: Some(lens),
        blocking: Some(BackwardBlocking { queries: 4, keys: 4, chunks: 2 }),
        reference: Box::new(reference),
    };
    check(&case, &mut rng);
}

#[test]
fn rows_that_see_no_key_get_zero_gradients_never_nan() {
    let mut rng = Rng(25);
    let c = config(1, 2, 2, 12, 12, 8);
    // Rows 0..=3 see nothing.
    let mut mods = AttentionMods::new();
    let slopes = mods.capture("slopes", &[2], DType::F32);
    let mods = mods
        .score(move |x, s| s + x.load(slopes, &[x.h.clone()]) * (&x.kv - &x.q).cast(DType::F32))
        .mask(|x| (&x.kv + 4).lt(&x.q + idx(1)));
    let reference = move |x: &[Vec<f32>]| {
        let slope = &x[3];
        let score = |s: f64, [_, h, i, j]: [usize; 4]| s + f64::from(slope[h]) * (j as f64 - i as f64);
        let keep = |[_, _, i, j]: [usize; 4]| j + 4 <= i;
        let f = FlexReference { score: Some(&score), mask: Some(&keep), sinks: None };
        reference_flex_f64(&c, &x[0], &x[1], &x[2], Extras::default(), f)
    };
    let case = Case {
        name: "empty rows",
        config: c,
        mods,
        captures: vec![Ok(vec![0.3, -0.2])],
        key_lengths: None,
        blocking: Some(BackwardBlocking { queries: 4, keys: 4, chunks: 1 }),
        reference: Box::new(reference),
    };
    check(&case, &mut rng);
}

#[test]
fn bad_gradient_slices_are_errors_naming_the_capture() {
    let c = config(1, 2, 2, 8, 8, 8);
    let mut mods = AttentionMods::new();
    let slopes = mods.capture("slopes", &[2], DType::F32);
    let mods = mods.score(move |x, s| s + x.load(slopes, &[x.h.clone()]));
    let b = SdpaBackward::compile_flex(&c, &mods).unwrap();
    let (q, o, lse) = (vec![0.1f32; c.q_len()], vec![0.0f32; c.q_len()], vec![0.0f32; b.lse_len()]);
    let slope = [0.5f32, 0.25];
    let captures = [CaptureValues::F32(&slope)];
    let extras = Extras { captures: &captures, ..Extras::default() };
    let saved = ForwardSaved { q: &q, k: &q, v: &q, o: &o, lse: &lse };
    let (mut dq, mut dk, mut dv) = (vec![0.0; c.q_len()], vec![0.0; c.kv_len()], vec![0.0; c.kv_len()]);
    let mut short = [0.0f32; 1];
    let err = b
        .run_with_capture_grads(saved, &q, extras, [&mut dq, &mut dk, &mut dv], &mut [&mut short[..]])
        .unwrap_err()
        .to_string();
    assert!(err.contains("slopes") && err.contains("holds 1, want 2"), "{err}");
    let err = b
        .run_with_capture_grads(saved, &q, extras, [&mut dq, &mut dk, &mut dv], &mut [])
        .unwrap_err()
        .to_string();
    assert!(err.contains("0 gradient slice(s) given"), "{err}");
    // A plain backward has no captures to differentiate.
    let plain = SdpaBackward::compile(&c).unwrap();
    let err = plain
        .run_with_capture_grads(saved, &q, Extras::default(), [&mut dq, &mut dk, &mut dv], &mut [])
        .unwrap_err()
        .to_string();
    assert!(err.contains("dcaptures"), "{err}");
}

#[test]
fn bf16_inputs_get_the_f32_gradients_of_their_values_rounded_once() {
    use half::bf16;
    use uopc_kernels::sdpa::{SdpaBackwardHalf, SdpaDType};
    let mut rng = Rng(27);
    let c = config(1, 4, 2, 37, 53, 16);
    let mods = support::alibi_causal(4, c.causal_offset());
    let round = |v: Vec<f32>| v.into_iter().map(bf16::from_f32).collect::<Vec<bf16>>();
    let (q, k, v, d_o) = (
        round(rng.values(c.q_len())),
        round(rng.values(c.kv_len())),
        round(rng.values(c.kv_len())),
        round(rng.values(c.q_len())),
    );
    let slopes = [0.5f32, -0.25, 0.125, 0.3];
    let captures = [CaptureValues::F32(&slopes)];
    let extras = Extras { captures: &captures, ..Extras::default() };
    let half = SdpaBackwardHalf::compile_flex(&SdpaConfig { dtype: SdpaDType::BF16, ..c }, &mods).unwrap();
    let (mut dq, mut dk, mut dv) =
        (vec![bf16::NAN; c.q_len()], vec![bf16::NAN; c.kv_len()], vec![bf16::NAN; c.kv_len()]);
    let mut dslopes = vec![f32::NAN; 4];
    half.gradients_with_capture_grads(
        [&q, &k, &v],
        &d_o,
        extras,
        [&mut dq, &mut dk, &mut dv],
        &mut [&mut dslopes],
    )
    .unwrap();
    // The f32 flex backward on the widened values, rounded once: the same bits.
    let wide = |x: &[bf16]| x.iter().map(|h| h.to_f32()).collect::<Vec<f32>>();
    let b = SdpaBackward::compile_flex(&c, &mods).unwrap();
    let (q, k, v, d_o) = (wide(&q), wide(&k), wide(&v), wide(&d_o));
    let (mut out, mut lse) = (vec![0.0; c.q_len()], vec![0.0; b.lse_len()]);
    b.forward(&q, &k, &v, extras, &mut out, &mut lse).unwrap();
    let (mut gq, mut gk, mut gv) = (vec![0.0; c.q_len()], vec![0.0; c.kv_len()], vec![0.0; c.kv_len()]);
    let mut gslopes = vec![0.0f32; 4];
    let saved = ForwardSaved { q: &q, k: &k, v: &v, o: &out, lse: &lse };
    b.run_with_capture_grads(saved, &d_o, extras, [&mut gq, &mut gk, &mut gv], &mut [&mut gslopes]).unwrap();
    assert_eq!(dq, round(gq));
    assert_eq!(dk, round(gk));
    assert_eq!(dv, round(gv));
    assert_eq!(dslopes, gslopes);
    // The f32 configuration is SdpaBackward's.
    assert!(SdpaBackwardHalf::compile_flex(&c, &mods).is_err());
}

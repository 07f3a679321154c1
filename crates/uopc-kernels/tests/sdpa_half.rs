//! bf16 and f16 attention against the f64 reference computed from the same 16-bit inputs,
//! against uopc's f32 attention on those inputs, and against the loop-IR interpreter; masks,
//! GQA, head sizes, decode (split-K) and the errors of mismatched dtypes (the backward is in
//! `sdpa_half_backward`).
//!
//! Tolerance: the scores, softmax and both GEMMs' sums are f32 (errors near 1e-6 here), so
//! what is left is at most two roundings to the 16-bit type with unit roundoff `u` (2^-8 for
//! bf16, 2^-11 for f16; f16 keeps its probabilities in f32, so only its output is rounded, and
//! the bound below is loose for it). Rounding each probability moves it by at most `u` of itself; as the
//! row sum adds the rounded weights, the normalized weights move by at most `2u / (1 - u)` of
//! themselves, so the output moves by at most `2u / (1 - u) * max |v|`. Rounding the output
//! adds at most `u * |o| <= u * max |v|`. With values in [-1, 1] the bound is about `3u`, and
//! `1e-5` covers the f32 parts.

use half::{bf16, f16};
use uopc_ir::DType;
use uopc_kernels::sdpa::{
    Blocking, Extras, Layout, MaskKind, Sdpa, SdpaBackward, SdpaConfig, SdpaDType, SdpaError, Values,
    ValuesMut, attention, reference_f64,
};

mod support;
use support::{Half, Rng};

/// The bound derived in the module docs, for values of magnitude at most 1.
fn tolerance<T: Half>() -> f64 {
    let u = T::UNIT_ROUNDOFF;
    2.0 * u / (1.0 - u) + u + 1e-5
}

struct Case<T> {
    config: SdpaConfig,
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    mask: Option<Vec<bool>>,
    bias: Option<Vec<f32>>,
    lens: Option<Vec<i32>>,
}

fn round<T: Half>(x: &[f32]) -> Vec<T> {
    x.iter().map(|&x| T::from(x)).collect()
}

fn widen<T: Half>(x: &[T]) -> Vec<f32> {
    x.iter().map(|&x| x.to()).collect()
}

impl<T: Half> Case<T> {
    fn new(config: SdpaConfig, rng: &mut Rng) -> Case<T> {
        let config = SdpaConfig { dtype: T::DTYPE, ..config };
        let (q, k, v) = (
            round(&rng.values(config.q_len())),
            round(&rng.values(config.kv_len())),
            round(&rng.values(config.kv_len())),
        );
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
    /// The f64 attention of the 16-bit inputs (widened exactly).
    fn reference(&self, extras: Extras<'_>) -> Vec<f64> {
        reference_f64(&self.config, &widen(&self.q), &widen(&self.k), &widen(&self.v), extras)
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

/// Runs `case` on `sdpa` and checks it against the f64 reference and against uopc's f32
/// attention of the same (16-bit) inputs, both within [`tolerance`]; returns the output.
fn check_with<T: Half>(case: &Case<T>, sdpa: &Sdpa, extras: Extras<'_>) -> Vec<f32> {
    let mut out = vec![T::from(f32::NAN); case.config.q_len()];
    sdpa.run(&case.q, &case.k, &case.v, extras, &mut out).expect("run");
    let out = widen(&out);
    let want = case.reference(extras);
    let err = error(&out, &want);
    let tol = tolerance::<T>();
    assert!(err <= tol, "{sdpa} ({:?}): max error {err} above {tol}", case.config);
    let f32_config = SdpaConfig { dtype: SdpaDType::F32, ..case.config };
    let mut f32_out = vec![f32::NAN; case.config.q_len()];
    attention(&f32_config, &widen(&case.q), &widen(&case.k), &widen(&case.v), extras, &mut f32_out)
        .expect("f32");
    let vs_f32 = error(&out, &f32_out.iter().map(|&x| f64::from(x)).collect::<Vec<_>>());
    assert!(vs_f32 <= tol, "{sdpa}: {vs_f32} from uopc's f32 attention");
    out
}

fn check<T: Half>(config: SdpaConfig, rng: &mut Rng) -> Sdpa {
    let case = Case::<T>::new(config, rng);
    let sdpa = Sdpa::compile(&case.config).expect("compile");
    check_with(&case, &sdpa, case.extras());
    sdpa
}

fn config(b: usize, h: usize, hkv: usize, n_q: usize, n_k: usize, d: usize) -> SdpaConfig {
    SdpaConfig { kv_heads: hkv, ..SdpaConfig::new(b, h, n_q, n_k, d) }
}

fn both(f: impl Fn(&mut Rng, bool)) {
    f(&mut Rng(11), false);
    f(&mut Rng(13), true);
}

/// `check` for bf16 (`f16 = false`) or f16.
fn check_dtype(config: SdpaConfig, rng: &mut Rng, f16: bool) -> Sdpa {
    if f16 { check::<half::f16>(config, rng) } else { check::<bf16>(config, rng) }
}

#[test]
fn keys_and_values_packed_once_widened_give_the_reference() {
    // K and V widened into f32 panels once per run, the queries widened into a tile: against
    // the f64 reference and uopc's f32 attention, with GQA, a ragged last key block and panel,
    // causal rows, and a bias; f16 and bf16 (whose probabilities then stay f32 over the scores,
    // as f16's do: the panels' f32 GEMM reads them).
    both(|rng, f16| {
        for (c, blocking) in [
            (config(2, 4, 2, 48, 70, 20), Blocking { kv_panel_width: 16, ..Blocking::new(1, 16, 32) }),
            (config(1, 8, 1, 33, 64, 24), Blocking { kv_panel_width: 8, ..Blocking::new(2, 11, 16) }),
            (
                SdpaConfig {
                    causal: true,
                    mask: MaskKind::Bias([1, 1, 40, 40]),
                    ..config(1, 2, 2, 40, 40, 8)
                },
                Blocking { kv_panel_width: 8, ..Blocking::new(1, 8, 8) },
            ),
        ] {
            let dtype = if f16 { SdpaDType::F16 } else { SdpaDType::BF16 };
            let c = SdpaConfig { dtype, ..c };
            if !f16 && !bf16_widens() {
                // bf16 on bf16 GEMMs packs pair panels instead (the next test).
                assert!(Sdpa::compile_with(&c, blocking).is_err());
                continue;
            }
            let sdpa = Sdpa::compile_with(&c, blocking).expect("compile");
            assert!(sdpa.to_string().contains("packed once per run"), "{sdpa}");
            let text = uopc_ir::print_program(&uopc_kernels::sdpa::sdpa_ir(&c, &blocking)).unwrap();
            assert!(!text.contains("to=bf16"), "{text}");
            if f16 {
                let case = Case::<half::f16>::new(c, rng);
                check_with(&case, &sdpa, case.extras());
            } else {
                let case = Case::<bf16>::new(c, rng);
                check_with(&case, &sdpa, case.extras());
            }
        }
    });
}

fn bf16_widens() -> bool {
    uopc_jit::machine::Machine::get().choices().bf16.widens()
}

#[test]
fn keys_and_values_packed_once_in_pair_panels_give_the_reference() {
    // bf16 K and V packed once into pair panels of 32 for GEMMs that multiply bf16 (AMX,
    // vdpbf16ps): against the f64 reference and uopc's f32 attention, with GQA and stacked
    // heads, D not a multiple of 32, a ragged last key block, causal rows with a bias, and
    // diagonal blocks whose GEMMs run in parts (k of 16, half a pair-panel step).
    if bf16_widens() {
        println!("skipped: this machine's bf16 GEMM widens to f32, which reads f32 panels");
        return;
    }
    let mut rng = Rng(29);
    for (c, blocking) in [
        (config(2, 4, 2, 48, 70, 20), Blocking { kv_panel_width: 32, ..Blocking::new(1, 16, 32) }),
        (config(1, 8, 1, 33, 200, 80), Blocking { kv_panel_width: 32, ..Blocking::new(2, 11, 64) }),
        (
            SdpaConfig {
                causal: true,
                mask: MaskKind::Bias([1, 1, 100, 100]),
                ..config(1, 2, 2, 100, 100, 40)
            },
            Blocking { kv_panel_width: 32, ..Blocking::new(1, 32, 32) },
        ),
        (
            SdpaConfig { causal: true, ..config(1, 2, 1, 256, 256, 64) },
            Blocking { kv_panel_width: 32, diagonal_parts: 4, ..Blocking::new(1, 128, 64) },
        ),
    ] {
        let c = SdpaConfig { dtype: SdpaDType::BF16, ..c };
        let sdpa = Sdpa::compile_with(&c, blocking).expect("compile");
        assert!(sdpa.to_string().contains("bf16 pair panels of 32"), "{sdpa}");
        let text = uopc_ir::print_program(&uopc_kernels::sdpa::sdpa_ir(&c, &blocking)).unwrap();
        assert!(text.contains("B in pair panels of 32"), "{text}");
        let case = Case::<bf16>::new(c, &mut rng);
        check_with(&case, &sdpa, case.extras());
    }
    println!("ran: bf16 attention from pair panels on {}", uopc_jit::machine::Machine::get().choices().bf16);
}

#[test]
fn head_dims_gqa_and_unequal_lengths() {
    both(|rng, f16| {
        for (i, d) in [1, 64, 80, 128, 256].into_iter().enumerate() {
            let (h, hkv) = [(2, 2), (4, 2), (4, 1), (8, 2), (3, 3)][i];
            check_dtype(config(2, h, hkv, 9, 13, d), rng, f16);
            check_dtype(config(1, h, hkv, 70, 33, d), rng, f16);
        }
        // Several query blocks and key blocks with a narrow last one, and n_q > n_k.
        check_dtype(config(1, 2, 1, 300, 200, 64), rng, f16);
        check_dtype(config(1, 1, 1, 130, 131, 16), rng, f16);
    });
}

#[test]
fn every_mask_kind_alone_and_combined() {
    both(|rng, f16| {
        for (n_q, n_k) in [(37, 37), (20, 150), (256, 256), (150, 90)] {
            for (causal, mask, lens) in [
                (true, MaskKind::None, false),
                (false, MaskKind::None, true),
                (true, MaskKind::None, true),
                (false, MaskKind::Bool([2, 1, n_q, n_k]), false),
                (false, MaskKind::Bias([1, 4, 1, n_k]), false),
                (true, MaskKind::Bias([2, 4, n_q, n_k]), true),
                (true, MaskKind::Bool([1, 1, n_q, n_k]), true),
            ] {
                let c = SdpaConfig { causal, mask, key_lengths: lens, ..config(2, 4, 2, n_q, n_k, 32) };
                check_dtype(c, rng, f16);
            }
        }
    });
}

#[test]
fn layouts_and_scales() {
    both(|rng, f16| {
        for layout in [Layout::Bhnd, Layout::Bnhd] {
            for causal in [false, true] {
                check_dtype(SdpaConfig { causal, layout, ..config(2, 4, 2, 40, 70, 24) }, rng, f16);
            }
        }
        // A negative and a zero scale: the masked blocks scale their scores before the mask
        // (the suffix form would turn -inf into +inf or NaN), the others in the softmax step.
        for scale in [-0.3, 0.0, 2.0] {
            let c = SdpaConfig {
                causal: true,
                key_lengths: true,
                scale: Some(scale),
                ..config(2, 2, 1, 70, 90, 16)
            };
            check_dtype(c, rng, f16);
        }
    });
}

#[test]
fn decode_shapes_split_the_keys() {
    both(|rng, f16| {
        for (b, h, hkv, n_k, d) in [(1, 8, 2, 4096, 64), (1, 2, 2, 2048, 128), (1, 4, 1, 1500, 80)] {
            let sdpa = check_dtype(config(b, h, hkv, 1, n_k, d), rng, f16);
            assert!(sdpa.blocking().splits > 1, "{sdpa}: expected split-K");
        }
        let lens = SdpaConfig { key_lengths: true, causal: true, ..config(3, 8, 2, 1, 3000, 64) };
        check_dtype(lens, rng, f16);
    });
}

#[test]
fn runtime_kv_length_compiles_once() {
    let mut rng = Rng(5);
    let c = SdpaConfig {
        causal: true,
        runtime_kv_length: true,
        dtype: SdpaDType::BF16,
        ..config(1, 4, 2, 1, 1024, 64)
    };
    let case = Case::<bf16>::new(c, &mut rng);
    let sdpa = Sdpa::compile(&case.config).unwrap();
    for len in [0, 1, 2, 513, 1024] {
        let extras = Extras { kv_length: Some(len), ..case.extras() };
        // The reference of the first `len` keys: a config of `len` keys over the prefix.
        let mut out = vec![bf16::NAN; c.q_len()];
        sdpa.run(&case.q, &case.k, &case.v, extras, &mut out).unwrap();
        let out = widen(&out);
        if len == 0 {
            assert!(out.iter().all(|&x| x == 0.0), "no key: zeros");
            continue;
        }
        let prefix = SdpaConfig { n_k: len, runtime_kv_length: false, ..case.config };
        let keys = |x: &[bf16]| -> Vec<f32> {
            // BHND: head h's keys are rows h * n_k .. h * n_k + len.
            (0..c.kv_heads).flat_map(|h| widen(&x[h * c.n_k * c.d..][..len * c.d])).collect()
        };
        let want = reference_f64(&prefix, &widen(&case.q), &keys(&case.k), &keys(&case.v), Extras::default());
        let err = error(&out, &want);
        assert!(err <= tolerance::<bf16>(), "L = {len}: {err}");
    }
    let short = sdpa.run(
        &case.q,
        &case.k,
        &case.v,
        Extras { kv_length: Some(1025), ..case.extras() },
        &mut vec![bf16::ZERO; c.q_len()],
    );
    assert!(matches!(short, Err(SdpaError::KvLength { len: 1025, .. })), "{short:?}");
}

#[test]
fn nan_keys_and_fully_masked_rows() {
    let mut rng = Rng(3);
    let c = SdpaConfig { key_lengths: true, ..config(2, 2, 2, 5, 40, 16) };
    let mut case = Case::<bf16>::new(c, &mut rng);
    // Item 0 sees no key; item 1 sees its first 30, of which key 7 of head 0 is NaN.
    case.lens = Some(vec![0, 30]);
    let at = (2 * c.n_k + 7) * c.d + 3;
    case.k[at] = bf16::NAN;
    let sdpa = Sdpa::compile(&case.config).unwrap();
    let out = check_with(&case, &sdpa, case.extras());
    let row = c.n_q * c.d;
    assert!(out[..2 * row].iter().all(|&x| x == 0.0), "item 0 sees nothing: zeros");
    assert!(out[2 * row..3 * row].iter().all(|x| x.is_nan()), "head 0 of item 1 sees the NaN key");
    assert!(out[3 * row..].iter().all(|x| x.is_finite()));
    // Item 1 seeing only its first key, a NaN in head 0: that head's rows are NaN, although
    // their score blocks hold nothing else but masked keys.
    case.lens = Some(vec![0, 1]);
    case.k[2 * c.n_k * c.d + 3] = bf16::NAN;
    let out = check_with(&case, &sdpa, case.extras());
    assert!(out[2 * row..3 * row].iter().all(|x| x.is_nan()), "head 0 of item 1 sees only a NaN key");
    assert!(out[3 * row..].iter().all(|x| x.is_finite()));
}

#[test]
fn bf16_probabilities_are_rounded_exactly_where_the_gemm_takes_bf16_operands() {
    // One query, two keys: P = [1, p1] with p1 = exp(-x) for the first key's score x, and with
    // v = [0, 1] in one column the output is p1 / (1 + p1), rounded. x is the first score of a
    // grid whose bf16 output tells a bf16-rounded p1 from an f32 one: rounded where the bf16
    // GEMM takes bf16 operands, f32 where it widens them.
    let c = SdpaConfig { scale: Some(1.0), dtype: SdpaDType::BF16, ..config(1, 1, 1, 1, 2, 1) };
    let output = |p1: f64| bf16::from_f64(p1 / (1.0 + p1));
    let (x, exact) = (1..256)
        .map(|i| {
            let x = bf16::from_f64(f64::from(i) / 64.0);
            (x, (-x.to_f64()).exp())
        })
        .find(|&(_, e)| output(bf16::from_f64(e).to_f64()) != output(e))
        .expect("a score whose output tells rounded P from f32 P");
    let q = [bf16::from_f32(1.0)];
    let k = [x, bf16::ZERO];
    let v = [bf16::ZERO, bf16::ONE];
    let mut out = [bf16::NAN];
    attention(&c, &q, &k, &v, Extras::default(), &mut out).unwrap();
    // The kernel's exp2 is within 1.2e-7 of exact, far inside the gap the rounding makes.
    let widens = uopc_jit::machine::Machine::get().choices().bf16.widens();
    if widens {
        assert_eq!(out[0], output(exact), "P kept in f32 where the bf16 GEMM widens (x = {x})");
    } else {
        let rounded = bf16::from_f64(exact).to_f64();
        assert_eq!(out[0], output(rounded), "P rounded to bf16 and summed as rounded (x = {x})");
    }
    // The kernel's step is the rounded one exactly where P has a bf16 tile of its own.
    let c = SdpaConfig { dtype: SdpaDType::BF16, ..config(1, 2, 2, 256, 256, 64) };
    let sdpa = Sdpa::compile(&c).unwrap();
    let text = uopc_ir::print_program(&uopc_kernels::sdpa::sdpa_ir(&c, &sdpa.blocking())).unwrap();
    assert_eq!(text.contains("tile_softmax_rounded"), !widens, "{text}");
    println!(
        "checked: bf16 P {} (this machine's bf16 GEMM {})",
        if widens { "in f32" } else { "rounded" },
        if widens { "widens" } else { "takes bf16" }
    );
}

#[test]
fn f16_probabilities_stay_f32_over_the_scores() {
    // As for bf16: P = [1, p1] with p1 = exp(-x) for a key score x, and p1 / (1 + p1) the
    // output. f16 writes P over its f32 score tile in f32, unrounded: x is the first score of
    // a grid whose f16 output differs between f16-rounded and f32 weights, and the output is
    // the one of the f32 weights.
    let c = SdpaConfig { scale: Some(1.0), dtype: SdpaDType::F16, ..config(1, 1, 1, 1, 2, 1) };
    let output = |p1: f64| f16::from_f64(p1 / (1.0 + p1));
    let (x, exact) = (1..256)
        .map(|i| {
            let x = f16::from_f64(f64::from(i) / 64.0);
            (x, (-x.to_f64()).exp())
        })
        .find(|&(_, e)| output(f16::from_f64(e).to_f64()) != output(e))
        .expect("a score whose output tells rounded P from f32 P");
    let q = [f16::from_f32(1.0)];
    let k = [x, f16::ZERO];
    let v = [f16::ZERO, f16::ONE];
    let mut out = [f16::NAN];
    attention(&c, &q, &k, &v, Extras::default(), &mut out).unwrap();
    // The kernel's exp2 is within 1.2e-7 of exact, far inside the gap between this p1 and its
    // f16 rounding, so the output is the f32 weights' one.
    assert_eq!(out[0], output(exact), "P kept in f32 (x = {x})");
    // The kernel's P is its score tile: no 16-bit scratch tile, the f32 step.
    let c = SdpaConfig { dtype: SdpaDType::F16, ..config(1, 2, 2, 256, 256, 64) };
    let sdpa = Sdpa::compile(&c).unwrap();
    let text = uopc_ir::print_program(&uopc_kernels::sdpa::sdpa_ir(&c, &sdpa.blocking())).unwrap();
    assert!(text.contains("tile_softmax") && !text.contains("tile_softmax_rounded"), "{text}");
}

#[test]
fn small_programs_agree_with_the_loop_ir_interpreter() {
    use uopc_ir::HostBuffer;
    use uopc_ir::interp::{Precision, run_with_vars};
    use uopc_kernels::sdpa::{sdpa_ir, sdpa_merge_ir};
    let mut rng = Rng(29);
    for (c, blocking) in [
        (SdpaConfig { causal: true, key_lengths: true, ..config(2, 2, 1, 7, 11, 4) }, Blocking::new(2, 4, 4)),
        (
            SdpaConfig { mask: MaskKind::Bias([1, 2, 1, 11]), ..config(1, 2, 2, 1, 11, 3) },
            Blocking { splits: 3, ..Blocking::new(1, 1, 2) },
        ),
        // Query blocks dividing n_q: each task owns its output rows, which are rounded by one
        // block conversion.
        (config(1, 2, 2, 8, 11, 5), Blocking::new(1, 4, 4)),
    ] {
        for dtype in [SdpaDType::BF16, SdpaDType::F16] {
            let c = SdpaConfig { dtype, ..c };
            let (q, k, v) = (rng.values(c.q_len()), rng.values(c.kv_len()), rng.values(c.kv_len()));
            let bias: Option<Vec<f32>> = matches!(c.mask, MaskKind::Bias(_)).then(|| rng.values(22));
            let lens: Option<Vec<i32>> = c.key_lengths.then(|| vec![5, 11]);
            let buf = |x: &[f32]| match dtype {
                SdpaDType::BF16 => HostBuffer::BF16(x.iter().map(|&x| bf16::from_f32(x)).collect()),
                _ => HostBuffer::F16(x.iter().map(|&x| f16::from_f32(x)).collect()),
            };
            let (hq, hk, hv) = (buf(&q), buf(&k), buf(&v));
            let sdpa = Sdpa::compile_with(&c, blocking).unwrap();
            let extras = Extras { bias: bias.as_deref(), key_lengths: lens.as_deref(), ..Extras::default() };
            let mut out = HostBuffer::zeros(dtype.dtype(), c.q_len());
            fn values(b: &HostBuffer) -> Values<'_> {
                match b {
                    HostBuffer::BF16(x) => Values::BF16(&x[..]),
                    HostBuffer::F16(x) => Values::F16(&x[..]),
                    _ => unreachable!(),
                }
            }
            let out_values = match &mut out {
                HostBuffer::BF16(x) => ValuesMut::BF16(&mut x[..]),
                HostBuffer::F16(x) => ValuesMut::F16(&mut x[..]),
                _ => unreachable!(),
            };
            sdpa.run_values(values(&hq), values(&hk), values(&hv), extras, out_values).unwrap();
            let states = blocking.tasks(&c) * blocking.heads_per_task * blocking.queries;
            let mut bufs = vec![hq.clone(), hk.clone(), hv.clone()];
            if blocking.splits > 1 {
                bufs.extend([
                    HostBuffer::zeros(DType::F32, states * c.d),
                    HostBuffer::zeros(DType::F32, states),
                    HostBuffer::zeros(DType::F32, states),
                ]);
            } else {
                bufs.push(HostBuffer::zeros(dtype.dtype(), c.q_len()));
            }
            if let Some(b) = &bias {
                bufs.push(HostBuffer::F32(b.clone()));
            }
            if let Some(l) = &lens {
                bufs.push(HostBuffer::I32(l.clone()));
            }
            run_with_vars(&sdpa_ir(&c, &blocking), &mut bufs, &[], Precision::F64).unwrap();
            let interpreted = if blocking.splits > 1 {
                let mut merged = vec![
                    bufs[4].clone(),
                    bufs[5].clone(),
                    bufs[3].clone(),
                    HostBuffer::zeros(dtype.dtype(), c.q_len()),
                ];
                run_with_vars(&sdpa_merge_ir(&c, &blocking), &mut merged, &[], Precision::F64).unwrap();
                merged[3].to_f64_vec()
            } else {
                bufs[3].to_f64_vec()
            };
            let got: Vec<f32> = out.to_f64_vec().iter().map(|&x| x as f32).collect();
            // Both round P and the output to the same type, from sums in different orders: the
            // outputs may differ by the rounding of P (one unit roundoff of a weight) and one
            // ulp of the output.
            let tol = 3.0 * if dtype == SdpaDType::BF16 { 1.0 / 256.0 } else { 1.0 / 2048.0 };
            let err = error(&got, &interpreted);
            assert!(err <= tol, "{sdpa}: {err}");
            assert!(interpreted.iter().any(|x| x.abs() > 1e-3));
        }
    }
}

#[test]
fn mismatched_dtypes_and_lengths_are_errors_naming_the_argument() {
    let c = SdpaConfig { dtype: SdpaDType::BF16, ..config(1, 2, 2, 3, 5, 4) };
    let sdpa = Sdpa::compile(&c).unwrap();
    let (q, kv) = (vec![bf16::ONE; c.q_len()], vec![bf16::ONE; c.kv_len()]);
    let k32 = vec![1.0f32; c.kv_len()];
    let mut out = vec![bf16::ZERO; c.q_len()];
    let err = sdpa
        .run_values(
            Values::BF16(&q),
            Values::F32(&k32),
            Values::BF16(&kv),
            Extras::default(),
            ValuesMut::BF16(&mut out),
        )
        .unwrap_err();
    assert!(
        matches!(err, SdpaError::DType { arg: "k", expected: SdpaDType::BF16, got: SdpaDType::F32 }),
        "{err}"
    );
    assert!(err.to_string().contains("`k`"), "{err}");
    let mut out16 = vec![f16::ZERO; c.q_len()];
    let err = sdpa
        .run_values(
            Values::BF16(&q),
            Values::BF16(&kv),
            Values::BF16(&kv),
            Extras::default(),
            ValuesMut::F16(&mut out16),
        )
        .unwrap_err();
    assert!(matches!(err, SdpaError::DType { arg: "out", .. }), "{err}");
    // f32 slices on a bf16 configuration: the first argument is named.
    let (q32, mut o32) = (vec![1.0f32; c.q_len()], vec![0.0f32; c.q_len()]);
    let err = sdpa.run(&q32, &k32, &k32, Extras::default(), &mut o32).unwrap_err();
    assert!(matches!(err, SdpaError::DType { arg: "q", .. }), "{err}");
    // A 16-bit buffer of the wrong length.
    let err = sdpa.run(&q, &kv[1..], &kv, Extras::default(), &mut out).unwrap_err();
    assert!(matches!(err, SdpaError::Length { arg: "k", .. }), "{err}");
    // The f32 configuration refuses 16-bit values.
    let f32_sdpa = Sdpa::compile(&SdpaConfig { dtype: SdpaDType::F32, ..c }).unwrap();
    let err = f32_sdpa.run(&q, &kv, &kv, Extras::default(), &mut out).unwrap_err();
    assert!(
        matches!(err, SdpaError::DType { arg: "q", expected: SdpaDType::F32, got: SdpaDType::BF16 }),
        "{err}"
    );
    // The f32 backward refuses a 16-bit configuration and names the one that takes it.
    let err = SdpaBackward::compile(&c).unwrap_err().to_string();
    assert!(err.contains("SdpaBackwardHalf") && err.contains("bf16"), "{err}");
}

#[test]
fn the_kernel_runs_16_bit_tile_ops() {
    let c = SdpaConfig { dtype: SdpaDType::BF16, causal: true, ..config(1, 2, 2, 256, 256, 64) };
    let sdpa = Sdpa::compile(&c).unwrap();
    let text = uopc_ir::print_program(&uopc_kernels::sdpa::sdpa_ir(&c, &sdpa.blocking())).unwrap();
    // The rounded step where the bf16 GEMM takes bf16 operands, else the f32 one (P in f32).
    let widens = uopc_jit::machine::Machine::get().choices().bf16.widens();
    assert_eq!(text.contains("tile_softmax_rounded"), !widens, "{text}");
    assert_eq!(text.contains("tile_softmax "), widens, "{text}");
    // bf16 queries are copied as they are (or read in place where the GEMMs widen); the output
    // rows are rounded by a block conversion.
    assert_eq!(text.matches("tile_convert").count(), 1, "{text}");
    assert!(sdpa.to_string().contains(" bf16"), "{sdpa}");
}

#[test]
fn the_tensor_op_takes_16_bit_tensors() {
    use uopc_kernels::sdpa::scaled_dot_product_attention;
    use uopc_tensor::Tensor;
    let mut rng = Rng(41);
    let (b, h, hkv, n_q, n_k, d) = (2, 4, 2, 33, 70, 16);
    let c = SdpaConfig { causal: true, ..config(b, h, hkv, n_q, n_k, d) };
    let case = Case::<bf16>::new(c, &mut rng);
    let tensor = |x: &[bf16], rows: usize, heads: usize| Tensor::from_vec(x.to_vec(), &[b, heads, rows, d]);
    let (q, k, v) = (tensor(&case.q, n_q, h), tensor(&case.k, n_k, hkv), tensor(&case.v, n_k, hkv));
    let out = scaled_dot_product_attention(&q, &k, &v, None, true, None).unwrap();
    assert_eq!(out.dtype(), DType::BF16);
    let got = widen(out.to_ndarray::<bf16>().unwrap().as_slice().unwrap());
    let err = error(&got, &case.reference(Extras::default()));
    assert!(err <= tolerance::<bf16>(), "tensor op: {err}");
    // The same kernel as the slice entry point (one query block per task, no split-K here).
    let sdpa = Sdpa::compile(&case.config).unwrap();
    let mut direct = vec![bf16::ZERO; c.q_len()];
    sdpa.run(&case.q, &case.k, &case.v, Extras::default(), &mut direct).unwrap();
    assert_eq!(got, widen(&direct), "tensor node and Sdpa::run agree bit for bit");

    // Mixed dtypes name the argument (the gradient is tested in `sdpa_half_backward`).
    let k32 = k.cast(DType::F32);
    let err = scaled_dot_product_attention(&q, &k32, &v, None, false, None).unwrap_err();
    assert!(matches!(err, SdpaError::Shape { arg: "k", .. }) && err.to_string().contains("f32"), "{err}");
}

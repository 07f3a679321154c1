//! The FlashAttention-2 backward of the attention entry point against an f64 reference
//! backward written here (plain loops over the exact softmax, independent of the kernels), on
//! random shapes, GQA ratios, masks, layouts and key lengths; against central finite
//! differences of the f64 forward; the forward's saved lse; bad arguments; and the programs'
//! structure (no N x N buffer).

use uopc_kernels::sdpa::{
    BackwardBlocking, Blocking, Extras, ForwardSaved, Layout, MaskKind, SdpaBackward, SdpaConfig, SdpaError,
    compiled_backward, reference_backward_f64, reference_f64,
};

use crate::support::Rng;

struct Case {
    config: SdpaConfig,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_o: Vec<f32>,
    mask: Option<Vec<bool>>,
    bias: Option<Vec<f32>>,
    lens: Option<Vec<i32>>,
}

impl Case {
    fn new(config: SdpaConfig, rng: &mut Rng) -> Case {
        let (q, k, v) =
            (rng.values(config.q_len()), rng.values(config.kv_len()), rng.values(config.kv_len()));
        let d_o = rng.values(config.q_len());
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
        let lens = config.key_lengths.then(|| {
            (0..config.batch)
                .map(|b| match b % 3 {
                    0 => 0,
                    1 => config.n_k as i32,
                    _ => rng.below(config.n_k + 1) as i32,
                })
                .collect()
        });
        Case { config, q, k, v, d_o, mask, bias, lens }
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
}

/// The f64 reference backward of the case: dq, dk, dv and dbias.
fn reference_backward(case: &Case) -> [Vec<f64>; 4] {
    reference_backward_f64(&case.config, &case.q, &case.k, &case.v, &case.d_o, case.extras())
}

/// Largest absolute error; NaN anywhere fails.
fn error(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(&g, &w)| if g.is_nan() { f64::INFINITY } else { (f64::from(g) - w).abs() })
        .fold(0.0, f64::max)
}

/// Forward with lse, backward, and the three gradients; the outputs start as NaN so that an
/// unwritten element fails.
fn gradients(case: &Case, bwd: &SdpaBackward) -> [Vec<f32>; 3] {
    let c = &case.config;
    let mut o = vec![f32::NAN; c.q_len()];
    let mut lse = vec![f32::NAN; bwd.lse_len()];
    bwd.forward(&case.q, &case.k, &case.v, case.extras(), &mut o, &mut lse).expect("forward");
    let (mut dq, mut dk, mut dv) =
        (vec![f32::NAN; c.q_len()], vec![f32::NAN; c.kv_len()], vec![f32::NAN; c.kv_len()]);
    let saved = ForwardSaved { q: &case.q, k: &case.k, v: &case.v, o: &o, lse: &lse };
    bwd.run(saved, &case.d_o, case.extras(), &mut dq, &mut dk, &mut dv).expect("backward");
    [dq, dk, dv]
}

/// The gradients against the f64 reference. Inputs are in [-1, 1], so every product of the
/// backward is O(1) and each gradient element sums at most `n_k` (dq) or `group * n_q` (dk,
/// dv) such terms, each with a few f32 roundings: 2e-6 per summed term bounds the error with
/// room for the exp2 polynomial's 1.2e-7 relative error.
fn check(case: &Case, bwd: &SdpaBackward) {
    let got = gradients(case, bwd);
    let want = reference_backward(case);
    let c = &case.config;
    let terms = c.n_k.max(c.heads / c.kv_heads * c.n_q) as f64;
    let tol = 2e-5_f64.max(2e-6 * terms);
    for (name, g, w) in [("dq", &got[0], &want[0]), ("dk", &got[1], &want[1]), ("dv", &got[2], &want[2])] {
        let err = error(g, w);
        assert!(err <= tol, "{bwd} ({c:?}): {name} max error {err} > {tol}");
    }
}

/// Forward, then the backward with the bias's gradient: `[dq, dk, dv, dbias]`, starting as
/// NaN so that an unwritten element fails.
fn gradients_with_bias(case: &Case, bwd: &SdpaBackward) -> [Vec<f32>; 4] {
    let c = &case.config;
    let mut o = vec![f32::NAN; c.q_len()];
    let mut lse = vec![f32::NAN; bwd.lse_len()];
    bwd.forward(&case.q, &case.k, &case.v, case.extras(), &mut o, &mut lse).expect("forward");
    let (mut dq, mut dk, mut dv) =
        (vec![f32::NAN; c.q_len()], vec![f32::NAN; c.kv_len()], vec![f32::NAN; c.kv_len()]);
    let mut dbias = vec![f32::NAN; case.bias.as_ref().expect("a bias case").len()];
    let saved = ForwardSaved { q: &case.q, k: &case.k, v: &case.v, o: &o, lse: &lse };
    bwd.run_with_bias_grad(saved, &case.d_o, case.extras(), [&mut dq, &mut dk, &mut dv], &mut dbias)
        .expect("backward with dbias");
    [dq, dk, dv, dbias]
}

/// All four gradients against the f64 reference. dq, dk and dv as in [`check`], and the
/// same as [`gradients`] gives (the dbias program differs only by its extra writes). A dbias
/// element sums one `dS` term per (item, head, row, key) it broadcasts over; each term is a
/// product of O(1) values with a few f32 roundings, so 2e-6 per summed term again bounds it.
fn check_with_bias(case: &Case, bwd: &SdpaBackward) {
    let c = &case.config;
    let MaskKind::Bias(shape) = c.mask else { panic!("not a bias case") };
    let got = gradients_with_bias(case, bwd);
    let want = reference_backward(case);
    let terms = c.n_k.max(c.heads / c.kv_heads * c.n_q) as f64;
    let tol = 2e-5_f64.max(2e-6 * terms);
    for (name, g, w) in [("dq", &got[0], &want[0]), ("dk", &got[1], &want[1]), ("dv", &got[2], &want[2])] {
        let err = error(g, w);
        assert!(err <= tol, "{bwd} ({c:?}): {name} max error {err} > {tol}");
    }
    let full = [c.batch, c.heads, c.n_q, c.n_k];
    let summed: usize = (0..4).map(|a| if shape[a] == 1 { full[a] } else { 1 }).product();
    let tol = 2e-5_f64.max(2e-6 * summed as f64);
    let err = error(&got[3], &want[3]);
    assert!(err <= tol, "{bwd} ({c:?}): dbias max error {err} > {tol}");
    // Softmax ignores a shift shared by a row's keys: a bias broadcast over keys has a zero
    // gradient (checked above against the reference's ~0); any other gets a real one.
    if shape[3] != 1 {
        assert!(want[3].iter().any(|x| x.abs() > 1e-3), "the bias gradient is not trivially zero");
    }
    let plain = gradients(case, bwd);
    for g in 0..3 {
        assert_eq!(plain[g], got[g], "{bwd}: gradient {g} depends on whether dbias is written");
    }
}

/// Every broadcast pattern of a bias over (B, H, n_q, n_k), 1 or full on each axis.
fn bias_shapes(full: [usize; 4]) -> impl Iterator<Item = [usize; 4]> {
    (0..16usize).map(move |bits| std::array::from_fn(|a| if bits >> a & 1 == 1 { 1 } else { full[a] }))
}

#[test]
fn bias_gradient_for_every_broadcast_pattern() {
    let mut rng = Rng(53);
    for (i, shape) in bias_shapes([2, 4, 9, 13]).enumerate() {
        let c = SdpaConfig {
            causal: i % 3 == 1,
            key_lengths: i % 4 == 2,
            layout: if i % 5 == 3 { Layout::Bnhd } else { Layout::Bhnd },
            mask: MaskKind::Bias(shape),
            ..config(2, 4, 2, 9, 13, 8)
        };
        let mut case = Case::new(c, &mut rng);
        if let Some(lens) = case.lens.as_mut() {
            // Not 0 for item 0, so that some terms reach a bias shared over items.
            lens[0] = 7;
        }
        check_with_bias(&case, &SdpaBackward::compile(&c).expect("compile"));
    }
}

#[test]
fn bias_gradient_with_chunked_key_blocks_gqa_and_odd_sizes() {
    // Chunks > 1: tasks of one head share the rows of a bias broadcast over keys, and the
    // regions' key slots are not in key order.
    let mut rng = Rng(59);
    for (n, (queries, keys, chunks)) in
        [(16, 16, 3), (7, 5, 2), (3, 64, 4), (20, 9, 1)].into_iter().enumerate()
    {
        for shape in [[1, 1, 70, 100], [1, 2, 1, 100], [1, 2, 70, 1], [1, 1, 1, 1]] {
            let c = SdpaConfig {
                causal: n % 2 == 0,
                mask: MaskKind::Bias(shape),
                ..config(1, 2, 1, 70, 100, 12)
            };
            let case = Case::new(c, &mut rng);
            let bwd = SdpaBackward::compile_with(
                &c,
                Blocking::choose(&c, 2),
                BackwardBlocking { queries, keys, chunks },
            )
            .expect("compile");
            check_with_bias(&case, &bwd);
        }
    }
    for (h, hkv, d) in [(8, 1, 3), (8, 2, 64), (3, 3, 127)] {
        for shape in [[2, h, 33, 65], [1, h, 1, 65], [2, 1, 33, 1]] {
            let c = SdpaConfig { mask: MaskKind::Bias(shape), ..config(2, h, hkv, 33, 65, d) };
            check_with_bias(&Case::new(c, &mut rng), &SdpaBackward::compile(&c).expect("compile"));
        }
    }
}

#[test]
fn bias_gradient_against_central_finite_differences() {
    let mut rng = Rng(61);
    for (causal, shape) in [(false, [1, 2, 3, 5]), (true, [1, 1, 1, 5]), (false, [2, 1, 3, 1])] {
        let c = SdpaConfig { causal, mask: MaskKind::Bias(shape), ..config(2, 2, 1, 3, 5, 4) };
        let case = Case::new(c, &mut rng);
        let got = gradients_with_bias(&case, &SdpaBackward::compile(&c).unwrap());
        let bias = case.bias.as_ref().unwrap();
        // As for q, k, v below: h = 2^-7, the loss in f64, O(h^2) truncation well under 1e-3.
        let h = 1.0f32 / 128.0;
        for idx in 0..bias.len() {
            if bias[idx] == f32::NEG_INFINITY {
                assert_eq!(got[3][idx], 0.0, "a masked key gets no gradient");
                continue;
            }
            let at = |delta: f32| {
                let mut b = bias.clone();
                b[idx] += delta;
                let o =
                    reference_f64(&c, &case.q, &case.k, &case.v, Extras { bias: Some(&b), ..case.extras() });
                o.iter().zip(&case.d_o).map(|(&x, &g)| x * f64::from(g)).sum::<f64>()
            };
            let fd = (at(h) - at(-h)) / (2.0 * f64::from(h));
            assert!(
                (fd - f64::from(got[3][idx])).abs() < 1e-3,
                "bias[{idx}]: fd {fd}, backward {}",
                got[3][idx]
            );
        }
    }
}

#[test]
fn bias_gradient_arguments_are_checked() {
    let c = config(1, 2, 1, 4, 6, 8);
    let bwd = SdpaBackward::compile(&c).unwrap();
    let (q, kv, lse) = (vec![0.0f32; c.q_len()], vec![0.0f32; c.kv_len()], vec![0.0f32; bwd.lse_len()]);
    let saved = ForwardSaved { q: &q, k: &kv, v: &kv, o: &q, lse: &lse };
    let (mut dq, mut dk, mut dv) = (q.clone(), kv.clone(), kv.clone());
    let err =
        bwd.run_with_bias_grad(saved, &q, Extras::default(), [&mut dq, &mut dk, &mut dv], &mut [0.0; 24]);
    assert!(matches!(err, Err(SdpaError::Extra { arg: "dbias", expected: false })), "{err:?}");
    let c = SdpaConfig { mask: MaskKind::Bias([1, 1, 4, 6]), ..c };
    let bwd = SdpaBackward::compile(&c).unwrap();
    let bias = [0.5f32; 24];
    let extras = Extras { bias: Some(&bias), ..Extras::default() };
    let err = bwd.run_with_bias_grad(saved, &q, extras, [&mut dq, &mut dk, &mut dv], &mut [0.0; 23]);
    assert!(matches!(err, Err(SdpaError::Length { arg: "dbias", expected: 24, got: 23 })), "{err:?}");
}

fn check_config(config: SdpaConfig, rng: &mut Rng) {
    let case = Case::new(config, rng);
    check(&case, &SdpaBackward::compile(&config).expect("compile"));
}

fn config(b: usize, h: usize, hkv: usize, n_q: usize, n_k: usize, d: usize) -> SdpaConfig {
    SdpaConfig { kv_heads: hkv, ..SdpaConfig::new(b, h, n_q, n_k, d) }
}

#[test]
fn gqa_ratios_and_head_dims() {
    let mut rng = Rng(7);
    for (i, d) in [1, 3, 16, 64, 80, 127, 256].into_iter().enumerate() {
        let (h, hkv) = [(2, 2), (4, 2), (4, 1), (8, 1), (3, 3)][i % 5];
        check_config(config(2, h, hkv, 9, 13, d), &mut rng);
    }
    for (h, hkv) in [(1, 1), (2, 1), (4, 1), (4, 2), (8, 2)] {
        check_config(config(1, h, hkv, 37, 70, 8), &mut rng);
        check_config(SdpaConfig { causal: true, ..config(2, h, hkv, 70, 37, 5) }, &mut rng);
    }
}

#[test]
fn odd_and_unequal_lengths_causal_and_layouts() {
    let mut rng = Rng(11);
    for (n_q, n_k) in [(1, 1), (1, 200), (7, 7), (33, 65), (65, 33), (130, 64), (64, 130), (200, 201), (5, 1)]
    {
        for causal in [false, true] {
            for layout in [Layout::Bhnd, Layout::Bnhd] {
                check_config(SdpaConfig { causal, layout, ..config(2, 4, 2, n_q, n_k, 8) }, &mut rng);
            }
        }
    }
}

#[test]
fn random_shapes_every_mask_kind_and_key_lengths() {
    let mut rng = Rng(23);
    for _ in 0..30 {
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
fn chunked_key_blocks_and_forced_blockings() {
    // Fewer (item, head) pairs than chunks: the key blocks of one head are dealt to several
    // tasks whose dq partials are summed; odd block sizes leave narrower last blocks.
    let mut rng = Rng(31);
    for causal in [false, true] {
        for (queries, keys, chunks) in [(16, 16, 3), (7, 5, 2), (64, 64, 1), (3, 64, 4), (20, 9, 1)] {
            let c = SdpaConfig { causal, ..config(1, 2, 1, 70, 100, 12) };
            let case = Case::new(c, &mut rng);
            let bwd = SdpaBackward::compile_with(
                &c,
                Blocking::choose(&c, 2),
                BackwardBlocking { queries, keys, chunks },
            )
            .expect("compile");
            check(&case, &bwd);
        }
    }
}

#[test]
fn a_forward_with_keys_and_values_in_panels_gives_the_same_gradients() {
    // The forward packs K and V into panels (causal with its wide prefix, key lengths, GQA,
    // both layouts); its lse and output feed the backward unchanged.
    let mut rng = Rng(37);
    let native = uopc_tile::panel_width(uopc_tile::Isa::detect());
    for causal in [false, true] {
        for layout in [Layout::Bhnd, Layout::Bnhd] {
            let c = SdpaConfig { causal, layout, key_lengths: true, ..config(2, 4, 2, 200, 260, 12) };
            let forward = Blocking { kv_panel_width: native, ..Blocking::new(1, 128, 64) };
            let bwd =
                SdpaBackward::compile_with(&c, forward, BackwardBlocking::choose(&c, 2)).expect("compile");
            assert!(bwd.to_string().contains("panels"), "{bwd}");
            check(&Case::new(c, &mut rng), &bwd);
        }
    }
    // The library's own choice packs once for many readers.
    let c = config(1, 8, 2, 1024, 1024, 64);
    assert!(SdpaBackward::compile(&c).unwrap().forward_blocking().kv_panel_width > 0);
}

#[test]
fn the_score_and_dp_gemms_read_the_tasks_key_and_value_tiles_in_panels() {
    // Full key blocks are copied into panels (both GEMMs read them in place); a narrower last
    // block keeps rows. The gradients are checked against f64 elsewhere on the same shapes.
    // Four whole blocks of the machine's panel width, then 5 keys more.
    let w = uopc_tile::panel_width(uopc_tile::Isa::detect());
    let c = config(1, 2, 1, 64, 4 * w + 5, 32);
    let bwd = SdpaBackward::compile_with(
        &c,
        Blocking::choose(&c, 2),
        BackwardBlocking { queries: 32, keys: 4 * w, chunks: 1 },
    )
    .expect("compile");
    let ir = bwd.program().loop_ir();
    assert_eq!(ir.matches(&format!("B in panels of {w}")).count(), 2, "{ir}");
    check(&Case::new(c, &mut Rng(41)), &bwd);
}

#[test]
fn fully_masked_rows_and_empty_key_lengths_give_zero_gradients() {
    let mut rng = Rng(41);
    // n_q > n_k under the causal mask: the first n_q - n_k rows see no key.
    let c = SdpaConfig { causal: true, ..config(1, 2, 2, 40, 9, 8) };
    let case = Case::new(c, &mut rng);
    let bwd = SdpaBackward::compile(&c).unwrap();
    let [dq, ..] = gradients(&case, &bwd);
    let [_, qsh, qsn] = c.layout.strides(c.heads, c.n_q, c.d);
    for h in 0..2 {
        for i in 0..31 {
            let row = &dq[h * qsh + i * qsn..][..c.d];
            assert!(row.iter().all(|&x| x == 0.0), "row {i} of head {h} saw no key: {row:?}");
        }
    }
    check(&case, &bwd);
    // Key length 0 for every item: every gradient is exactly zero.
    let c = SdpaConfig { key_lengths: true, ..config(2, 2, 1, 17, 30, 8) };
    let mut case = Case::new(c, &mut rng);
    case.lens = Some(vec![0, 0]);
    let got = gradients(&case, &SdpaBackward::compile(&c).unwrap());
    assert!(got.iter().all(|g| g.iter().all(|&x| x == 0.0)));
    // An all-false bool mask row with a NaN in V behind it: zeros, no NaN.
    let c = SdpaConfig { mask: MaskKind::Bool([1, 1, 6, 10]), ..config(1, 1, 1, 6, 10, 4) };
    let mut case = Case::new(c, &mut rng);
    let m = case.mask.as_mut().unwrap();
    m[..10].iter_mut().for_each(|x| *x = false);
    let got = gradients(&case, &SdpaBackward::compile(&c).unwrap());
    assert!(got[0][..4].iter().all(|&x| x == 0.0), "{:?}", &got[0][..4]);
    check(&case, &SdpaBackward::compile(&c).unwrap());
}

/// The f64 loss `sum(dO * attention(q, k, v))`.
fn loss(case: &Case, q: &[f32], k: &[f32], v: &[f32]) -> f64 {
    let o = reference_f64(&case.config, q, k, v, case.extras());
    o.iter().zip(&case.d_o).map(|(&x, &g)| x * f64::from(g)).sum()
}

#[test]
fn central_finite_differences_on_a_tiny_shape() {
    let mut rng = Rng(5);
    for causal in [false, true] {
        let c = SdpaConfig { causal, mask: MaskKind::Bias([1, 2, 3, 5]), ..config(1, 2, 1, 3, 5, 4) };
        let case = Case::new(c, &mut rng);
        let got = gradients(&case, &SdpaBackward::compile(&c).unwrap());
        // f32 inputs perturbed by h = 1e-2 (exact in f32 steps of 2^-7 ~ 7.8e-3 would be
        // cleaner, but the loss is evaluated in f64, so any representable step works): the
        // central difference's error is O(h^2) times the third derivative, well under 1e-3.
        let h = 1.0f32 / 128.0;
        for (which, grad) in got.iter().enumerate() {
            for idx in 0..grad.len() {
                let mut inputs = [case.q.clone(), case.k.clone(), case.v.clone()];
                inputs[which][idx] += h;
                let up = loss(&case, &inputs[0], &inputs[1], &inputs[2]);
                inputs[which][idx] -= 2.0 * h;
                let down = loss(&case, &inputs[0], &inputs[1], &inputs[2]);
                let fd = (up - down) / (2.0 * f64::from(h));
                assert!(
                    (fd - f64::from(grad[idx])).abs() < 1e-3,
                    "input {which}[{idx}]: fd {fd}, backward {}",
                    grad[idx]
                );
            }
        }
    }
}

#[test]
fn the_forward_saves_the_base2_log_sum_exp() {
    let mut rng = Rng(3);
    let c = SdpaConfig { causal: true, ..config(2, 4, 2, 20, 12, 8) };
    let case = Case::new(c, &mut rng);
    let bwd = SdpaBackward::compile(&c).unwrap();
    let mut o = vec![0.0; c.q_len()];
    let mut lse = vec![0.0; bwd.lse_len()];
    bwd.forward(&case.q, &case.k, &case.v, Extras::default(), &mut o, &mut lse).unwrap();
    let want_o = reference_f64(&c, &case.q, &case.k, &case.v, Extras::default());
    assert!(o.iter().zip(&want_o).all(|(&g, &w)| (f64::from(g) - w).abs() < 2e-5));
    let scale = f64::from(c.effective_scale());
    let [_, qsh, qsn] = c.layout.strides(c.heads, c.n_q, c.d);
    let [_, ksh, ksn] = c.layout.strides(c.kv_heads, c.n_k, c.d);
    for b in 0..2 {
        for h in 0..4 {
            for i in 0..20 {
                let last = i as i64 + c.causal_offset();
                let sum: f64 = (0..c.n_k as i64)
                    .filter(|&j| j <= last)
                    .map(|j| {
                        let (qa, ka) = (
                            b * 4 * 20 * 8 + h * qsh + i * qsn,
                            b * 2 * 12 * 8 + h / 2 * ksh + j as usize * ksn,
                        );
                        let dot: f64 =
                            (0..8).map(|e| f64::from(case.q[qa + e]) * f64::from(case.k[ka + e])).sum();
                        (dot * scale).exp()
                    })
                    .sum();
                let want = if sum == 0.0 { f64::NEG_INFINITY } else { sum.ln() / std::f64::consts::LN_2 };
                let got = f64::from(lse[(b * 4 + h) * 20 + i]);
                assert!(got == want || (got - want).abs() < 1e-5, "({b}, {h}, {i}): {got} vs {want}");
            }
        }
    }
}

#[test]
fn bad_arguments_are_errors_naming_them() {
    let c = config(1, 2, 1, 4, 6, 8);
    let bwd = compiled_backward(&c).unwrap();
    let (q, kv, lse) = (vec![0.0f32; c.q_len()], vec![0.0f32; c.kv_len()], vec![0.0f32; bwd.lse_len()]);
    let saved = ForwardSaved { q: &q, k: &kv, v: &kv, o: &q, lse: &lse };
    let (mut dq, mut dk, mut dv) = (q.clone(), kv.clone(), kv.clone());
    let name = |e: SdpaError| match e {
        SdpaError::Length { arg, .. } | SdpaError::Extra { arg, .. } => arg,
        other => panic!("{other}"),
    };
    let short = &q[1..];
    let err =
        bwd.run(ForwardSaved { lse: &lse[1..], ..saved }, &q, Extras::default(), &mut dq, &mut dk, &mut dv);
    assert_eq!(name(err.unwrap_err()), "lse");
    let err = bwd.run(saved, short, Extras::default(), &mut dq, &mut dk, &mut dv);
    assert_eq!(name(err.unwrap_err()), "d_o");
    let err = bwd.run(saved, &q, Extras::default(), &mut dq, &mut dk[1..], &mut dv);
    assert_eq!(name(err.unwrap_err()), "dk");
    let mask = [true; 24];
    let err =
        bwd.run(saved, &q, Extras { mask: Some(&mask), ..Extras::default() }, &mut dq, &mut dk, &mut dv);
    assert_eq!(name(err.unwrap_err()), "mask");
    let mut o = q.clone();
    let err = bwd.forward(&q, &kv, &kv, Extras::default(), &mut o, &mut [0.0; 3]);
    assert_eq!(name(err.unwrap_err()), "lse");
    assert!(std::sync::Arc::ptr_eq(&bwd, &compiled_backward(&c).unwrap()), "cached per configuration");
    let bad = SdpaConfig { kv_heads: 3, ..c };
    assert!(matches!(SdpaBackward::compile(&bad), Err(SdpaError::HeadGrouping { .. })));
}

#[test]
fn no_buffer_of_n_q_by_n_k_elements_and_parallel_tasks() {
    for c in [
        SdpaConfig { causal: true, ..config(1, 1, 1, 8192, 8192, 64) },
        SdpaConfig { causal: true, ..config(1, 1, 1, 1024, 1024, 64) },
        config(2, 8, 8, 1000, 1000, 80),
        config(1, 4, 2, 512, 300, 128),
        SdpaConfig { layout: Layout::Bnhd, ..config(1, 4, 4, 256, 256, 64) },
    ] {
        let bwd = SdpaBackward::compile(&c).unwrap();
        // O(N D): nothing beyond the chunks' dq partials (at most one per core) and the
        // task-major dk, dv copies; at N = 8192 that is far below n_q * n_k.
        let bound = 4 * c.q_len().max(c.kv_len());
        for program in [bwd.forward_program(), bwd.program()] {
            for spec in program.buffers() {
                assert!(spec.len <= bound, "{bwd}: buffer {} holds {} elements", spec.slot, spec.len);
            }
        }
        // Plus Delta, one float per query row.
        let rows = c.batch * c.heads * c.n_q;
        assert!(
            bwd.temporary_bytes() <= 4 * (bound + rows),
            "{bwd}: {} temporary bytes",
            bwd.temporary_bytes()
        );
        assert!(4 * bound < c.n_q * c.n_k || c.n_q < 8192);
        assert!(bwd.program().is_parallel(), "{bwd}");
        // The forward's tasks are proven disjoint in both layouts: a BNHD task's rows of one
        // head are a block of D columns, rows H * D apart.
        assert!(bwd.forward_program().is_parallel(), "{bwd}");
    }
}

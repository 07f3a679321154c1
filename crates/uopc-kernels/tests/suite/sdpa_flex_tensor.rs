//! Attention with score and mask functions on lazy tensors (`q.sdpa(&k, &v).mods(..)`): its
//! output and every gradient (q, k, v and the float captures, through autograd) against the
//! compiled flex forward and backward (`SdpaBackward::compile_flex`, whose gradients are
//! checked against central differences of the f64 reference in `sdpa_flex_backward.rs`),
//! over the causal rewrite, windows, documents (a plan counted per run), sinks, GQA and bf16;
//! which kernels a gradient builds (one forward, the capture gradients only when asked for); and captures that do not fit.

use crate::support::Rng;
use half::bf16;
use uopc_ir::{DType, idx};
use uopc_kernels::sdpa::{
    AttentionMods, AttentionOp, CaptureValues, Extras, ForwardSaved, SdpaBackward, SdpaConfig, and, or,
};
use uopc_tensor::{RealizeOptions, Tensor, gradient, make_plan};

/// A capture's values: floats get gradients, ids do not.
#[derive(Clone)]
enum Values {
    F32(Vec<f32>),
    I32(Vec<i32>),
}

/// One case: the shape, the causal flag, the mods and their captures.
struct Case {
    config: SdpaConfig,
    mods: AttentionMods,
    captures: Vec<Values>,
}

/// The output and the gradients `[dq, dk, dv, d(float capture) ..]` of `sum(out * dO)`.
struct Outcome {
    out: Vec<f32>,
    grads: Vec<Vec<f32>>,
}

impl Case {
    fn inputs(&self, rng: &mut Rng) -> [Vec<f32>; 4] {
        let c = &self.config;
        [rng.values(c.q_len()), rng.values(c.kv_len()), rng.values(c.kv_len()), rng.values(c.q_len())]
    }

    /// The compiled flex forward and backward, run on slices.
    fn direct(&self, [q, k, v, d_o]: &[Vec<f32>; 4]) -> Outcome {
        let c = self.config;
        let b = SdpaBackward::compile_flex(&c, &self.mods).unwrap();
        let values: Vec<CaptureValues<'_>> = self
            .captures
            .iter()
            .map(|x| match x {
                Values::F32(v) => CaptureValues::F32(v),
                Values::I32(v) => CaptureValues::I32(v),
            })
            .collect();
        let extras = Extras { captures: &values, ..Extras::default() };
        let (mut out, mut lse) = (vec![0.0; c.q_len()], vec![0.0; b.lse_len()]);
        b.forward(q, k, v, extras, &mut out, &mut lse).unwrap();
        let (mut dq, mut dk, mut dv) = (vec![0.0; c.q_len()], vec![0.0; c.kv_len()], vec![0.0; c.kv_len()]);
        let mut dcap: Vec<Vec<f32>> = self
            .captures
            .iter()
            .map(|x| match x {
                Values::F32(v) => vec![0.0; v.len()],
                Values::I32(_) => Vec::new(),
            })
            .collect();
        let mut targets: Vec<&mut [f32]> = dcap.iter_mut().map(|v| v.as_mut_slice()).collect();
        let saved = ForwardSaved { q, k, v, o: &out, lse: &lse };
        b.run_with_capture_grads(saved, d_o, extras, [&mut dq, &mut dk, &mut dv], &mut targets).unwrap();
        let mut grads = vec![dq, dk, dv];
        grads.extend(
            dcap.into_iter()
                .zip(&self.captures)
                .filter_map(|(g, x)| matches!(x, Values::F32(_)).then_some(g)),
        );
        Outcome { out, grads }
    }

    /// The tensors of the case: q, k, v and dO, then the captures.
    fn tensors(&self, [q, k, v, d_o]: &[Vec<f32>; 4]) -> (Vec<Tensor>, Vec<Tensor>) {
        let c = &self.config;
        let (qs, ks) = ([c.batch, c.heads, c.n_q, c.d], [c.batch, c.kv_heads, c.n_k, c.d]);
        let main = vec![
            Tensor::from_vec(q.clone(), &qs),
            Tensor::from_vec(k.clone(), &ks),
            Tensor::from_vec(v.clone(), &ks),
            Tensor::from_vec(d_o.clone(), &qs),
        ];
        let caps = self
            .captures
            .iter()
            .zip(self.mods.captures())
            .map(|(x, spec)| match x {
                Values::F32(v) => Tensor::from_vec(v.clone(), &spec.shape),
                Values::I32(v) => Tensor::from_vec(v.clone(), &spec.shape),
            })
            .collect();
        (main, caps)
    }

    /// The same attention as a graph node, differentiated by autograd.
    fn graph(&self, inputs: &[Vec<f32>; 4]) -> Outcome {
        let c = &self.config;
        let (t, caps) = self.tensors(inputs);
        let refs: Vec<&Tensor> = caps.iter().collect();
        let mut op = t[0].sdpa(&t[1], &t[2]).mods(&self.mods, &refs);
        if c.causal {
            op = op.causal();
        }
        let out = op.run().unwrap();
        let loss = out.try_mul(&t[3]).unwrap().try_reshape(&[c.q_len()]).unwrap().try_sum(0, false).unwrap();
        let mut params = vec![&t[0], &t[1], &t[2]];
        params.extend(caps.iter().filter(|x| x.dtype() == DType::F32));
        let grads = gradient(&loss, &params).unwrap();
        let read = |x: &Tensor| x.to_ndarray::<f32>().unwrap().iter().copied().collect::<Vec<f32>>();
        Outcome { out: read(&out), grads: grads.iter().map(read).collect() }
    }

    /// The graph's output and gradients equal the compiled kernels' within f32 sums in another
    /// order (and blocking): `1e-4 (1 + |want|)`.
    fn check(&self, name: &str, seed: u64) {
        let inputs = self.inputs(&mut Rng(seed));
        let (want, got) = (self.direct(&inputs), self.graph(&inputs));
        let close = |g: f32, w: f32, tol: f32| g.is_finite() && (g - w).abs() <= tol * (1.0 + w.abs());
        for (i, (&g, &w)) in got.out.iter().zip(&want.out).enumerate() {
            assert!(close(g, w, 2e-5), "{name}: out[{i}] = {g}, want {w}");
        }
        assert_eq!(got.grads.len(), want.grads.len());
        for (which, (g, w)) in got.grads.iter().zip(&want.grads).enumerate() {
            for (j, (&g, &w)) in g.iter().zip(w).enumerate() {
                assert!(close(g, w, 1e-4), "{name}: gradient {which} [{j}] = {g}, want {w}");
            }
        }
    }
}

fn config(b: usize, h: usize, hkv: usize, n_q: usize, n_k: usize, d: usize) -> SdpaConfig {
    SdpaConfig { kv_heads: hkv, ..SdpaConfig::new(b, h, n_q, n_k, d) }
}

/// ALiBi with per-head slopes under a mask function that is the causal mask (run as the causal
/// kernel), GQA, more keys than queries.
fn alibi_case() -> Case {
    let c = config(2, 4, 2, 70, 150, 16);
    let mods = crate::support::alibi_causal(4, c.causal_offset());
    Case { config: c, mods, captures: vec![Values::F32(vec![-0.5, -0.25, -0.125, -0.0625])] }
}

#[test]
fn alibi_through_the_causal_rewrite() {
    alibi_case().check("alibi", 31);
}

#[test]
fn softcap_in_a_sliding_window_under_the_causal_flag() {
    let c = SdpaConfig { causal: true, ..config(1, 2, 1, 200, 200, 16) };
    let mods = AttentionMods::new()
        .score(|_, s| {
            let e = (s * (2.0 / 3.0 * std::f32::consts::LOG2_E)).exp2();
            (((e + 1.0f32).recip() * -2.0f32) + 1.0f32) * 3.0f32
        })
        .mask(|x| (&x.q - &x.kv).lt(40));
    Case { config: c, mods, captures: Vec::new() }.check("softcap, window", 32);
}

#[test]
fn a_relative_position_table_inside_documents() {
    let (n, heads) = (160, 2);
    let mods = crate::support::relative_table_in_documents(heads, 2, n);
    // Item 0: documents of 70, 85 and 5 tokens; item 1: 10, 140 and 10 (whole, partial and
    // empty key blocks, so the plan counted per run skips and unmasks blocks).
    let ids = crate::support::document_ids(&[&[70, 85, 5], &[10, 140, 10]]);
    let values: Vec<f32> = (0..heads * (2 * n - 1)).map(|i| ((i * 7) % 11) as f32 * 0.1 - 0.5).collect();
    let case = Case {
        config: config(2, heads, 1, n, n, 8),
        mods,
        captures: vec![Values::F32(values), Values::I32(ids)],
    };
    case.check("relative table, documents", 33);
}

#[test]
fn sinks_with_a_prefix_lm_mask_and_rows_that_see_no_key() {
    let c = config(1, 4, 1, 90, 90, 8);
    let mut mods = AttentionMods::new();
    let logits = mods.capture("sinks", &[4], DType::F32);
    // Rows below 10 see no key (the window starts 10 keys back); the prefix of 5 is always seen
    // by the others.
    let mods =
        mods.sinks(logits).mask(|x| and(&or(&x.kv.lt(5), &x.kv.lt(&x.q + 1)), &idx(9).lt(x.q.clone())));
    Case { config: c, mods, captures: vec![Values::F32(vec![0.5, -1.0, f32::NEG_INFINITY, 2.0])] }
        .check("sinks, prefix-LM", 34);
}

#[test]
fn capture_gradients_are_built_only_when_asked_for() {
    let case = alibi_case();
    let inputs = case.inputs(&mut Rng(35));
    let (t, caps) = case.tensors(&inputs);
    let out = t[0].sdpa(&t[1], &t[2]).mods(&case.mods, &[&caps[0]]).run().unwrap();
    let loss =
        out.try_mul(&t[3]).unwrap().try_reshape(&[case.config.q_len()]).unwrap().try_sum(0, false).unwrap();
    let names = |params: &[&Tensor]| {
        let g = gradient(&loss, params).unwrap();
        let roots: Vec<_> = g.iter().map(|x| x.uop().clone()).collect();
        make_plan(&roots, &RealizeOptions::default())
            .unwrap()
            .kernel_names()
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    let only_q = names(&[&t[0]]);
    assert!(only_q.iter().any(|n| n == "sdpa_flex_backward"), "{only_q:?}");
    // The gradient reads the forward's output and lse: one attention forward in all.
    assert_eq!(only_q.iter().filter(|n| n.starts_with("sdpa_flex_lse")).count(), 1, "{only_q:?}");
    assert!(!only_q.iter().any(|n| n == "sdpa_flex"), "{only_q:?}");
    assert!(!only_q.iter().any(|n| n.ends_with("capture_grads")), "{only_q:?}");
    let with_slopes = names(&[&t[0], &caps[0]]);
    assert!(with_slopes.iter().any(|n| n == "sdpa_flex_backward_capture_grads"), "{with_slopes:?}");
    assert!(!with_slopes.iter().any(|n| n == "sdpa_flex_backward"), "{with_slopes:?}");
}

#[test]
fn bf16_inputs_match_the_f32_graph_of_their_values() {
    let case = alibi_case();
    let round = |v: &Vec<f32>| v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect::<Vec<f32>>();
    let inputs = case.inputs(&mut Rng(36));
    let inputs = [round(&inputs[0]), round(&inputs[1]), round(&inputs[2]), round(&inputs[3])];
    let want = case.graph(&inputs);
    let (t, caps) = case.tensors(&inputs);
    let half: Vec<Tensor> = t.iter().map(|x| x.cast(DType::BF16)).collect();
    let out = half[0].sdpa(&half[1], &half[2]).mods(&case.mods, &[&caps[0]]).run().unwrap();
    assert_eq!(out.dtype(), DType::BF16);
    let loss = out.cast(DType::F32).try_mul(&t[3]).unwrap().try_reshape(&[case.config.q_len()]).unwrap();
    let grads = gradient(&loss.try_sum(0, false).unwrap(), &[&half[0], &caps[0]]).unwrap();
    let read =
        |x: &Tensor| x.cast(DType::F32).to_ndarray::<f32>().unwrap().iter().copied().collect::<Vec<f32>>();
    // Rounding the output (and dq) once to bf16: half an ulp, 2^-9 relative; the slopes'
    // gradient sums dS over every score, each from bf16-rounded inputs and output.
    for (g, w) in read(&out).iter().zip(&want.out) {
        assert!((g - w).abs() <= 4e-3 * (1.0 + w.abs()), "out {g} vs {w}");
    }
    for (which, tol) in [(0, 4e-3), (1, 2e-2)] {
        let (g, w) = (read(&grads[which]), &want.grads[if which == 0 { 0 } else { 3 }]);
        for (g, w) in g.iter().zip(w) {
            assert!((g - w).abs() <= tol * (1.0 + w.abs()), "gradient {which}: {g} vs {w}");
        }
    }
}

#[test]
fn captures_that_do_not_fit_are_errors_naming_them() {
    let case = alibi_case();
    let (t, _) = case.tensors(&case.inputs(&mut Rng(37)));
    let run = |mods: &AttentionMods, caps: &[&Tensor]| {
        t[0].sdpa(&t[1], &t[2]).mods(mods, caps).run().unwrap_err().to_string()
    };
    let short = Tensor::from_vec(vec![0.5f32; 3], &[3]);
    let err = run(&case.mods, &[&short]);
    assert!(err.contains("capture `slopes`") && err.contains("[3]"), "{err}");
    let ints = Tensor::from_vec(vec![1i32; 4], &[4]);
    let err = run(&case.mods, &[&ints]);
    assert!(err.contains("capture `slopes`") && err.contains("i32"), "{err}");
    let err = run(&case.mods, &[]);
    assert!(err.contains("0 capture tensor(s) given"), "{err}");
    // A score function reading one head past the table.
    let mut mods = AttentionMods::new();
    let slopes = mods.capture("slopes", &[4], DType::F32);
    let mods = mods.score(move |x, s| s + x.load(slopes, &[&x.h + 1]));
    let fine = Tensor::from_vec(vec![0.5f32; 4], &[4]);
    let err = run(&mods, &[&fine]);
    assert!(err.contains("capture `slopes`") && err.contains("out of its bounds"), "{err}");
    // A mask beside mods.
    let mask = Tensor::full(&[1, 1, 70, 150], 0.0);
    let err = t[0].sdpa(&t[1], &t[2]).mods(&case.mods, &[&fine]).mask(&mask).run().unwrap_err().to_string();
    assert!(err.contains("`mask`"), "{err}");
}

//! The backward of bf16 and f16 attention ([`SdpaBackwardHalf`] and the tensor op's gradient)
//! against the f64 reference backward of the same 16-bit inputs (widened exactly), on GQA,
//! causal, key lengths, a bool mask and a bias (with its gradient); bit for bit against the f32
//! backward of the widened inputs rounded once; and its errors.
//!
//! Tolerance: the gradients are the f32 backward's at the widened inputs, whose error against
//! f64 `sdpa_backward` bounds by `e32 = max(2e-5, 2e-6 * terms)` (inputs in [-1, 1], `terms`
//! the longest sum), then rounded once to the 16-bit type with unit roundoff `u` (2^-8 for
//! bf16, 2^-11 for f16). So `|g - w| <= u |g32| + e32 <= u |w| + (1 + u) e32` per element,
//! which is what [`check`] allows.

use half::{bf16, f16};
use uopc_ir::DType;
use uopc_kernels::sdpa::{
    Extras, MaskKind, SdpaBackward, SdpaBackwardHalf, SdpaConfig, SdpaDType, SdpaError,
    reference_backward_f64,
};

use crate::support::{Half, Rng};

fn widen<T: Half>(x: &[T]) -> Vec<f32> {
    x.iter().map(|&x| x.to()).collect()
}

/// Random 16-bit q, k, v and dO for `config` (made of dtype `T`), and its extras.
struct Case<T> {
    config: SdpaConfig,
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    d_o: Vec<T>,
    mask: Option<Vec<bool>>,
    bias: Option<Vec<f32>>,
    lens: Option<Vec<i32>>,
}

impl<T: Half> Case<T> {
    fn new(config: SdpaConfig, rng: &mut Rng) -> Case<T> {
        let config = SdpaConfig { dtype: T::DTYPE, ..config };
        let mut round = |len: usize| rng.values(len).into_iter().map(T::from).collect::<Vec<T>>();
        let (q, k, v, d_o) =
            (round(config.q_len()), round(config.kv_len()), round(config.kv_len()), round(config.q_len()));
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
            (0..config.batch).map(|b| if b == 0 { 0 } else { rng.below(config.n_k + 1) as i32 }).collect()
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

    /// `[dq, dk, dv]` from [`SdpaBackwardHalf`], starting as NaN so an unwritten element fails,
    /// and dbias when the configuration has a bias.
    fn gradients(&self, bwd: &SdpaBackwardHalf) -> ([Vec<T>; 3], Option<Vec<f32>>) {
        let c = &self.config;
        let (mut dq, mut dk, mut dv) =
            (vec![T::NAN; c.q_len()], vec![T::NAN; c.kv_len()], vec![T::NAN; c.kv_len()]);
        let mut dbias = self.bias.as_ref().map(|b| vec![f32::NAN; b.len()]);
        bwd.gradients(
            [&self.q, &self.k, &self.v],
            &self.d_o,
            self.extras(),
            [&mut dq, &mut dk, &mut dv],
            dbias.as_deref_mut(),
        )
        .expect("backward");
        ([dq, dk, dv], dbias)
    }
}

/// The f32 error bound of the f32 backward (see the module docs).
fn f32_bound(c: &SdpaConfig) -> f64 {
    let terms = c.n_k.max(c.heads / c.kv_heads * c.n_q) as f64;
    2e-5_f64.max(2e-6 * terms)
}

/// Every element of `got` within `u |w| + (1 + u) e32` of the reference `want`.
fn check_close<T: Half>(name: &str, c: &SdpaConfig, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{name}");
    let (u, e32) = (T::UNIT_ROUNDOFF, f32_bound(c));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = u * w.abs() + (1.0 + u) * e32;
        assert!(
            (f64::from(g) - w).abs() <= tol,
            "{c:?}: {name}[{i}] = {g}, reference {w} (tolerance {tol:e})"
        );
    }
}

/// The case's gradients against the f64 reference, and bit for bit against the f32 backward
/// of the widened inputs rounded to `T`.
fn check<T: Half>(case: &Case<T>) {
    let c = &case.config;
    let bwd = SdpaBackwardHalf::compile(c).expect("compiles");
    let ([dq, dk, dv], dbias) = case.gradients(&bwd);
    let (q, k, v, d_o) = (widen(&case.q), widen(&case.k), widen(&case.v), widen(&case.d_o));
    let want = reference_backward_f64(c, &q, &k, &v, &d_o, case.extras());
    for (name, g, w) in [("dq", &dq, &want[0]), ("dk", &dk, &want[1]), ("dv", &dv, &want[2])] {
        check_close::<T>(name, c, &widen(g), w);
    }
    assert!(widen(&dq).iter().any(|x| x.abs() > 1e-2), "{c:?}: dq is not trivially zero");
    if let Some(dbias) = &dbias {
        // dbias is f32: the f32 backward's bound for a sum over every row and key it covers.
        let tol = 2e-5_f64.max(2e-6 * (c.batch * c.heads * c.n_q) as f64);
        for (i, (&g, &w)) in dbias.iter().zip(&want[3]).enumerate() {
            assert!((f64::from(g) - w).abs() <= tol, "{c:?}: dbias[{i}] = {g}, reference {w}");
        }
    }
    // The f32 backward on the widened inputs, rounded once, is what the 16-bit one returns.
    let wide = SdpaBackward::compile(&SdpaConfig { dtype: SdpaDType::F32, ..*c }).expect("compiles");
    let mut o = vec![0.0f32; c.q_len()];
    let mut lse = vec![0.0f32; wide.lse_len()];
    wide.forward(&q, &k, &v, case.extras(), &mut o, &mut lse).unwrap();
    let saved = uopc_kernels::sdpa::ForwardSaved { q: &q, k: &k, v: &v, o: &o, lse: &lse };
    let (mut gq, mut gk, mut gv) =
        (vec![0.0f32; c.q_len()], vec![0.0f32; c.kv_len()], vec![0.0f32; c.kv_len()]);
    wide.run(saved, &d_o, case.extras(), &mut gq, &mut gk, &mut gv).unwrap();
    for (name, g, w) in [("dq", &dq, &gq), ("dk", &dk, &gk), ("dv", &dv, &gv)] {
        let rounded: Vec<T> = w.iter().map(|&x| T::from(x)).collect();
        assert!(g == &rounded, "{c:?}: {name} differs from the rounded f32 backward");
    }
}

fn config(b: usize, h: usize, hkv: usize, n_q: usize, n_k: usize, d: usize) -> SdpaConfig {
    SdpaConfig { kv_heads: hkv, ..SdpaConfig::new(b, h, n_q, n_k, d) }
}

/// The shapes of both types' suites: plain, GQA and causal with unequal lengths, key lengths
/// (one item with none), a bool mask, and a bias with its gradient.
fn configs() -> Vec<SdpaConfig> {
    vec![
        config(1, 2, 2, 33, 47, 16),
        SdpaConfig { causal: true, ..config(2, 4, 2, 40, 70, 32) },
        SdpaConfig { causal: true, ..config(1, 8, 1, 70, 40, 64) },
        SdpaConfig { key_lengths: true, ..config(3, 2, 1, 20, 50, 16) },
        SdpaConfig { mask: MaskKind::Bool([1, 1, 30, 45]), ..config(2, 2, 2, 30, 45, 16) },
        SdpaConfig { mask: MaskKind::Bias([2, 1, 1, 45]), causal: true, ..config(2, 3, 3, 30, 45, 16) },
    ]
}

#[test]
fn bf16_backward_against_f64() {
    let mut rng = Rng(17);
    for c in configs() {
        check(&Case::<bf16>::new(c, &mut rng));
    }
}

#[test]
fn f16_backward_against_f64() {
    let mut rng = Rng(29);
    for c in configs() {
        check(&Case::<f16>::new(c, &mut rng));
    }
}

#[test]
fn bad_arguments_are_errors_naming_them() {
    let c = SdpaConfig { dtype: SdpaDType::BF16, ..config(1, 2, 1, 8, 9, 16) };
    let bwd = SdpaBackwardHalf::compile(&c).unwrap();
    let (q, kv) = (vec![bf16::ONE; c.q_len()], vec![bf16::ONE; c.kv_len()]);
    let (mut dq, mut dk, mut dv) = (q.clone(), kv.clone(), kv.clone());
    let err = bwd
        .gradients([&q, &kv, &kv], &q, Extras::default(), [&mut dq, &mut dk[1..], &mut dv], None)
        .unwrap_err();
    assert!(matches!(err, SdpaError::Length { arg: "dk", .. }), "{err}");
    // f16 values for a bf16 configuration.
    let (qh, kvh) = (vec![f16::ONE; c.q_len()], vec![f16::ONE; c.kv_len()]);
    let (mut dqh, mut dkh, mut dvh) = (qh.clone(), kvh.clone(), kvh.clone());
    let err = bwd
        .gradients([&qh, &kvh, &kvh], &qh, Extras::default(), [&mut dqh, &mut dkh, &mut dvh], None)
        .unwrap_err();
    assert!(
        matches!(err, SdpaError::DType { arg: "q", expected: SdpaDType::BF16, got: SdpaDType::F16 }),
        "{err}"
    );
    // A dbias without a bias; nothing was written by any refused call.
    let mut dbias = vec![0.0f32; 9];
    let err = bwd
        .gradients([&q, &kv, &kv], &q, Extras::default(), [&mut dq, &mut dk, &mut dv], Some(&mut dbias))
        .unwrap_err();
    assert!(matches!(err, SdpaError::Extra { arg: "dbias", .. }), "{err}");
    assert!(dq.iter().chain(&dk).chain(&dv).all(|&x| x == bf16::ONE));
    // An f32 configuration belongs to SdpaBackward.
    let err = SdpaBackwardHalf::compile(&SdpaConfig { dtype: SdpaDType::F32, ..c }).unwrap_err();
    assert!(err.to_string().contains("SdpaBackward"), "{err}");
}

#[test]
fn the_tensor_gradient_of_bf16_attention() {
    use uopc_kernels::sdpa::scaled_dot_product_attention;
    use uopc_tensor::{Tensor, gradient};
    let mut rng = Rng(41);
    let (b, h, hkv, n_q, n_k, d) = (2, 4, 2, 33, 70, 16);
    let c = SdpaConfig { causal: true, ..config(b, h, hkv, n_q, n_k, d) };
    let case = Case::<bf16>::new(c, &mut rng);
    let tensor = |x: &[bf16], rows: usize, heads: usize| Tensor::from_vec(x.to_vec(), &[b, heads, rows, d]);
    let (q, k, v) = (tensor(&case.q, n_q, h), tensor(&case.k, n_k, hkv), tensor(&case.v, n_k, hkv));
    let w = tensor(&case.d_o, n_q, h).cast(DType::F32);
    let out = scaled_dot_product_attention(&q, &k, &v, None, true, None).unwrap();
    let loss = (&out.cast(DType::F32) * &w).sum(-1, false).sum(-1, false).sum(-1, false).sum(-1, false);
    let grads = gradient(&loss, &[&q, &k, &v]).unwrap();
    let want = reference_backward_f64(
        &case.config,
        &widen(&case.q),
        &widen(&case.k),
        &widen(&case.v),
        &widen(&case.d_o),
        Extras::default(),
    );
    let bwd = SdpaBackwardHalf::compile(&case.config).unwrap();
    let (direct, _) = case.gradients(&bwd);
    for (i, name) in ["dq", "dk", "dv"].into_iter().enumerate() {
        assert_eq!(grads[i].dtype(), DType::BF16, "{name}");
        let got = grads[i].to_ndarray::<bf16>().unwrap().as_slice().unwrap().to_vec();
        check_close::<bf16>(name, &case.config, &widen(&got), &want[i]);
        // The loss's cotangent reaches the node as the bf16 cotangent of the output, which is
        // `w` exactly (w holds bf16 values), so the node computes what the slice entry does,
        // but its Delta sums in another order: the f32 gradients differ in their last bits,
        // and a rounding may land on the neighbouring bf16, one unit in the last place (at
        // most 2^-7 of the value) away.
        for (j, (&a, &e)) in widen(&got).iter().zip(&widen(&direct[i])).enumerate() {
            let ulp = a.abs().max(e.abs()) / 128.0;
            assert!((a - e).abs() <= ulp, "{name}[{j}]: tensor node {a}, SdpaBackwardHalf {e}");
        }
    }
}

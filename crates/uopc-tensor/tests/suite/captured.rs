//! `Captured`: a graph planned once and run on new values of some inputs, against the same
//! graph built and realized anew for those values.

use uopc_tensor::{Captured, RealizeOptions, Tensor};

/// Deterministic values of `n` elements from `seed`.
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + seed * 13) % 23) as f32 / 11.0 - 1.0).collect()
}

/// A layer-like graph: a residual add, a product with a weight, a norm-like reduce.
fn graph(x: &Tensor, a: &Tensor, w: &Tensor) -> (Tensor, Tensor) {
    let y = x + &a.matmul(w);
    let scale = (&y * &y).mean(-1, true).sqrt() + 1.0;
    (y.clone(), (&y / &scale).matmul(&w.t()))
}

#[test]
fn a_captured_graph_run_on_new_inputs_equals_the_graph_built_for_them() -> Result<(), uopc_tensor::TensorError>
{
    let w = Tensor::from_vec(values(6 * 5, 1), &[6, 5]);
    let realized = |t: Tensor| t.realize();
    let (x0, a0) = (
        realized(Tensor::from_vec(values(3 * 5, 2), &[3, 5]))?,
        realized(Tensor::from_vec(values(3 * 6, 3), &[3, 6]))?,
    );
    let (y0, z0) = graph(&x0, &a0, &w);
    let captured = Captured::new(&[&y0, &z0], &[&x0, &a0], &RealizeOptions::default())?;
    for seed in 4..8 {
        let x = realized(Tensor::from_vec(values(3 * 5, seed), &[3, 5]))?;
        let a = realized(Tensor::from_vec(values(3 * 6, seed + 10), &[3, 6]))?;
        let got = captured.run(&[&x, &a])?;
        let (y, z) = graph(&x, &a, &w);
        // The same plan on the same values: the same results, bit for bit.
        assert_eq!(got[0].to_ndarray::<f32>()?, y.to_ndarray::<f32>()?);
        assert_eq!(got[1].to_ndarray::<f32>()?, z.to_ndarray::<f32>()?);
        assert_eq!(got[1].shape(), &[3, 6]);
    }
    Ok(())
}

#[test]
fn capture_refuses_inputs_it_cannot_replace() -> Result<(), uopc_tensor::TensorError> {
    let w = Tensor::from_vec(values(6 * 5, 1), &[6, 5]);
    let x = Tensor::from_vec(values(3 * 5, 2), &[3, 5]).realize()?;
    let a = Tensor::from_vec(values(3 * 6, 3), &[3, 6]).realize()?;
    let (y, z) = graph(&x, &a, &w);
    let unread = Tensor::from_vec(values(4, 9), &[4]).realize()?;
    let err = Captured::new(&[&y, &z], &[&x, &unread], &RealizeOptions::default()).unwrap_err();
    assert!(err.to_string().contains("input 1"), "{err}");
    let captured = Captured::new(&[&y, &z], &[&x, &a], &RealizeOptions::default())?;
    // Wrong count, wrong shape, an unrealized tensor: errors naming the input, nothing run.
    assert!(captured.run(&[&x]).unwrap_err().to_string().contains("1 inputs given for 2"));
    let narrow = Tensor::from_vec(values(3 * 4, 5), &[3, 4]).realize()?;
    assert!(captured.run(&[&x, &narrow]).unwrap_err().to_string().contains("input 1"));
    let lazy = &a * 2.0;
    assert!(captured.run(&[&x, &lazy]).unwrap_err().to_string().contains("unrealized"));
    Ok(())
}

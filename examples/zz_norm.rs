use uopc::tensor::Tensor;
fn main() {
    let (n, d) = (512usize, 576usize);
    let x = Tensor::from_vec((0..n * d).map(|i| (i as f32 * 0.37).sin()).collect::<Vec<_>>(), &[n, d]);
    let c = Tensor::from_vec((0..n * d).map(|i| (i as f32 * 0.11).cos()).collect::<Vec<_>>(), &[n, d]);
    let w = Tensor::from_vec((0..d).map(|i| 1.0 + i as f32 * 0.001).collect::<Vec<_>>(), &[d]);
    for _ in 0..3 {
        let inv = ((&x * &x).mean(-1, true) + 1e-5).sqrt().recip();
        let y = (&x * &inv) * &w;
        let loss = (&y * &c).sum(-1, false).sum(0, false);
        let g = uopc::tensor::gradient(&loss, &[&w]).unwrap().remove(0);
        let _ = g.realize().unwrap();
    }
}

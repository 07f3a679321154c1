//! Helpers shared by the online-reduction tests: realizing to an f32 array, comparing it
//! with an f64 reference, and where a kernel's accumulators live.

use ndarray::ArrayD;
use uopc::ir::{Op, Stmt, UOp, linearize, view_base};
use uopc::{RealizeOptions, Tensor};

/// Largest difference relative to `max(|want|, 1)`; NaN only matches NaN and an infinity only
/// itself.
pub fn max_err(got: &ArrayD<f32>, want: &ArrayD<f64>) -> f64 {
    assert_eq!(got.shape(), want.shape());
    got.iter()
        .zip(want.iter())
        .map(|(&g, &w)| {
            let g = f64::from(g);
            match (g.is_nan(), w.is_nan()) {
                (true, true) => 0.0,
                (false, false) if g == w => 0.0,
                (false, false) => (g - w).abs() / w.abs().max(1.0),
                _ => f64::INFINITY,
            }
        })
        .fold(0.0, f64::max)
}

/// `t` realized with `opts`, as f32.
pub fn realize(t: &Tensor, opts: &RealizeOptions) -> ArrayD<f32> {
    t.realize_with(opts).expect("realizes").0.to_ndarray::<f32>().expect("f32")
}

/// Whether every store to a local accumulator sits inside the THREAD loop.
pub fn accumulators_inside_thread(program: &UOp) -> bool {
    fn go(body: &[Stmt], in_thread: bool, thread: &UOp) -> bool {
        body.iter().all(|s| match s {
            Stmt::Loop { range, body } => go(body, in_thread || range == thread, thread),
            Stmt::Op(u) if matches!(u.op(), Op::Store) => {
                let local = view_base(&u.src()[0]).is_some_and(|b| matches!(b.op(), Op::Alloc { .. }));
                !local || in_thread
            }
            Stmt::Op(_) => true,
        })
    }
    let lin = linearize(program).unwrap();
    let Some(thread) = lin.thread.clone() else { return false };
    go(&lin.root, false, &thread)
}

//! DEBUG reporting: the lines are made from the plan and the run, never re-described.

use uopc_tensor::attention::attention;
use uopc_tensor::debug::{kernel_line, summary_line};
use uopc_tensor::*;

#[test]
fn debug_lines_list_exactly_the_plans_kernels() {
    let (n, d) = (64, 16);
    let t = |s: usize| {
        Tensor::from_vec((0..n * d).map(|x| ((x * s) % 13) as f32 / 13.0).collect::<Vec<f32>>(), &[n, d])
    };
    let out = attention(&t(3), &t(5), &t(7));
    set_debug_level(3);
    assert_eq!(debug_level(), 3);
    let (_, report) = realize(&[&out], &RealizeOptions::default()).unwrap();
    set_debug_level(0);
    let plan = make_plan(&[out.uop().clone()], &RealizeOptions::default()).unwrap();
    let names: Vec<&str> = report.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, plan.kernel_names());
    for k in &report.kernels {
        let line = kernel_line(k);
        assert!(line.trim_start().starts_with(&k.name), "{line}");
        assert!(k.again_seconds.is_some(), "DEBUG=3 re-runs every kernel");
        assert!(line.contains("again"), "{line}");
        // every kernel but the transposed copy of V does arithmetic
        if !k.name.starts_with("e_1_") {
            assert!(k.flops > 0, "{} has FLOPs", k.name);
        }
    }
    let summary = summary_line(&report);
    assert!(summary.starts_with(&format!("realize: {} kernels, schedule", plan.kernels.len())), "{summary}");
}

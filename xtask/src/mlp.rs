//! `bench mlp`: one training step of a two-layer MLP (forward, mean-squared loss, the
//! gradients of every weight) per activation, so each activation's cost, its backward
//! included, shows beside the others on the same GEMMs.

use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;
use std::path::Path;
use std::process::ExitCode;

use crate::block::time_passes;
use crate::stats::median;
use uopc::tensor::{RealizeOptions, Tensor, gradient, realize};

/// An activation function of the hidden layer.
type Activation = fn(&Tensor) -> Tensor;

/// The activations timed, by name.
const ACTIVATIONS: [(&str, Activation); 4] = [
    ("relu", Tensor::relu),
    ("gelu_tanh", Tensor::gelu_tanh),
    ("gelu", Tensor::gelu),
    ("silu", Tensor::silu),
];

/// The step's sizes: `batch` rows of `inputs` features, `hidden` units, `outputs` targets.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct MlpShape {
    pub batch: usize,
    pub inputs: usize,
    pub hidden: usize,
    pub outputs: usize,
}

#[derive(Serialize)]
struct Row {
    activation: &'static str,
    median_ms: f64,
    best_ms: f64,
    over_gelu_tanh: f64,
    kernels: usize,
}

fn random(shape: &[usize], rng: &mut StdRng) -> Tensor {
    Tensor::from_vec(crate::matmul::random(shape.iter().product(), rng), shape)
}

/// The loss and the gradients of both layers' weights and biases, for activation `act`.
fn step(x: &Tensor, target: &Tensor, params: &[Tensor; 4], act: Activation) -> Vec<Tensor> {
    let [w1, b1, w2, b2] = params;
    let hidden = act(&(&x.matmul(w1) + b1));
    let err = &(&hidden.matmul(w2) + b2) - target;
    let loss = (&err * &err).mean(0, false).mean(0, false);
    let refs: Vec<&Tensor> = params.iter().collect();
    let mut outs = vec![loss.clone()];
    outs.extend(gradient(&loss, &refs).expect("the loss is a float scalar"));
    outs
}

/// Runs `bench mlp`: each activation's step once to compile, then `rounds` interleaved rounds
/// of `reps` timed realizes of each.
pub fn run(shape: MlpShape, reps: usize, rounds: usize, json: Option<&Path>) -> ExitCode {
    let MlpShape { batch, inputs, hidden, outputs } = shape;
    let mut rng = StdRng::seed_from_u64(3);
    let x = random(&[batch, inputs], &mut rng);
    let target = random(&[batch, outputs], &mut rng);
    let scale = |t: Tensor, fan_in: usize| &t * (1.0 / (fan_in as f64).sqrt());
    let params = [
        scale(random(&[inputs, hidden], &mut rng), inputs),
        random(&[hidden], &mut rng),
        scale(random(&[hidden, outputs], &mut rng), hidden),
        random(&[outputs], &mut rng),
    ];
    let steps: Vec<Vec<Tensor>> =
        ACTIVATIONS.iter().map(|&(_, act)| step(&x, &target, &params, act)).collect();
    let opts = RealizeOptions::default();
    let mut kernels = Vec::new();
    for (outs, (name, _)) in steps.iter().zip(ACTIVATIONS) {
        match realize(&outs.iter().collect::<Vec<_>>(), &opts) {
            Ok((_, report)) => kernels.push(report.kernels.len()),
            Err(e) => {
                eprintln!("error: {name}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let passes: Vec<(String, Vec<&Tensor>, &RealizeOptions)> = (steps.iter().zip(ACTIVATIONS))
        .map(|(outs, (name, _))| (name.to_string(), outs.iter().collect(), &opts))
        .collect();
    let timings = time_passes(&passes, rounds, reps);
    let medians: Vec<f64> = timings.samples.iter().map(|s| median(s)).collect();
    let tanh_ms = medians[1];
    println!("MLP training step, batch {batch}, {inputs} -> {hidden} -> {outputs}, loss and 4 gradients:");
    println!(
        "{:<10} {:>10} {:>10} {:>14} {:>8}",
        "activation", "median ms", "best ms", "/ gelu_tanh", "kernels"
    );
    let mut rows = Vec::new();
    for (k, (name, _)) in ACTIVATIONS.iter().enumerate() {
        let best = timings.samples[k].iter().copied().fold(f64::INFINITY, f64::min);
        let row = Row {
            activation: name,
            median_ms: medians[k],
            best_ms: best,
            over_gelu_tanh: medians[k] / tanh_ms,
            kernels: kernels[k],
        };
        println!(
            "{:<10} {:>10.3} {:>10.3} {:>13.2}x {:>8}",
            row.activation, row.median_ms, row.best_ms, row.over_gelu_tanh, row.kernels
        );
        rows.push(row);
    }
    if let Some(path) = json {
        let record =
            serde_json::json!({ "machine": crate::machine_record(), "shape": shape, "results": rows });
        let text = serde_json::to_string_pretty(&record).expect("rows serialize to JSON");
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

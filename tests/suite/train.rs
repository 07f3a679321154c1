//! Training a loaded model: the optimizers against their formulas, a training step against its
//! parts, a fine-tuning run whose loss falls, and a saved checkpoint that loads back to the
//! same model.

use std::path::Path;
use uopc::Tensor;
use uopc::models::{CausalLm, Logits};
use uopc::optim::{AdamW, Sgd};

fn fixture_dir(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models").join(name)
}

#[test]
fn adamw_and_sgd_follow_torchs_update_rules() {
    let p0 = [0.5f64, -1.25, 2.0];
    let grads = [[0.1f64, -0.3, 0.05], [0.2, 0.1, -0.4], [-0.05, 0.25, 0.3]];
    let (lr, b1, b2, eps, wd) = (0.01f64, 0.9f64, 0.999f64, 1e-8f64, 0.01f64);
    // AdamW by its formula in f64.
    let (mut w, mut m, mut v) = (p0, [0.0f64; 3], [0.0f64; 3]);
    let mut p = Tensor::from_vec(p0.iter().map(|&x| x as f32).collect::<Vec<_>>(), &[3]);
    let mut opt = AdamW::new(lr as f32);
    for (t, g) in grads.iter().enumerate() {
        for i in 0..3 {
            w[i] -= lr * wd * w[i];
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            let (mh, vh) = (m[i] / (1.0 - b1.powi(t as i32 + 1)), v[i] / (1.0 - b2.powi(t as i32 + 1)));
            w[i] -= lr * mh / (vh.sqrt() + eps);
        }
        let gt = Tensor::from_vec(g.iter().map(|&x| x as f32).collect::<Vec<_>>(), &[3]);
        p = opt.step(&[p], &[gt]).unwrap().remove(0);
    }
    let got = p.to_ndarray::<f32>().unwrap();
    for (g, want) in got.iter().zip(w) {
        assert!((f64::from(*g) - want).abs() < 1e-6, "{g} vs {want}");
    }
    assert_eq!(opt.steps(), 3);
    // SGD with momentum 0.9: b = g, then b = 0.9 b + g; p -= lr b.
    let mut sgd = Sgd::new(0.1, 0.9);
    let mut p = Tensor::from_vec(vec![1.0f32], &[1]);
    let mut want = 1.0f64;
    let mut b = 0.0f64;
    for (t, g) in [0.5f64, -0.25, 1.0].iter().enumerate() {
        b = if t == 0 { *g } else { 0.9 * b + g };
        want -= 0.1 * b;
        p = sgd.step(&[p], &[Tensor::from_vec(vec![*g as f32], &[1])]).unwrap().remove(0);
    }
    assert!((f64::from(p.item().unwrap()) - want).abs() < 1e-6);
    // Mismatched lists are errors naming the step.
    let e = opt.step(&[Tensor::zeros(&[3]), Tensor::zeros(&[2])], &[Tensor::zeros(&[3])]).unwrap_err();
    assert!(e.to_string().contains("optimizer step"), "{e}");
}

#[test]
fn fine_tuning_lowers_the_loss_and_a_saved_checkpoint_loads_back() {
    let mut model = CausalLm::load(&fixture_dir("llama_tiny_gqa")).unwrap();
    // The synthetic task: each token is followed by the next one (mod 32).
    let sequences: Vec<Vec<u32>> =
        (0..3).map(|s| (0..12).map(|i| ((s * 5 + i) % 32) as u32).collect()).collect();
    let loss_of = |m: &CausalLm| -> Tensor {
        let losses: Vec<Tensor> = sequences.iter().map(|s| m.loss(s).unwrap()).collect();
        losses.iter().skip(1).fold(losses[0].clone(), |a, b| a + b)
    };
    let mut opt = AdamW::new(3e-3);
    let first = loss_of(&model).item().unwrap();
    let mut last = first;
    for _ in 0..8 {
        let loss = loss_of(&model);
        last = loss.item().unwrap();
        let leaves = model.leaves();
        let refs: Vec<&Tensor> = leaves.iter().collect();
        let grads = uopc::tensor::gradient(&loss, &refs).unwrap();
        model = model.with_leaves(&opt.step(&leaves, &grads).unwrap()).unwrap();
    }
    assert!(last < 0.8 * first, "loss {first} -> {last}");
    let dir = std::env::temp_dir().join(format!("uopc_saved_{}", std::process::id()));
    model.save(&dir).unwrap();
    let back = CausalLm::load(&dir).unwrap();
    let prompt = [3u32, 4, 5, 6];
    let a =
        model.forward(&prompt, &mut model.new_cache(4), Logits::All).unwrap().to_ndarray::<f32>().unwrap();
    let b = back.forward(&prompt, &mut back.new_cache(4), Logits::All).unwrap().to_ndarray::<f32>().unwrap();
    assert_eq!(a, b, "the saved weights are the model's, bit for bit");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn adamw_updates_every_element_of_parameters_longer_than_one_piece() {
    // Parameters cut into pieces for the threads, one of them ragged: each element follows
    // the formula with its own gradient and moments over two steps.
    let sizes = [200_003usize, 7];
    let init = |n: usize, s: f32| (0..n).map(|i| ((i as f32) * 0.37 + s).sin()).collect::<Vec<f32>>();
    let grad =
        |n: usize, t: usize| (0..n).map(|i| ((i * (t + 2)) as f32 * 0.011).cos()).collect::<Vec<f32>>();
    let mut params: Vec<Tensor> = sizes.iter().map(|&n| Tensor::from_vec(init(n, n as f32), &[n])).collect();
    let mut opt = AdamW::new(0.01);
    for t in 0..2 {
        let grads: Vec<Tensor> = sizes.iter().map(|&n| Tensor::from_vec(grad(n, t), &[n])).collect();
        params = opt.step(&params, &grads).unwrap();
    }
    let (lr, b1, b2, eps, wd) = (0.01f64, 0.9f64, 0.999f64, 1e-8f64, 0.01f64);
    for (p, &n) in params.iter().zip(&sizes) {
        let got = p.as_slice::<f32>().expect("an optimizer's output is realized");
        let start = init(n, n as f32);
        for i in (0..n).step_by(997).chain([n - 1]) {
            let (mut w, mut m, mut v) = (f64::from(start[i]), 0.0f64, 0.0f64);
            for t in 0..2 {
                let g = f64::from(grad(n, t)[i]);
                w -= lr * wd * w;
                m = b1 * m + (1.0 - b1) * g;
                v = b2 * v + (1.0 - b2) * g * g;
                let (mh, vh) = (m / (1.0 - b1.powi(t as i32 + 1)), v / (1.0 - b2.powi(t as i32 + 1)));
                w -= lr * mh / (vh.sqrt() + eps);
            }
            assert!((f64::from(got[i]) - w).abs() < 1e-6, "size {n}, element {i}: {} vs {w}", got[i]);
        }
    }
}

#[test]
fn a_batch_loss_is_the_mean_over_its_sequences_and_so_are_its_gradients() {
    // Llama (rotary positions) and GPT-2 (a position table added to each sequence's rows).
    for name in ["llama_tiny_gqa", "gpt2_tiny"] {
        batch_loss_is_the_mean_over_its_sequences(name);
    }
}

fn batch_loss_is_the_mean_over_its_sequences(name: &str) {
    let model = CausalLm::load(&fixture_dir(name)).unwrap();
    let (a, b): (Vec<u32>, Vec<u32>) =
        ((0..10).map(|i| (i * 5 + 1) % 64).collect(), (0..10).map(|i| (i * 3 + 7) % 64).collect());
    let leaf = model.leaves()[1].clone();
    let loss_and_grad = |loss: Tensor| {
        let g = uopc::tensor::gradient(&loss, &[&leaf]).unwrap().remove(0);
        (loss.item().unwrap(), g.to_ndarray::<f32>().unwrap())
    };
    let (batch, gb) = loss_and_grad(model.loss_batch(&[&a, &b]).unwrap());
    let (la, ga) = loss_and_grad(model.loss(&a).unwrap());
    let (lb, gbb) = loss_and_grad(model.loss(&b).unwrap());
    assert!((batch - (la + lb) / 2.0).abs() <= 1e-6 * batch.abs(), "{name}: {batch} vs {la} and {lb}");
    for ((g, x), y) in gb.iter().zip(&ga).zip(&gbb) {
        let want = (x + y) / 2.0;
        assert!((g - want).abs() <= 1e-5 * (1e-3 + want.abs()), "{name}: {g} vs {want}");
    }
    let short = [1u32, 2, 3];
    match model.loss_batch(&[&a, &short]) {
        Err(uopc::models::ModelError::Input(msg)) => assert!(msg.contains("one length"), "{msg}"),
        other => panic!("sequences of two lengths: {other:?}"),
    }
}

#[test]
fn a_train_step_is_the_loss_its_gradients_and_the_optimizers_update() {
    let model = CausalLm::load(&fixture_dir("gpt2_tiny")).unwrap();
    let batch: [&[u32]; 2] = [&[1, 5, 9, 2, 7, 3], &[4, 4, 8, 1, 0, 6]];
    // By hand: the loss, its gradients, the update.
    let loss = model.loss_batch(&batch).unwrap();
    let leaves = model.leaves();
    let grads = uopc::tensor::gradient(&loss, &leaves.iter().collect::<Vec<_>>()).unwrap();
    let values = |ts: &[Tensor]| -> Vec<Vec<f32>> {
        ts.iter().map(|t| t.to_ndarray::<f32>().unwrap().iter().copied().collect()).collect()
    };
    for momentum in [0.0f32, 0.9] {
        let want = Sgd::new(0.05, momentum).step(&leaves, &grads).unwrap();
        let (next, value) = model.train_step(&batch, &mut Sgd::new(0.05, momentum)).unwrap();
        assert_eq!(value, loss.item().unwrap());
        assert_eq!(values(&next.leaves()), values(&want), "momentum {momentum}");
    }
    let want = AdamW::new(1e-3).step(&leaves, &grads).unwrap();
    let (next, _) = model.train_step(&batch, &mut AdamW::new(1e-3)).unwrap();
    assert_eq!(values(&next.leaves()), values(&want));
    // Sequences of two lengths are the loss's error.
    assert!(model.train_step(&[&[1, 2, 3], &[1, 2]], &mut AdamW::new(1e-3)).is_err());
}

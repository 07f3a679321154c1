//! Bytes -> a random Tensor graph built through the fallible `try_` API (shape errors are
//! fine) -> realized unfused, fused and without opts. Any panic, abort or signal is a crash;
//! the three realizations of one graph must agree.

#![no_main]

use libfuzzer_sys::fuzz_target;
use uopc_tensor::{NoOpt, RealizeOptions, Tensor};

/// A byte source that yields zeros when exhausted.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn small(&mut self, n: usize) -> usize {
        self.next() as usize % n.max(1)
    }
}

fn leaf(b: &mut Bytes<'_>) -> Tensor {
    let shape: Vec<usize> = (0..1 + b.small(3)).map(|_| 1 + b.small(5)).collect();
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| (b.next() as f32 - 128.0) / 32.0).collect();
    Tensor::from_vec(data, &shape)
}

fn step(b: &mut Bytes<'_>, stack: &mut Vec<Tensor>) {
    let x = match stack.pop() {
        Some(x) => x,
        None => leaf(b),
    };
    let axis = b.small(4) as isize - 2;
    let result = match b.small(16) {
        0 => Ok(leaf(b)),
        1 => x.try_add(&stack.pop().unwrap_or_else(|| leaf(b))),
        2 => x.try_mul(&stack.pop().unwrap_or_else(|| leaf(b))),
        3 => x.try_sub(&stack.pop().unwrap_or_else(|| leaf(b))),
        4 => x.try_maximum(&stack.pop().unwrap_or_else(|| leaf(b))),
        5 => x.try_sum(axis, b.next() % 2 == 0),
        6 => x.try_max(axis, b.next() % 2 == 0),
        7 => x.try_softmax(axis),
        8 => x.try_matmul(&stack.pop().unwrap_or_else(|| leaf(b))),
        9 => x.try_transpose(axis, b.small(4) as isize - 2),
        10 => {
            let n = x.numel();
            let shape = if n % 2 == 0 { vec![2, n / 2] } else { vec![n] };
            x.try_reshape(&shape)
        }
        11 => {
            let len = x.shape().first().copied().unwrap_or(1);
            let begin = b.small(len);
            x.try_slice(0, begin, begin + 1 + b.small(len - begin))
        }
        12 => Tensor::try_cat(&[&x, &stack.pop().unwrap_or_else(|| leaf(b))], axis),
        13 => Ok((&x * 0.25).exp()),
        14 => Ok(x.recip()),
        _ => {
            let mut shape = x.shape().to_vec();
            shape.insert(0, 1 + b.small(3));
            x.try_reshape(&[&[1], x.shape()].concat()).and_then(|t| t.try_expand(&shape))
        }
    };
    match result {
        Ok(t) => stack.push(t),
        Err(_) => stack.push(x),
    }
}

fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= 1e-3 * (1.0 + x.abs().max(y.abs()))
        })
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    let mut stack = Vec::new();
    for _ in 0..1 + b.small(12) {
        step(&mut b, &mut stack);
    }
    let Some(root) = stack.pop() else { return };
    if root.numel() > 1 << 16 {
        return;
    }
    let mut results = Vec::new();
    let default_opts = RealizeOptions::default();
    let fused_opts = RealizeOptions::fused();
    let plain_opts = RealizeOptions::default().with_opt(NoOpt);
    for opts in [&default_opts, &fused_opts, &plain_opts] {
        match root.to_ndarray_with::<f32>(opts) {
            Ok(a) => results.push(a.iter().cloned().collect::<Vec<f32>>()),
            Err(e) => panic!("realize failed on a graph the API accepted: {e}"),
        }
    }
    assert!(same(&results[0], &results[1]), "fused differs from unfused");
    assert!(same(&results[0], &results[2]), "opts change the result");
});

//! Comparing the buffers two executions of one program produced.

use std::cmp::Ordering;
use uopc_ir::{DType, HostBuffer};

/// Machine epsilon of f32: every Smooth tolerance is in these units, since f32 rounding (or the
/// JIT's f32 EXP2 polynomial, within 2 ulp) dominates whenever an f32 is on the path.
pub const EPS: f64 = f32::EPSILON as f64;

/// How many `EPS * magnitude` units a Smooth result may be off per summed term: covers the
/// error growth of a few nested products (each one at most triples the bound's constant) and the
/// EXP2 polynomial.
pub const SMOOTH_UNITS: f64 = 64.0;

fn floats_equal(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Bit-exact equality, except that every NaN equals every NaN (and -0.0 equals +0.0 unless
/// `signed_zeros`).
pub fn exact(got: &[HostBuffer], want: &[HostBuffer]) -> Result<(), String> {
    exact_with(got, want, true)
}

/// [`exact`], choosing whether the sign of zero counts.
pub fn exact_with(got: &[HostBuffer], want: &[HostBuffer], signed_zeros: bool) -> Result<(), String> {
    let floats_equal = |a: f64, b: f64| floats_equal(a, b) || (!signed_zeros && a == 0.0 && b == 0.0);
    if got.len() != want.len() {
        return Err(format!("{} buffers vs {}", got.len(), want.len()));
    }
    for (slot, (g, w)) in got.iter().zip(want).enumerate() {
        if g.dtype() != w.dtype() || g.len() != w.len() {
            return Err(format!("slot {slot}: {} x {} vs {} x {}", g.dtype(), g.len(), w.dtype(), w.len()));
        }
        let bad = match (g, w) {
            (HostBuffer::F32(a), HostBuffer::F32(b)) => {
                a.iter().zip(b).position(|(x, y)| !floats_equal(*x as f64, *y as f64))
            }
            (HostBuffer::F64(a), HostBuffer::F64(b)) => {
                a.iter().zip(b).position(|(x, y)| !floats_equal(*x, *y))
            }
            (HostBuffer::BF16(a), HostBuffer::BF16(b)) => {
                a.iter().zip(b).position(|(x, y)| !floats_equal(x.to_f64(), y.to_f64()))
            }
            (HostBuffer::F16(a), HostBuffer::F16(b)) => {
                a.iter().zip(b).position(|(x, y)| !floats_equal(x.to_f64(), y.to_f64()))
            }
            _ => (0..g.len()).find(|&i| g.get_f64(i).to_bits() != w.get_f64(i).to_bits()),
        };
        if let Some(i) = bad {
            return Err(format!("slot {slot} element {i}: {:?} vs {:?}", show(g, i), show(w, i)));
        }
    }
    Ok(())
}

fn show(b: &HostBuffer, i: usize) -> String {
    match b {
        HostBuffer::Bool(v) => format!("{}", v[i]),
        HostBuffer::I32(v) => format!("{}", v[i]),
        HostBuffer::I64(v) => format!("{}", v[i]),
        HostBuffer::F32(v) => format!("{:e} ({:#010x})", v[i], v[i].to_bits()),
        HostBuffer::F64(v) => format!("{:e} ({:#018x})", v[i], v[i].to_bits()),
        HostBuffer::BF16(v) => format!("{:e} ({:#06x})", v[i].to_f32(), v[i].to_bits()),
        HostBuffer::F16(v) => format!("{:e} ({:#06x})", v[i].to_f32(), v[i].to_bits()),
    }
}

/// Integers and bools exactly; floats within `units * EPS * (1 + sum_len) * magnitude`, where
/// `magnitude` is the element of `mag` (the Magnitude twin's result), and 16-bit floats within
/// that plus one 16-bit rounding step of the magnitude. NaN equals NaN, infinities
/// of one sign are equal, and an infinite or NaN magnitude accepts anything.
pub fn within(
    got: &[HostBuffer],
    want: &[HostBuffer],
    mag: &[HostBuffer],
    sum_len: u64,
    units: f64,
) -> Result<(), String> {
    if got.len() != want.len() || got.len() != mag.len() {
        return Err(format!("{} buffers vs {} vs {}", got.len(), want.len(), mag.len()));
    }
    let scale = units * EPS * (1.0 + sum_len as f64);
    for (slot, ((g, w), m)) in got.iter().zip(want).zip(mag).enumerate() {
        if g.dtype() != w.dtype() || g.len() != w.len() || m.len() != g.len() {
            return Err(format!("slot {slot}: shapes differ"));
        }
        if !g.dtype().is_float() && !g.dtype().is_half() {
            exact(std::slice::from_ref(g), std::slice::from_ref(w))
                .map_err(|e| format!("slot {slot}: {e}"))?;
            continue;
        }
        // A 16-bit result is an f32 or f64 one rounded: results within tolerance before the
        // rounding may land one 16-bit step apart (relative 2^-7 for bf16, 2^-10 for f16, or
        // the smallest subnormal step).
        let (step, tiny) = match g.dtype() {
            DType::BF16 => (2f64.powi(-7), 2f64.powi(-133)),
            DType::F16 => (2f64.powi(-10), 2f64.powi(-24)),
            _ => (0.0, 0.0),
        };
        for i in 0..g.len() {
            let (x, y, mm) = (g.get_f64(i), w.get_f64(i), m.get_f64(i).abs());
            if floats_equal(x, y) || x == y || !mm.is_finite() {
                continue;
            }
            let tol = scale * mm * (1.0 + step) + step * mm + tiny;
            // A NaN on one side only is incomparable, hence a failure.
            let ok = matches!((x - y).abs().partial_cmp(&tol), Some(Ordering::Less | Ordering::Equal));
            if !ok {
                return Err(format!(
                    "slot {slot} element {i}: {x:e} vs {y:e} (|diff| {:e}, tolerance {tol:e}, magnitude {mm:e})",
                    (x - y).abs()
                ));
            }
        }
    }
    Ok(())
}

//! The 16-bit conversions against the `half` crate: exhaustive over all 65,536 bit patterns of
//! bf16 and f16, the f32 values at and around every rounding boundary, and a sweep over f32
//! bit patterns; the scalar and slice (vector) forms alike.

use half::{bf16, f16};
use uopc_tile::TileError;
use uopc_tile::convert::{
    bf16_from_f32, bf16_to_f32, bf16_to_f32_slice, f16_from_f32, f16_to_f32, f16_to_f32_slice,
    f32_to_bf16_slice, f32_to_f16_slice,
};

fn all_bf16() -> Vec<bf16> {
    (0..=u16::MAX).map(bf16::from_bits).collect()
}

fn all_f16() -> Vec<f16> {
    (0..=u16::MAX).map(f16::from_bits).collect()
}

/// The slice form narrowing `src`; an odd length so the scalar tail after the vectors runs.
fn narrow_bf16(src: &[f32]) -> Vec<bf16> {
    let mut out = vec![bf16::ZERO; src.len()];
    f32_to_bf16_slice(src, &mut out).unwrap();
    out
}

fn narrow_f16(src: &[f32]) -> Vec<f16> {
    let mut out = vec![f16::ZERO; src.len()];
    f32_to_f16_slice(src, &mut out).unwrap();
    out
}

/// f32 values at and next to the halfway point between every pair of adjacent bf16 values
/// (upper 16 bits `b`, lower `0x8000`, one f32 ulp either side, and the extremes of the
/// dropped half), plus every bf16 value itself.
fn bf16_boundaries() -> Vec<f32> {
    let mut v = Vec::new();
    for b in 0..=u32::from(u16::MAX) {
        for low in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
            v.push(f32::from_bits(b << 16 | low));
        }
    }
    v.push(0.0); // an odd length: the vector path's scalar tail runs too
    v
}

#[test]
fn bf16_widening_is_exhaustively_halfs() {
    let all = all_bf16();
    let mut wide = vec![0.0f32; all.len()];
    bf16_to_f32_slice(&all, &mut wide).unwrap();
    for (&h, &w) in all.iter().zip(&wide) {
        let want = h.to_f32().to_bits();
        assert_eq!(bf16_to_f32(h).to_bits(), want, "scalar {:#06x}", h.to_bits());
        assert_eq!(w.to_bits(), want, "slice {:#06x}", h.to_bits());
        if !h.is_nan() {
            // Widening is exact: the bf16 is the top half of the f32.
            assert_eq!(want, u32::from(h.to_bits()) << 16);
        }
    }
    // An odd-length slice exercises the scalar tail.
    let mut odd = vec![0.0f32; 21];
    bf16_to_f32_slice(&all[0x7F70..0x7F85], &mut odd).unwrap();
    for (h, w) in all[0x7F70..0x7F85].iter().zip(&odd) {
        assert_eq!(w.to_bits(), h.to_f32().to_bits());
    }
}

#[test]
fn bf16_round_trip_keeps_every_pattern() {
    let all = all_bf16();
    let wide: Vec<f32> = all.iter().map(|&h| bf16_to_f32(h)).collect();
    let back = narrow_bf16(&wide);
    for ((&h, &w), &b) in all.iter().zip(&wide).zip(&back) {
        let scalar = bf16_from_f32(w);
        assert_eq!(scalar.to_bits(), b.to_bits(), "scalar and slice differ on {:#06x}", h.to_bits());
        if h.is_nan() {
            // NaNs come back quiet, with their sign and payload's top bits.
            assert_eq!(scalar.to_bits(), h.to_bits() | 0x0040, "{:#06x}", h.to_bits());
        } else {
            assert_eq!(scalar.to_bits(), h.to_bits(), "{:#06x}", h.to_bits());
        }
    }
}

#[test]
fn bf16_narrowing_rounds_to_nearest_even_like_half() {
    let vals = bf16_boundaries();
    let slice = narrow_bf16(&vals);
    for (&x, &s) in vals.iter().zip(&slice) {
        let want = bf16::from_f32(x);
        let got = bf16_from_f32(x);
        assert_eq!(got.to_bits(), want.to_bits(), "scalar on {:#010x}", x.to_bits());
        assert_eq!(s.to_bits(), want.to_bits(), "slice on {:#010x}", x.to_bits());
        let (hi, lo) = (x.to_bits() >> 16, x.to_bits() & 0xFFFF);
        if hi & 0x7F80 != 0x7F80 {
            // Independently of `half`: below the halfway point truncates, above it rounds up
            // (in magnitude), and at it the even neighbour wins.
            let up = match lo {
                0x8000 => hi & 1 == 1,
                l => l > 0x8000,
            };
            assert_eq!(u32::from(got.to_bits()), hi + u32::from(up), "{:#010x}", x.to_bits());
        }
    }
}

#[test]
fn bf16_special_values() {
    let cases: [(f32, u16); 10] = [
        (0.0, 0x0000),
        (-0.0, 0x8000),
        (f32::INFINITY, 0x7F80),
        (f32::NEG_INFINITY, 0xFF80),
        (f32::from_bits(0x7F80_0001), 0x7FC0), // signaling NaN, low payload: still a NaN, quiet
        (f32::from_bits(0xFFA0_0000), 0xFFE0), // signaling NaN: sign and top payload kept
        (f32::MAX, 0x7F80),                    // rounds past the largest bf16 to infinity
        (f32::from_bits(0x0000_8000), 0x0000), // subnormal halfway between 0 and the smallest: even
        (f32::from_bits(0x0001_8000), 0x0002), // halfway, odd below: rounds up
        (f32::from_bits(0x0000_8001), 0x0001), // just above halfway
    ];
    for (x, bits) in cases {
        assert_eq!(bf16_from_f32(x).to_bits(), bits, "{:#010x}", x.to_bits());
        assert_eq!(narrow_bf16(&[x])[0].to_bits(), bits, "slice {:#010x}", x.to_bits());
    }
}

#[test]
fn f16_widening_and_round_trip_are_exhaustively_halfs() {
    let all = all_f16();
    let mut wide = vec![0.0f32; all.len()];
    f16_to_f32_slice(&all, &mut wide).unwrap();
    for (&h, &w) in all.iter().zip(&wide) {
        let want = h.to_f32();
        assert_eq!(f16_to_f32(h).to_bits(), want.to_bits(), "scalar {:#06x}", h.to_bits());
        assert_eq!(w.to_bits(), want.to_bits(), "slice {:#06x}", h.to_bits());
    }
    let back = narrow_f16(&wide);
    for ((&h, &w), &b) in all.iter().zip(&wide).zip(&back) {
        assert_eq!(f16_from_f32(w).to_bits(), b.to_bits(), "scalar and slice differ on {:#06x}", h.to_bits());
        if h.is_nan() {
            assert!(b.is_nan() && b.to_bits() & 0x0200 != 0, "{:#06x} -> {:#06x}", h.to_bits(), b.to_bits());
            assert_eq!(b.to_bits() & 0x8000, h.to_bits() & 0x8000, "sign of {:#06x}", h.to_bits());
        } else {
            assert_eq!(b.to_bits(), h.to_bits(), "{:#06x}", h.to_bits());
        }
    }
}

#[test]
fn f16_narrowing_at_every_rounding_boundary_is_halfs() {
    // Midpoints between adjacent f16 values (exact in f32: f16 has 11 significant bits), one
    // f32 ulp either side, subnormals, the overflow threshold and beyond.
    let mut vals = Vec::new();
    for h in 0..0x7C00u16 {
        for sign in [0u16, 0x8000] {
            let lo = f16::from_bits(h | sign).to_f32();
            let hi = f16::from_bits((h + 1) | sign).to_f32();
            let mid = ((f64::from(lo) + f64::from(hi)) / 2.0) as f32;
            for d in [-1i32, 0, 1] {
                vals.push(f32::from_bits(mid.to_bits().wrapping_add_signed(d)));
            }
            vals.push(lo);
        }
    }
    vals.extend([
        f32::MAX,
        65520.0,
        65519.996,
        f32::INFINITY,
        f32::NAN,
        f32::from_bits(0x7F80_0001),
        1e-8,
        3e-8,
    ]);
    let slice = narrow_f16(&vals);
    for (&x, &s) in vals.iter().zip(&slice) {
        let want = f16::from_f32(x);
        if want.is_nan() {
            assert!(f16_from_f32(x).is_nan() && s.is_nan(), "{:#010x}", x.to_bits());
        } else {
            assert_eq!(f16_from_f32(x).to_bits(), want.to_bits(), "scalar {:#010x}", x.to_bits());
            assert_eq!(s.to_bits(), want.to_bits(), "slice {:#010x}", x.to_bits());
        }
    }
}

#[test]
fn f32_sweep_agrees_with_half() {
    // Every 251st f32 bit pattern (a prime stride, so every exponent and low-bit pattern
    // turns up), both signs.
    let vals: Vec<f32> = (0..=u32::MAX).step_by(251).map(f32::from_bits).collect();
    let b = narrow_bf16(&vals);
    let h = narrow_f16(&vals);
    for ((&x, &b), &h) in vals.iter().zip(&b).zip(&h) {
        assert_eq!(b.to_bits(), bf16::from_f32(x).to_bits(), "bf16 {:#010x}", x.to_bits());
        let want = f16::from_f32(x);
        if want.is_nan() {
            assert!(h.is_nan(), "f16 {:#010x}", x.to_bits());
        } else {
            assert_eq!(h.to_bits(), want.to_bits(), "f16 {:#010x}", x.to_bits());
        }
    }
}

#[test]
fn short_destinations_are_errors() {
    let src = [1.0f32; 5];
    let mut b = [bf16::ZERO; 4];
    let mut h = [f16::ZERO; 4];
    let mut w = [0.0f32; 4];
    let err = Err(TileError::BufferTooSmall { operand: "dst", needed: 5, len: 4 });
    assert_eq!(f32_to_bf16_slice(&src, &mut b), err);
    assert_eq!(f32_to_f16_slice(&src, &mut h), err);
    assert_eq!(bf16_to_f32_slice(&[bf16::ONE; 5], &mut w), err);
    assert_eq!(f16_to_f32_slice(&[f16::ONE; 5], &mut w), err);
    assert_eq!(b, [bf16::ZERO; 4], "a refused call wrote");
    // A longer destination is fine: only the first `src.len()` elements are written.
    let mut long = [bf16::NAN; 7];
    f32_to_bf16_slice(&src, &mut long).unwrap();
    assert_eq!(long[..5], [bf16::ONE; 5]);
    assert!(long[5].is_nan() && long[6].is_nan());
}

/// `convert_block` on every pair against the `half` crate per element, with padded rows
/// (the padding must survive) and tails past the 16-wide vectors; its errors; the C entry.
#[test]
fn block_conversions_match_half_and_keep_the_padding() {
    use uopc_tile::convert::{conversion_code, convert_block, uopc_tile_convert_block};
    let (rows, cols, lds, ldd) = (3, 37, 40, 41);
    let wide: Vec<f32> = (0..(rows - 1) * lds + cols)
        .map(|i| match i % 9 {
            0 => f32::NAN,
            1 => 70000.0,
            2 => 3e-7,
            3 => 1.0 + 3.0 / 4096.0,
            _ => (i as f32 * 0.37).sin() * 10f32.powi(i as i32 % 5 - 2),
        })
        .collect();
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    // f32 to f16 and bf16.
    let mut h = vec![f16::from_f32(-9.0); (rows - 1) * ldd + cols];
    convert_block(rows, cols, &wide, lds, &mut h, ldd).unwrap();
    let mut b = vec![bf16::from_f32(-9.0); h.len()];
    convert_block(rows, cols, &wide, lds, &mut b, ldd).unwrap();
    for r in 0..rows {
        for j in 0..ldd.min(h.len() - r * ldd) {
            let (got_h, got_b) = (h[r * ldd + j], b[r * ldd + j]);
            if j < cols {
                let x = wide[r * lds + j];
                assert_eq!(got_h.to_bits(), f16::from_f32(x).to_bits(), "f16 at ({r}, {j}) from {x}");
                assert!(same(got_b.to_f32(), bf16::from_f32(x).to_f32()), "bf16 at ({r}, {j}) from {x}");
            } else {
                assert_eq!((got_h.to_f32(), got_b.to_f32()), (-9.0, -9.0), "padding at ({r}, {j})");
            }
        }
    }
    // f16 and bf16 back to f32, exactly.
    let mut back = vec![-9.0f32; h.len()];
    convert_block(rows, cols, &h, ldd, &mut back, ldd).unwrap();
    assert!(h.iter().zip(&back).all(|(x, y)| same(x.to_f32(), *y)));
    convert_block(rows, cols, &b, ldd, &mut back, ldd).unwrap();
    assert!(b.iter().zip(&back).all(|(x, y)| same(x.to_f32(), *y)));
    // Errors name the operand; nothing is written.
    let short = convert_block(rows, cols, &wide[..wide.len() - 1], lds, &mut h, ldd);
    assert_eq!(
        short,
        Err(TileError::BufferTooSmall { operand: "src", needed: wide.len(), len: wide.len() - 1 })
    );
    let narrow = convert_block(rows, cols, &wide, lds, &mut h, cols - 1);
    assert_eq!(narrow, Err(TileError::LeadingDim { operand: "dst", ld: cols - 1, cols }));
    // The C entry: the same result, and -1 for a bad code or stride.
    let mut via_c = vec![f16::from_f32(-9.0); h.len()];
    // SAFETY: both pointers cover their blocks (`(rows - 1) * ld + cols` elements).
    let ok = unsafe {
        uopc_tile_convert_block(
            wide.as_ptr().cast(),
            via_c.as_mut_ptr().cast(),
            rows as i64,
            cols as i64,
            lds as i64,
            ldd as i64,
            conversion_code::F32_TO_F16,
        )
    };
    assert_eq!(ok, 0);
    assert_eq!(
        via_c.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        h.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    for (ld, code) in [(lds as i64, 4), (cols as i64 - 1, conversion_code::F32_TO_F16), (-1, 0)] {
        // SAFETY: rejected before any access.
        let bad = unsafe {
            uopc_tile_convert_block(
                wide.as_ptr().cast(),
                via_c.as_mut_ptr().cast(),
                rows as i64,
                cols as i64,
                ld,
                ldd as i64,
                code,
            )
        };
        assert_eq!(bad, -1, "ld {ld}, code {code}");
    }
}

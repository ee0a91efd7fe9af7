//! The mean magnitude `Σ|clean(v)| / n`, rounded once to f32: the scale of the sign codecs.
//!
//! Why integers and not a float sum: a float sum rounds at every addition (the scale was up
//! to 4 ulp off on vectors of one constant magnitude) and overflows past f32's range, and a
//! compensated float sum is only as exact as the shader compiler lets it be (a compiler that
//! reassociates or contracts erases the compensation). Here each magnitude is placed, exactly,
//! in a 128-bit fixed-point frame whose unit is 2^-[`GUARD`] of the last bit of the largest
//! magnitude in the vector. Integer addition is associative, so every order, thread count and
//! device gives the same bits (the GPU half is `magnitudes`/`mean` in shaders/compress/
//! sign.wgsl). The one loss is the bits of magnitudes that fall below the unit: less than one
//! unit each, so the sum is low by less than `n · 2^-(GUARD + 23)` of itself (below 2^-55 for
//! any length below 2^32), and a flag records that something was dropped, so that a quotient
//! sitting exactly on a rounding boundary rounds the way the exact one would. The sum is then
//! divided by n and the quotient rounded to nearest even, in integers, subnormal results
//! included. The mean never exceeds the largest magnitude, so it cannot overflow.

use rayon::prelude::*;

use super::support::max_abs;

/// Bits of the frame below the largest magnitude's last bit.
pub const GUARD: u32 = 64;

/// A fixed-point sum: `value · 2^(unit exponent)`, plus whether bits were dropped below it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FixedSum {
    /// The sum in units of the frame.
    pub value: u128,
    /// Whether some magnitude had bits below the unit (the exact sum is a little more).
    pub inexact: bool,
}

impl FixedSum {
    fn add(self, other: FixedSum) -> FixedSum {
        FixedSum {
            // At most 2^32 terms below 2^88 each: no overflow.
            value: self.value + other.value,
            inexact: self.inexact | other.inexact,
        }
    }
}

/// The exponent field that sets the frame: that of `top` (the largest magnitude), counted as 1
/// for zero and subnormal values, whose last bit is 2^-149 either way. Reading the field from
/// the bits makes a GPU that flushes subnormals agree.
pub fn frame_exponent(top: f32) -> u32 {
    ((top.to_bits() >> 23) & 0xff).max(1)
}

/// `|v|` in the frame of `frame` ([`frame_exponent`]); non-finite values count as zero, as
/// `support::clean` has them.
pub fn place(v: f32, frame: u32) -> FixedSum {
    let bits = v.to_bits() & 0x7fff_ffff;
    let field = bits >> 23;
    if field == 0xff {
        return FixedSum::default();
    }
    let significand = (bits & 0x007f_ffff) | if field > 0 { 1 << 23 } else { 0 };
    // How far this value's last bit sits above the frame's unit (negative: below it).
    let shift = GUARD as i64 - (frame as i64 - field.max(1) as i64);
    if shift >= 0 {
        FixedSum {
            value: (significand as u128) << shift,
            inexact: false,
        }
    } else if shift > -24 {
        let drop = (-shift) as u32;
        FixedSum {
            value: (significand >> drop) as u128,
            inexact: significand & ((1 << drop) - 1) != 0,
        }
    } else {
        FixedSum {
            value: 0,
            inexact: significand != 0,
        }
    }
}

/// `sum · 2^(frame - 150 - GUARD) / n`, rounded to nearest even (1 ≤ n < 2^40, so that the sum
/// of n placed values, each below 2^(GUARD + 24), fits u128).
pub fn round_quotient(sum: FixedSum, n: u64, frame: u32) -> f32 {
    if sum.value == 0 {
        return 0.0;
    }
    let quotient = sum.value / n as u128;
    let sticky = sum.inexact || !sum.value.is_multiple_of(n as u128);
    // The value of the quotient's unit is 2^unit.
    let unit = frame as i32 - 150 - GUARD as i32;
    let length = 128 - quotient.leading_zeros() as i32;
    let top = length - 1 + unit;
    // Bits of the quotient below the result's last bit: 24 significant bits for a normal
    // result, everything below 2^-149 for a subnormal one. At least 1 either way: the sum is
    // at least 2^GUARD units (the largest value sits there) and n below 2^40.
    let drop = if top >= -126 {
        length - 24
    } else {
        -149 - unit
    };
    let kept = (quotient >> drop) as u32;
    let half = (quotient >> (drop - 1)) & 1 == 1;
    let below = sticky || quotient & ((1u128 << (drop - 1)) - 1) != 0;
    let rounded = kept + (half && (below || kept & 1 == 1)) as u32;
    if top >= -126 {
        // Exponent field plus significand: a carry out of the significand (kept rounding up
        // to 2^24) lands in the exponent, as it should.
        f32::from_bits((((top + 127 - 1) as u32) << 23) + rounded)
    } else {
        // Subnormal: the significand is the bits; rounding up to 2^23 gives the least normal.
        f32::from_bits(rounded)
    }
}

/// Elements per task of [`mean_abs`]: few enough that a sum of significands (each below
/// 2^24) cannot overflow u64.
const TASK: usize = 1 << 14;

/// The frame sum of one task's values: the same integer as adding [`place`] of each, faster.
/// Values the frame holds exactly are summed per exponent field (their significands, in u64)
/// and each field's total is placed once; values that lose bits are placed one by one.
fn task_sum(x: &[f32], frame: u32) -> FixedSum {
    let mut by_field = [0u64; 256];
    let mut sum = FixedSum::default();
    for &v in x {
        let bits = v.to_bits() & 0x7fff_ffff;
        let field = bits >> 23;
        if field + GUARD >= frame {
            // Zero and subnormals share field 1's unit (`place`); 255 (non-finite) is left out
            // below.
            let significand = (bits & 0x007f_ffff) | if field > 0 { 1 << 23 } else { 0 };
            by_field[field.max(1) as usize] += significand as u64;
        } else {
            sum = sum.add(place(v, frame));
        }
    }
    for (field, &total) in by_field.iter().enumerate().take(255).skip(1) {
        if total != 0 {
            sum.value += (total as u128) << (GUARD - (frame - field as u32));
        }
    }
    sum
}

/// The mean of `|clean(v)|` over `x`, correctly rounded up to the dropped bits (module docs).
pub fn mean_abs(x: &[f32]) -> f32 {
    if x.is_empty() {
        return 0.0;
    }
    let frame = frame_exponent(max_abs(x));
    let sum = x
        .par_chunks(TASK)
        .map(|c| task_sum(c, frame))
        .reduce(FixedSum::default, FixedSum::add);
    round_quotient(sum, x.len() as u64, frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `r` is `exact / n` rounded to nearest even, where `exact` is the sum of the
    /// magnitudes as an exact rational `numerator · 2^-300` (all f32 values are multiples of
    /// 2^-149, so a 2^-300 unit with big integers would do; u128 suffices for the ranges used).
    fn is_nearest(sum_units: u128, unit_exp: i32, n: u128, r: f32) -> bool {
        // Compare |sum - r·n| against n·ulp(r)/2 in units of 2^(unit_exp - 1).
        let to_units = |f: f32| -> Option<u128> {
            let bits = f.to_bits();
            let field = (bits >> 23) as i32;
            let sig = ((bits & 0x7f_ffff) | if field > 0 { 1 << 23 } else { 0 }) as u128;
            let e = field.max(1) - 150 - (unit_exp - 1);
            if e < 0 {
                None
            } else {
                sig.checked_mul(1u128.checked_shl(e as u32)?)
            }
        };
        let ulp = f32::from_bits(r.to_bits() + 1) - r;
        let (Some(rn), Some(half_ulp)) = (to_units(r), to_units(ulp)) else {
            return false;
        };
        let (rn, half_ulp) = (rn * n, half_ulp * n / 2);
        let s = sum_units * 2;
        let diff = s.abs_diff(rn);
        diff < half_ulp || (diff == half_ulp && r.to_bits() & 1 == 0)
    }

    #[test]
    fn task_sums_equal_the_sum_of_placed_values() {
        let x: Vec<f32> = (0..5000)
            .map(|i| match i % 7 {
                0 => 3e38,
                1 => f32::from_bits(i),
                2 => -1e-20,
                3 => f32::NAN,
                4 => 1.5f32.powi(i as i32 % 200 - 100),
                _ => i as f32,
            })
            .collect();
        for k in [0, 60, 120, 200, 260] {
            let x: Vec<f32> = x
                .iter()
                .map(|v| v * 2f32.powi(-k / 2) * 2f32.powi(-k / 2))
                .collect();
            let frame = frame_exponent(max_abs(&x));
            let placed = x
                .iter()
                .fold(FixedSum::default(), |s, &v| s.add(place(v, frame)));
            assert_eq!(task_sum(&x, frame), placed, "scaled by 2^-{k}");
            // Unscaled, 1e-20 sits far below 3e38's frame: the one-by-one path is taken.
            assert!(k > 0 || placed.inexact);
        }
    }

    #[test]
    fn constant_magnitudes_give_that_magnitude_exactly() {
        for &c in &[0.1f32, 1.0 / 3.0, 1e-3, 7.77e30, f32::MAX, 1e-45, 1.17e-38] {
            for &n in &[1usize, 3, 1000, 4097, 100_003] {
                let x: Vec<f32> = (0..n).map(|i| if i % 3 == 0 { -c } else { c }).collect();
                assert_eq!(mean_abs(&x), c, "n = {n}, c = {c:e}");
            }
        }
    }

    #[test]
    fn means_are_correctly_rounded() {
        // Values within a 2^40 range of each other, so that the exact sum fits u128 in units of
        // the smallest value's last bit, and the reference needs no big integers.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for case in 0..400 {
            let n = 1 + (next() % 3000) as usize;
            let base = (next() % 200) as i32 - 120;
            let x: Vec<f32> = (0..n)
                .map(|_| {
                    let e = base + (next() % 40) as i32;
                    let m = 1.0 + (next() % (1 << 23)) as f32 / (1 << 23) as f32;
                    m * 2f32.powi(e) * if next() & 1 == 0 { -1.0 } else { 1.0 }
                })
                .collect();
            let r = mean_abs(&x);
            let low = x
                .iter()
                .map(|v| v.abs().to_bits() >> 23)
                .min()
                .unwrap()
                .max(1) as i32;
            let unit_exp = low - 150;
            let sum: u128 = x
                .iter()
                .map(|v| {
                    let bits = v.abs().to_bits();
                    let field = (bits >> 23) as i32;
                    let sig = ((bits & 0x7f_ffff) | if field > 0 { 1 << 23 } else { 0 }) as u128;
                    sig << (field.max(1) - 150 - unit_exp)
                })
                .sum();
            assert!(
                is_nearest(sum, unit_exp, n as u128, r),
                "case {case}: n = {n}, mean {r:e} is not the nearest"
            );
        }
    }

    #[test]
    fn huge_and_tiny_vectors_stay_in_range() {
        // Past f32's range as a sum, and a mean in the subnormals.
        let huge = vec![f32::MAX; 1000];
        assert_eq!(mean_abs(&huge), f32::MAX);
        let mixed = [f32::MAX, f32::MAX, 0.0, 0.0];
        assert_eq!(mean_abs(&mixed), f32::MAX / 2.0);
        let tiny = [f32::from_bits(3), f32::from_bits(0)];
        // 3 · 2^-149 / 2 = 1.5 · 2^-149: a tie, to even (2 · 2^-149).
        assert_eq!(mean_abs(&tiny), f32::from_bits(2));
        assert_eq!(mean_abs(&[f32::NAN, f32::INFINITY, 2.0, -2.0]), 1.0);
        assert_eq!(mean_abs(&[0.0; 10]), 0.0);
    }

    #[test]
    fn dropped_bits_break_ties_upwards() {
        // (2 + 2^-22) + (1 - 2^-24) = 3 · (1 + 2^-24): over three, exactly halfway between 1
        // and the next float, so it rounds to even (1) ...
        let (a, b) = (2.0 + 2f32.powi(-22), 1.0 - 2f32.powi(-24));
        assert_eq!(mean_abs(&[a, b, 0.0]), 1.0);
        // ... unless a value too small for the frame says the exact sum is a little more.
        assert_eq!(
            mean_abs(&[a, b, 2f32.powi(-100)]),
            f32::from_bits(1f32.to_bits() + 1)
        );
    }
}

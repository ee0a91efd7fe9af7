//! Pieces every codec shares: the non-finite policy, the canonical reduction order, half
//! precision conversions and b-bit code packing. The WGSL side is shaders/compress/common.wgsl.

use crate::error::{Error, Result};
use crate::kernels::math::workgroup_fold;

/// Non-finite inputs count as zero in every codec, the f32, f16 and bf16 casts included: one
/// NaN or infinity must not poison a whole partition's scale, and zero is what error feedback
/// then carries forward. (A non-finite gradient is a fault of the node that computed it: the
/// data-parallel worker reports it before encoding, docs/wire-format.md.)
#[inline]
pub fn clean(v: f32) -> f32 {
    if v.is_finite() {
        v
    } else {
        0.0
    }
}

/// `2^e` built exactly from exponent bits (|e| <= 126): the same bits on every device.
pub fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// Round half to even for |x| <= 2^22, without a library call: adding 1.5 * 2^23 leaves no
/// fraction bits, so the hardware's round-to-nearest-even does the rounding. (Rust's
/// `round_ties_even` is a call to `rintf` on baseline x86-64.)
#[inline(always)]
pub fn rne(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// Largest quantization factor (levels / scale) a codec uses: 2^126. A smaller scale (a
/// partition whose values are all below about 1e-36, or subnormal) encodes as all zeros, so
/// `|v| * factor` can never overflow, and `0 * inf` never makes a NaN.
pub const MAX_FACTOR: f32 = f32::from_bits(0x7e80_0000);

/// Largest scale of the max- and l2-scaled quantizers (dithering, QSGD, the hybrid): 2^127.
/// Their largest value is `L * (scale / L)`, which may round a little above the scale; under
/// this cap it stays finite, so every payload an encoder makes decodes. Larger inputs saturate
/// at the cap, as natural compression's do at 2^127.
pub const MAX_SCALE: f32 = f32::from_bits(0x7f00_0000);

/// Scaled random-k's factor n / k, and the largest |v| whose product with it is finite.
pub fn randk_factor(n: usize, k: usize) -> (f32, f32) {
    let factor = n as f32 / k as f32;
    let mut limit = f32::MAX / factor;
    while (limit * factor).is_infinite() {
        limit = limit.next_down();
    }
    while limit < f32::MAX && (limit.next_up() * factor).is_finite() {
        limit = limit.next_up();
    }
    (factor, limit)
}

/// `v * factor`, saturating at ±f32::MAX past `limit` (from [`randk_factor`]): an infinite
/// value would make a payload its own decoder refuses. The limit is compared instead of the
/// product so that the GPU, whose overflow behaviour WGSL leaves open, gives the same bits.
#[inline]
pub fn scale_saturating(v: f32, factor: f32, limit: f32) -> f32 {
    if v.abs() > limit {
        f32::MAX.copysign(v)
    } else {
        v * factor
    }
}

/// Lanes of the reduction workgroup, and elements one workgroup folds per pass.
pub const LANES: usize = 256;
/// Elements one reduction workgroup folds per pass, the chunk of [`canonical_sum`].
pub const CHUNK: usize = 4096;

/// The canonical sum of `f(0..n)`: chunks of [`CHUNK`] elements are each folded the way a
/// 256-lane workgroup folds them (lane-strided, then a tree), then the chunk sums are reduced
/// the same way, recursively. The GPU kernels use exactly this order, so every device and
/// every thread count gives the same bits.
pub fn canonical_sum(n: usize, f: impl Fn(usize) -> f32 + Sync) -> f32 {
    use rayon::prelude::*;
    if n <= CHUNK {
        return workgroup_fold((0..n).map(&f), LANES, 0.0, |a, b| a + b);
    }
    let partials: Vec<f32> = (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .map(|c| {
            workgroup_fold(
                (c * CHUNK..((c + 1) * CHUNK).min(n)).map(&f),
                LANES,
                0.0,
                |a, b| a + b,
            )
        })
        .collect();
    canonical_sum_of(&partials)
}

/// `2^-64`: what the l2 norm scales values by when their squares' sum passes f32's range.
pub const L2_DOWNSCALE: f32 = f32::from_bits(0x1f80_0000);

/// `sqrt(Σ clean(v)²)`, the squares summed in the canonical order. Where that sum passes
/// f32's range (values from about 1.8e19 up), the values are scaled by 2^-64 first, exactly,
/// and the root scaled back, so the norm stays right up to f32's largest values (past it, it
/// saturates). Finite sums keep their bits: the scaled sum is only taken when the plain one
/// overflowed. The GPU computes both sums and takes the same one.
pub fn l2_norm(x: &[f32]) -> f32 {
    let plain = canonical_sum(x.len(), |i| clean(x[i]) * clean(x[i]));
    if plain.is_finite() {
        return plain.sqrt();
    }
    let scaled = canonical_sum(x.len(), |i| {
        let v = clean(x[i]) * L2_DOWNSCALE;
        v * v
    });
    // Times 2^64, exactly (a power of two), as the GPU does it.
    (scaled.sqrt() * f32::from_bits(0x5f80_0000)).min(f32::MAX)
}

/// [`canonical_sum`] of a slice.
pub fn canonical_sum_of(values: &[f32]) -> f32 {
    canonical_sum(values.len(), |i| values[i])
}

/// Largest `|clean(v)|`: order-independent, so any parallel split gives the same value.
///
/// Compared as integers: the bits of non-negative floats order as their values do, and an
/// integer max vectorizes where `f32::max` (with its NaN rule) does not.
pub fn max_abs(x: &[f32]) -> f32 {
    use rayon::prelude::*;
    let magnitude = |v: f32| {
        let bits = v.to_bits() & 0x7fff_ffff;
        // Non-finite values count as zero, as `clean` has them.
        if bits >= 0x7f80_0000 {
            0
        } else {
            bits
        }
    };
    let bits = x
        .par_chunks(1 << 16)
        .map(|c| c.iter().fold(0u32, |m, &v| m.max(magnitude(v))))
        .reduce(|| 0, u32::max);
    f32::from_bits(bits)
}

/// IEEE binary16 bits of `x`, rounding to nearest even; overflow gives infinity, NaN stays a
/// (quiet) NaN, as IEEE casts do. Mirrors `f32_to_f16` in common.wgsl. (The f16 codec clamps to
/// ±65504 first, so its payloads saturate instead: `plain::half_code`.)
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = (b >> 16) & 0x8000;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x007f_ffff;
    if exp == 255 {
        let nan = if man != 0 { 0x0200 | (man >> 13) } else { 0 };
        return (sign | 0x7c00 | nan) as u16;
    }
    let e = exp - 127 + 15;
    if e >= 31 {
        return (sign | 0x7c00) as u16;
    }
    if e <= 0 {
        if e < -10 {
            return sign as u16;
        }
        // Subnormal half: shift the full significand right, rounding to nearest even.
        let m = man | 0x0080_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let q = m >> shift;
        let rem = m & ((1u32 << shift) - 1);
        let q = if rem > half || (rem == half && q & 1 == 1) {
            q + 1
        } else {
            q
        };
        return (sign | q) as u16;
    }
    let q = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    // A carry out of the mantissa correctly rounds up into the exponent (or to infinity).
    let q = if rem > 0x1000 || (rem == 0x1000 && q & 1 == 1) {
        q + 1
    } else {
        q
    };
    (sign | q) as u16
}

/// The f32 value of IEEE binary16 bits (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let exp = (h >> 10) & 0x1f;
    let man = h & 0x03ff;
    let bits = match exp {
        0 if man == 0 => sign,
        0 => {
            // Subnormal: man * 2^-24, exact in f32.
            let v = man as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -v } else { v };
        }
        31 => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// bfloat16 bits of `x`, rounding to nearest even; NaN stays a quiet NaN.
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x0040) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 value of bfloat16 bits `h` (exact: bf16 is the upper half of an f32).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Bytes of `n` codes of `bits` bits packed LSB-first.
pub fn packed_len(n: usize, bits: u32) -> usize {
    (n * bits as usize).div_ceil(8)
}

/// Packs b-bit code patterns LSB-first: code i occupies bits `[b*i, b*i + b)` of the
/// little-endian bit stream. `out` must hold `packed_len(codes.len(), bits)` bytes and is
/// overwritten; padding bits are zero.
pub fn pack(codes: &[u32], bits: u32, out: &mut [u8]) {
    debug_assert_eq!(out.len(), packed_len(codes.len(), bits));
    match bits {
        8 => out.iter_mut().zip(codes).for_each(|(o, &c)| *o = c as u8),
        4 => {
            for (o, pair) in out.iter_mut().zip(codes.chunks(2)) {
                *o = (pair[0] & 0xf) as u8 | ((pair.get(1).copied().unwrap_or(0) & 0xf) << 4) as u8;
            }
        }
        _ => {
            let mask = (1u64 << bits) - 1;
            let (mut acc, mut filled, mut at) = (0u64, 0u32, 0usize);
            for &c in codes {
                acc |= (c as u64 & mask) << filled;
                filled += bits;
                while filled >= 8 {
                    out[at] = acc as u8;
                    at += 1;
                    acc >>= 8;
                    filled -= 8;
                }
            }
            if filled > 0 {
                out[at] = acc as u8;
            }
        }
    }
}

/// [`pack`] for codes in groups of 32: each group becomes exactly `bits` little-endian words,
/// with the shifts known at compile time. `out` may end inside the last group's words.
pub fn pack_fast(codes: &[u32], bits: u32, out: &mut [u8]) {
    macro_rules! widths {
        ($($b:literal)*) => {
            match bits {
                $($b => pack32::<$b>(codes, out),)*
                _ => pack(codes, bits, out),
            }
        };
    }
    widths!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
}

#[inline(always)]
fn pack32<const B: u32>(codes: &[u32], out: &mut [u8]) {
    let mask = if B == 32 { u32::MAX } else { (1u32 << B) - 1 };
    for (group, dst) in codes.chunks(32).zip(out.chunks_mut(4 * B as usize)) {
        let mut words = [0u32; 16];
        if group.len() == 32 {
            for j in 0..32u32 {
                let c = group[j as usize] & mask;
                let bit = j * B;
                words[(bit / 32) as usize] |= c << (bit % 32);
                if bit % 32 + B > 32 {
                    words[(bit / 32 + 1) as usize] |= c >> (32 - bit % 32);
                }
            }
        } else {
            for (j, &c) in group.iter().enumerate() {
                let (c, bit) = (c & mask, j as u32 * B);
                words[(bit / 32) as usize] |= c << (bit % 32);
                if bit % 32 + B > 32 {
                    words[(bit / 32 + 1) as usize] |= c >> (32 - bit % 32);
                }
            }
        }
        for (d, w) in dst.chunks_mut(4).zip(words) {
            d.copy_from_slice(&w.to_le_bytes()[..d.len()]);
        }
    }
}

/// The inverse of [`pack_fast`]: fills `codes` from `bytes`, groups of 32 codes at a time.
/// `bytes` may end inside the last group (missing bytes read as zero).
pub fn unpack_fast(bytes: &[u8], bits: u32, codes: &mut [u32]) {
    macro_rules! widths {
        ($($b:literal)*) => {
            match bits {
                $($b => unpack32::<$b>(bytes, codes),)*
                _ => unreachable!("code widths are 1 to 16 bits"),
            }
        };
    }
    widths!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
}

#[inline(always)]
fn unpack32<const B: u32>(bytes: &[u8], codes: &mut [u32]) {
    let mask = (1u32 << B) - 1;
    for (group, src) in codes.chunks_mut(32).zip(bytes.chunks(4 * B as usize)) {
        let mut words = [0u32; 17];
        for (w, c) in words.iter_mut().zip(src.chunks(4)) {
            let mut le = [0u8; 4];
            le[..c.len()].copy_from_slice(c);
            *w = u32::from_le_bytes(le);
        }
        for (j, code) in group.iter_mut().enumerate() {
            let bit = j as u32 * B;
            let (w, s) = ((bit / 32) as usize, bit % 32);
            let mut v = words[w] >> s;
            if s + B > 32 {
                v |= words[w + 1] << (32 - s);
            }
            *code = v & mask;
        }
    }
}

/// Fails if the bits past the last of `n` codes in `bytes` are not zero, or the length is
/// not `packed_len(n, bits)`.
pub fn check_padding(bytes: &[u8], n: usize, bits: u32, codec: &str) -> Result<()> {
    if bytes.len() != packed_len(n, bits) {
        return Err(payload_err(
            codec,
            format!(
                "{} code bytes for {n} elements of {bits} bits, expected {}",
                bytes.len(),
                packed_len(n, bits)
            ),
        ));
    }
    let used = n * bits as usize;
    if !used.is_multiple_of(8) && bytes[bytes.len() - 1] >> (used % 8) != 0 {
        return Err(payload_err(codec, "nonzero padding bits".into()));
    }
    Ok(())
}

/// Unpacks `n` b-bit code patterns; fails if the length is wrong or a padding bit is set.
pub fn unpack(bytes: &[u8], n: usize, bits: u32, codec: &str) -> Result<Vec<u32>> {
    check_padding(bytes, n, bits, codec)?;
    let mut out = Vec::with_capacity(n);
    match bits {
        8 => out.extend(bytes.iter().map(|&b| b as u32)),
        4 => {
            for &b in bytes {
                out.push((b & 0xf) as u32);
                out.push((b >> 4) as u32);
            }
            out.truncate(n);
        }
        _ => {
            let mask = (1u64 << bits) - 1;
            let (mut acc, mut have, mut bytes) = (0u64, 0u32, bytes.iter());
            for _ in 0..n {
                while have < bits {
                    acc |= (*bytes.next().expect("length checked") as u64) << have;
                    have += 8;
                }
                out.push((acc & mask) as u32);
                acc >>= bits;
                have -= bits;
            }
        }
    }
    Ok(out)
}

/// A code pattern as a two's-complement signed value of `bits` bits.
#[inline]
pub fn sign_extend(pattern: u32, bits: u32) -> i32 {
    ((pattern << (32 - bits)) as i32) >> (32 - bits)
}

/// The b-bit two's-complement pattern of `v`.
#[inline]
pub fn to_pattern(v: i32, bits: u32) -> u32 {
    (v as u32) & ((1u32 << bits) - 1)
}

/// A [`Error::Payload`] naming the codec `codec` and what is wrong with its payload.
pub fn payload_err(codec: &str, detail: String) -> Error {
    Error::Payload {
        codec: codec.to_string(),
        detail,
    }
}

/// Refuses a payload that is not exactly `expected` bytes long for `n` elements: every
/// decoder's first check.
pub fn check_payload_len(codec: &str, payload: &[u8], n: usize, expected: usize) -> Result<()> {
    if payload.len() == expected {
        return Ok(());
    }
    Err(payload_err(
        codec,
        format!(
            "{} bytes for {n} elements, expected {expected}",
            payload.len()
        ),
    ))
}

/// Reads little-endian f32 number `i` of `bytes`, failing on non-finite or negative values
/// (scales and norms).
pub fn read_scale(bytes: &[u8], i: usize, codec: &str) -> Result<f32> {
    let v = f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    if !v.is_finite() || v < 0.0 {
        return Err(payload_err(
            codec,
            format!("scale {i} is {v}, not a finite non-negative number"),
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversions_round_to_nearest_even() {
        for (x, h) in [
            (0.0f32, 0x0000u16),
            (-0.0, 0x8000),
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (65504.0, 0x7bff),
            (65520.0, 0x7c00), // rounds up to infinity
            (1e6, 0x7c00),
            (f32::INFINITY, 0x7c00),
            (5.960_464_5e-8, 0x0001), // smallest subnormal
            (2.980_232_2e-8, 0x0000), // exactly half of it: ties to even (zero)
            (3.0e-8, 0x0001),
            (1.0 + 1.0 / 2048.0, 0x3c00), // tie, even mantissa stays
            (1.0 + 3.0 / 2048.0, 0x3c02), // tie, odd mantissa rounds up
        ] {
            assert_eq!(f32_to_f16(x), h, "{x}");
        }
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        for h in [0u16, 1, 0x3ff, 0x400, 0x3c00, 0x7bff, 0x8001, 0xfbff] {
            assert_eq!(f32_to_f16(f16_to_f32(h)), h, "{h:#x} round trips");
        }
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert_eq!(f16_to_f32(0x8001), -5.960_464_5e-8);
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(
            f32_to_bf16(f32::from_bits(0x3f80_8000)),
            0x3f80,
            "tie to even"
        );
        assert_eq!(
            f32_to_bf16(f32::from_bits(0x3f81_8000)),
            0x3f82,
            "tie to even, odd rounds up"
        );
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80, "overflow to infinity");
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    }

    #[test]
    fn packing_round_trips_every_width_and_length() {
        for bits in 1..=16u32 {
            for n in [0usize, 1, 7, 8, 31, 32, 33, 100] {
                let codes: Vec<u32> = (0..n as u32)
                    .map(|i| {
                        i.wrapping_mul(2_654_435_761u32.wrapping_mul(i + 1)) & ((1 << bits) - 1)
                    })
                    .collect();
                let mut bytes = vec![0u8; packed_len(n, bits)];
                pack(&codes, bits, &mut bytes);
                assert_eq!(
                    unpack(&bytes, n, bits, "t").unwrap(),
                    codes,
                    "bits {bits} n {n}"
                );
            }
        }
        // Nibbles in the documented order: byte = q0 | q1 << 4.
        let mut b = [0u8; 1];
        pack(&[to_pattern(-8, 4), to_pattern(7, 4)], 4, &mut b);
        assert_eq!(b, [0x78]);
        assert_eq!(sign_extend(0x8, 4), -8);
        assert!(
            unpack(&[0xf0], 1, 4, "t").is_err(),
            "set padding bits are refused"
        );
        assert!(
            unpack(&[0, 0], 1, 4, "t").is_err(),
            "wrong length is refused"
        );
    }

    #[test]
    fn canonical_sum_is_independent_of_thread_count() {
        let n = 3 * CHUNK * CHUNK / 1000 + 17;
        let f = |i: usize| ((i * 7919) % 1000) as f32 * 1e-3 - 0.4;
        let all = canonical_sum(n, f);
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| canonical_sum(n, f));
        assert_eq!(all.to_bits(), one.to_bits());
        let exact: f64 = (0..n).map(|i| f(i) as f64).sum();
        assert!((all as f64 - exact).abs() < 1e-3 * exact.abs().max(1.0));
    }
}

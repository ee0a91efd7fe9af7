//! Dense quantizers: a few f32 scales, then one b-bit code per element.
//!
//! ```text
//! payload = [scale f32 LE] * header_count(n)  ||  codes packed LSB-first, b bits each
//! ```
//!
//! | codec | scales | code of v (non-finite v counts as 0) | value of code c |
//! |---|---|---|---|
//! | `dither:linear` | norm (max or l2) | sign(v)*q, q = stochastic rounding of |v|*(s/norm) onto 0..s | q*(norm/s) |
//! | `dither:natural` | norm | sign(v)*(j+1) for q = 2^j, 0 for q = 0, q stochastic onto {0,1,2,..,2^(s-1)} | 2^(|c|-1)*(norm/2^(s-1)) |
//! | `natural` | none | 9 bits: sign, then the biased exponent of a or 2a (a = 2^floor(log2|v|)), 0 for zero | +-2^(e-127) |
//! | `qsgd` | max|v| | sign(v)*l, l = round(|v|*(L/max)) (nearest: ties to even; or stochastic), L = 2^(b-1)-1 | l*(max/L) |
//! | `loco` | none (s = 2^log2s fixed) | clamp(rne(v*s), -2^(p-1), 2^(p-1)-1) | c*2^-log2s |
//! | `blockq` | per group: max/2^(b-1) | clamp(rne(v*(2^(b-1)/max)), ...) | c*scale |
//!
//! Codes are two's complement. b is `1 + bit_length(s)` for dithering (s = 15 gives 5 bits),
//! 9 for natural compression, and the spec's `bits` otherwise. Codes a decoder cannot have
//! produced (|c| > s, -2^(b-1) for qsgd, exponent 255) are errors, as are non-finite or
//! negative scales. Subnormal inputs to natural compression encode as zero, and results past
//! 2^127 saturate there.

use rayon::prelude::*;

use super::codec::{bits_per_element, Codec, CodecContext, DecodeMode, Properties};
use super::gpu::{dense_decode_gpu, dense_encode_gpu, DenseLayout};
use super::spec::{CodecSpec, Levels, Norm, Rounding};
use super::support::{
    check_padding, check_payload_len, clean, l2_norm, max_abs, packed_len, payload_err, pow2,
    read_scale, rne, sign_extend, to_pattern, MAX_FACTOR, MAX_SCALE,
};
use crate::error::Result;
use crate::gpu::{Gpu, GpuBuf};
use crate::rng::{element_words, unit_f32};

/// Elements per parallel task: a multiple of 32, so each task's codes start on a word.
const TASK: usize = 4096;

fn bit_length(s: u32) -> u32 {
    32 - s.leading_zeros()
}

/// Uniform in [0, 1) from a random word (24 bits, exact on every device).
#[inline]
fn uniform(word: u32) -> f32 {
    unit_f32(word)
}

/// Stochastic rounding of `xi >= 0` onto `0..=top`: floor, plus one with probability equal
/// to the fraction.
#[inline(always)]
fn stochastic_level(xi: f32, top: f32, word: u32) -> f32 {
    let l = floor_pos(xi);
    if l >= top {
        top
    } else if uniform(word) < xi - l {
        l + 1.0
    } else {
        l
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct DenseCodec {
    pub spec: CodecSpec,
    /// Bits per code.
    pub bits: u32,
}

impl DenseCodec {
    pub fn new(spec: CodecSpec) -> Self {
        let bits = match spec {
            CodecSpec::Dither { s, .. } => 1 + bit_length(s),
            CodecSpec::Natural => 9,
            CodecSpec::Qsgd { bits, .. }
            | CodecSpec::Loco { bits, .. }
            | CodecSpec::BlockQ { bits, .. } => bits,
            other => unreachable!("{other} is not a dense quantizer"),
        };
        DenseCodec { spec, bits }
    }

    fn name(&self) -> String {
        self.spec.to_string()
    }

    /// Number of f32 scales in front of the codes.
    pub fn header_count(&self, n: usize) -> usize {
        match self.spec {
            CodecSpec::Dither { .. }
            | CodecSpec::Qsgd { .. }
            | CodecSpec::Loco {
                rescalable: true, ..
            } => 1,
            CodecSpec::BlockQ { group, .. } => n.div_ceil(group),
            _ => 0,
        }
    }

    /// What the GPU kernels need to know of this codec for `n` elements.
    fn gpu_layout(&self, n: usize) -> DenseLayout {
        DenseLayout {
            spec: self.spec,
            bits: self.bits,
            header: self.header_count(n),
            payload_len: self.payload_len(n),
        }
    }

    pub fn stochastic(&self) -> bool {
        matches!(
            self.spec,
            CodecSpec::Dither { .. }
                | CodecSpec::Natural
                | CodecSpec::Qsgd {
                    rounding: Rounding::Stochastic,
                    ..
                }
        )
    }

    /// The header scales of `x`.
    fn scales(&self, x: &[f32]) -> Vec<f32> {
        match self.spec {
            CodecSpec::Dither {
                norm: Norm::Max, ..
            }
            | CodecSpec::Qsgd { .. } => vec![max_abs(x).min(MAX_SCALE)],
            CodecSpec::Dither { norm: Norm::L2, .. } => vec![l2_norm(x).min(MAX_SCALE)],
            CodecSpec::Loco {
                log2s,
                rescalable: true,
                ..
            } => vec![pow2(log2s)],
            CodecSpec::BlockQ { bits, group } => x
                .par_chunks(group)
                .map(|g| {
                    let m = g.iter().fold(0.0f32, |m, &v| m.max(clean(v).abs()));
                    if m == 0.0 {
                        1.0
                    } else {
                        m * pow2(1 - bits as i32)
                    }
                })
                .collect(),
            _ => vec![],
        }
    }

    /// The per-payload factors the element formulas use, derived from the scales the same way
    /// on every device: (encode factor, decode step).
    fn factors(&self, scale: f32) -> (f32, f32) {
        match self.spec {
            CodecSpec::Dither {
                levels: Levels::Linear,
                s,
                ..
            } => ((s as f32) / scale, scale / (s as f32)),
            CodecSpec::Dither {
                levels: Levels::Natural,
                s,
                ..
            } => {
                let top = pow2(s as i32 - 1);
                (top / scale, scale / top)
            }
            CodecSpec::Qsgd { bits, .. } => {
                let l = ((1u32 << (bits - 1)) - 1) as f32;
                (l / scale, scale / l)
            }
            // 1/scale is 2^(b-1)/max exactly: scale is max * 2^(1-b), a power-of-two multiple.
            CodecSpec::BlockQ { .. } => (1.0 / scale, scale),
            // A rescalable payload's scale is 2^k (checked by `check_loco_scale`): k from its
            // exponent bits, so that 1/scale is exact on every device.
            CodecSpec::Loco {
                rescalable: true, ..
            } => {
                let k = ((scale.to_bits() >> 23) & 0xff) as i32 - 127;
                (pow2(k), pow2(-k))
            }
            CodecSpec::Loco { log2s, .. } => (pow2(log2s), pow2(-log2s)),
            _ => (1.0, 1.0),
        }
    }

    /// The code pattern of one (cleaned) element, for the codecs without a loop of their own
    /// in [`Self::segment_codes`]: natural dithering, natural compression and stochastic QSGD
    /// (the scale factor is already known to be at most `MAX_FACTOR`).
    #[inline]
    fn code(&self, v: f32, factor: f32, word: u32) -> u32 {
        let b = self.bits;
        match self.spec {
            CodecSpec::Dither {
                levels: Levels::Natural,
                s,
                ..
            } => {
                let xi = v.abs() * factor;
                let top = pow2(s as i32 - 1);
                let q = if xi >= top {
                    top
                } else if xi < 1.0 {
                    if uniform(word) < xi {
                        1.0
                    } else {
                        0.0
                    }
                } else {
                    let lo = f32::from_bits(xi.to_bits() & 0xff80_0000);
                    if uniform(word) < (xi - lo) / lo {
                        2.0 * lo
                    } else {
                        lo
                    }
                };
                let mag = if q == 0.0 {
                    0
                } else {
                    ((q.to_bits() >> 23) as i32 - 127) + 1
                };
                to_pattern(if v < 0.0 { -mag } else { mag }, b)
            }
            CodecSpec::Natural => {
                let bits = v.to_bits();
                let e = (bits >> 23) & 0xff;
                if e == 0 {
                    return 0;
                }
                let frac = (bits & 0x007f_ffff) as f32 * pow2(-23);
                let e = if uniform(word) < frac {
                    (e + 1).min(254)
                } else {
                    e
                };
                ((bits >> 31) << 8) | e
            }
            CodecSpec::Qsgd {
                bits,
                rounding: Rounding::Stochastic,
            } => {
                let top = ((1u32 << (bits - 1)) - 1) as f32;
                let l = stochastic_level(v.abs() * factor, top, word) as i32;
                to_pattern(if v < 0.0 { -l } else { l }, b)
            }
            _ => unreachable!("segment_codes codes {:?} itself", self.spec),
        }
    }

    /// The value of a code pattern, or `None` for a pattern no encoder produces.
    #[inline]
    fn value(&self, pattern: u32, step: f32) -> Option<f32> {
        let b = self.bits;
        match self.spec {
            CodecSpec::Dither { levels, s, .. } => {
                let c = sign_extend(pattern, b);
                if c.unsigned_abs() > s {
                    return None;
                }
                let mag = match levels {
                    Levels::Linear => c.unsigned_abs() as f32 * step,
                    Levels::Natural if c == 0 => 0.0,
                    Levels::Natural => pow2(c.unsigned_abs() as i32 - 1) * step,
                };
                Some(if c < 0 { -mag } else { mag })
            }
            CodecSpec::Natural => {
                let e = pattern & 0xff;
                match (pattern >> 8, e) {
                    (0, 0) => Some(0.0),
                    (_, 0) | (_, 255) => None,
                    (sign, e) => Some(f32::from_bits((sign << 31) | (e << 23))),
                }
            }
            CodecSpec::Qsgd { bits, .. } => {
                let c = sign_extend(pattern, b);
                (c.unsigned_abs() < (1 << (bits - 1))).then_some(c as f32 * step)
            }
            CodecSpec::Loco { .. } | CodecSpec::BlockQ { .. } => {
                Some(sign_extend(pattern, b) as f32 * step)
            }
            _ => unreachable!(),
        }
    }
}

/// `x` (finite, |x| < 2^31) as i32, truncating. `as` would add saturation and NaN checks
/// that keep the loops from vectorising; every caller has bounded `x` already.
#[inline(always)]
fn to_i32(x: f32) -> i32 {
    debug_assert!(x.is_finite() && x.abs() < 2_147_483_648.0, "{x}");
    // SAFETY: x is finite and within i32's range (checked in debug builds).
    unsafe { x.to_int_unchecked() }
}

/// floor for 0 <= x < 2^31.
#[inline(always)]
fn floor_pos(x: f32) -> f32 {
    to_i32(x) as f32
}

#[inline(always)]
fn fill(xs: &[f32], words: &[u32], codes: &mut [u32], f: impl Fn(f32, u32) -> u32) {
    if words.is_empty() {
        codes
            .iter_mut()
            .zip(xs)
            .for_each(|(c, &v)| *c = f(clean(v), 0));
    } else {
        codes
            .iter_mut()
            .zip(xs)
            .zip(words)
            .for_each(|((c, &v), &w)| *c = f(clean(v), w));
    }
}

impl DenseCodec {
    /// The payload of `x`, and with `residual` also `clean(x) - decode(payload)` in the same
    /// pass.
    fn encode_with(&self, x: &[f32], ctx: &CodecContext, residual: Option<&mut [f32]>) -> Vec<u8> {
        let scales = self.scales(x);
        let head = 4 * scales.len();
        let mut out = vec![0u8; self.payload_len(x.len())];
        for (i, s) in scales.iter().enumerate() {
            out[4 * i..4 * i + 4].copy_from_slice(&s.to_le_bytes());
        }
        let task_bytes = TASK / 8 * self.bits as usize;
        let tasks = out[head..]
            .par_chunks_mut(task_bytes)
            .zip(x.par_chunks(TASK))
            .enumerate();
        match residual {
            None => tasks.for_each(|(t, (bytes, xs))| {
                self.encode_task(t * TASK, xs, &scales, ctx, bytes, None)
            }),
            Some(r) => tasks
                .zip(r.par_chunks_mut(TASK))
                .for_each(|((t, (bytes, xs)), rs)| {
                    self.encode_task(t * TASK, xs, &scales, ctx, bytes, Some(rs))
                }),
        }
        out
    }

    /// Encodes one task's elements (`first` is a multiple of 32) into their code bytes.
    fn encode_task(
        &self,
        first: usize,
        xs: &[f32],
        scales: &[f32],
        ctx: &CodecContext,
        bytes: &mut [u8],
        residual: Option<&mut [f32]>,
    ) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            return unsafe { self.encode_task_avx2(first, xs, scales, ctx, bytes, residual) };
        }
        self.encode_task_portable(first, xs, scales, ctx, bytes, residual)
    }

    /// The same code, compiled for AVX2 so that the per-element loops vectorise; the
    /// arithmetic is identical (no fused multiply-adds are introduced).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn encode_task_avx2(
        &self,
        first: usize,
        xs: &[f32],
        scales: &[f32],
        ctx: &CodecContext,
        bytes: &mut [u8],
        residual: Option<&mut [f32]>,
    ) {
        self.encode_task_portable(first, xs, scales, ctx, bytes, residual)
    }

    #[inline(always)]
    fn encode_task_portable(
        &self,
        first: usize,
        xs: &[f32],
        scales: &[f32],
        ctx: &CodecContext,
        bytes: &mut [u8],
        residual: Option<&mut [f32]>,
    ) {
        let mut words = [0u32; TASK];
        let words = if self.stochastic() {
            element_words(
                ctx.rounding_seed(),
                ctx.step,
                ctx.key,
                first as u32,
                &mut words[..xs.len()],
            );
            &words[..xs.len()]
        } else {
            &words[..0]
        };
        let mut codes = [0u32; TASK];
        match self.spec {
            CodecSpec::BlockQ { group, .. } => {
                // One segment per (part of a) group, each with its own scale.
                let mut j = 0;
                while j < xs.len() {
                    let g = (first + j) / group;
                    let end = ((g + 1) * group - first).min(xs.len());
                    self.segment_codes(&xs[j..end], &words[..0], &mut codes[j..end], scales[g]);
                    j = end;
                }
            }
            _ => self.segment_codes(
                xs,
                words,
                &mut codes[..xs.len()],
                scales.first().copied().unwrap_or(1.0),
            ),
        }
        super::support::pack_fast(&codes[..xs.len()], self.bits, bytes);
        if let Some(rs) = residual {
            let mut values = [0.0f32; TASK];
            self.decode_task(first, bytes, scales, &mut values[..xs.len()])
                .expect("own codes are valid");
            rs.iter_mut()
                .zip(xs)
                .zip(&values)
                .for_each(|((r, &v), &d)| *r = clean(v) - d);
        }
    }

    /// Values of one task's codes; on a code no encoder produces, its element and pattern.
    fn decode_task(
        &self,
        first: usize,
        bytes: &[u8],
        scales: &[f32],
        values: &mut [f32],
    ) -> std::result::Result<(), (usize, u32)> {
        let mut codes = [0u32; TASK];
        let codes = &mut codes[..values.len()];
        super::support::unpack_fast(bytes, self.bits, codes);
        let mut j = 0;
        while j < values.len() {
            let (scale, end) = match self.spec {
                CodecSpec::BlockQ { group, .. } => {
                    let g = (first + j) / group;
                    (scales[g], ((g + 1) * group - first).min(values.len()))
                }
                _ => (scales.first().copied().unwrap_or(1.0), values.len()),
            };
            let (_, step) = self.factors(scale);
            let (cs, vs) = (&codes[j..end], &mut values[j..end]);
            match self.spec {
                // Every pattern is valid: a plain multiply the loop can vectorise.
                CodecSpec::Loco { .. } | CodecSpec::BlockQ { .. } => {
                    let b = self.bits;
                    vs.iter_mut()
                        .zip(cs)
                        .for_each(|(v, &c)| *v = sign_extend(c, b) as f32 * step);
                }
                _ => {
                    for (k, (v, &c)) in vs.iter_mut().zip(cs).enumerate() {
                        *v = self.value(c, step).ok_or((first + j + k, c))?;
                    }
                }
            }
            // A scale near f32's limit times a code can overflow: no encoder makes that.
            if let Some(k) = vs.iter().position(|v| !v.is_finite()) {
                return Err((first + j + k, cs[k]));
            }
            j = end;
        }
        Ok(())
    }

    /// Codes of elements that share one scale.
    #[inline(always)]
    fn segment_codes(&self, xs: &[f32], words: &[u32], codes: &mut [u32], scale: f32) {
        let (factor, _) = self.factors(scale);
        let b = self.bits;
        let signed = move |neg: bool, mag: i32| to_pattern(if neg { -mag } else { mag }, b);
        match self.spec {
            CodecSpec::BlockQ { .. } if factor > MAX_FACTOR => codes.fill(0),
            CodecSpec::Loco { .. } | CodecSpec::BlockQ { .. } => {
                let lim = (1i32 << (b - 1)) as f32;
                fill(xs, words, codes, |v, _| {
                    to_pattern(
                        to_i32(rne((v * factor).clamp(-lim - 1.0, lim)).clamp(-lim, lim - 1.0)),
                        b,
                    )
                });
            }
            _ if factor > MAX_FACTOR && !matches!(self.spec, CodecSpec::Natural) => codes.fill(0),
            CodecSpec::Dither {
                levels: Levels::Linear,
                s,
                ..
            } => {
                let top = s as f32;
                fill(xs, words, codes, |v, w| {
                    signed(v < 0.0, to_i32(stochastic_level(v.abs() * factor, top, w)))
                });
            }
            CodecSpec::Qsgd {
                rounding: Rounding::Nearest,
                bits,
            } => {
                let top = ((1u32 << (bits - 1)) - 1) as f32;
                fill(xs, words, codes, |v, _| {
                    signed(
                        v < 0.0,
                        to_i32(rne((v.abs() * factor).min(top + 1.0)).min(top)),
                    )
                });
            }
            _ => fill(xs, words, codes, |v, w| self.code(v, factor, w)),
        }
    }
}

/// `log2 s` of a rescalable LoCo payload's scale: `None` unless it is exactly `2^k` with
/// `|k| <= 100`, the scales a LoCo spec can name.
pub(crate) fn loco_payload_log2s(scale: &f32) -> Option<i32> {
    let bits = scale.to_bits();
    let k = ((bits >> 23) & 0xff) as i32 - 127;
    (bits & 0x807f_ffff == 0 && (-100..=100).contains(&k)).then_some(k)
}

impl Codec for DenseCodec {
    fn spec(&self) -> CodecSpec {
        self.spec
    }

    fn properties(&self) -> Properties {
        let n = 1 << 20;
        Properties {
            bits_per_element: bits_per_element(self.payload_len(n), n),
            unbiased: matches!(
                self.spec,
                CodecSpec::Dither { .. }
                    | CodecSpec::Natural
                    | CodecSpec::Qsgd {
                        rounding: Rounding::Stochastic,
                        ..
                    }
            ),
            stochastic: self.stochastic(),
        }
    }

    fn payload_len(&self, n: usize) -> usize {
        4 * self.header_count(n) + packed_len(n, self.bits)
    }

    fn encode(&self, x: &[f32], ctx: &CodecContext) -> Vec<u8> {
        self.encode_with(x, ctx, None)
    }

    fn encode_residual(
        &self,
        q: &[f32],
        ctx: &CodecContext,
        residual: &mut [f32],
    ) -> Result<Vec<u8>> {
        Ok(self.encode_with(q, ctx, Some(residual)))
    }

    fn decode_into(
        &self,
        payload: &[u8],
        out: &mut [f32],
        _ctx: &CodecContext,
        mode: DecodeMode,
    ) -> Result<()> {
        let n = out.len();
        let name = self.name();
        check_payload_len(&name, payload, n, self.payload_len(n))?;
        let head = 4 * self.header_count(n);
        let scales = (0..self.header_count(n))
            .map(|i| read_scale(payload, i, &name))
            .collect::<Result<Vec<_>>>()?;
        if let CodecSpec::Loco {
            rescalable: true, ..
        } = self.spec
        {
            loco_payload_log2s(&scales[0]).ok_or_else(|| {
                payload_err(
                    &name,
                    format!(
                        "scale {:e} is not a power of two from 2^-100 to 2^100",
                        scales[0]
                    ),
                )
            })?;
        }
        let codes = &payload[head..];
        check_padding(codes, n, self.bits, &name)?;
        // Every value first, so that a bad code leaves `out` untouched.
        let task_bytes = TASK / 8 * self.bits as usize;
        let mut values = vec![0.0f32; n];
        values
            .par_chunks_mut(TASK)
            .zip(codes.par_chunks(task_bytes))
            .enumerate()
            .try_for_each(|(t, (vs, bytes))| {
                self.decode_task(t * TASK, bytes, &scales, vs)
                    .map_err(|(i, p)| {
                        payload_err(
                            &name,
                            format!("element {i} has code {p:#x}, which no encoder produces with this scale"),
                        )
                    })
            })?;
        out.par_iter_mut()
            .zip(&values)
            .for_each(|(o, &v)| mode.apply(o, v));
        Ok(())
    }

    fn encode_gpu(&self, gpu: &Gpu, x: &GpuBuf, n: usize, ctx: &CodecContext) -> Result<GpuBuf> {
        dense_encode_gpu(&self.gpu_layout(n), gpu, x, n, ctx)
    }

    fn decode_gpu(
        &self,
        gpu: &Gpu,
        payload: &GpuBuf,
        out: &GpuBuf,
        n: usize,
        _ctx: &CodecContext,
        mode: DecodeMode,
    ) -> Result<()> {
        dense_decode_gpu(&self.gpu_layout(n), gpu, payload, out, n, mode)
    }
}

#[cfg(test)]
mod tests {
    use super::stochastic_level;

    /// How many of the 2^24 uniforms round `l + f` up, found from the rounding itself: it
    /// rounds up exactly for the uniforms below some threshold, which a binary search over
    /// the 24-bit grid finds in 25 calls.
    fn words_rounding_up(l: f32, f: f32) -> u64 {
        let up = |k: u64| stochastic_level(l + f, 1e6, (k as u32) << 8) > l;
        let (mut lo, mut hi) = (0u64, 1u64 << 24);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if up(mid) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        // Monotone: everything below the threshold rounds up, nothing above.
        assert!(lo == 0 || up(lo - 1));
        assert!(lo == 1 << 24 || !up(lo));
        lo
    }

    #[test]
    fn stochastic_rounding_with_24_bit_uniforms_is_biased_by_under_2_pow_minus_24_of_a_step() {
        // The claim in docs/wire-format.md ("What 24 bits cost"), measured on the rounding
        // itself: the chance of rounding up exceeds the fraction by less than 2^-24, never
        // falls below it, and a fraction under 2^-24 rounds up with probability 2^-24.
        let grid = (1u64 << 24) as f64;
        let mut fractions: Vec<f32> = vec![
            1e-9,
            2f32.powi(-25),
            2f32.powi(-24),
            3.0 * 2f32.powi(-24),
            1e-6,
            0.1,
            1.0 / 3.0,
            0.5,
            0.999_999,
            1.0 - 2f32.powi(-24),
        ];
        let mut x = 0x2545_f491u32;
        for _ in 0..200 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            fractions.push((x >> 8) as f32 / grid as f32 + (x & 0xff) as f32 * 2f32.powi(-32));
        }
        for &l in &[0.0f32, 5.0] {
            for &f in &fractions {
                // The fraction the codec sees: l + f rounded to f32, minus l.
                let f = ((l + f) - l) as f64;
                if f <= 0.0 || f >= 1.0 {
                    continue;
                }
                let p_up = words_rounding_up(l, f as f32) as f64 / grid;
                let bias = p_up - f;
                assert!(
                    (0.0..1.0 / grid).contains(&bias),
                    "level {l}, fraction {f:e}: rounds up with probability {p_up:e}, bias {bias:e}"
                );
                if f < 1.0 / grid {
                    assert_eq!(p_up, 1.0 / grid, "fraction {f:e}");
                }
            }
        }
    }
}

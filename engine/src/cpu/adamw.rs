//! AdamW's update of one element, and the same bits without the microcode assists that
//! subnormal numbers cost.
//!
//! A parameter whose gradient stays 0 (a unit that no longer fires) keeps a first moment that
//! decays by `beta1` a step, into the subnormal numbers after some 800 steps, and on Intel
//! every vector multiply with a subnormal operand or result takes a microcode assist of a
//! hundred cycles or more (a throwaway probe on the 2-core Xeon: 5.7-6.5 ns an element against
//! 0.12; conversions and additions took none). Such units are spread through every row of a
//! weight matrix, so every vector of the update met one: the MNIST MLP's AdamW step went from
//! 0.33 to 2.7 ms after ~700 steps on one batch (docs/benchmarks.md, session 16), and epochs
//! of real MNIST training slowed one after another.
//!
//! Flushing subnormals to zero would change the bits. Instead, blocks of elements with values
//! near the subnormal range carry out their products and their last quotient in f64 and round
//! each to f32 (`as f32`, which the hardware rounds into the subnormal range without an
//! assist) before the next operation reads it; sums and differences take no assist and stay
//! f32. That gives the f32 results exactly: a product of two f32 values is exact in f64, so
//! it is rounded once. A quotient is rounded twice, which is innocuous where f64's 53 bits are
//! at least twice f32's 24 plus 2 (Figueroa, "When is double rounding innocuous?", 1995); for
//! a quotient rounded into the subnormal range, the exact quotient of two f32 values lies at
//! least 2^-174 from any midpoint of f32's grid unless it is one, while f64's error there is
//! at most 2^-180. The test checks it against the f32 arithmetic on values drawn across the
//! whole range.
//!
//! Measured on the MLP trained on one batch (throwaway probe, docs/benchmarks.md, session 16):
//! before ~600 steps the update took 0.33-0.37 ms a step with f32 throughout and 0.37-0.40 ms
//! this way; from step 800 on, 2.6-2.8 ms with f32 throughout and 0.82-0.85 ms this way.

/// The f32 constants of one AdamW step, computed as the update's expression computes them.
#[derive(Debug, Clone, Copy)]
pub struct AdamWConstants {
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    decay: f32,
    step_size: f32,
    bc2_sqrt: f32,
    eps: f32,
}

impl AdamWConstants {
    /// The constants of an update with these hyperparameters and bias corrections `(1 -
    /// beta1^t, sqrt(1 - beta2^t))` (`kernels::optim::AdamWStep` gives both).
    pub fn new(
        lr: f32,
        (beta1, beta2): (f32, f32),
        eps: f32,
        weight_decay: f32,
        (bc1, bc2_sqrt): (f32, f32),
    ) -> AdamWConstants {
        AdamWConstants {
            beta1,
            one_minus_beta1: 1.0 - beta1,
            beta2,
            one_minus_beta2: 1.0 - beta2,
            decay: 1.0 - lr * weight_decay,
            step_size: lr / bc1,
            bc2_sqrt,
            eps,
        }
    }
}

/// The update of one element in f32, PyTorch's AdamW: the definition of its bits.
#[inline(always)]
pub fn element(w: &mut f32, g: f32, m: &mut f32, v: &mut f32, k: &AdamWConstants) {
    *m = k.beta1 * *m + k.one_minus_beta1 * g;
    *v = k.beta2 * *v + k.one_minus_beta2 * g * g;
    let decayed = *w * k.decay;
    *w = decayed - k.step_size * *m / (v.sqrt() / k.bc2_sqrt + k.eps);
}

/// The constants as f64 values that the compiler cannot see are widened f32 values (see
/// [`element_without_assists`]).
#[derive(Debug, Clone, Copy)]
pub struct WideConstants {
    beta1: f64,
    one_minus_beta1: f64,
    beta2: f64,
    one_minus_beta2: f64,
    decay: f64,
    step_size: f64,
    /// 1.0
    one: f64,
}

impl WideConstants {
    /// `k` widened; each constant multiplied by a 1.0 read through `black_box`.
    #[inline(always)]
    pub fn new(k: &AdamWConstants) -> WideConstants {
        let one = std::hint::black_box(1.0f64);
        let wide = |x: f32| x as f64 * one;
        WideConstants {
            beta1: wide(k.beta1),
            one_minus_beta1: wide(k.one_minus_beta1),
            beta2: wide(k.beta2),
            one_minus_beta2: wide(k.one_minus_beta2),
            decay: wide(k.decay),
            step_size: wide(k.step_size),
            one,
        }
    }
}

/// [`element`]'s bits with its products and its last quotient carried out in f64 and
/// rounded to f32: the operations that take an assist for a subnormal operand or result
/// never see one (see the module comment). Sums and differences, which take none, stay f32,
/// and so do the square root and the quotient of the denominator, whose operands are normal
/// unless the second moment itself is near the subnormals.
///
/// An f64 operation on two widened f32 values whose result is narrowed to f32 is that f32
/// operation, and LLVM narrows it back into one (a probe ran a first version at 200 ns an
/// element on subnormal moments): one operand of each is a constant or a value multiplied by
/// a 1.0 the compiler cannot see ([`WideConstants`]).
#[inline(always)]
pub fn element_without_assists(
    w: &mut f32,
    g: f32,
    m: &mut f32,
    v: &mut f32,
    k: &AdamWConstants,
    wide: &WideConstants,
) {
    // `a * b` rounded to f32, the product exact in f64 before it.
    let times = |a: f64, b: f32| (a * b as f64) as f32;
    let g_wide = g as f64 * wide.one;
    let m_new = times(wide.beta1, *m) + times(wide.one_minus_beta1, g);
    let v_new = times(wide.beta2, *v) + (times(wide.one_minus_beta2, g) as f64 * g_wide) as f32;
    let decayed = (*w as f64 * wide.decay) as f32;
    let denominator = v_new.sqrt() / k.bc2_sqrt + k.eps;
    let update = (times(wide.step_size, m_new) as f64 / (denominator as f64 * wide.one)) as f32;
    *m = m_new;
    *v = v_new;
    *w = decayed - update;
}

/// Elements per block that takes one of the two ways.
pub const BLOCK: usize = 16;

/// Below this magnitude (2^-90), a nonzero moment or weight may lead to a subnormal
/// intermediate; a gradient below [`TINY_GRADIENT`] (2^-50) may, through its square. Only
/// speed depends on these bounds: both ways give the same bits.
const TINY: u32 = 0x1280_0000;
const TINY_GRADIENT: u32 = 0x2680_0000;

/// Whether `x` is nonzero and below `bound` (the bits of a positive f32) in magnitude, read
/// from its bits (a comparison of floats is no arithmetic, but the bits say it plainly).
#[inline(always)]
fn tiny(x: f32, bound: u32) -> bool {
    (x.to_bits() & 0x7fff_ffff).wrapping_sub(1) < bound - 1
}

/// The update over equally long slices, a block of [`BLOCK`] at a time: in f32 where no value
/// is near the subnormal range, in f64 otherwise. Call it on the widest vector unit.
#[inline(always)]
pub fn update(w: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], k: &AdamWConstants) {
    assert!(grad.len() == w.len() && m.len() == w.len() && v.len() == w.len());
    let wide = WideConstants::new(k);
    let whole = w.len() / BLOCK * BLOCK;
    let (w_blocks, w_rest) = w.split_at_mut(whole);
    let (m_blocks, m_rest) = m.split_at_mut(whole);
    let (v_blocks, v_rest) = v.split_at_mut(whole);
    let blocks = w_blocks
        .chunks_exact_mut(BLOCK)
        .zip(grad.chunks_exact(BLOCK))
        .zip(
            m_blocks
                .chunks_exact_mut(BLOCK)
                .zip(v_blocks.chunks_exact_mut(BLOCK)),
        );
    for ((w, g), (m, v)) in blocks {
        let w: &mut [f32; BLOCK] = w.try_into().expect("a block");
        let g: &[f32; BLOCK] = g.try_into().expect("a block");
        let m: &mut [f32; BLOCK] = m.try_into().expect("a block");
        let v: &mut [f32; BLOCK] = v.try_into().expect("a block");
        let mut near_subnormal = false;
        for i in 0..BLOCK {
            near_subnormal |=
                tiny(w[i], TINY) | tiny(g[i], TINY_GRADIENT) | tiny(m[i], TINY) | tiny(v[i], TINY);
        }
        if near_subnormal {
            for i in 0..BLOCK {
                element_without_assists(&mut w[i], g[i], &mut m[i], &mut v[i], k, &wide);
            }
        } else {
            for i in 0..BLOCK {
                element(&mut w[i], g[i], &mut m[i], &mut v[i], k);
            }
        }
    }
    let rest = w_rest
        .iter_mut()
        .zip(&grad[whole..])
        .zip(m_rest.iter_mut().zip(v_rest));
    for ((w, &g), (m, v)) in rest {
        element_without_assists(w, g, m, v, k, &wide);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// A value from every part of f32's range: zeros, subnormals, the edges of the normal
    /// range, ordinary magnitudes, infinities and NaN, either sign.
    fn any_f32(rng: &mut Rng) -> f32 {
        let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
        let magnitude = match rng.below(10) {
            0 => 0.0,
            1 => f32::from_bits(1 + rng.below(0x7f_ffff) as u32),
            2 => f32::from_bits(0x0080_0000 + rng.below(1 << 26) as u32),
            3 => f32::INFINITY,
            4 => f32::NAN,
            5 => f32::from_bits(0x7f7f_ffff - rng.below(1 << 20) as u32),
            _ => f32::from_bits(rng.below(0x7f80_0000) as u32),
        };
        sign * magnitude
    }

    /// A state of one element as training meets it: moments and gradients from 1 down
    /// through the subnormals.
    fn training_like(rng: &mut Rng) -> f32 {
        let exponent = rng.below(160) as i32 - 150;
        (1.0 + rng.uniform()) * 2f32.powi(exponent) * if rng.below(2) == 0 { 1.0 } else { -1.0 }
    }

    /// PyTorch's defaults at step 1, then random hyperparameters and corrections.
    fn constants(rng: &mut Rng) -> Vec<AdamWConstants> {
        let mut all = vec![AdamWConstants::new(
            1e-3,
            (0.9, 0.999),
            1e-8,
            0.01,
            (0.1, 0.0316),
        )];
        for _ in 0..20 {
            all.push(AdamWConstants::new(
                10f32.powf(-8.0 * rng.uniform()),
                (rng.uniform(), rng.uniform()),
                10f32.powf(-12.0 * rng.uniform()),
                rng.uniform(),
                (rng.uniform().max(1e-6), rng.uniform().max(1e-3)),
            ));
        }
        all
    }

    #[test]
    fn the_f64_way_gives_the_f32_bits_across_the_range() {
        // Compared as bits, but any NaN with any NaN: a sum of two NaNs gives its first
        // operand's on x86, and the compiler may swap a sum's operands (Rust promises no
        // NaN's sign or payload). The test once compared NaNs' bits too, and a change
        // elsewhere in the crate (session 22) left the two ways with NaNs of opposite signs
        // for w = -inf, g and m NaN.
        let bits = |x: f32| {
            if x.is_nan() {
                f32::NAN.to_bits()
            } else {
                x.to_bits()
            }
        };
        let mut rng = Rng::new(24, 0);
        for k in constants(&mut rng) {
            let wide = WideConstants::new(&k);
            for i in 0..100_000 {
                let draw = |rng: &mut Rng| {
                    if i % 2 == 0 {
                        any_f32(rng)
                    } else {
                        training_like(rng)
                    }
                };
                let (w, g, m, v) = (
                    draw(&mut rng),
                    draw(&mut rng),
                    draw(&mut rng),
                    draw(&mut rng),
                );
                let v = if i % 4 == 1 { v.abs() } else { v };
                let (mut w32, mut m32, mut v32) = (w, m, v);
                element(&mut w32, g, &mut m32, &mut v32, &k);
                let (mut w64, mut m64, mut v64) = (w, m, v);
                element_without_assists(&mut w64, g, &mut m64, &mut v64, &k, &wide);
                assert_eq!(
                    [bits(w32), bits(m32), bits(v32)],
                    [bits(w64), bits(m64), bits(v64)],
                    "w {w:e} g {g:e} m {m:e} v {v:e}, {k:?}"
                );
            }
        }
    }

    #[test]
    fn blocks_near_the_subnormals_give_the_elements_bits() {
        // A buffer with tiny values in some blocks, not others, and a short last block:
        // `update` equals `element` on each element, whichever way each block took.
        let mut rng = Rng::new(25, 0);
        let n = 5 * BLOCK + 3;
        let mut state: Vec<[f32; 4]> = (0..n)
            .map(|i| {
                let scale = if (i / BLOCK).is_multiple_of(2) {
                    1e-40
                } else {
                    1e-3
                };
                [
                    rng.normal(),
                    rng.normal() * scale,
                    rng.normal() * scale,
                    rng.uniform() * scale,
                ]
            })
            .collect();
        let k = AdamWConstants::new(1e-3, (0.9, 0.999), 1e-8, 0.01, (0.52, 0.083));
        let column = |state: &[[f32; 4]], c: usize| state.iter().map(|s| s[c]).collect::<Vec<_>>();
        let (mut w, g, mut m, mut v) = (
            column(&state, 0),
            column(&state, 1),
            column(&state, 2),
            column(&state, 3),
        );
        update(&mut w, &g, &mut m, &mut v, &k);
        for (i, s) in state.iter_mut().enumerate() {
            let [w0, g0, m0, v0] = s;
            element(w0, *g0, m0, v0, &k);
            assert_eq!(
                [w[i].to_bits(), m[i].to_bits(), v[i].to_bits()],
                [w0.to_bits(), m0.to_bits(), v0.to_bits()],
                "element {i}"
            );
        }
        assert!(tiny(1e-40, TINY) && tiny(-1e-30, TINY) && !tiny(0.0, TINY) && !tiny(-0.0, TINY));
        assert!(!tiny(1e-20, TINY) && tiny(1e-20, TINY_GRADIENT) && !tiny(f32::NAN, TINY));
    }
}

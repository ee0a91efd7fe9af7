//! LoCo's gradient scale s, chosen once before training (loco.md §7.5): the power of two that
//! puts the 99.9th percentile of |g| at the largest code, 2^round(log2(q_max / quantile)).
//! Every peer must use the same s: one peer measures it and the run's configuration carries
//! log2 s to all.

use crate::error::{Error, Result};

/// `log2 s` for a `bits`-bit fixed-scale quantizer, from a gradient sample `g`.
pub fn loco_log2s(g: &[f32], bits: u32) -> Result<i32> {
    let mut magnitudes: Vec<f32> = g
        .iter()
        .map(|v| v.abs())
        .filter(|v| v.is_finite())
        .collect();
    if magnitudes.is_empty() || !(2..=8).contains(&bits) {
        return Err(Error::Config(format!(
            "calibrating s needs a finite gradient sample and 2 to 8 bits ({} values, {bits} bits)",
            g.len()
        )));
    }
    let at = ((0.999 * magnitudes.len() as f64).ceil() as usize).clamp(1, magnitudes.len()) - 1;
    let (_, quantile, _) = magnitudes.select_nth_unstable_by(at, f32::total_cmp);
    let quantile = *quantile as f64;
    if quantile <= 0.0 {
        return Err(Error::Config(
            "calibrating s: the gradient sample is (almost) all zero".into(),
        ));
    }
    let top = ((1u32 << (bits - 1)) - 1) as f64;
    Ok((top / quantile).log2().round().clamp(-100.0, 100.0) as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_puts_the_high_quantile_at_the_top_code() {
        // 1000 magnitudes 0.001 .. 1.0: the 99.9th percentile is 0.999, so s = 7 / 0.999 ≈ 2^3.
        let g: Vec<f32> = (1..=1000)
            .map(|i| i as f32 * 0.001 * if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        assert_eq!(loco_log2s(&g, 4).unwrap(), 3);
        // Scaling the gradient by 2^-10 scales s by 2^10.
        let small: Vec<f32> = g.iter().map(|v| v / 1024.0).collect();
        assert_eq!(loco_log2s(&small, 4).unwrap(), 13);
        assert_eq!(loco_log2s(&g, 8).unwrap(), 7);
        assert!(loco_log2s(&[0.0; 10], 4).is_err());
        assert!(loco_log2s(&[], 4).is_err());
        assert!(loco_log2s(&[f32::NAN, 1.0], 4).is_ok());
    }
}

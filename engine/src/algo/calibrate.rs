//! LoCo's gradient scale s, chosen once before training (loco.md §7.5): the power of two that
//! puts the 99.9th percentile of |g| at the largest code, 2^round(log2(q_max / quantile)).
//! Every peer must use the same s: one peer measures it and the run's configuration carries
//! log2 s to all.

use crate::compress::CodecSpec;
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

/// Where a job leaves LoCo's scale to calibration: the bits of its `loco` codec spec when the
/// spec names no `log2s` (the codec's own default, 2^19, suits no real gradient: loco.md
/// §7.5), else `None`.
pub fn scale_left_to_calibration(codec: &str) -> Option<u32> {
    let CodecSpec::Loco { bits, .. } = codec.parse().ok()? else {
        return None;
    };
    let named = codec.split(':').any(|part| part.starts_with("log2s="));
    (!named).then_some(bits)
}

/// `codec` with LoCo's calibrated scale named in it, and `memory` with the matching error
/// scale s_e = 4s (the paper's choice, loco.md §2.3) where it is a LoCo memory that names none.
/// A codec that names its scale, or is not LoCo, comes back unchanged with its memory.
pub fn with_calibrated_scale(codec: &str, memory: &str, log2s: i32) -> (String, String) {
    if scale_left_to_calibration(codec).is_none() {
        return (codec.to_string(), memory.to_string());
    }
    let codec = format!("{codec}:log2s={log2s}");
    let loco_memory = matches!(memory.split(':').next(), Some("loco-ema" | "loco"));
    let memory = if loco_memory && !memory.split(':').any(|p| p.starts_with("se=")) {
        format!("{memory}:se={}", 4.0 * 2f64.powi(log2s))
    } else {
        memory.to_string()
    };
    (codec, memory)
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

    #[test]
    fn only_scales_left_open_are_filled_in() {
        assert_eq!(scale_left_to_calibration("loco"), Some(4));
        assert_eq!(scale_left_to_calibration("loco:bits=8"), Some(8));
        assert_eq!(scale_left_to_calibration("loco:bits=4:log2s=11"), None);
        assert_eq!(scale_left_to_calibration("topk:0.1"), None);
        assert_eq!(
            with_calibrated_scale("loco:bits=4", "loco-ema:beta=0.2", 11),
            (
                "loco:bits=4:log2s=11".to_string(),
                "loco-ema:beta=0.2:se=8192".to_string()
            )
        );
        // What the job names stays as named.
        assert_eq!(
            with_calibrated_scale("loco:log2s=9", "loco-ema:se=100", 11),
            ("loco:log2s=9".to_string(), "loco-ema:se=100".to_string())
        );
        assert_eq!(
            with_calibrated_scale("f32", "ef", 11),
            ("f32".to_string(), "ef".to_string())
        );
        let (codec, memory) = with_calibrated_scale("loco", "loco", -3);
        assert!(
            codec.parse::<CodecSpec>().is_ok() && memory.parse::<crate::feedback::Memory>().is_ok()
        );
    }
}

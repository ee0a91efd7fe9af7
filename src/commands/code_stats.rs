//! How a round's codes sat, as the dashboards show it beside the loss.

/// `"  clipped 12.0%  error≠0 25.0%"` for the statistics a round has ("" for none): the share
/// of LoCo codes clipped at the ends of their range, and of nonzero error-feedback entries.
pub fn code_stats_line(saturated: Option<f64>, error_nonzero: Option<f64>) -> String {
    let mut line = String::new();
    if let Some(s) = saturated {
        line += &format!("  clipped {:.1}%", 100.0 * s);
    }
    if let Some(e) = error_nonzero {
        line += &format!("  error≠0 {:.1}%", 100.0 * e);
    }
    line
}

/// `"LoCo's scale recalibrated at step 938: s = 2^12 (was 2^10)"`.
pub fn recalibrated_line(step: u64, log2s: i32, was: Option<i32>) -> String {
    let was = was.map_or(String::new(), |w| format!(" (was 2^{w})"));
    format!("LoCo's scale recalibrated at step {step}: s = 2^{log2s}{was}")
}

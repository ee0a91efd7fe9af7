//! What the pipeline reproductions share about stepping a run: a step that reports why a run
//! stops, and when a run evaluates.

use murmur_engine::pipeline::{Pipeline, StepReport};

/// One step of `pipeline`, or why the run stops there (an error, or a loss that is no longer
/// finite: a diverged arm is recorded as such instead of ending the reproduction).
pub fn checked_step(pipeline: &mut Pipeline) -> Result<StepReport, String> {
    match pipeline.step() {
        Ok(r) if r.loss.is_finite() => Ok(r),
        Ok(_) => Err("loss not finite".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Whether a run of `steps` steps that evaluates `evals` times, evenly spaced and last after
/// its final step, evaluates after step `done` (counted from 1).
pub fn evaluates_after(done: u64, steps: u64, evals: u64) -> bool {
    let evals = evals.clamp(1, steps.max(1));
    done >= 1 && done <= steps && done * evals / steps > (done - 1) * evals / steps
}

#[cfg(test)]
mod tests {
    use super::evaluates_after;

    #[test]
    fn evaluations_are_evenly_spaced_and_the_last_follows_the_final_step() {
        let at = |steps, evals| -> Vec<u64> {
            (0..=steps + 1)
                .filter(|&t| evaluates_after(t, steps, evals))
                .collect()
        };
        assert_eq!(at(2000, 3), [667, 1334, 2000]);
        assert_eq!(at(10, 5), [2, 4, 6, 8, 10]);
        assert_eq!(at(4, 10), [1, 2, 3, 4], "at most one evaluation per step");
        assert_eq!(at(7, 1), [7]);
        assert_eq!(at(7, 0), [7], "a run always ends with an evaluation");
    }
}

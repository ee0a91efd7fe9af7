//! Running summaries of per-round figures, for reports and dashboards.

/// The mean of the values that were there: rounds without a figure (`None`) do not count.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Mean {
    sum: f64,
    count: u64,
}

impl Mean {
    /// Counts `v` where there is one.
    pub fn add(&mut self, v: Option<f64>) {
        if let Some(v) = v {
            self.sum += v;
            self.count += 1;
        }
    }

    /// Folds in another mean's values.
    pub fn merge(&mut self, other: Mean) {
        self.sum += other.sum;
        self.count += other.count;
    }

    /// The mean, or `None` before any value.
    pub fn get(self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }
}

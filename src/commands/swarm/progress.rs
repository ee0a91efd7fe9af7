//! The local swarm's dashboard: a bar per worker (step, loss, bytes per step), epoch results
//! as they come, and the totals that end the run. Without a terminal it prints plain lines.

use std::collections::BTreeMap;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use murmur_engine::stats::Mean;
use murmur_node::Event;

use crate::commands::code_stats::{code_stats_line, recalibrated_line};

#[derive(Default, Clone)]
struct WorkerTotals {
    steps: u64,
    bytes_pushed: u64,
    bytes_pulled: u64,
    f32_bytes_each_way: u64,
    done: bool,
}

pub struct Dashboard {
    multi: MultiProgress,
    bars: Vec<ProgressBar>,
    totals: Vec<WorkerTotals>,
    accuracy: BTreeMap<u32, f64>,
    /// The accuracy of the latest round evaluated, with that round: a worker that lagged
    /// (frozen, catching up) may report an earlier epoch after the others' last one.
    final_accuracy: Option<(u64, f64)>,
    /// The language model's validation losses by round, and the latest round's.
    valid_loss: BTreeMap<u64, f64>,
    final_valid_loss: Option<(u64, f64)>,
    total_steps: u64,
    rejoins: usize,
    /// Workers that died and were started again, and those let go.
    respawned: usize,
    left: usize,
    servers_restarted: usize,
    /// Without a terminal: the next step at which to print a plain progress line.
    next_line: u64,
    /// Rank 0's code statistics summed over its rounds, and the rounds that had each.
    saturated: Mean,
    error_nonzero: Mean,
}

/// What the run achieved, printed as JSON on stdout.
#[derive(Serialize)]
pub struct Outcome {
    pub workers: usize,
    pub steps: u64,
    pub test_accuracy: Vec<f64>,
    pub final_test_accuracy: Option<f64>,
    /// The language model's validation losses in nats per byte, by round.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub valid_loss: Vec<(u64, f64)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_valid_loss: Option<f64>,
    /// Mean bytes one worker sent / received per step.
    pub pushed_per_step: f64,
    pub pulled_per_step: f64,
    /// What one worker would send (and receive) per step in f32.
    pub f32_per_step: f64,
    /// Bytes all workers sent and received, and the same traffic in f32.
    pub total_bytes: u64,
    pub total_f32_bytes: u64,
    /// f32 traffic over actual traffic.
    pub reduction: f64,
    pub rejoins: usize,
    /// Workers that died and were started again (`--respawn`), and that died and were let go.
    pub respawned: usize,
    pub left: usize,
    /// Server shards that died and were started again.
    pub servers_restarted: usize,
    /// Mean over rank 0's rounds of the fraction of its LoCo codes clipped at the ends of
    /// their range (LoCo codecs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loco_clipped: Option<f64>,
    /// Mean over rank 0's rounds of the fraction of nonzero error-feedback entries (with
    /// error feedback only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_nonzero: Option<f64>,
}

impl Dashboard {
    pub fn new(workers: usize, quiet: bool) -> Dashboard {
        let target = if quiet {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        };
        let multi = MultiProgress::with_draw_target(target);
        let style = ProgressStyle::with_template("worker {prefix} [{bar:24}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> ");
        let bars = (0..workers)
            .map(|r| {
                let bar = multi.add(ProgressBar::new(0));
                bar.set_style(style.clone());
                bar.set_prefix(r.to_string());
                bar.set_message("connecting");
                bar
            })
            .collect();
        Dashboard {
            multi,
            bars,
            totals: vec![WorkerTotals::default(); workers],
            accuracy: BTreeMap::new(),
            final_accuracy: None,
            valid_loss: BTreeMap::new(),
            final_valid_loss: None,
            total_steps: 0,
            rejoins: 0,
            respawned: 0,
            left: 0,
            servers_restarted: 0,
            next_line: 0,
            saturated: Mean::default(),
            error_nonzero: Mean::default(),
        }
    }

    fn say(&self, line: String) {
        if self.multi.is_hidden() {
            eprintln!("{line}");
        } else {
            let _ = self.multi.println(line);
        }
    }

    /// Shows worker `index`'s event.
    pub fn handle(&mut self, index: usize, event: Event) {
        match event {
            Event::Waiting { what } => {
                self.bars[index].set_message(format!("waiting for {what}"));
            }
            // The wait that follows names the rank.
            Event::Assigned { .. } => {}
            Event::Joined {
                rank,
                steps,
                from_step,
                parameters,
                keys,
                codec,
                ..
            } => {
                let bar = &self.bars[index];
                bar.set_length(steps);
                bar.set_position(from_step);
                bar.set_message("training");
                self.total_steps = steps;
                if rank == 0 {
                    self.say(format!(
                        "model: {parameters} parameters in {keys} keys; {steps} rounds; pushes {codec}"
                    ));
                }
            }
            Event::Step {
                rank,
                step,
                loss,
                pushed,
                pulled,
                f32_each_way,
                samples_per_second,
                saturated,
                error_nonzero,
                ..
            } => {
                let bar = &self.bars[index];
                bar.set_position(step);
                let codes = code_stats_line(saturated, error_nonzero);
                bar.set_message(format!(
                    "loss {loss:.3}  up {:.0} KB  down {:.0} KB /round (f32 {:.0} KB)  {samples_per_second:.0} samples/s{codes}",
                    pushed as f64 / 1e3,
                    pulled as f64 / 1e3,
                    f32_each_way as f64 / 1e3
                ));
                if rank == 0 {
                    self.saturated.add(saturated);
                    self.error_nonzero.add(error_nonzero);
                }
                if self.multi.is_hidden() && rank == 0 && step >= self.next_line {
                    self.next_line = step + (self.total_steps / 10).max(1);
                    eprintln!(
                        "step {step}/{}: loss {loss:.3}, {:.0} KB up and {:.0} KB down per worker per round (f32 every step: {:.0} KB each way){codes}",
                        self.total_steps,
                        pushed as f64 / 1e3,
                        pulled as f64 / 1e3,
                        f32_each_way as f64 / 1e3
                    );
                }
            }
            Event::Evaluated {
                step,
                epoch,
                accuracy,
                seconds,
                ..
            } => {
                if self.final_accuracy.is_none_or(|(at, _)| step >= at) {
                    self.final_accuracy = Some((step, accuracy));
                }
                // Every worker evaluates the last round: say it once.
                if self.accuracy.insert(epoch, accuracy).is_none() {
                    self.say(format!(
                        "epoch {epoch}: test accuracy {:.2}% ({seconds:.1} s)",
                        100.0 * accuracy
                    ));
                }
            }
            Event::Validated {
                step,
                valid_loss,
                seconds,
                ..
            } => {
                if self.final_valid_loss.is_none_or(|(at, _)| step >= at) {
                    self.final_valid_loss = Some((step, valid_loss));
                }
                // Every worker measures the last round: say it once.
                if self.valid_loss.insert(step, valid_loss).is_none() {
                    self.say(format!(
                        "round {step}: validation loss {valid_loss:.4} nats/byte ({seconds:.1} s)"
                    ));
                }
            }
            Event::Recalibrated {
                rank: 0,
                step,
                log2s,
                was,
            } => self.say(recalibrated_line(step, log2s, was)),
            Event::Paused { rank, step } => {
                self.bars[index].set_message(format!("paused at step {step}"));
                self.say(format!("worker {rank} paused at step {step}"));
            }
            Event::Error { message, .. } => {
                self.bars[index].abandon_with_message(format!("failed: {message}"));
            }
            Event::Rejoined { rank, step, reason } => {
                self.rejoins += 1;
                self.say(format!(
                    "worker {rank} rejoined at step {step} after: {reason}"
                ));
            }
            Event::Done {
                steps,
                bytes_pushed,
                bytes_pulled,
                f32_bytes_each_way,
                seconds,
                ..
            } => {
                let t = &mut self.totals[index];
                t.steps = steps;
                t.bytes_pushed = bytes_pushed;
                t.bytes_pulled = bytes_pulled;
                t.f32_bytes_each_way = f32_bytes_each_way;
                t.done = true;
                self.bars[index].finish_with_message(format!("done in {seconds:.0} s"));
            }
            // `Event` is non-exhaustive: a kind added later shows nothing until it has a line.
            _ => {}
        }
    }

    /// Shard `shard` died and is started again from its state.
    pub fn server_restarted(&mut self, shard: u16) {
        self.servers_restarted += 1;
        self.say(format!(
            "server {shard} died; starting it again from its saved state (the workers reconnect)"
        ));
    }

    /// Worker `index` died before the end; `respawning` if it is started again.
    pub fn left(&mut self, index: usize, respawning: bool) {
        let step = self.bars[index].position();
        if respawning {
            self.respawned += 1;
            self.bars[index].set_message("died; starting it again");
            self.say(format!(
                "worker {index} died at step {step}; starting it again (the others go on)"
            ));
        } else {
            self.left += 1;
            self.bars[index].abandon_with_message("died");
            self.say(format!(
                "worker {index} died at step {step}; the others go on without it"
            ));
        }
    }

    pub fn outcome(&self) -> Outcome {
        let done: Vec<&WorkerTotals> = self.totals.iter().filter(|t| t.done).collect();
        let per_step = |f: fn(&WorkerTotals) -> u64| {
            let steps: u64 = done.iter().map(|t| t.steps).sum();
            done.iter().map(|t| f(t)).sum::<u64>() as f64 / steps.max(1) as f64
        };
        let total_bytes: u64 = done.iter().map(|t| t.bytes_pushed + t.bytes_pulled).sum();
        let total_f32_bytes: u64 = done.iter().map(|t| 2 * t.f32_bytes_each_way).sum();
        Outcome {
            workers: self.totals.len(),
            steps: done.iter().map(|t| t.steps).max().unwrap_or(0),
            test_accuracy: self.accuracy.values().copied().collect(),
            final_test_accuracy: self.final_accuracy.map(|(_, a)| a),
            valid_loss: self.valid_loss.iter().map(|(s, l)| (*s, *l)).collect(),
            final_valid_loss: self.final_valid_loss.map(|(_, l)| l),
            pushed_per_step: per_step(|t| t.bytes_pushed),
            pulled_per_step: per_step(|t| t.bytes_pulled),
            f32_per_step: per_step(|t| t.f32_bytes_each_way),
            total_bytes,
            total_f32_bytes,
            reduction: total_f32_bytes as f64 / total_bytes.max(1) as f64,
            rejoins: self.rejoins,
            respawned: self.respawned,
            left: self.left,
            servers_restarted: self.servers_restarted,
            loco_clipped: self.saturated.get(),
            error_nonzero: self.error_nonzero.get(),
        }
    }

    pub fn clear(&self) {
        let _ = self.multi.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evaluated(rank: u16, step: u64, epoch: u32, accuracy: f64) -> Event {
        Event::Evaluated {
            rank,
            step,
            epoch,
            accuracy,
            seconds: 1.0,
        }
    }

    #[test]
    fn the_final_accuracy_is_the_latest_rounds_whatever_arrives_last() {
        let mut dashboard = Dashboard::new(2, true);
        dashboard.handle(0, evaluated(0, 100, 2, 0.97));
        dashboard.handle(1, evaluated(1, 100, 2, 0.97));
        // A worker that was frozen reports its earlier epoch late.
        dashboard.handle(1, evaluated(1, 50, 1, 0.93));
        let outcome = dashboard.outcome();
        assert_eq!(outcome.final_test_accuracy, Some(0.97));
        assert_eq!(outcome.test_accuracy, [0.93, 0.97]);
    }
}

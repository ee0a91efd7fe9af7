//! `murmur repro loco`: LoCo against its baselines (f32, bf16, naive 4-bit, error feedback
//! with an f32 or an 8-bit error, LoCo without reset, block-absmax 4-bit with and without
//! LoCo) on Fashion-MNIST (or MNIST) with an MLP and N simulated workers, with AdamW and SGD
//! (shared/specs/loco.md §5.4). s is calibrated once from an initial gradient. Writes
//! docs/results/loco.md (raw numbers beside it as JSON) and checks the expected orderings.

use clap::Args;
use murmur_engine::algo::calibrate::loco_log2s;
use murmur_engine::algo::{Blocking, ClassifierReplica, MethodSpec, OptimizerSpec, Replica};

use super::arms::{Arm, ArmResult, Bench, CommonArgs};
use super::report::{keep_arms, pm};

#[derive(Args, Debug)]
pub struct LocoArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// AdamW's learning rate.
    #[arg(long, default_value_t = 1e-3)]
    adamw_lr: f32,
    /// AdamW's (decoupled) weight decay.
    #[arg(long, default_value_t = 0.01)]
    adamw_weight_decay: f32,
    /// Plain SGD's learning rate (momentum 0).
    #[arg(long, default_value_t = 0.1)]
    sgd_lr: f32,
    /// LoCo's reset period T_c, in steps (the paper's ablation favours 128 of 512 and 1024).
    #[arg(long, default_value_t = 128)]
    reset: u32,
    /// LoCo's β, the weight of the new residual (DeepSpeed's default 0.2).
    #[arg(long, default_value_t = 0.2)]
    beta: f32,
    /// log2 of the gradient scale s [default: calibrated from an initial gradient].
    #[arg(long)]
    log2s: Option<i32>,
}

fn arms(a: &LocoArgs, log2s: i32) -> Vec<Arm> {
    let four = format!("loco:bits=4:log2s={log2s}");
    let (beta, reset, log2se) = (a.beta, a.reset, log2s + 2);
    let loco = |extra: &str| -> MethodSpec {
        format!("loco:beta={beta}:reset={reset}{extra}")
            .parse()
            .expect("a valid LoCo spec")
    };
    let arm = |label: &str, method, codec: &str, optimizer| {
        let (lr, weight_decay) = if optimizer == OptimizerSpec::Sgd {
            (a.sgd_lr, 0.0)
        } else {
            (a.adamw_lr, a.adamw_weight_decay)
        };
        Arm {
            label: label.into(),
            method,
            codec: codec.into(),
            optimizer,
            blocking: Blocking::Bucket { bytes: 64 * 1024 },
            lr,
            weight_decay,
        }
    };
    let adamw = OptimizerSpec::ADAMW;
    let sgd = OptimizerSpec::Sgd;
    vec![
        arm("AdamW f32", MethodSpec::PSgd, "f32", adamw),
        arm("AdamW bf16", MethodSpec::DIRECT, "bf16", adamw),
        arm("AdamW naive 4-bit", MethodSpec::DIRECT, &four, adamw),
        arm("AdamW EF (f32 error)", MethodSpec::MemSgd, &four, adamw),
        arm(
            "AdamW EF (8-bit error)",
            "loco:beta=1:reset=0".parse().expect("spec"),
            &four,
            adamw,
        ),
        arm(
            "AdamW LoCo (no reset)",
            format!("loco:beta={beta}:reset=0").parse().expect("spec"),
            &four,
            adamw,
        ),
        arm(
            "AdamW LoCo mode A (f32 average)",
            loco(":f32"),
            &four,
            adamw,
        ),
        arm("AdamW LoCo mode B (int8 only)", loco(""), &four, adamw),
        // The sharded path (FSDP / ZeRO): the servers own the parameters, step AdamW on the
        // f32 mean and send bf16 parameters back; the paper's 16-bit baseline beside LoCo.
        arm(
            "AdamW bf16, sharded (FSDP baseline)",
            MethodSpec::Direct { sharded: true },
            "bf16",
            adamw,
        ),
        arm("AdamW LoCo mode B, sharded", loco(":sharded"), &four, adamw),
        arm(
            "AdamW block-absmax 4-bit",
            MethodSpec::DIRECT,
            "blockq:bits=4",
            adamw,
        ),
        arm(
            "AdamW block-absmax 4-bit + LoCo (mode A)",
            loco(&format!(":f32:log2se={log2se}")),
            "blockq:bits=4",
            adamw,
        ),
        arm("SGD f32", MethodSpec::PSgd, "f32", sgd),
        arm("SGD naive 4-bit", MethodSpec::DIRECT, &four, sgd),
        arm("SGD LoCo mode A", loco(":f32"), &four, sgd),
    ]
}

/// Calibrates log2 s on the mean gradient of the first batch at the seed-0 initialization.
fn calibrate(bench: &Bench) -> anyhow::Result<i32> {
    let indices: Vec<usize> = (0..bench.args.batch.min(bench.train.len())).collect();
    let mut replica = ClassifierReplica::new(bench.classifier(0)?, |_| bench.train.batch(&indices));
    let (_, g) = replica.loss_and_gradient(0)?;
    Ok(loco_log2s(&g, 4)?)
}

pub fn run(a: LocoArgs) -> anyhow::Result<()> {
    // The arms' labels do not depend on the scale: an unknown --arms name is refused before
    // any work, calibration included.
    keep_arms(arms(&a, 0), &a.common.arms, |x| &x.label)?;
    let bench = Bench::new(a.common.clone(), "loco")?;
    let log2s = match a.log2s {
        Some(l) => l,
        None => calibrate(&bench)?,
    };
    let arms = keep_arms(arms(&a, log2s), &a.common.arms, |x| &x.label)?;
    let results = bench.run("LoCo reproduction", &format!(", s = 2^{log2s}"), arms)?;
    let mut text = bench.header("LoCo and its baselines: reproduction");
    let mut w = |s: String| {
        text.push_str(&s);
        text.push('\n');
    };
    w(format!(
        "Setup (shared/specs/loco.md §5.4, scaled down): {}. s = 2^{log2s} ({}), s_e = 4s, \
         β = {}, T_c = {} \
         steps. The servers return the mean exactly: the integer sum of the 4-bit codes at one \
         byte per element where the number of workers is a power of two up to 16, else f32; \
         bf16 pushes get a bf16 mean. The sharded arms (loco.md §2.6) instead let the servers \
         own the parameters: they average the pushes in f32, step AdamW and send the \
         parameters back in bf16, which the workers compute with (their bytes include the \
         one parameter round at the start). AdamW: lr {}, weight decay {}; SGD: lr {}, momentum 0. \
         {} seed(s); accuracy is the best over epochs, mean ± std over seeds. \"error ≠ 0\" is \
         the fraction of worker 0's error entries that are nonzero at the end (loco.md §7.2's \
         diagnostic), mean over epochs.\n",
        bench.setup(),
        if a.log2s.is_some() {
            "given"
        } else {
            "calibrated: the 99.9th percentile of |g| of the first batch at the code 7"
        },
        a.beta,
        a.reset,
        a.adamw_lr,
        a.adamw_weight_decay,
        a.sgd_lr,
        bench.seeds,
    ));
    w("| Arm | algorithm | codec | best test acc % | final train loss | error ≠ 0 | bytes/step per worker, both ways (counted) |".into());
    w("|---|---|---|---|---|---|---|".into());
    for r in &results {
        let nonzero: Vec<f64> = r
            .runs
            .iter()
            .flatten()
            .filter_map(|e| e.worker_error_nonzero)
            .collect();
        w(format!(
            "| {} | `{}` | `{}` | {} | {} | {} | {:.0} |",
            r.arm.label,
            r.arm.method,
            r.arm.codec,
            pm(&r.best_accuracy(), 2),
            pm(&r.last(|e| e.train_loss), 4),
            if nonzero.is_empty() {
                "–".to_string()
            } else {
                format!("{:.3}", nonzero.iter().sum::<f64>() / nonzero.len() as f64)
            },
            r.bytes_per_step(a.common.workers, bench.per_epoch),
        ));
    }
    w(String::new());
    w("## Expected orderings (loco.md §5.4)\n".into());
    for line in orderings(&results) {
        w(format!("- {line}"));
    }
    bench.finish(&text, &results)
}

/// The spec's orderings of final loss (lower is better), each with the numbers and whether it
/// shows; accuracy beside it.
fn orderings(results: &[ArmResult]) -> Vec<String> {
    let find = |label: &str| results.iter().find(|r| r.arm.label == label);
    let shown = |ok: bool| if ok { "shown" } else { "NOT shown" };
    let describe = |r: &ArmResult| {
        format!(
            "{} loss {:.4} acc {:.2}%",
            r.arm.label,
            r.final_loss(),
            r.accuracy()
        )
    };
    let mut out = Vec::new();
    let mut better = |a: &str, b: &str, claim: &str| {
        if let (Some(x), Some(y)) = (find(a), find(b)) {
            out.push(format!(
                "{claim}: {} vs {}: {}",
                describe(x),
                describe(y),
                shown(x.final_loss() < y.final_loss())
            ));
        }
    };
    better(
        "AdamW LoCo mode A (f32 average)",
        "AdamW naive 4-bit",
        "LoCo better than naive 4-bit",
    );
    better(
        "AdamW LoCo mode B (int8 only)",
        "AdamW naive 4-bit",
        "LoCo (int8 memory) better than naive 4-bit",
    );
    better(
        "AdamW EF (8-bit error)",
        "AdamW naive 4-bit",
        "EF (8-bit error) better than naive 4-bit",
    );
    better(
        "AdamW block-absmax 4-bit + LoCo (mode A)",
        "AdamW block-absmax 4-bit",
        "LoCo-blockwise better than blockwise",
    );
    better(
        "SGD LoCo mode A",
        "SGD naive 4-bit",
        "with SGD: LoCo better than naive",
    );
    better(
        "AdamW LoCo mode B, sharded",
        "AdamW naive 4-bit",
        "sharded LoCo better than naive 4-bit",
    );
    if let Some(f) = find("AdamW f32") {
        for label in [
            "AdamW bf16",
            "AdamW LoCo mode A (f32 average)",
            "AdamW LoCo mode B (int8 only)",
            "AdamW bf16, sharded (FSDP baseline)",
            "AdamW LoCo mode B, sharded",
        ] {
            if let Some(r) = find(label) {
                let spread = super::report::mean_std(&r.best_accuracy())
                    .1
                    .max(super::report::mean_std(&f.best_accuracy()).1);
                out.push(format!(
                    "{label} about as good as f32 (accuracy at most 0.5 points or the spread \
                     {spread:.2} below): {:.2}% vs {:.2}%: {}",
                    r.accuracy(),
                    f.accuracy(),
                    shown(r.accuracy() >= f.accuracy() - 0.5f64.max(spread))
                ));
            }
        }
    }
    out
}

//! Train an MLP on MNIST with murmur's engine, in about thirty lines.
//!
//! Run: `scripts/fetch-data.sh mnist && cargo run --release --example train_mlp`

use murmur::engine::data::{default_root, epoch_batches, ImageDataset, Split};
use murmur::engine::train::{Classifier, ClassifierConfig};
use murmur::engine::Device;

fn main() -> anyhow::Result<()> {
    let train = ImageDataset::Mnist.load(&default_root(), Split::Train)?;
    let test = ImageDataset::Mnist.load(&default_root(), Split::Test)?;
    // A hardware GPU if there is one, else the CPU path (faster than a software adapter
    // such as lavapipe, with the same bits); Device::gpu() and Device::Cpu choose yourself.
    let (device, why) = Device::auto()?;
    eprintln!("device {why}");
    let config = ClassifierConfig {
        hidden: vec![256],
        lr: 1e-3,
        seed: 42,
        ..ClassifierConfig::default()
    };
    let mut clf = Classifier::new(&device, train.features(), train.classes, &config)?;

    for epoch in 0..2 {
        let mut last = None;
        for batch in epoch_batches(train.len(), 128, config.seed, epoch) {
            let (x, y) = train.batch(&batch);
            last = Some(clf.step(&x, &y)?);
        }
        // Reading a loss waits for the GPU; read one per epoch.
        let loss = last.map(|t| t.item()).transpose()?.unwrap_or(f32::NAN);
        println!(
            "epoch {epoch}: loss {loss:.4}, test accuracy {:.2}%",
            100.0 * clf.accuracy(&test, 1000)?
        );
    }
    Ok(())
}

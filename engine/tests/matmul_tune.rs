//! The matmul kernel chosen per adapter and shape class: measured once, kept on disk keyed
//! by adapter, driver and murmur version, read back by a later GPU, measured again when the
//! file is damaged or belongs to another version; and the product it dispatches gives the
//! reference's bits in every class.

mod common;

use murmur_engine::gpu::Gpu;
use murmur_engine::kernels::matmul::{matmul, matmul_ref, MatmulDims, MatmulKernel};
use murmur_engine::kernels::matmul_choice::{ShapeClass, Source};
use murmur_engine::kernels::matmul_tune::tune;
use murmur_engine::rng::Rng;
use murmur_engine::{Device, Tensor};

fn only_cache_file(dir: &std::path::Path) -> std::path::PathBuf {
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

#[test]
fn kernels_are_measured_once_kept_and_read_back() {
    if std::env::var_os("MURMUR_MATMUL").is_some() {
        eprintln!("skipped: MURMUR_MATMUL overrides the choice");
        return;
    }
    let _ = common::gpu();
    let dir = tempfile::tempdir().unwrap();

    let first = Gpu::new().unwrap();
    let measured = tune(&first, Some(dir.path())).unwrap();
    let file = only_cache_file(dir.path());
    assert_eq!(
        measured.source,
        Source::Measured {
            cache: Some(file.clone())
        }
    );
    assert_eq!(measured.choices.len(), ShapeClass::ALL.len());
    for c in &measured.choices {
        assert_eq!(c.seconds.len(), MatmulKernel::ALL.len());
        assert!(c.seconds.iter().all(|s| s.is_finite() && *s > 0.0));
        // The choice is the fastest measured.
        let best = MatmulKernel::ALL
            .iter()
            .position(|k| *k == c.kernel)
            .unwrap();
        assert!(c.seconds.iter().all(|s| c.seconds[best] <= *s));
    }
    // The GPU that was tuned dispatches by class.
    for c in &measured.choices {
        let side = match c.class {
            ShapeClass::Small => 64,
            ShapeClass::Medium => 300,
            ShapeClass::Large => 700,
        };
        assert_eq!(ShapeClass::of(&MatmulDims::square(side)), c.class);
        assert_eq!(
            MatmulKernel::for_gpu(&first, &MatmulDims::square(side)).unwrap(),
            c.kernel
        );
    }

    // Another GPU on the same adapter reads the choice instead of measuring.
    let second = Gpu::new().unwrap();
    let cached = tune(&second, Some(dir.path())).unwrap();
    assert_eq!(cached.source, Source::Cached(file.clone()));
    assert_eq!(cached.choices, measured.choices);

    // A file from another murmur version is not this one's: measured again.
    let text = std::fs::read_to_string(&file).unwrap();
    let version = format!("\"murmur\": \"{}\"", env!("CARGO_PKG_VERSION"));
    assert!(text.contains(&version), "{text}");
    std::fs::write(&file, text.replace(&version, "\"murmur\": \"0.0.0-older\"")).unwrap();
    let third = Gpu::new().unwrap();
    assert!(matches!(
        tune(&third, Some(dir.path())).unwrap().source,
        Source::Measured { cache: Some(_) }
    ));

    // A damaged file costs a measurement, not the node, and is written anew.
    std::fs::write(&file, "{ not json").unwrap();
    let t = tune(&Gpu::new().unwrap(), Some(dir.path())).unwrap();
    assert!(matches!(t.source, Source::Measured { .. }));
    assert_eq!(
        tune(&Gpu::new().unwrap(), Some(dir.path())).unwrap().source,
        Source::Cached(file.clone())
    );
}

#[test]
fn a_tuned_gpu_gives_the_references_bits_in_every_class() {
    let device = common::gpu();
    let gpu = device.as_gpu().unwrap();
    let dir = tempfile::tempdir().unwrap();
    tune(gpu, Some(dir.path())).unwrap();
    let mut rng = Rng::new(11, 0);
    // Awkward shapes, one per class: no side a multiple of a tile.
    for (m, k, n) in [(37, 61, 29), (301, 257, 130), (515, 533, 509)] {
        let a = common::random(&mut rng, m * k, 1.0);
        let b = common::random(&mut rng, k * n, 1.0);
        let ta = Tensor::from_vec(&device, &[m, k], a.clone()).unwrap();
        let tb = Tensor::from_vec(&device, &[k, n], b.clone()).unwrap();
        let got = matmul(&ta, &tb, false, false).unwrap().to_vec().unwrap();
        let (dims, _) = MatmulDims::infer(&[m, k], &[k, n], false, false).unwrap();
        let want = matmul_ref(&a, &b, &dims);
        common::assert_close(&format!("{m}x{k}x{n}"), &got, &want, 1e-4, 1e-4);
        // The CPU path agrees too.
        let cpu = matmul(
            &Tensor::from_vec(&Device::Cpu, &[m, k], a).unwrap(),
            &Tensor::from_vec(&Device::Cpu, &[k, n], b).unwrap(),
            false,
            false,
        )
        .unwrap()
        .to_vec()
        .unwrap();
        assert!(cpu
            .iter()
            .zip(&want)
            .all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}

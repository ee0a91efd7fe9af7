//! The figures drawn from tiny synthetic results files of each kind.

use std::path::Path;

use super::*;

/// The width and height a PNG file's header states, after checking its signature.
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(
        &bytes[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    let be = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().unwrap());
    (be(16), be(20))
}

#[test]
fn each_kind_of_results_file_draws_its_figures_and_a_wrong_one_is_refused() {
    let dir = std::env::temp_dir().join(format!("murmur-figures-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let epochs = |norms: &[f64]| {
        norms
            .iter()
            .enumerate()
            .map(|(i, n)| serde_json::json!({"epoch": i, "error_norm": n, "test_accuracy": 0.5}))
            .collect::<Vec<_>>()
    };
    let liec = serde_json::json!([
        {"method": "psgd", "blocking": "whole", "seed": 0, "epochs": epochs(&[0.0, 0.0])},
        {"method": "liec:32", "blocking": "whole", "seed": 0, "epochs": epochs(&[0.5, 0.25])},
        {"method": "liec:32", "blocking": "whole", "seed": 1, "epochs": epochs(&[1.5, 0.75])},
        {"method": "liec:32", "blocking": "bucket:64k", "seed": 0, "epochs": epochs(&[2.0, 1.0])},
    ]);
    let seed = |acc: f64| serde_json::json!({"epochs": [{"test_accuracy": acc - 0.1}, {"test_accuracy": acc}]});
    let arm = |label: &str, variant: &str, p: f64| serde_json::json!({"label": label, "table": "Main", "variant": variant, "p": p, "stages": 4});
    let clapping = serde_json::json!([
        {"arm": arm("uncompressed", "none", 1.0), "runs": [seed(0.86), seed(0.87)]},
        {"arm": arm("FC 0.2", "fc", 0.2), "runs": [seed(0.82)]},
        {"arm": arm("FC 0.6", "fc", 0.6), "runs": [seed(0.84)]},
    ]);
    let loco = serde_json::json!([
        {"arm": "f32", "seed": 0, "epochs": [{"test_accuracy": 0.8}]},
        {"arm": "f32", "seed": 1, "epochs": [{"test_accuracy": 0.9}]},
        {"arm": "LoCo", "seed": 0, "epochs": [{"test_accuracy": 0.85}]},
    ]);
    for (name, value) in [("liec-sgd", liec), ("clapping", clapping), ("loco", loco)] {
        std::fs::write(dir.join(format!("{name}.json")), value.to_string()).unwrap();
    }
    run(FiguresArgs { dir: dir.clone() }).unwrap();
    assert_eq!(
        png_size(&dir.join("liec-sgd-error-norm.png")),
        (WIDTH, 60 + 2 * 330)
    );
    assert_eq!(
        png_size(&dir.join("clapping-accuracy-vs-p.png")),
        (WIDTH, 560)
    );
    // Rows are drawn as tall as the arms need: three arms here, two in loco.
    assert_eq!(
        png_size(&dir.join("clapping-accuracy.png")),
        (WIDTH, 110 + 3 * 30)
    );
    assert_eq!(
        png_size(&dir.join("loco-accuracy.png")),
        (WIDTH, 110 + 2 * 30)
    );

    // A file named like one kind but holding another is an error that names it.
    let wrong = dir.join("loco-wrong.json");
    std::fs::write(&wrong, r#"[{"method": "psgd"}]"#).unwrap();
    let err = format!("{:#}", arms(&wrong).unwrap_err());
    assert!(
        err.contains("loco-wrong.json is not a per-arm results file"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

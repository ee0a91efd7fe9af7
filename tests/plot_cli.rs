//! `murmur plot` end to end: metrics files in, a PNG (or SVG) of the stated size out, and a
//! clear error naming the file and the line for bad input.

mod common;

use common::RemovedOnDrop;
use std::path::Path;
use std::process::{Command, Output};

fn plot(args: &[&str], files: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_murmur"))
        .arg("plot")
        .args(files)
        .args(args)
        .output()
        .unwrap()
}

/// Two runs: one on one machine with two evaluations, one of two ranks with traffic.
fn write_runs(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (a, b) = (dir.join("adamw.jsonl"), dir.join("swarm.jsonl"));
    let mut one = String::new();
    let mut two = String::new();
    for step in 1..=40u32 {
        let loss = 2.3 / (1.0 + step as f64 / 10.0);
        one += &format!(
            "{{\"step\":{step},\"epoch\":1,\"loss\":{loss},\"bytes_up\":0,\"bytes_down\":0,\"step_seconds\":0.01,\"lr\":0.001}}\n"
        );
        for rank in 0..2 {
            two += &format!(
                "{{\"step\":{step},\"rank\":{rank},\"loss\":{},\"bytes_up\":1000,\"bytes_down\":3000}}\n",
                loss * 1.1
            );
        }
        if step % 20 == 0 {
            one += &format!("{{\"step\":{step},\"accuracy\":0.{}}}\n", 70 + step / 2);
        }
    }
    two += "{\"step\":41,\"rank\":0,\"loss\":null,\"bytes_up\":1000,\"bytes_down\":3000}\n";
    std::fs::write(&a, one).unwrap();
    std::fs::write(&b, two).unwrap();
    (a, b)
}

#[test]
fn two_runs_make_a_png_of_the_asked_size_and_an_svg() {
    let dir = RemovedOnDrop::temp("plot");
    std::fs::create_dir_all(&dir.0).unwrap();
    let (a, b) = write_runs(&dir.0);
    let png = dir.0.join("curves.png");
    let out = plot(
        &[
            "-o",
            png.to_str().unwrap(),
            "--width",
            "640",
            "--height",
            "480",
        ],
        &[&a, &b],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let be = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().unwrap());
    assert_eq!(&bytes[12..16], b"IHDR");
    assert_eq!((be(16), be(20)), (640, 480));
    // A blank page of 640x480 compresses to almost nothing: curves and text do not.
    assert!(bytes.len() > 10_000, "{} bytes", bytes.len());

    let svg = dir.0.join("curves.svg");
    let out = plot(
        &[
            "-o",
            svg.to_str().unwrap(),
            "--label",
            "one",
            "--label",
            "two",
        ],
        &[&a, &b],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{}", &text[..50.min(text.len())]);
    for label in ["one", "two", "Test accuracy", "MB sent + received so far"] {
        assert!(text.contains(label), "the SVG lacks {label:?}");
    }
}

#[test]
fn bad_input_is_an_error_naming_the_file_and_line() {
    let dir = RemovedOnDrop::temp("plot-bad");
    std::fs::create_dir_all(&dir.0).unwrap();
    let (good, _) = write_runs(&dir.0);
    let png = dir.0.join("x.png");
    let cases = [
        ("broken.jsonl", "{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":", "broken.jsonl is not a metrics file: line 2 is not a metrics record"),
        ("nostep.jsonl", "{\"loss\":2}\n", "nostep.jsonl is not a metrics file: line 1 is not a metrics record: missing field `step`"),
        ("empty.jsonl", "", "empty.jsonl is not a metrics file: it holds no records"),
        ("nothing.jsonl", "{\"step\":1,\"lr\":0.1}\n", "line 1 has nothing to draw (no loss, accuracy, valid_loss or bytes)"),
    ];
    for (name, text, expected) in cases {
        let bad = dir.0.join(name);
        std::fs::write(&bad, text).unwrap();
        let out = plot(&["-o", png.to_str().unwrap()], &[&good, &bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains(expected), "{name}: {err}");
        assert!(!png.exists(), "{name}: no figure after an error");
    }
    let out = plot(&["-o", dir.0.join("x.gif").to_str().unwrap()], &[&good]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("name the figure .png or .svg"),
        "{err}"
    );
}

//! The CLI behaves like a well-made tool: bad input is refused at once, before any work,
//! with one clear sentence and exit code 2; a signal stops a command gracefully (exit code
//! 128 + N) and `murmur swarm` leaves no process behind; completions, the manual page and
//! `info --json` come from the same definitions the parser uses.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{have_mnist, RemovedOnDrop};

fn murmur() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_murmur"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

#[test]
fn bad_input_is_refused_at_once_with_one_clear_sentence() {
    let refusals: &[(&str, &str)] = &[
        // A worker takes its job from the servers: a bad codec is refused by the server
        // that would hand it out, before it listens.
        ("server --node s --codec foo", "no such codec"),
        ("swarm --codec foo", "no such codec"),
        ("swarm --codec topk:2", "ambiguous"),
        ("swarm --codec hybrid:bits=6:topk=12", "ambiguous"),
        ("swarm --codec loco:bits=3", "2, 4 or 8 bits"),
        ("swarm --lr -1", "lr must be a positive number"),
        ("swarm --lr nan", "lr must be a positive number"),
        ("swarm --servers 0", "--servers must be at least 1"),
        ("train --lr -1", "--lr must be a number above 0"),
        ("train --lr nan", "--lr must be a number above 0"),
        ("train --weight-decay nan", "--weight-decay must be"),
        ("train --optim foo", "use adamw or sgd"),
        ("train --model cnn --dropout 1", "--dropout must be"),
        (
            "train --save /nonexistent/model.safetensors",
            "there is no folder",
        ),
        ("train --resume /nonexistent/model.safetensors", "--resume"),
        ("train --model foo", "invalid value 'foo'"),
        ("pipeline --lr nan", "lr must be a number above 0"),
        ("pipeline --lr 0", "lr must be a number above 0"),
        ("pipeline --codec topk:2", "ambiguous"),
        ("pipeline --variant foo", "variant \"foo\""),
        ("repro clan --arms bogus", "no such arm"),
        ("repro clapping --arms bogus", "no such arm"),
        ("repro loco --arms bogus", "no such arm"),
        (
            "worker --connect 127.0.0.1:9 --node w --save /nonexistent/m.safetensors",
            "there is no folder",
        ),
    ];
    for (args, says) in refusals {
        let started = Instant::now();
        let out = murmur().args(args.split_whitespace()).output().unwrap();
        let took = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args}: a usage error: {stderr}"
        );
        assert!(stderr.contains(says), "{args}: {stderr}");
        assert!(
            took < Duration::from_secs(1),
            "{args}: refused after {took:?}, not at once"
        );
        // One sentence, not a Rust debug dump: no struct syntax, no panic, no backtrace.
        for dump in ["panicked", "Os {", "Error {", "Config(", "backtrace"] {
            assert!(!stderr.contains(dump), "{args}: {stderr}");
        }
        if !args.starts_with("train --model foo") {
            assert_eq!(stderr.trim().lines().count(), 1, "{args}: {stderr}");
            assert!(stderr.starts_with("murmur: error: "), "{args}: {stderr}");
        }
    }
}

/// The pids of `parent`'s children, from /proc.
#[cfg(target_os = "linux")]
fn children_of(parent: u32) -> Vec<u32> {
    let mut out = vec![];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // /proc/PID/stat: "pid (comm) state ppid ...", comm may hold spaces.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

#[cfg(target_os = "linux")]
fn alive(pid: u32) -> bool {
    // A zombie has been stopped; only its parent's wait is missing.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

#[cfg(target_os = "linux")]
fn sigterm(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[cfg(target_os = "linux")]
#[test]
fn sigterm_stops_a_swarm_and_every_process_it_started_saving_the_model() {
    if !have_mnist() {
        return;
    }
    let dir = RemovedOnDrop::temp("swarm-sigterm");
    let model = dir.0.join("model.safetensors");
    std::fs::create_dir_all(&dir.0).unwrap();
    let mut swarm = murmur()
        .args(
            "swarm --workers 2 --servers 2 --epochs 50 --hidden 32 --train-limit 6000 \
             --device cpu --quiet --dir"
                .split_whitespace(),
        )
        .arg(dir.0.join("swarm"))
        .arg("--save")
        .arg(&model)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the two servers and two workers, and for the first rounds.
    let started = Instant::now();
    let children = loop {
        let children = children_of(swarm.id());
        let log =
            std::fs::read_to_string(dir.0.join("swarm/logs/server-0.log")).unwrap_or_default();
        if children.len() == 4 && log.matches("joins the job as rank").count() == 2 {
            break children;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the swarm did not start: {children:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_secs(2));
    sigterm(swarm.id());
    let stopped = Instant::now();
    let status = loop {
        if let Some(status) = swarm.try_wait().unwrap() {
            break status;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(45),
            "the swarm did not stop within 45 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut swarm.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(143), "128 + SIGTERM: {stderr}");
    assert!(stderr.contains("interrupted by SIGTERM"), "{stderr}");
    for pid in children {
        assert!(!alive(pid), "process {pid} outlived the swarm: {stderr}");
    }
    let bytes = std::fs::read(&model).unwrap_or_else(|e| panic!("no model ({e}): {stderr}"));
    assert!(
        bytes.len() > 1000,
        "the model file is {} bytes",
        bytes.len()
    );
}

#[cfg(target_os = "linux")]
#[test]
fn sigterm_stops_training_with_a_checkpoint_it_can_resume_from() {
    if !have_mnist() {
        return;
    }
    let dir = RemovedOnDrop::temp("train-sigterm");
    std::fs::create_dir_all(&dir.0).unwrap();
    let checkpoint = dir.0.join("run.safetensors");
    let flags = "train --device cpu --hidden 32 --train-limit 6000 --epochs 200 --quiet";
    let train = murmur()
        .args(flags.split_whitespace())
        .arg("--save")
        .arg(&checkpoint)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    sigterm(train.id());
    let out = train.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    assert!(stderr.contains("checkpoint written to"), "{stderr}");
    // The checkpoint is whole: a resumed run takes it (and stops at once, at --max-steps).
    let out = murmur()
        .args(flags.split_whitespace())
        .arg("--resume")
        .arg(&checkpoint)
        .args(["--max-steps", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("resumed from"), "{stderr}");
}

#[test]
fn completions_the_manual_and_info_come_from_the_definitions() {
    let out = murmur().args(["completions", "bash"]).output().unwrap();
    let script = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for flag in ["--codec", "--save", "--metrics-never-a-flag"] {
        let expected = flag != "--metrics-never-a-flag";
        assert_eq!(
            script.contains(flag),
            expected,
            "bash completion and {flag}"
        );
    }
    let out = murmur().arg("man").output().unwrap();
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && page.contains(".TH murmur 1"),
        "{page}"
    );
    assert!(page.contains("swarm"), "the page lists the subcommands");

    let out = murmur().args(["info", "--json"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(info["selected"]["name"].is_string(), "{info}");
    assert!(info["machine"]["cores"].as_u64().unwrap() >= 1);
}

#[test]
fn rust_log_sets_the_level_and_a_bad_one_is_said() {
    let out = murmur()
        .arg("info")
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("GPU opened"),
        "RUST_LOG=info shows info lines: {stderr}"
    );
    let out = murmur().arg("info").output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("GPU opened"));
    let out = murmur().arg("info").env("RUST_LOG", "x[").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ignoring RUST_LOG"), "{stderr}");
}

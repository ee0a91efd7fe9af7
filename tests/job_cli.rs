//! The job as the servers hold it: a TOML file with flags on top, refused with a clear message
//! when it cannot run, and addresses as people type them.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::RemovedOnDrop;

fn murmur() -> Command {
    Command::new(env!("CARGO_BIN_EXE_murmur"))
}

/// A swarm folder with certificates for `nodes`: `server-N` as the server of shard N, any
/// other name as a worker.
fn swarm(name: &str, nodes: &[&str]) -> RemovedOnDrop {
    let dir = RemovedOnDrop::temp(name);
    let mut ok = murmur()
        .args(["swarm", "init"])
        .arg(&dir.0)
        .status()
        .unwrap()
        .success();
    for node in nodes {
        let role = match node.strip_prefix("server-") {
            Some(shard) => format!("server/{shard}"),
            None => "worker".into(),
        };
        ok &= murmur()
            .args(["swarm", "issue"])
            .arg(&dir.0)
            .args([node, "--role", &role])
            .status()
            .unwrap()
            .success();
    }
    assert!(ok);
    dir
}

/// `murmur server` for shard 0 of the swarm in `dir`, serving the job file `job`.
fn server_with_job(dir: &RemovedOnDrop, job: &std::path::Path) -> Command {
    let mut cmd = murmur();
    cmd.args(["server", "--listen", "localhost:0", "--node", "server-0"])
        .arg("--swarm")
        .arg(&dir.0)
        .arg("--config")
        .arg(job);
    cmd
}

#[test]
fn flags_override_only_the_job_fields_given_and_the_file_keeps_the_rest() {
    let dir = swarm("job-cli", &["server-0"]);
    let job = dir.0.join("job.toml");
    std::fs::write(&job, "workers = 3\ncodec = \"sign\"\n").unwrap();
    let mut server = server_with_job(&dir, &job)
        .args(["--codec", "topk:0.01"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    server.kill().unwrap();
    server.wait().unwrap();
    // workers from the file (not the flag default, 4), codec from the flag (not the file).
    assert!(
        line.contains("a job of 3 workers, codec topk:0.01"),
        "{line}"
    );
}

#[test]
fn a_job_that_cannot_run_and_a_host_that_does_not_resolve_are_clear_errors_at_once() {
    let dir = swarm("job-cli-bad", &["server-0", "worker-0"]);
    let job = dir.0.join("job.toml");
    for (text, needle) in [
        ("wokers = 3\n", "wokers"),
        ("codec = \"foo\"\n", "codec"),
        ("lr = -1.0\n", "lr must be a positive number"),
    ] {
        std::fs::write(&job, text).unwrap();
        let started = Instant::now();
        let out = server_with_job(&dir, &job).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(needle),
            "{text}: {stderr}"
        );
        assert!(started.elapsed() < Duration::from_secs(5), "{text}");
    }
    let out = murmur()
        .args(["worker", "--connect", "no-such-host.invalid:7400"])
        .args(["--node", "worker-0", "--swarm"])
        .arg(&dir.0)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("does not resolve"),
        "{stderr}"
    );
    let out = murmur()
        .args([
            "worker",
            "--connect",
            "localhost",
            "--node",
            "worker-0",
            "--swarm",
        ])
        .arg(&dir.0)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("has no port"), "{stderr}");
}

/// A UDP flood of junk and of QUIC initials that lead nowhere: every one is refused, and the
/// server's log grows by a few lines, not a line per packet.
#[test]
fn a_flood_costs_the_server_a_few_log_lines() {
    let dir = swarm("job-cli-flood", &["server-0"]);
    let job = dir.0.join("job.toml");
    std::fs::write(&job, "workers = 2\n").unwrap();
    let log = dir.0.join("server.log");
    let mut server = server_with_job(&dir, &job)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let port = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if let Some(rest) = text.split("listening on ").nth(1) {
            let addr = rest.split_whitespace().next().unwrap();
            break addr.rsplit(':').next().unwrap().parse::<u16>().unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{text}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let before = std::fs::metadata(&log).unwrap().len();
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let target = ("127.0.0.1", port);
    let flood = Instant::now();
    let mut sent = 0u64;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut junk = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    };
    while flood.elapsed() < Duration::from_secs(2) {
        let mut packet = junk(1200);
        if sent.is_multiple_of(2) {
            // A QUIC v1 initial with random connection ids: parsed, then refused.
            packet[..6].copy_from_slice(&[0xc0, 0, 0, 0, 1, 8]);
            packet[14] = 8;
            packet[23] = 0;
        }
        let _ = socket.send_to(&packet, target);
        sent += 1;
    }
    std::thread::sleep(Duration::from_millis(500));
    server.kill().unwrap();
    server.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let grew = text.len() as u64 - before;
    eprintln!("{sent} packets in 2 s grew the server's log by {grew} bytes");
    assert!(sent > 10_000, "the flood sent only {sent} packets");
    assert!(
        grew < 8 << 10,
        "{sent} packets grew the log by {grew} bytes:\n{}",
        &text[..text.len().min(4000)]
    );
}

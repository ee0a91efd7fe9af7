//! A shaped IP path between two network namespaces, so that any protocol (murmur's QUIC, the
//! kernel's TCP) crosses the same link: each namespace holds a TUN device, and a forwarder
//! in this process reads the packets one side sends and writes them into the other after a
//! [`Schedule`] (loss, rate limit with a drop-tail queue, delay). It stands in for `tc
//! netem`, which not every kernel has; the [UDP relay](crate::relay) shapes QUIC alone.
//!
//! Linux only, as root (it creates namespaces with `ip netns` and TUN devices). Everything
//! it creates is removed when it is dropped. Sockets for either end are made on a thread
//! that has entered that end's namespace ([`ShapedPath::in_a`], [`ShapedPath::in_b`]); a
//! socket stays in the namespace it was made in wherever it is used afterwards.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{NetError, Result};
use crate::netns::{in_namespace, run};
use crate::shape::{Schedule, Shape};

/// The address of end A of every path (each path lives in namespaces of its own).
pub const ADDR_A: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 1);
/// The address of end B.
pub const ADDR_B: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 2);
/// The TUN device's name in both namespaces.
const TUN: &str = "mmpath0";
/// An Ethernet-sized MTU, as on a home link.
const MTU: &str = "1500";
/// How often blocked forwarder threads look at the stop flag.
const POLL: Duration = Duration::from_millis(50);

/// Packets the path has carried and dropped, both directions together.
#[derive(Debug, Default)]
pub struct PathStats {
    /// Packets delivered to the far end.
    pub forwarded: AtomicU64,
    /// Packets lost to the loss draws or to a full queue.
    pub dropped: AtomicU64,
}

/// Two namespaces joined by a shaped path; removed on drop.
pub struct ShapedPath {
    namespaces: Vec<String>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// What the path has done so far.
    pub stats: Arc<PathStats>,
}

impl ShapedPath {
    /// Creates the namespaces, their TUN devices (end A at [`ADDR_A`], end B at [`ADDR_B`])
    /// and the forwarders: `a_to_b` shapes what A sends, `b_to_a` what B sends.
    pub fn create(a_to_b: Shape, b_to_a: Shape) -> Result<ShapedPath> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tag = format!(
            "mmpath{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Relaxed)
        );
        let mut path = ShapedPath {
            namespaces: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            stats: Arc::new(PathStats::default()),
        };
        for end in ["a", "b"] {
            let ns = format!("{tag}{end}");
            ip(&["netns", "add", &ns])?;
            path.namespaces.push(ns);
        }
        let tun_a = Arc::new(path.in_a(open_tun)??);
        let tun_b = Arc::new(path.in_b(open_tun)??);
        for (ns, local, peer) in [
            (&path.namespaces[0], ADDR_A, ADDR_B),
            (&path.namespaces[1], ADDR_B, ADDR_A),
        ] {
            let (local, peer) = (local.to_string(), peer.to_string());
            ip(&["-n", ns, "addr", "add", &local, "peer", &peer, "dev", TUN])?;
            ip(&["-n", ns, "link", "set", TUN, "mtu", MTU, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        path.forward(tun_a.clone(), tun_b.clone(), a_to_b);
        path.forward(tun_b, tun_a, b_to_a);
        Ok(path)
    }

    /// Runs `f` on a thread inside end A's namespace (to make its sockets).
    pub fn in_a<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        in_namespace(&self.namespaces[0], f)
    }

    /// Runs `f` on a thread inside end B's namespace.
    pub fn in_b<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        in_namespace(&self.namespaces[1], f)
    }

    /// One direction: a reader that schedules each packet from `from` as it arrives, and a
    /// writer that hands it to `to` when it is due (the schedule keeps due times in order).
    fn forward(&mut self, from: Arc<File>, to: Arc<File>, shape: Shape) {
        let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
        let (stop, stats) = (self.stop.clone(), self.stats.clone());
        self.threads.push(std::thread::spawn(move || {
            let mut schedule = Schedule::new(shape);
            let mut buf = vec![0u8; 65_536];
            while !stop.load(Relaxed) {
                if !readable(&from) {
                    continue;
                }
                let n = match (&*from).read(&mut buf) {
                    Ok(n) => n,
                    Err(_) => break,
                };
                match schedule.admit(Instant::now(), n) {
                    Some(due) => {
                        if tx.send((due, buf[..n].to_vec())).is_err() {
                            break;
                        }
                    }
                    None => {
                        stats.dropped.fetch_add(1, Relaxed);
                    }
                }
            }
        }));
        let (stop, stats) = (self.stop.clone(), self.stats.clone());
        self.threads.push(std::thread::spawn(move || loop {
            match rx.recv_timeout(POLL) {
                Ok((due, packet)) => {
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    // A packet the far end's kernel refuses is lost, like one on a wire.
                    if (&*to).write(&packet).is_ok() {
                        stats.forwarded.fetch_add(1, Relaxed);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) if !stop.load(Relaxed) => {}
                Err(_) => break,
            }
        }));
    }
}

impl Drop for ShapedPath {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for ns in &self.namespaces {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// `struct ifreq` as TUNSETIFF reads it: the name, the flags, and the rest of the union.
#[repr(C)]
struct TunRequest {
    name: [u8; 16],
    flags: libc::c_short,
    _rest: [u8; 22],
}

/// Runs `ip` with `args`, failing with its message.
fn ip(args: &[&str]) -> Result<()> {
    run("a shaped path", ("ip", "iproute2"), args, None)
}

/// Creates [`TUN`] (layer 3, no packet information header) in this thread's namespace.
fn open_tun() -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(|e| NetError::Connection(format!("/dev/net/tun: {e} (needs root)")))?;
    let mut request = TunRequest {
        name: [0; 16],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
        _rest: [0; 22],
    };
    request.name[..TUN.len()].copy_from_slice(TUN.as_bytes());
    // SAFETY: TUNSETIFF reads an ifreq, which TunRequest lays out, and writes the name back.
    if unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut request) } < 0 {
        return Err(NetError::Connection(format!(
            "TUNSETIFF: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(file)
}

/// Waits up to [`POLL`] for a packet on `tun`.
fn readable(tun: &File) -> bool {
    let mut fd = libc::pollfd {
        fd: tun.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut fd, 1, POLL.as_millis() as libc::c_int) };
    ready > 0 && fd.revents & libc::POLLIN != 0
}

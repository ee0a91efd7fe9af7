//! Two hosts behind NATs of their own, and a public network between them, in network
//! namespaces: where NAT traversal is tested and shown.
//!
//! ```text
//!   host A 192.168.1.2 ─ NAT A ─ 10.80.1.2 ┐
//!                                          ├─ public: 10.80.1.1, 10.80.2.1 (PUBLIC)
//!   host B 192.168.1.2 ─ NAT B ─ 10.80.2.2 ┘
//! ```
//!
//! Both hosts have the same private address, as two homes would. Each NAT is a namespace
//! whose nftables rules masquerade what leaves its public side and, like a home router's
//! firewall, drop what arrives there unasked. The [`Mapping`] says how it picks public ports.
//!
//! Linux only, as root, with iproute2 and nftables; everything it creates is removed when it
//! is dropped. Sockets of a host are made on a thread inside its namespace
//! ([`NatLab::in_public`], [`NatLab::in_host`]).

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::error::Result;
use crate::netns::{in_namespace, run};

/// The public network's address on NAT A's side, where a rendezvous listens.
pub const PUBLIC: Ipv4Addr = Ipv4Addr::new(10, 80, 1, 1);
/// Each host's private address (the same in both homes).
pub const HOST: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 2);

/// How a NAT maps a private address and port to a public port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// One public port per private socket, whatever the destination (Linux's masquerade
    /// keeps the source port where it is free): what hole punching needs.
    EndpointIndependent,
    /// A public port of its own for each destination (masquerade with random ports): the
    /// address a rendezvous sees is not the one a neighbour would be sent from.
    Symmetric,
}

/// Which host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    /// Behind NAT A.
    A,
    /// Behind NAT B.
    B,
}

/// The namespaces; removed on drop.
pub struct NatLab {
    public: String,
    hosts: [String; 2],
    all: Vec<String>,
}

impl NatLab {
    /// What this machine lacks to build a lab (root, iproute2, nftables); `None` when it can.
    pub fn missing() -> Option<String> {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let tool = |t: &str| Command::new(t).arg("--version").output().is_ok();
        let (ip, nft) = (tool("ip"), tool("nft"));
        (!(root && ip && nft)).then(|| {
            format!("a NAT lab needs root, iproute2 and nftables (root {root}, ip {ip}, nft {nft})")
        })
    }

    /// Builds the public network and both homes, NAT A mapping as `a`, NAT B as `b`.
    pub fn create(a: Mapping, b: Mapping) -> Result<NatLab> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tag = format!("mmnat{}-{}", std::process::id(), NEXT.fetch_add(1, Relaxed));
        let public = format!("{tag}p");
        let mut lab = NatLab {
            public: public.clone(),
            hosts: [format!("{tag}ha"), format!("{tag}hb")],
            all: Vec::new(),
        };
        ip(&["netns", "add", &public])?;
        lab.all.push(public.clone());
        up(&public, "lo")?;
        sysctl(&public, "net.ipv4.ip_forward=1")?;
        for (i, mapping) in [a, b].into_iter().enumerate() {
            let (nat, host) = (format!("{tag}n{i}"), lab.hosts[i].clone());
            for ns in [&nat, &host] {
                ip(&["netns", "add", ns])?;
                lab.all.push(ns.clone());
                up(ns, "lo")?;
            }
            let net = i + 1;
            // The NAT's public side, facing the public network.
            let side = format!("p{net}");
            ip(&[
                "-n", &nat, "link", "add", "wan", "type", "veth", "peer", "name", &side,
            ])?;
            ip(&["-n", &nat, "link", "set", &side, "netns", &public])?;
            addr(&public, &side, &format!("10.80.{net}.1/24"))?;
            addr(&nat, "wan", &format!("10.80.{net}.2/24"))?;
            ip(&[
                "-n",
                &nat,
                "route",
                "add",
                "default",
                "via",
                &format!("10.80.{net}.1"),
            ])?;
            // The home network.
            ip(&[
                "-n", &nat, "link", "add", "lan", "type", "veth", "peer", "name", "eth0",
            ])?;
            ip(&["-n", &nat, "link", "set", "eth0", "netns", &host])?;
            addr(&nat, "lan", "192.168.1.1/24")?;
            addr(&host, "eth0", &format!("{HOST}/24"))?;
            ip(&["-n", &host, "route", "add", "default", "via", "192.168.1.1"])?;
            sysctl(&nat, "net.ipv4.ip_forward=1")?;
            nft(&nat, &rules(mapping))?;
        }
        Ok(lab)
    }

    /// Runs `f` on a thread in the public network (to make a rendezvous's sockets).
    pub fn in_public<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        in_namespace(&self.public, f)
    }

    /// Runs `f` on a thread in `host`'s home network.
    pub fn in_host<T: Send>(&self, host: Host, f: impl FnOnce() -> T + Send) -> Result<T> {
        in_namespace(&self.hosts[host as usize], f)
    }
}

impl Drop for NatLab {
    fn drop(&mut self) {
        for ns in self.all.iter().rev() {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// A home router's rules: masquerade on the way out, drop what comes in unasked.
fn rules(mapping: Mapping) -> String {
    let masquerade = match mapping {
        Mapping::EndpointIndependent => "masquerade",
        Mapping::Symmetric => "masquerade random",
    };
    format!(
        "table ip nat {{
  chain post {{ type nat hook postrouting priority 100; oifname \"wan\" {masquerade}; }}
}}
table ip filter {{
  chain input {{ type filter hook input priority 0; iifname \"wan\" ct state established,related accept; iifname \"wan\" drop; }}
  chain forward {{ type filter hook forward priority 0; iifname \"wan\" ct state established,related accept; iifname \"wan\" drop; }}
}}
"
    )
}

fn up(ns: &str, dev: &str) -> Result<()> {
    ip(&["-n", ns, "link", "set", dev, "up"])
}

fn addr(ns: &str, dev: &str, cidr: &str) -> Result<()> {
    ip(&["-n", ns, "addr", "add", cidr, "dev", dev])?;
    up(ns, dev)
}

const LAB: &str = "a NAT lab";

fn ip(args: &[&str]) -> Result<()> {
    run(LAB, ("ip", "iproute2"), args, None)
}

fn sysctl(ns: &str, setting: &str) -> Result<()> {
    let args = ["netns", "exec", ns, "sysctl", "-q", "-w", setting];
    run(LAB, ("ip", "procps"), &args, None)
}

fn nft(ns: &str, rules: &str) -> Result<()> {
    run(
        LAB,
        ("ip", "nftables"),
        &["netns", "exec", ns, "nft", "-f", "-"],
        Some(rules),
    )
}

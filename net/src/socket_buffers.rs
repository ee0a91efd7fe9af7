//! UDP socket buffers that follow the windows: a connection's receive window bounds what its
//! peer may have in flight toward this end, so a socket whose receive buffer holds the
//! largest window can hold what the peers may send before this end reads it (the kernel
//! counts its own overhead on top: Linux grants twice the size asked for that). Every endpoint's socket starts with
//! [`WANT_SOCKET_BUFFER`] each way; when a connection's
//! window grows (measured) or is stated larger, the process's sockets ask the kernel for that
//! much, up to [`MAX_SOCKET_BUFFER`] (the kernel grants at most `net.core.rmem_max` and
//! `wmem_max`; what it granted is logged).
//!
//! quinn owns an endpoint's socket, so murmur hands it a `SizedSocket`: quinn's own socket
//! for the runtime, with a second handle on the same socket (closed with it) through which the
//! buffers are resized. The size wanted is one number for the process, the largest window any
//! connection has reached (a node holds one or two endpoints), read on every receive poll.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, Runtime, TokioRuntime, UdpPoller};

/// Smallest socket buffer murmur is content with (a warning below it).
pub const SOCKET_BUFFER: usize = 2 << 20;
/// Socket buffer murmur asks for when it binds (the kernel may grant less).
pub const WANT_SOCKET_BUFFER: usize = 4 << 20;

/// Asks for [`WANT_SOCKET_BUFFER`] each way; failures leave the kernel's default.
pub(crate) fn request_socket_buffers(socket: socket2::SockRef<'_>) {
    let _ = socket.set_recv_buffer_size(WANT_SOCKET_BUFFER);
    let _ = socket.set_send_buffer_size(WANT_SOCKET_BUFFER);
}

/// The most a socket buffer is asked for: a 256 MiB window's data arrives over many round
/// trips, and the kernel's own limits stop far below this on most systems.
pub const MAX_SOCKET_BUFFER: usize = 64 << 20;

/// The buffer size every socket of the process should have: the largest window reached.
static WANTED: AtomicUsize = AtomicUsize::new(WANT_SOCKET_BUFFER);

/// A window of `bytes` was granted somewhere in this process: sockets grow their buffers to
/// it (at most [`MAX_SOCKET_BUFFER`]) on their next receive.
pub(crate) fn follow_window(bytes: u64) {
    let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    WANTED.fetch_max(bytes.min(MAX_SOCKET_BUFFER), Ordering::Relaxed);
}

/// An endpoint's socket whose buffers follow [`follow_window`].
pub(crate) struct SizedSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    /// The same socket, for setting its buffer sizes; closed when the endpoint drops this.
    handle: socket2::Socket,
    /// The size last asked for.
    asked: AtomicUsize,
}

impl fmt::Debug for SizedSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SizedSocket")
            .field("inner", &self.inner)
            .field("asked", &self.asked.load(Ordering::Relaxed))
            .finish()
    }
}

impl SizedSocket {
    /// Wraps a bound socket (with its buffers as [`crate::transport::bind_udp`] set them) for
    /// quinn's tokio runtime; must be called inside a tokio runtime.
    pub(crate) fn wrap(socket: std::net::UdpSocket) -> io::Result<Arc<Self>> {
        let handle = socket2::Socket::from(socket.try_clone()?);
        let asked = handle.recv_buffer_size()?;
        let inner = TokioRuntime.wrap_udp_socket(socket)?;
        Ok(Arc::new(SizedSocket {
            inner,
            handle,
            asked: AtomicUsize::new(asked),
        }))
    }

    /// Asks for the buffers the process wants, if it wants more than was asked.
    fn follow(&self) {
        let want = WANTED.load(Ordering::Relaxed);
        if want <= self.asked.load(Ordering::Relaxed) {
            return;
        }
        self.asked.store(want, Ordering::Relaxed);
        // A refusal leaves the buffers as they were: the transfer goes on, only less smoothly.
        let _ = self.handle.set_recv_buffer_size(want);
        let _ = self.handle.set_send_buffer_size(want);
        let granted = (
            self.handle.recv_buffer_size().unwrap_or(0),
            self.handle.send_buffer_size().unwrap_or(0),
        );
        tracing::debug!(
            "UDP buffers: asked {want} bytes each way for the windows, the kernel granted {} / {}",
            granted.0,
            granted.1
        );
    }

    /// The receive buffer the kernel reports now.
    #[cfg(test)]
    fn recv_buffer(&self) -> usize {
        self.handle.recv_buffer_size().unwrap_or(0)
    }
}

impl AsyncUdpSocket for SizedSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [io::IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.follow();
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn a_socket_grows_its_buffers_to_the_windows_granted() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _inside = runtime.enter();
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        // Start small, below what any system allows, to see it grow.
        socket2::SockRef::from(&socket)
            .set_recv_buffer_size(64 << 10)
            .unwrap();
        let sized = SizedSocket::wrap(socket).unwrap();
        let before = sized.recv_buffer();
        follow_window(1 << 20);
        sized.follow();
        // The kernel grants up to rmem_max (208 KiB unless raised) and reports twice what it
        // granted (its bookkeeping).
        let cap: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(212_992);
        let after = sized.recv_buffer();
        assert!(
            after > before && after >= cap.min(1 << 20),
            "{before} -> {after} (rmem_max {cap})"
        );
        // A window past the cap asks for the cap, no more.
        follow_window(u64::MAX);
        sized.follow();
        assert_eq!(sized.asked.load(Ordering::Relaxed), MAX_SOCKET_BUFFER);
    }
}

//! The network seam: how connections are made and accepted.
//!
//! Everything above a byte stream ([`crate::net::RpcConn`], [`crate::net::serve_with`],
//! [`crate::net::accept_loop`]) is written against [`Transport`], so the same request,
//! reply, timeout and budget code runs over TCP in the daemons and over [`mem::MemNet`]
//! in tests, where the network is a seeded, in-process one with delays, arbitrary
//! segmentation, stalls (a partition: bytes wait, as TCP's retransmissions would) and
//! resets, under tokio's paused clock (minutes of timeouts in milliseconds).
//!
//! A stream transport has TCP's guarantees and nothing more: bytes of one connection
//! arrive in order, once, or the connection fails; there is no loss or duplication inside
//! a connection (the simulated datagram network with loss and duplication is
//! `spindle-sim`'s, which carries messages, not streams).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// Makes and accepts byte-stream connections. Cheap to clone (shared by tasks).
pub trait Transport: Clone + Send + Sync + 'static {
    type Read: AsyncRead + Send + Unpin + 'static;
    type Write: AsyncWrite + Send + Unpin + 'static;
    type Listener: Send + Sync + 'static;

    /// Opens a connection to `addr` (no timeout here: the caller sets one).
    fn connect(
        &self,
        addr: &str,
    ) -> impl Future<Output = io::Result<(Self::Read, Self::Write)>> + Send;

    /// Waits for the next connection; returns its halves and the peer's address.
    fn accept(
        &self,
        listener: &Self::Listener,
    ) -> impl Future<Output = io::Result<(Self::Read, Self::Write, String)>> + Send;
}

/// TCP with the options every Spindle connection uses: no Nagle delay, and keepalive on
/// accepted connections (a peer host that vanished is noticed even on an idle socket).
#[derive(Clone, Copy, Debug, Default)]
pub struct Tcp;

/// TCP keepalive on accepted connections: a peer that vanished without a FIN or RST (host
/// crash, partition) is noticed after about idle + interval * retries.
const KEEPALIVE_IDLE_MS: u64 = 30_000;
const KEEPALIVE_INTERVAL_MS: u64 = 10_000;
const KEEPALIVE_RETRIES: u32 = 3;

fn set_keepalive(stream: &tokio::net::TcpStream) {
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_millis(KEEPALIVE_IDLE_MS))
        .with_interval(Duration::from_millis(KEEPALIVE_INTERVAL_MS))
        .with_retries(KEEPALIVE_RETRIES);
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&ka) {
        tracing::debug!("cannot set TCP keepalive: {e}");
    }
}

/// The halves of an accepted TCP stream, with its options set.
pub fn tcp_accepted(
    stream: tokio::net::TcpStream,
) -> (
    tokio::net::tcp::OwnedReadHalf,
    tokio::net::tcp::OwnedWriteHalf,
    String,
) {
    let _ = stream.set_nodelay(true);
    set_keepalive(&stream);
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".to_string());
    let (r, w) = stream.into_split();
    (r, w, peer)
}

impl Transport for Tcp {
    type Read = tokio::net::tcp::OwnedReadHalf;
    type Write = tokio::net::tcp::OwnedWriteHalf;
    type Listener = tokio::net::TcpListener;

    async fn connect(&self, addr: &str) -> io::Result<(Self::Read, Self::Write)> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(stream.into_split())
    }

    async fn accept(
        &self,
        listener: &Self::Listener,
    ) -> io::Result<(Self::Read, Self::Write, String)> {
        let (stream, _) = listener.accept().await?;
        Ok(tcp_accepted(stream))
    }
}

pub mod mem {
    //! An in-process stream network for tests: named hosts, listeners on addresses,
    //! connections whose bytes cross a relay per direction that cuts them into seeded
    //! segments, delays each segment, holds them while the two hosts are partitioned and
    //! fails the connection on a reset. Use it under `tokio::time::pause` for timeouts.

    use super::Transport;
    use std::collections::{BTreeSet, HashMap};
    use std::io;
    use std::sync::{Arc, Mutex, MutexGuard};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio::sync::{mpsc, watch};

    /// Bytes a relay moves at most per segment.
    const SEGMENT_BYTES_MAX: usize = 64 << 10;
    /// Buffer of each side's in-process pipe.
    const PIPE_BYTES: usize = 256 << 10;

    /// How the network treats bytes.
    #[derive(Clone, Copy, Debug)]
    pub struct MemNetConfig {
        pub seed: u64,
        /// Each segment is delayed by a uniformly drawn time in this range (ms).
        pub delay_ms_min: u64,
        pub delay_ms_max: u64,
        /// Segments are at most this long (1 cuts every byte apart).
        pub segment_bytes_max: usize,
    }

    impl Default for MemNetConfig {
        fn default() -> Self {
            MemNetConfig {
                seed: 1,
                delay_ms_min: 0,
                delay_ms_max: 0,
                segment_bytes_max: SEGMENT_BYTES_MAX,
            }
        }
    }

    type Accepted = (DuplexStream, DuplexStream, String);

    struct State {
        cfg: MemNetConfig,
        rng: u64,
        listeners: HashMap<String, (String, mpsc::UnboundedSender<Accepted>)>,
        /// Unordered host pairs that cannot exchange bytes now.
        partitions: BTreeSet<(String, String)>,
        /// Bumped by every partition change, so held relays look again.
        changes: watch::Sender<u64>,
        /// Per host pair, the resets so far (a relay of an older generation fails).
        resets: HashMap<(String, String), u64>,
        connections: u64,
    }

    impl State {
        /// xorshift64*: enough for segment sizes and delays, and the same for a seed.
        fn next(&mut self) -> u64 {
            let mut x = self.rng;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.rng = x;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            if n == 0 {
                0
            } else {
                self.next() % n
            }
        }
    }

    fn pair(a: &str, b: &str) -> (String, String) {
        if a <= b {
            (a.to_string(), b.to_string())
        } else {
            (b.to_string(), a.to_string())
        }
    }

    /// The network: hosts get a [`MemTransport`] each with [`MemNet::host`].
    #[derive(Clone)]
    pub struct MemNet {
        state: Arc<Mutex<State>>,
    }

    impl MemNet {
        pub fn new(cfg: MemNetConfig) -> MemNet {
            MemNet {
                state: Arc::new(Mutex::new(State {
                    cfg,
                    rng: cfg.seed.max(1),
                    listeners: HashMap::new(),
                    partitions: BTreeSet::new(),
                    changes: watch::channel(0).0,
                    resets: HashMap::new(),
                    connections: 0,
                })),
            }
        }

        fn lock(&self) -> MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(|p| p.into_inner())
        }

        /// The transport of host `name`.
        pub fn host(&self, name: &str) -> MemTransport {
            MemTransport {
                net: self.clone(),
                me: name.to_string(),
            }
        }

        /// Bytes between hosts `a` and `b` wait (in both directions) until [`MemNet::heal`];
        /// connections stay open, as TCP's would while retransmitting. New connections
        /// between them hang in `connect`.
        pub fn partition(&self, a: &str, b: &str) {
            let mut s = self.lock();
            s.partitions.insert(pair(a, b));
            s.changes.send_modify(|n| *n += 1);
        }

        pub fn heal(&self, a: &str, b: &str) {
            let mut s = self.lock();
            s.partitions.remove(&pair(a, b));
            s.changes.send_modify(|n| *n += 1);
        }

        /// Fails every open connection between `a` and `b` (both ends see an error).
        pub fn reset(&self, a: &str, b: &str) {
            let mut s = self.lock();
            *s.resets.entry(pair(a, b)).or_insert(0) += 1;
            s.changes.send_modify(|n| *n += 1);
        }

        /// Connections made so far.
        pub fn connections(&self) -> u64 {
            self.lock().connections
        }

        fn partitioned(&self, link: &(String, String)) -> bool {
            self.lock().partitions.contains(link)
        }

        fn generation(&self, link: &(String, String)) -> u64 {
            self.lock().resets.get(link).copied().unwrap_or(0)
        }

        /// Moves bytes from `from` to `to` segment by segment until either side closes,
        /// the link is reset, or the relay's owner goes.
        async fn relay(self, link: (String, String), mut from: DuplexStream, mut to: DuplexStream) {
            let generation = self.generation(&link);
            let mut changes = self.lock().changes.subscribe();
            let mut buf = vec![0u8; SEGMENT_BYTES_MAX];
            loop {
                let want = {
                    let mut s = self.lock();
                    let max = s.cfg.segment_bytes_max.clamp(1, SEGMENT_BYTES_MAX);
                    1 + s.below(max as u64) as usize
                };
                let n = tokio::select! {
                    r = from.read(&mut buf[..want]) => match r {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    },
                    _ = changes.changed() => {
                        if self.generation(&link) != generation {
                            break;
                        }
                        continue;
                    }
                };
                let delay_ms = {
                    let mut s = self.lock();
                    let (lo, hi) = (
                        s.cfg.delay_ms_min,
                        s.cfg.delay_ms_max.max(s.cfg.delay_ms_min),
                    );
                    lo + s.below(hi - lo + 1)
                };
                if delay_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                }
                // Held while partitioned; a reset ends the connection.
                while self.partitioned(&link) {
                    if self.generation(&link) != generation {
                        return;
                    }
                    if changes.changed().await.is_err() {
                        return;
                    }
                }
                if self.generation(&link) != generation {
                    return;
                }
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            // Dropping `to` (and `from`) ends the reader's stream and fails the writer's
            // next write.
            let _ = to.shutdown().await;
        }
    }

    /// One host's view of a [`MemNet`].
    #[derive(Clone)]
    pub struct MemTransport {
        net: MemNet,
        me: String,
    }

    impl std::fmt::Debug for MemTransport {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "MemTransport({})", self.me)
        }
    }

    /// A listener of a [`MemTransport`] (closed when dropped).
    pub struct MemListener {
        addr: String,
        rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<Accepted>>,
        net: MemNet,
    }

    impl Drop for MemListener {
        fn drop(&mut self) {
            self.net.lock().listeners.remove(&self.addr);
        }
    }

    impl MemTransport {
        pub fn name(&self) -> &str {
            &self.me
        }

        /// Listens on `addr` (any unique string, e.g. "osd.1:6800").
        pub fn bind(&self, addr: &str) -> io::Result<MemListener> {
            let mut s = self.net.lock();
            if s.listeners.contains_key(addr) {
                return Err(io::Error::new(io::ErrorKind::AddrInUse, addr.to_string()));
            }
            let (tx, rx) = mpsc::unbounded_channel();
            s.listeners.insert(addr.to_string(), (self.me.clone(), tx));
            Ok(MemListener {
                addr: addr.to_string(),
                rx: tokio::sync::Mutex::new(rx),
                net: self.net.clone(),
            })
        }
    }

    impl Transport for MemTransport {
        type Read = DuplexStream;
        type Write = DuplexStream;
        type Listener = MemListener;

        async fn connect(&self, addr: &str) -> io::Result<(Self::Read, Self::Write)> {
            let (server_host, tx) = match self.net.lock().listeners.get(addr) {
                Some((host, tx)) => (host.clone(), tx.clone()),
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        format!("nothing listens on {addr}"),
                    ))
                }
            };
            let link = pair(&self.me, &server_host);
            // A partitioned connect hangs like a SYN nobody answers (the caller's timeout
            // decides), and goes on if the partition heals first.
            let mut changes = self.net.lock().changes.subscribe();
            while self.net.partitioned(&link) {
                if changes.changed().await.is_err() {
                    return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "closed"));
                }
            }
            // One pipe per direction and side, so that dropping a write half ends the
            // stream for the reader (as closing a TCP socket's write side sends a FIN).
            let (client_write, c2s_in) = tokio::io::duplex(PIPE_BYTES);
            let (c2s_out, server_read) = tokio::io::duplex(PIPE_BYTES);
            let (server_write, s2c_in) = tokio::io::duplex(PIPE_BYTES);
            let (s2c_out, client_read) = tokio::io::duplex(PIPE_BYTES);
            tokio::spawn(self.net.clone().relay(link.clone(), c2s_in, c2s_out));
            tokio::spawn(self.net.clone().relay(link, s2c_in, s2c_out));
            if tx
                .send((server_read, server_write, self.me.clone()))
                .is_err()
            {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("{addr} stopped listening"),
                ));
            }
            self.net.lock().connections += 1;
            Ok((client_read, client_write))
        }

        async fn accept(
            &self,
            listener: &Self::Listener,
        ) -> io::Result<(Self::Read, Self::Write, String)> {
            match listener.rx.lock().await.recv().await {
                Some(a) => Ok(a),
                None => Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    "listener closed",
                )),
            }
        }
    }
}

/// The transport a process is configured with: TCP, or a host of an in-process
/// [`mem::MemNet`] (tests that run monitors, daemons and clients in one process with
/// partitions between them). One match per poll; the TCP arms are the plain halves.
#[derive(Clone, Debug, Default)]
pub enum Net {
    #[default]
    Tcp,
    Mem(mem::MemTransport),
}

/// The read half of a [`Net`] connection.
pub enum NetRead {
    Tcp(tokio::net::tcp::OwnedReadHalf),
    Mem(tokio::io::DuplexStream),
}

/// The write half of a [`Net`] connection.
pub enum NetWrite {
    Tcp(tokio::net::tcp::OwnedWriteHalf),
    Mem(tokio::io::DuplexStream),
}

/// A listener of a [`Net`].
pub enum NetListener {
    Tcp(tokio::net::TcpListener),
    Mem(mem::MemListener),
}

impl Net {
    /// Listens on `addr`; returns the listener and the address peers are to use (a TCP
    /// port 0 becomes the port picked).
    pub async fn bind(&self, addr: &str) -> io::Result<(NetListener, String)> {
        match self {
            Net::Tcp => {
                let l = tokio::net::TcpListener::bind(addr).await?;
                let bound = l.local_addr()?.to_string();
                Ok((NetListener::Tcp(l), bound))
            }
            Net::Mem(t) => Ok((NetListener::Mem(t.bind(addr)?), addr.to_string())),
        }
    }
}

impl Transport for Net {
    type Read = NetRead;
    type Write = NetWrite;
    type Listener = NetListener;

    async fn connect(&self, addr: &str) -> io::Result<(NetRead, NetWrite)> {
        match self {
            Net::Tcp => {
                let (r, w) = Tcp.connect(addr).await?;
                Ok((NetRead::Tcp(r), NetWrite::Tcp(w)))
            }
            Net::Mem(t) => {
                let (r, w) = t.connect(addr).await?;
                Ok((NetRead::Mem(r), NetWrite::Mem(w)))
            }
        }
    }

    async fn accept(&self, listener: &NetListener) -> io::Result<(NetRead, NetWrite, String)> {
        match (self, listener) {
            (_, NetListener::Tcp(l)) => {
                let (r, w, peer) = Tcp.accept(l).await?;
                Ok((NetRead::Tcp(r), NetWrite::Tcp(w), peer))
            }
            (Net::Mem(t), NetListener::Mem(l)) => {
                let (r, w, peer) = t.accept(l).await?;
                Ok((NetRead::Mem(r), NetWrite::Mem(w), peer))
            }
            (Net::Tcp, NetListener::Mem(_)) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an in-process listener on the TCP transport",
            )),
        }
    }
}

impl AsyncRead for NetRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            NetRead::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            NetRead::Mem(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for NetWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            NetWrite::Tcp(w) => Pin::new(w).poll_write(cx, buf),
            NetWrite::Mem(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            NetWrite::Tcp(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            NetWrite::Mem(w) => Pin::new(w).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            NetWrite::Tcp(w) => w.is_write_vectored(),
            NetWrite::Mem(w) => w.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            NetWrite::Tcp(w) => Pin::new(w).poll_flush(cx),
            NetWrite::Mem(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            NetWrite::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            NetWrite::Mem(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

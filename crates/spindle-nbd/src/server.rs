//! Listener loops, configuration and statistics.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{debug, info};

use crate::device::Exports;
use crate::{handshake, transmission};

/// Server tuning. Invalid values are rejected by [`NbdServer::new`] (a caller bug).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Largest READ/WRITE payload accepted, advertised as the maximum block size.
    /// Bounds the memory one request can pin. Default 32 MiB; must be in 512..=2^30.
    pub max_request_bytes: u32,
    /// Device operations run concurrently per connection; when reached, the server stops
    /// reading that socket (backpressure). Default 64; must be >= 1.
    pub requests_in_flight_per_connection: usize,
    /// Advertised preferred block size. Default 4096; a power of two <= max_request_bytes.
    pub preferred_block_bytes: u32,
    /// WRITE payload bytes held by the whole server at once (all connections): a WRITE
    /// waits (and its connection is not read) until its bytes fit. Default 256 MiB;
    /// must be >= max_request_bytes.
    pub payload_budget_bytes: u64,
    /// A WRITE payload must arrive within this time plus `payload_deadline_ms_per_mib` per
    /// MiB once its header was read; a client that stops half way is disconnected (it
    /// would otherwise pin its buffer for ever). Default 10 s + 1 s/MiB.
    pub payload_deadline_ms_base: u64,
    pub payload_deadline_ms_per_mib: u64,
    /// The handshake must finish within this time (a connection that never negotiates is
    /// closed). Default 30 s.
    pub handshake_timeout_ms: u64,
}

// Accept failures (e.g. EMFILE) back off and are logged at most once per interval with a
// count; the payload budget is a semaphore of bytes (both `spindle_serve`, shared with the
// cluster protocol's servers).
use spindle_serve::{AcceptBackoff, PayloadBudget};

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_request_bytes: 32 * 1024 * 1024,
            requests_in_flight_per_connection: 64,
            preferred_block_bytes: 4096,
            payload_budget_bytes: 256 << 20,
            payload_deadline_ms_base: 10_000,
            payload_deadline_ms_per_mib: 1_000,
            handshake_timeout_ms: 30_000,
        }
    }
}

/// A snapshot of the server counters (monotonic except `connections_active`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub connections_accepted: u64,
    pub connections_active: u64,
    /// Connections that reached the transmission phase.
    pub sessions_started: u64,
    pub requests_read: u64,
    pub requests_write: u64,
    pub requests_flush: u64,
    pub requests_trim: u64,
    pub requests_write_zeroes: u64,
    pub requests_cache: u64,
    pub requests_block_status: u64,
    pub requests_disc: u64,
    /// Requests with an unknown command type.
    pub requests_unknown: u64,
    /// Payload bytes sent to clients by READ.
    pub bytes_read: u64,
    /// Payload bytes received from clients by WRITE.
    pub bytes_written: u64,
    /// Requests answered with an error (validation or device error).
    pub error_replies: u64,
    /// Connections dropped because the client broke the protocol.
    pub protocol_errors: u64,
    /// Connections dropped because a WRITE payload or the handshake stalled.
    pub stalled_connections: u64,
    /// WRITE payload bytes held now, and the most held since the last
    /// [`NbdServer::take_payload_peak_bytes`].
    pub payload_bytes_in_use: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub connections_accepted: AtomicU64,
    pub connections_active: AtomicU64,
    pub sessions_started: AtomicU64,
    pub requests_read: AtomicU64,
    pub requests_write: AtomicU64,
    pub requests_flush: AtomicU64,
    pub requests_trim: AtomicU64,
    pub requests_write_zeroes: AtomicU64,
    pub requests_cache: AtomicU64,
    pub requests_block_status: AtomicU64,
    pub requests_disc: AtomicU64,
    pub requests_unknown: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub error_replies: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub stalled_connections: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Decrements `connections_active` when a connection task ends, however it ends.
struct ActiveGuard<'a>(&'a AtomicU64);
impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An NBD server for the exports of `E`.
pub struct NbdServer<E: Exports> {
    pub(crate) exports: Arc<E>,
    pub(crate) config: ServerConfig,
    pub(crate) counters: Counters,
    pub(crate) payload_budget: PayloadBudget,
}

/// Resolves once the watch value is `true`. A dropped sender never resolves.
pub(crate) async fn wait_shutdown(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl<E: Exports> NbdServer<E> {
    /// Panics if `config` is invalid (see [`ServerConfig`] field docs).
    pub fn new(exports: Arc<E>, config: ServerConfig) -> Self {
        assert!(
            (512..=1 << 30).contains(&config.max_request_bytes),
            "max_request_bytes {} outside 512..=2^30",
            config.max_request_bytes
        );
        assert!(
            config.preferred_block_bytes.is_power_of_two()
                && config.preferred_block_bytes <= config.max_request_bytes,
            "preferred_block_bytes {} must be a power of two <= max_request_bytes",
            config.preferred_block_bytes
        );
        assert!(
            (1..=1 << 20).contains(&config.requests_in_flight_per_connection),
            "requests_in_flight_per_connection must be in 1..=2^20"
        );
        assert!(
            config.payload_budget_bytes >= config.max_request_bytes as u64,
            "payload_budget_bytes {} must hold one request of max_request_bytes {}",
            config.payload_budget_bytes,
            config.max_request_bytes
        );
        NbdServer {
            exports,
            payload_budget: PayloadBudget::new(config.payload_budget_bytes),
            config,
            counters: Counters::default(),
        }
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    pub fn stats(&self) -> ServerStats {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ServerStats {
            connections_accepted: g(&c.connections_accepted),
            connections_active: g(&c.connections_active),
            sessions_started: g(&c.sessions_started),
            requests_read: g(&c.requests_read),
            requests_write: g(&c.requests_write),
            requests_flush: g(&c.requests_flush),
            requests_trim: g(&c.requests_trim),
            requests_write_zeroes: g(&c.requests_write_zeroes),
            requests_cache: g(&c.requests_cache),
            requests_block_status: g(&c.requests_block_status),
            requests_disc: g(&c.requests_disc),
            requests_unknown: g(&c.requests_unknown),
            bytes_read: g(&c.bytes_read),
            bytes_written: g(&c.bytes_written),
            error_replies: g(&c.error_replies),
            protocol_errors: g(&c.protocol_errors),
            stalled_connections: g(&c.stalled_connections),
            payload_bytes_in_use: self.payload_budget.in_use_bytes(),
        }
    }

    /// Most WRITE payload bytes held at once since the previous call (then restarts from
    /// what is held now). The `spindle nbd` process trims its heap after a burst.
    pub fn take_payload_peak_bytes(&self) -> u64 {
        self.payload_budget.take_peak_bytes()
    }

    /// Accepts TCP connections until `shutdown` turns true, then waits for every
    /// connection to finish its in-flight requests. Accept errors (e.g. EMFILE) are
    /// logged and retried; they do not end the server.
    pub async fn serve_tcp(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        shutdown: watch::Receiver<bool>,
    ) -> io::Result<()> {
        self.serve_loop(
            || async {
                let (s, peer) = listener.accept().await?;
                // Small replies (write acks) must not wait for Nagle.
                if let Err(e) = s.set_nodelay(true) {
                    debug!(error = %e, "set_nodelay failed");
                }
                set_keepalive(&s);
                Ok((s, peer.to_string()))
            },
            shutdown,
        )
        .await
    }

    /// Like [`NbdServer::serve_tcp`], on a Unix-domain socket.
    pub async fn serve_unix(
        self: Arc<Self>,
        listener: tokio::net::UnixListener,
        shutdown: watch::Receiver<bool>,
    ) -> io::Result<()> {
        self.serve_loop(
            || async {
                let (s, peer) = listener.accept().await?;
                Ok((s, format!("{peer:?}")))
            },
            shutdown,
        )
        .await
    }

    async fn serve_loop<S, F, Fut>(
        self: Arc<Self>,
        mut accept: F,
        shutdown: watch::Receiver<bool>,
    ) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = io::Result<(S, String)>>,
    {
        let mut stop = shutdown.clone();
        let mut conns = JoinSet::new();
        let mut backoff = AcceptBackoff::new();
        loop {
            tokio::select! {
                biased;
                _ = wait_shutdown(&mut stop) => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                r = accept() => match r {
                    Ok((stream, peer)) => {
                        backoff.accepted();
                        debug!(%peer, "nbd connection accepted");
                        let server = self.clone();
                        let sd = shutdown.clone();
                        conns.spawn(async move {
                            if let Err(e) = server.serve_connection(stream, sd).await {
                                debug!(%peer, error = %e, "nbd connection ended with error");
                            }
                        });
                    }
                    Err(e) => backoff.pause_after("nbd", &e).await,
                },
            }
        }
        info!(connections = conns.len(), "nbd server shutting down");
        while conns.join_next().await.is_some() {}
        Ok(())
    }

    /// Serves one already-accepted connection (any byte stream) to completion: handshake,
    /// then transmission until the client disconnects, breaks the protocol, or `shutdown`
    /// turns true.
    pub async fn serve_connection<S>(
        self: &Arc<Self>,
        stream: S,
        mut shutdown: watch::Receiver<bool>,
    ) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        bump(&self.counters.connections_accepted, 1);
        bump(&self.counters.connections_active, 1);
        let _active = ActiveGuard(&self.counters.connections_active);
        let (rd, mut wr) = tokio::io::split(stream);
        let mut rd = BufReader::with_capacity(256 * 1024, rd);
        let handshake_timeout = Duration::from_millis(self.config.handshake_timeout_ms);
        let session = tokio::select! {
            r = tokio::time::timeout(handshake_timeout, handshake::negotiate(self, &mut rd, &mut wr)) => match r {
                Ok(r) => r?,
                Err(_) => {
                    bump(&self.counters.stalled_connections, 1);
                    debug!("nbd handshake not finished after {handshake_timeout:?}: closing");
                    None
                }
            },
            _ = wait_shutdown(&mut shutdown) => None,
        };
        let Some(session) = session else {
            return Ok(());
        };
        bump(&self.counters.sessions_started, 1);
        transmission::run(self.clone(), session, rd, wr, shutdown).await
    }
}

/// TCP keepalive: a client that vanished without a FIN or RST (host crash, partition) is
/// noticed after about two minutes instead of never.
fn set_keepalive(s: &tokio::net::TcpStream) {
    let sock = socket2::SockRef::from(s);
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(60))
        .with_interval(Duration::from_secs(15))
        .with_retries(4);
    if let Err(e) = sock.set_tcp_keepalive(&ka) {
        debug!(error = %e, "cannot set TCP keepalive");
    }
}

//! Shared test helpers: an in-process server on 127.0.0.1:0 (own runtime thread) and
//! checks for the external NBD client tools.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;
use std::thread::JoinHandle;

use spindle_nbd::{MemoryDevice, MemoryExports, NbdServer, ServerConfig};
use tokio::sync::watch;

pub struct TestServer {
    pub port: u16,
    pub exports: Arc<MemoryExports>,
    pub server: Arc<NbdServer<MemoryExports>>,
    shutdown: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    pub fn start(exports: MemoryExports) -> TestServer {
        Self::start_with(exports, ServerConfig::default())
    }

    /// Serves on a Unix-domain socket at `path` (`port` is 0).
    pub fn start_unix(exports: MemoryExports, path: &std::path::Path) -> TestServer {
        Self::spawn(exports, ServerConfig::default(), Some(path.to_path_buf()))
    }

    pub fn start_with(exports: MemoryExports, config: ServerConfig) -> TestServer {
        Self::spawn(exports, config, None)
    }

    fn spawn(exports: MemoryExports, config: ServerConfig, unix: Option<PathBuf>) -> TestServer {
        let exports = Arc::new(exports);
        let server = Arc::new(NbdServer::new(exports.clone(), config));
        let (shutdown, rx) = watch::channel(false);
        let (port_tx, port_rx) = std::sync::mpsc::channel();
        let srv = server.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Some(path) = unix {
                    let listener = tokio::net::UnixListener::bind(&path).unwrap();
                    port_tx.send(0).unwrap();
                    srv.serve_unix(listener, rx).await.unwrap();
                } else {
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                    port_tx.send(listener.local_addr().unwrap().port()).unwrap();
                    srv.serve_tcp(listener, rx).await.unwrap();
                }
            });
        });
        let port = port_rx.recv().expect("server thread failed to start");
        TestServer {
            port,
            exports,
            server,
            shutdown,
            thread: Some(thread),
        }
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd://127.0.0.1:{}/{}", self.port, export)
    }

    pub fn device(&self, name: &str) -> Arc<MemoryDevice> {
        self.exports.get(name).expect("export exists")
    }

    /// Signals shutdown and waits for the server to drain and return.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(t) = self.thread.take() {
            t.join().expect("server thread panicked");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.stop_inner();
        } else {
            let _ = self.shutdown.send(true);
        }
    }
}

/// Panics (never skips) if an external client tool is not installed.
pub fn require_tool(name: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "required NBD client tool `{name}` is not installed; install it with \
         `apt-get install -y libnbd-bin qemu-utils fio` (this test must not be skipped)"
    );
}

/// Runs a tool, panicking with its full output if it fails.
pub fn run(cmd: &str, args: &[&str]) -> Output {
    require_tool(cmd);
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd}: {e}"));
    if !out.status.success() {
        panic!(
            "`{cmd} {}` failed with {}\nstdout:\n{}\nstderr:\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// A fresh scratch directory under the system temp dir.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "spindle-nbd-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Deterministic pseudo-random bytes (xorshift64*).
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

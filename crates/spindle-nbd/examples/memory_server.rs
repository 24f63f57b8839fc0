//! Serves in-memory exports over NBD until Ctrl-C.
//!
//! `cargo run -p spindle-nbd --example memory_server -- 127.0.0.1:10809`, then e.g.
//! `nbdinfo --list nbd://127.0.0.1:10809` or `qemu-io -f raw nbd://127.0.0.1:10809/disk0`.

use std::sync::Arc;

use spindle_nbd::{MemoryDevice, MemoryExports, NbdServer, ServerConfig};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:10809".to_string());
    let exports = MemoryExports::new();
    exports.insert(
        "disk0",
        "64 MiB scratch disk",
        Arc::new(MemoryDevice::new(64 << 20)),
    );
    exports.insert(
        "small",
        "1 MiB + 512 B",
        Arc::new(MemoryDevice::new((1 << 20) + 512)),
    );
    exports.set_default("disk0");
    let server = Arc::new(NbdServer::new(Arc::new(exports), ServerConfig::default()));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("serving NBD on {}", listener.local_addr()?);
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        let _ = tx.send(true);
    });
    server.serve_tcp(listener, rx).await
}

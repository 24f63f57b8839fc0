//! Raw-socket protocol tests: a hand-written client speaks NBD bytes to the server and
//! checks the exact replies, including error and disconnect behaviour.

mod common;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::TestServer;
use spindle_nbd::proto::*;
use spindle_nbd::{
    BlockDevice, DeviceError, ExportInfo, Exports, MemoryDevice, MemoryExports, NbdServer,
    ServerConfig,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const T: Duration = Duration::from_secs(10);

async fn timeout<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(T, f)
        .await
        .expect("timed out waiting for the server")
}

/// Connects and completes the greeting with the given client flags.
async fn connect(port: u16, client_flags: u32) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut g = [0u8; 18];
    timeout(s.read_exact(&mut g)).await.unwrap();
    assert_eq!(&g[0..8], &NBD_MAGIC.to_be_bytes());
    assert_eq!(&g[8..16], &IHAVEOPT.to_be_bytes());
    assert_eq!(
        u16::from_be_bytes([g[16], g[17]]),
        NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES
    );
    s.write_all(&client_flags.to_be_bytes()).await.unwrap();
    s
}

async fn send_opt(s: &mut TcpStream, opt: u32, data: &[u8]) {
    let mut b = Vec::new();
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b).await.unwrap();
}

async fn read_opt_reply(s: &mut TcpStream) -> (u32, u32, Vec<u8>) {
    let mut h = [0u8; 20];
    timeout(s.read_exact(&mut h)).await.unwrap();
    assert_eq!(&h[0..8], &OPTION_REPLY_MAGIC.to_be_bytes());
    let opt = u32::from_be_bytes(h[8..12].try_into().unwrap());
    let rep = u32::from_be_bytes(h[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    let mut d = vec![0u8; len as usize];
    timeout(s.read_exact(&mut d)).await.unwrap();
    (opt, rep, d)
}

fn info_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

/// Sends INFO/GO; returns Ok((size, flags, info replies)) or Err(error reply type).
async fn info_or_go(
    s: &mut TcpStream,
    opt: u32,
    name: &str,
    infos: &[u16],
) -> Result<(u64, u16, Vec<Vec<u8>>), u32> {
    send_opt(s, opt, &info_data(name, infos)).await;
    let mut export = None;
    let mut all = Vec::new();
    loop {
        let (o, rep, d) = read_opt_reply(s).await;
        assert_eq!(o, opt);
        match rep {
            NBD_REP_INFO => {
                let t = u16::from_be_bytes([d[0], d[1]]);
                if t == NBD_INFO_EXPORT {
                    assert_eq!(d.len(), 12);
                    export = Some((
                        u64::from_be_bytes(d[2..10].try_into().unwrap()),
                        u16::from_be_bytes([d[10], d[11]]),
                    ));
                }
                all.push(d);
            }
            NBD_REP_ACK => {
                let (size, flags) = export.expect("NBD_INFO_EXPORT before ACK");
                return Ok((size, flags, all));
            }
            e => return Err(e),
        }
    }
}

async fn structured_reply(s: &mut TcpStream) {
    send_opt(s, NBD_OPT_STRUCTURED_REPLY, &[]).await;
    assert_eq!(read_opt_reply(s).await.1, NBD_REP_ACK);
}

/// Connect + optional structured replies + GO `name`.
async fn session(port: u16, name: &str, structured: bool) -> (TcpStream, u64, u16) {
    let mut s = connect(port, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES).await;
    if structured {
        structured_reply(&mut s).await;
    }
    let (size, flags, _) = info_or_go(&mut s, NBD_OPT_GO, name, &[]).await.expect("GO");
    (s, size, flags)
}

async fn send_req(
    s: &mut TcpStream,
    flags: u16,
    cmd: u16,
    handle: u64,
    offset: u64,
    len: u32,
    data: &[u8],
) {
    let mut b = RequestHeader::encode(flags, cmd, handle, offset, len).to_vec();
    b.extend_from_slice(data);
    s.write_all(&b).await.unwrap();
}

/// Reads a simple reply; returns (errno, handle).
async fn simple_reply(s: &mut TcpStream) -> (u32, u64) {
    let mut h = [0u8; 16];
    timeout(s.read_exact(&mut h)).await.unwrap();
    assert_eq!(
        &h[0..4],
        &NBD_SIMPLE_REPLY_MAGIC.to_be_bytes(),
        "simple reply magic"
    );
    (
        u32::from_be_bytes(h[4..8].try_into().unwrap()),
        u64::from_be_bytes(h[8..16].try_into().unwrap()),
    )
}

struct Chunk {
    flags: u16,
    kind: u16,
    handle: u64,
    payload: Vec<u8>,
}

async fn chunk(s: &mut TcpStream) -> Chunk {
    let mut h = [0u8; 20];
    timeout(s.read_exact(&mut h)).await.unwrap();
    assert_eq!(
        &h[0..4],
        &NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes(),
        "structured reply magic"
    );
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    let mut payload = vec![0u8; len as usize];
    timeout(s.read_exact(&mut payload)).await.unwrap();
    Chunk {
        flags: u16::from_be_bytes([h[4], h[5]]),
        kind: u16::from_be_bytes([h[6], h[7]]),
        handle: u64::from_be_bytes(h[8..16].try_into().unwrap()),
        payload,
    }
}

fn error_chunk_errno(c: &Chunk) -> u32 {
    assert_eq!(c.kind, NBD_REPLY_TYPE_ERROR);
    assert_eq!(c.flags & NBD_REPLY_FLAG_DONE, NBD_REPLY_FLAG_DONE);
    let msg_len = u16::from_be_bytes([c.payload[4], c.payload[5]]) as usize;
    assert_eq!(c.payload.len(), 6 + msg_len);
    assert!(msg_len > 0, "error chunk carries a message");
    u32::from_be_bytes(c.payload[0..4].try_into().unwrap())
}

/// Asserts the server closes the connection (EOF or reset) within the timeout.
async fn assert_closed(s: &mut TcpStream) {
    let mut b = [0u8; 64];
    match timeout(s.read(&mut b)).await {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("expected close, got {n} more bytes: {:?}", &b[..n]),
    }
}

fn mem_exports(size: u64) -> MemoryExports {
    let e = MemoryExports::new();
    e.insert("d", "test disk", Arc::new(MemoryDevice::new(size)));
    e
}

#[tokio::test]
async fn bad_request_magic_drops_only_that_client() {
    let srv = TestServer::start(mem_exports(1 << 20));
    let (mut bad, _, _) = session(srv.port, "d", false).await;
    let (mut good, _, _) = session(srv.port, "d", false).await;
    let mut garbage = RequestHeader::encode(0, NBD_CMD_READ, 1, 0, 512);
    garbage[0..4].copy_from_slice(&0xdead_beefu32.to_be_bytes());
    bad.write_all(&garbage).await.unwrap();
    assert_closed(&mut bad).await;

    send_req(&mut good, 0, NBD_CMD_WRITE, 7, 4096, 4, b"abcd").await;
    assert_eq!(simple_reply(&mut good).await, (0, 7));
    send_req(&mut good, 0, NBD_CMD_READ, 8, 4096, 4, &[]).await;
    assert_eq!(simple_reply(&mut good).await, (0, 8));
    let mut d = [0u8; 4];
    good.read_exact(&mut d).await.unwrap();
    assert_eq!(&d, b"abcd");
    assert_eq!(srv.server.stats().protocol_errors, 1);
    send_req(&mut good, 0, NBD_CMD_DISC, 9, 0, 0, &[]).await;
    assert_closed(&mut good).await;
    srv.stop();
}

#[tokio::test]
async fn transmission_errors_with_simple_replies() {
    let cfg = ServerConfig {
        max_request_bytes: 1 << 20,
        ..ServerConfig::default()
    };
    let srv = TestServer::start_with(mem_exports(8 << 20), cfg);
    let (mut s, size, flags) = session(srv.port, "d", false).await;
    assert_eq!(size, 8 << 20);
    assert_eq!(
        flags & NBD_FLAG_SEND_DF,
        0,
        "DF only with structured replies"
    );
    assert_ne!(flags & NBD_FLAG_CAN_MULTI_CONN, 0);

    send_req(&mut s, 0, 99, 1, 0, 0, &[]).await;
    assert_eq!(
        simple_reply(&mut s).await,
        (NBD_EINVAL, 1),
        "unknown command"
    );
    send_req(&mut s, 0, NBD_CMD_READ, 2, size - 100, 512, &[]).await;
    assert_eq!(
        simple_reply(&mut s).await,
        (NBD_EINVAL, 2),
        "read beyond end"
    );
    send_req(&mut s, 0, NBD_CMD_READ, 3, u64::MAX - 10, 512, &[]).await;
    assert_eq!(
        simple_reply(&mut s).await,
        (NBD_EINVAL, 3),
        "offset overflow"
    );
    send_req(&mut s, 0, NBD_CMD_WRITE, 4, size - 2, 4, b"wxyz").await;
    assert_eq!(
        simple_reply(&mut s).await,
        (NBD_ENOSPC, 4),
        "write beyond end"
    );
    send_req(&mut s, 0, NBD_CMD_WRITE_ZEROES, 5, size, 1, &[]).await;
    assert_eq!(
        simple_reply(&mut s).await,
        (NBD_ENOSPC, 5),
        "write_zeroes beyond end"
    );
    send_req(&mut s, 0, NBD_CMD_TRIM, 6, size, 1, &[]).await;
    assert_eq!(
        simple_reply(&mut s).await,
        (NBD_EINVAL, 6),
        "trim beyond end"
    );
    send_req(&mut s, 1 << 9, NBD_CMD_WRITE, 7, 0, 2, b"zz").await;
    assert_eq!(
        simple_reply(&mut s).await,
        (NBD_EINVAL, 7),
        "unknown flag (payload consumed)"
    );
    send_req(&mut s, 0, NBD_CMD_READ, 8, 0, (1 << 20) + 1, &[]).await;
    assert_eq!(
        simple_reply(&mut s).await,
        (NBD_EINVAL, 8),
        "read larger than max"
    );
    send_req(&mut s, 0, NBD_CMD_BLOCK_STATUS, 9, 0, 512, &[]).await;
    assert_eq!(
        simple_reply(&mut s).await,
        (NBD_EINVAL, 9),
        "block status without context"
    );
    send_req(&mut s, 0, NBD_CMD_CACHE, 10, 0, 4096, &[]).await;
    assert_eq!(simple_reply(&mut s).await, (0, 10), "cache");
    send_req(&mut s, NBD_CMD_FLAG_FUA, NBD_CMD_TRIM, 14, 0, 1 << 20, &[]).await;
    assert_eq!(simple_reply(&mut s).await, (0, 14), "trim with FUA");
    assert_eq!(
        srv.device("d").flush_count(),
        1,
        "FUA trim is followed by a flush"
    );

    // The session is still usable.
    send_req(
        &mut s,
        NBD_CMD_FLAG_FUA,
        NBD_CMD_WRITE,
        11,
        size - 4,
        4,
        b"tail",
    )
    .await;
    assert_eq!(simple_reply(&mut s).await, (0, 11));
    send_req(&mut s, 0, NBD_CMD_READ, 12, size - 4, 4, &[]).await;
    assert_eq!(simple_reply(&mut s).await, (0, 12));
    let mut d = [0u8; 4];
    s.read_exact(&mut d).await.unwrap();
    assert_eq!(&d, b"tail");

    // A WRITE whose payload exceeds the maximum cannot be skipped: error, then close.
    send_req(&mut s, 0, NBD_CMD_WRITE, 13, 0, (1 << 20) + 1, &[]).await;
    assert_eq!(
        simple_reply(&mut s).await,
        (NBD_EINVAL, 13),
        "oversized write"
    );
    assert_closed(&mut s).await;
    let st = srv.server.stats();
    assert_eq!(st.error_replies, 10, "{st:?}");
    assert_eq!(st.protocol_errors, 1, "{st:?}");
    srv.stop();
}

#[tokio::test]
async fn options_errors_keep_the_session() {
    let srv = TestServer::start(mem_exports(1 << 20));
    let mut s = connect(srv.port, NBD_FLAG_C_FIXED_NEWSTYLE).await;
    for opt in [99u32, NBD_OPT_PEEK_EXPORT, NBD_OPT_EXTENDED_HEADERS] {
        send_opt(&mut s, opt, b"xyz").await;
        assert_eq!(
            read_opt_reply(&mut s).await,
            (opt, NBD_REP_ERR_UNSUP, b"option not supported".to_vec())
        );
    }
    let mut q = Vec::new();
    q.extend_from_slice(&1u32.to_be_bytes());
    q.extend_from_slice(b"d");
    q.extend_from_slice(&0u32.to_be_bytes());
    send_opt(&mut s, NBD_OPT_LIST_META_CONTEXT, &q).await;
    assert_eq!(
        read_opt_reply(&mut s).await.1,
        NBD_REP_ERR_INVALID,
        "meta context needs structured replies"
    );
    send_opt(&mut s, NBD_OPT_STARTTLS, &[]).await;
    assert_eq!(read_opt_reply(&mut s).await.1, NBD_REP_ERR_UNSUP);
    send_opt(&mut s, NBD_OPT_INFO, &vec![0u8; 70 * 1024]).await;
    assert_eq!(read_opt_reply(&mut s).await.1, NBD_REP_ERR_TOO_BIG);
    send_opt(&mut s, NBD_OPT_GO, &[0, 0, 0, 9, b'x']).await;
    assert_eq!(
        read_opt_reply(&mut s).await.1,
        NBD_REP_ERR_INVALID,
        "truncated GO"
    );
    send_opt(&mut s, NBD_OPT_LIST, b"x").await;
    assert_eq!(
        read_opt_reply(&mut s).await.1,
        NBD_REP_ERR_INVALID,
        "LIST with data"
    );
    assert_eq!(
        info_or_go(&mut s, NBD_OPT_GO, "missing", &[]).await.err(),
        Some(NBD_REP_ERR_UNKNOWN)
    );
    assert_eq!(
        info_or_go(&mut s, NBD_OPT_INFO, "", &[]).await.err(),
        Some(NBD_REP_ERR_UNKNOWN),
        "no default export"
    );

    // LIST: one SERVER reply per export, then ACK.
    send_opt(&mut s, NBD_OPT_LIST, &[]).await;
    let (_, rep, d) = read_opt_reply(&mut s).await;
    assert_eq!(rep, NBD_REP_SERVER);
    assert_eq!(d, [&1u32.to_be_bytes()[..], b"d"].concat());
    assert_eq!(read_opt_reply(&mut s).await.1, NBD_REP_ACK);

    // INFO with every item, then GO; then transmission works.
    let (size, _, infos) = info_or_go(
        &mut s,
        NBD_OPT_INFO,
        "d",
        &[NBD_INFO_NAME, NBD_INFO_DESCRIPTION, NBD_INFO_BLOCK_SIZE, 77],
    )
    .await
    .unwrap();
    assert_eq!(size, 1 << 20);
    assert!(infos.contains(&[&NBD_INFO_NAME.to_be_bytes()[..], b"d"].concat()));
    assert!(infos.contains(&[&NBD_INFO_DESCRIPTION.to_be_bytes()[..], b"test disk"].concat()));
    let bs = [
        &NBD_INFO_BLOCK_SIZE.to_be_bytes()[..],
        &1u32.to_be_bytes(),
        &4096u32.to_be_bytes(),
        &(32u32 << 20).to_be_bytes(),
    ]
    .concat();
    assert!(infos.contains(&bs), "{infos:?}");
    assert_eq!(
        infos.len(),
        4,
        "NAME, DESCRIPTION, BLOCK_SIZE, EXPORT; unknown item ignored"
    );
    info_or_go(&mut s, NBD_OPT_GO, "d", &[]).await.unwrap();
    send_req(&mut s, 0, NBD_CMD_FLUSH, 1, 0, 0, &[]).await;
    assert_eq!(simple_reply(&mut s).await, (0, 1));
    srv.stop();
}

#[tokio::test]
async fn abort_export_name_and_bad_client_flags() {
    let exports = mem_exports(1 << 20);
    exports.set_default("d");
    let srv = TestServer::start(exports);

    // NBD_OPT_ABORT: ACK, then the server closes.
    let mut s = connect(srv.port, NBD_FLAG_C_FIXED_NEWSTYLE).await;
    send_opt(&mut s, NBD_OPT_ABORT, &[]).await;
    assert_eq!(read_opt_reply(&mut s).await.1, NBD_REP_ACK);
    assert_closed(&mut s).await;

    // Clients that do not speak fixed newstyle (or send unknown flags) are refused.
    for flags in [0u32, NBD_FLAG_C_FIXED_NEWSTYLE | 1 << 7] {
        let mut s = connect(srv.port, flags).await;
        assert_closed(&mut s).await;
    }

    // EXPORT_NAME with and without the 124 zero bytes; "" is the default export.
    for no_zeroes in [false, true] {
        let cf = NBD_FLAG_C_FIXED_NEWSTYLE | if no_zeroes { NBD_FLAG_C_NO_ZEROES } else { 0 };
        let mut s = connect(srv.port, cf).await;
        send_opt(&mut s, NBD_OPT_EXPORT_NAME, b"").await;
        let mut b = vec![0u8; if no_zeroes { 10 } else { 134 }];
        timeout(s.read_exact(&mut b)).await.unwrap();
        assert_eq!(u64::from_be_bytes(b[0..8].try_into().unwrap()), 1 << 20);
        let flags = u16::from_be_bytes([b[8], b[9]]);
        assert_ne!(flags & NBD_FLAG_HAS_FLAGS, 0);
        assert!(b[10..].iter().all(|&z| z == 0));
        send_req(&mut s, 0, NBD_CMD_READ, 5, 0, 8, &[]).await;
        assert_eq!(simple_reply(&mut s).await, (0, 5));
        let mut d = [1u8; 8];
        s.read_exact(&mut d).await.unwrap();
        assert_eq!(d, [0; 8]);
        send_req(&mut s, 0, NBD_CMD_DISC, 6, 0, 0, &[]).await;
        assert_closed(&mut s).await;
    }

    // EXPORT_NAME for an unknown export: the only possible answer is closing.
    let mut s = connect(srv.port, NBD_FLAG_C_FIXED_NEWSTYLE).await;
    send_opt(&mut s, NBD_OPT_EXPORT_NAME, b"nope").await;
    assert_closed(&mut s).await;
    srv.stop();
}

#[tokio::test]
async fn structured_replies_and_block_status() {
    let srv = TestServer::start(mem_exports(1 << 20));
    let mut s = connect(srv.port, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES).await;
    structured_reply(&mut s).await;

    // LIST_META_CONTEXT with no queries lists base:allocation (id 0).
    let mut q = Vec::new();
    q.extend_from_slice(&1u32.to_be_bytes());
    q.extend_from_slice(b"d");
    q.extend_from_slice(&0u32.to_be_bytes());
    send_opt(&mut s, NBD_OPT_LIST_META_CONTEXT, &q).await;
    assert_eq!(
        read_opt_reply(&mut s).await,
        (
            NBD_OPT_LIST_META_CONTEXT,
            NBD_REP_META_CONTEXT,
            [&0u32.to_be_bytes()[..], b"base:allocation"].concat()
        )
    );
    assert_eq!(read_opt_reply(&mut s).await.1, NBD_REP_ACK);
    // SET_META_CONTEXT base:allocation + an unknown context.
    let mut q = Vec::new();
    q.extend_from_slice(&1u32.to_be_bytes());
    q.extend_from_slice(b"d");
    q.extend_from_slice(&2u32.to_be_bytes());
    for name in ["qemu:dirty-bitmap:x", "base:allocation"] {
        q.extend_from_slice(&(name.len() as u32).to_be_bytes());
        q.extend_from_slice(name.as_bytes());
    }
    send_opt(&mut s, NBD_OPT_SET_META_CONTEXT, &q).await;
    let (_, rep, d) = read_opt_reply(&mut s).await;
    assert_eq!(rep, NBD_REP_META_CONTEXT);
    let ctx = u32::from_be_bytes(d[0..4].try_into().unwrap());
    assert_eq!(&d[4..], b"base:allocation");
    assert_eq!(read_opt_reply(&mut s).await.1, NBD_REP_ACK);
    let (_, flags, _) = info_or_go(&mut s, NBD_OPT_GO, "d", &[]).await.unwrap();
    assert_ne!(flags & NBD_FLAG_SEND_DF, 0);

    let payload: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
    send_req(
        &mut s,
        0,
        NBD_CMD_WRITE,
        1,
        1000,
        payload.len() as u32,
        &payload,
    )
    .await;
    let c = chunk(&mut s).await;
    assert_eq!(
        (c.flags, c.kind, c.handle, c.payload.len()),
        (NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 1, 0)
    );

    send_req(
        &mut s,
        NBD_CMD_FLAG_DF,
        NBD_CMD_READ,
        2,
        1000,
        payload.len() as u32,
        &[],
    )
    .await;
    let c = chunk(&mut s).await;
    assert_eq!(
        (c.flags, c.kind, c.handle),
        (NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_OFFSET_DATA, 2)
    );
    assert_eq!(
        u64::from_be_bytes(c.payload[0..8].try_into().unwrap()),
        1000
    );
    assert!(c.payload[8..] == payload[..]);

    send_req(&mut s, 0, NBD_CMD_READ, 3, (1 << 20) - 1, 2, &[]).await;
    let c = chunk(&mut s).await;
    assert_eq!(c.handle, 3);
    assert_eq!(error_chunk_errno(&c), NBD_EINVAL);
    send_req(&mut s, 0, NBD_CMD_WRITE, 4, 1 << 20, 1, b"x").await;
    assert_eq!(error_chunk_errno(&chunk(&mut s).await), NBD_ENOSPC);

    send_req(
        &mut s,
        NBD_CMD_FLAG_REQ_ONE,
        NBD_CMD_BLOCK_STATUS,
        5,
        4096,
        65536,
        &[],
    )
    .await;
    let c = chunk(&mut s).await;
    assert_eq!(
        (c.flags, c.kind, c.handle),
        (NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_BLOCK_STATUS, 5)
    );
    assert_eq!(
        c.payload,
        [
            ctx.to_be_bytes(),
            65536u32.to_be_bytes(),
            0u32.to_be_bytes()
        ]
        .concat()
    );

    send_req(&mut s, 0, NBD_CMD_FLUSH, 6, 0, 0, &[]).await;
    let c = chunk(&mut s).await;
    assert_eq!(
        (c.flags, c.kind, c.handle),
        (NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 6)
    );
    send_req(&mut s, 0, NBD_CMD_DISC, 7, 0, 0, &[]).await;
    assert_closed(&mut s).await;
    srv.stop();
}

// ---- A slow, instrumented device: ordering, concurrency and backpressure ----------

#[derive(Default)]
struct Probe {
    events: Mutex<Vec<String>>,
    active: AtomicUsize,
    max_active: AtomicUsize,
}

struct SlowDevice {
    inner: MemoryDevice,
    probe: Arc<Probe>,
    write_delay: Duration,
}

impl SlowDevice {
    fn log(&self, e: String) {
        self.probe.events.lock().unwrap().push(e);
    }
    async fn busy<R>(&self, d: Duration, f: impl FnOnce() -> R) -> R {
        let now = self.probe.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.probe.max_active.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(d).await;
        let r = f();
        self.probe.active.fetch_sub(1, Ordering::SeqCst);
        r
    }
}

impl BlockDevice for SlowDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn multi_conn_consistent(&self) -> bool {
        false
    }
    async fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>, DeviceError> {
        self.busy(Duration::from_millis(1), || {
            self.inner.read_sync(offset, len.into())
        })
        .await
    }
    async fn write(&self, offset: u64, data: Vec<u8>, _fua: bool) -> Result<(), DeviceError> {
        // Later writes finish first: exercises out-of-order completion.
        let d = self
            .write_delay
            .saturating_sub(Duration::from_millis(offset / 4096));
        self.busy(d, || {
            self.inner
                .write_sync(offset, data.len() as u64, Some(&data))
        })
        .await?;
        self.log(format!("write {offset}"));
        Ok(())
    }
    async fn flush(&self) -> Result<(), DeviceError> {
        self.log("flush".into());
        Ok(())
    }
    async fn trim(&self, _offset: u64, _len: u32) -> Result<(), DeviceError> {
        Err(DeviceError::NotPermitted("trim refused".into()))
    }
    async fn write_zeroes(&self, _o: u64, _l: u32, _t: bool, _f: bool) -> Result<(), DeviceError> {
        Err(DeviceError::Io("media error".into()))
    }
}

struct OneSlow(Arc<SlowDevice>);

impl Exports for OneSlow {
    type Device = SlowDevice;
    async fn list(&self) -> Result<Vec<ExportInfo>, DeviceError> {
        Ok(vec![ExportInfo {
            name: "slow".into(),
            size_bytes: self.0.size_bytes(),
            description: String::new(),
        }])
    }
    async fn open(&self, name: &str) -> Result<Arc<SlowDevice>, DeviceError> {
        if name == "slow" {
            Ok(self.0.clone())
        } else {
            Err(DeviceError::Invalid(name.into()))
        }
    }
}

/// Runs a server for `OneSlow` on this runtime; returns (port, server, shutdown, task).
async fn slow_server(
    in_flight: usize,
    write_delay: Duration,
) -> (
    u16,
    Arc<Probe>,
    Arc<NbdServer<OneSlow>>,
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let probe = Arc::new(Probe::default());
    let dev = Arc::new(SlowDevice {
        inner: MemoryDevice::new(16 << 20),
        probe: probe.clone(),
        write_delay,
    });
    let cfg = ServerConfig {
        requests_in_flight_per_connection: in_flight,
        ..ServerConfig::default()
    };
    let server = Arc::new(NbdServer::new(Arc::new(OneSlow(dev)), cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(server.clone().serve_tcp(listener, rx));
    (port, probe, server, tx, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_waits_for_earlier_writes_and_replies_are_pipelined() {
    let (port, probe, server, shutdown, task) = slow_server(64, Duration::from_millis(60)).await;
    let (mut s, _, flags) = session(port, "slow", false).await;
    assert_eq!(
        flags & NBD_FLAG_CAN_MULTI_CONN,
        0,
        "device is not multi-conn consistent"
    );
    // 16 pipelined writes (later offsets finish sooner), a flush, then a fast read.
    for i in 0..16u64 {
        send_req(
            &mut s,
            0,
            NBD_CMD_WRITE,
            i,
            i * 4096,
            4096,
            &[i as u8; 4096],
        )
        .await;
    }
    send_req(&mut s, 0, NBD_CMD_FLUSH, 100, 0, 0, &[]).await;
    send_req(&mut s, 0, NBD_CMD_READ, 200, 15 * 4096, 4, &[]).await;
    let mut order = Vec::new();
    for _ in 0..18 {
        let (err, h) = simple_reply(&mut s).await;
        assert_eq!(err, 0, "handle {h}");
        if h == 200 {
            let mut d = [0u8; 4];
            s.read_exact(&mut d).await.unwrap();
        }
        order.push(h);
    }
    assert_ne!(
        order[..16],
        (0..16).collect::<Vec<_>>()[..],
        "replies are sent as ops complete: {order:?}"
    );
    assert!(
        order.iter().position(|&h| h == 200) < order.iter().position(|&h| h == 100),
        "read not blocked: {order:?}"
    );
    let events = probe.events.lock().unwrap().clone();
    assert_eq!(events.len(), 17);
    assert_eq!(
        events.last().unwrap(),
        "flush",
        "flush ran after all earlier writes: {events:?}"
    );
    assert!(
        probe.max_active.load(Ordering::SeqCst) >= 8,
        "writes ran concurrently"
    );

    // Device errors map to their errno.
    send_req(&mut s, 0, NBD_CMD_TRIM, 300, 0, 4096, &[]).await;
    assert_eq!(simple_reply(&mut s).await, (NBD_EPERM, 300));
    send_req(&mut s, 0, NBD_CMD_WRITE_ZEROES, 301, 0, 4096, &[]).await;
    assert_eq!(simple_reply(&mut s).await, (NBD_EIO, 301));

    // DISC with writes in flight: they are completed and answered, then the close.
    for i in 0..4u64 {
        send_req(
            &mut s,
            0,
            NBD_CMD_WRITE,
            400 + i,
            i * 4096,
            4096,
            &[0xee; 4096],
        )
        .await;
    }
    send_req(&mut s, 0, NBD_CMD_DISC, 500, 0, 0, &[]).await;
    let mut got: Vec<u64> = Vec::new();
    for _ in 0..4 {
        let (err, h) = simple_reply(&mut s).await;
        assert_eq!(err, 0);
        got.push(h);
    }
    got.sort();
    assert_eq!(got, vec![400, 401, 402, 403]);
    assert_closed(&mut s).await;
    assert_eq!(server.stats().requests_disc, 1);
    shutdown.send(true).unwrap();
    timeout(task).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_limit_applies_backpressure() {
    let (port, probe, _server, shutdown, task) = slow_server(3, Duration::from_millis(30)).await;
    let (mut s, _, _) = session(port, "slow", false).await;
    for i in 0..24u64 {
        send_req(&mut s, 0, NBD_CMD_WRITE, i, 0, 512, &[1; 512]).await;
    }
    for _ in 0..24 {
        assert_eq!(simple_reply(&mut s).await.0, 0);
    }
    assert_eq!(
        probe.max_active.load(Ordering::SeqCst),
        3,
        "at most 3 ops in flight"
    );
    send_req(&mut s, 0, NBD_CMD_DISC, 99, 0, 0, &[]).await;
    assert_closed(&mut s).await;
    shutdown.send(true).unwrap();
    timeout(task).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_requests_then_closes() {
    let (port, _probe, server, shutdown, task) = slow_server(64, Duration::from_millis(200)).await;
    let (mut s, _, _) = session(port, "slow", false).await;
    // A connection still in the handshake is closed too.
    let mut idle = connect(port, NBD_FLAG_C_FIXED_NEWSTYLE).await;
    // So is one that stalls halfway through a request header.
    let (mut half, _, _) = session(port, "slow", false).await;
    half.write_all(&RequestHeader::encode(0, NBD_CMD_READ, 1, 0, 512)[..10])
        .await
        .unwrap();
    send_req(&mut s, 0, NBD_CMD_WRITE, 1, 0, 512, &[3; 512]).await;
    tokio::time::sleep(Duration::from_millis(50)).await; // the write is in flight
    shutdown.send(true).unwrap();
    assert_eq!(
        simple_reply(&mut s).await,
        (0, 1),
        "in-flight write answered before close"
    );
    assert_closed(&mut s).await;
    assert_closed(&mut idle).await;
    assert_closed(&mut half).await;
    timeout(task).await.unwrap().unwrap();
    assert!(
        TcpStream::connect(("127.0.0.1", port)).await.is_err(),
        "listener closed"
    );
    assert_eq!(server.stats().connections_active, 0);
}

/// Random garbage in the handshake and in transmission never takes the server down:
/// each bad connection is dropped (or answered), and a well-behaved client keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_input_only_affects_its_connection() {
    let cfg = ServerConfig {
        max_request_bytes: 1 << 16,
        ..ServerConfig::default()
    };
    let srv = TestServer::start_with(mem_exports(1 << 20), cfg);
    let (mut good, _, _) = session(srv.port, "d", true).await;
    for seed in 1..=300u64 {
        let r = common::random_bytes(64, seed * 7919);
        let mut junk = common::random_bytes((r[0] as usize) * 4, seed);
        let mut s = match seed % 3 {
            // Raw garbage instead of client flags / options.
            0 => TcpStream::connect(("127.0.0.1", srv.port)).await.unwrap(),
            // Options with random numbers, lengths and data.
            1 => {
                let s = connect(srv.port, NBD_FLAG_C_FIXED_NEWSTYLE).await;
                let mut h = IHAVEOPT.to_be_bytes().to_vec();
                h.extend_from_slice(&u32::from(r[1] % 12).to_be_bytes());
                h.extend_from_slice(&u32::from(r[2]).to_be_bytes());
                junk.splice(0..0, h);
                s
            }
            // Requests with a valid magic and random fields.
            _ => {
                let (s, _, _) = session(srv.port, "d", r[3] & 1 == 0).await;
                let len = u32::from_be_bytes([0, r[5] % 2, r[6], r[7]]);
                let h = RequestHeader::encode(
                    u16::from(r[8] & 0x3f),
                    u16::from(r[9] % 9),
                    seed,
                    u64::from_be_bytes([0, 0, 0, 0, 0, r[10] % 32, r[11], r[12]]),
                    len,
                );
                junk.splice(0..0, h);
                s
            }
        };
        let _ = s.write_all(&junk).await;
        drop(s);
    }
    // The good connection still works, and the bad ones are all gone.
    send_req(&mut good, 0, NBD_CMD_WRITE, 1, 0, 3, b"ok!").await;
    assert_eq!(chunk(&mut good).await.kind, NBD_REPLY_TYPE_NONE);
    send_req(&mut good, 0, NBD_CMD_READ, 2, 0, 3, &[]).await;
    let c = chunk(&mut good).await;
    assert_eq!(&c.payload[8..], b"ok!");
    let t0 = std::time::Instant::now();
    while srv.server.stats().connections_active > 1 {
        assert!(
            t0.elapsed() < T,
            "connections not cleaned up: {:?}",
            srv.server.stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(srv.server.stats().connections_accepted >= 301);
    srv.stop();
}

//! What an io_uring socket loop would save a storage daemon (issue #18 item 2), measured
//! before building one: the same request/reply server written twice, once on a tokio
//! current-thread runtime (what `spindle-proto` does today) and once as one thread that
//! owns an io_uring ring and drives its connection with `Recv`/`Send` operations
//! (`COOP_TASKRUN | SINGLE_ISSUER | DEFER_TASKRUN`, no busy polling: an idle loop sleeps in
//! `io_uring_enter`).
//!
//! The client is the same in both runs (tokio, one connection, `--depth` requests in
//! flight). A request is a 16-byte header (id, reply length); the reply is the header and
//! `--reply-bytes` of payload, like a 4 KiB read. Both servers read what the socket has,
//! answer every whole request in it with one write of all the replies, and go back to the
//! socket, so the two differ only in how they wait and make system calls.
//!
//! ```text
//! cargo run --release -p spindle-io --features tokio --example socket_loop -- --depth 1
//! cargo run --release -p spindle-io --features tokio --example socket_loop -- --depth 16
//! ```
//!
//! Prints, per server, requests per second, mean round trip, and the server thread's CPU per
//! request (`CLOCK_THREAD_CPUTIME_ID`).

use std::io;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HEADER_BYTES: usize = 16;
const READ_BUF_BYTES: usize = 256 * 1024;

struct Args {
    depth: usize,
    reply_bytes: usize,
    seconds: f64,
    rounds: usize,
}

fn parse_args() -> Args {
    let mut a = Args {
        depth: 1,
        reply_bytes: 4096,
        seconds: 3.0,
        rounds: 2,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < v.len() {
        let n = &v[i + 1];
        match v[i].as_str() {
            "--depth" => a.depth = n.parse().unwrap_or(1),
            "--reply-bytes" => a.reply_bytes = n.parse().unwrap_or(4096),
            "--seconds" => a.seconds = n.parse().unwrap_or(3.0),
            "--rounds" => a.rounds = n.parse().unwrap_or(2),
            other => panic!("unknown option {other}"),
        }
        i += 2;
    }
    a
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec for clock_gettime to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Answers every whole request at the front of `pending` into `out`; returns bytes consumed.
fn answer(pending: &[u8], reply_bytes: usize, out: &mut Vec<u8>) -> usize {
    let mut at = 0;
    while pending.len() - at >= HEADER_BYTES {
        let header = &pending[at..at + HEADER_BYTES];
        out.extend_from_slice(header);
        let start = out.len();
        out.resize(start + reply_bytes, 0);
        out[start] = header[0];
        at += HEADER_BYTES;
    }
    at
}

/// The tokio server: read, answer, write, on a current-thread runtime.
fn tokio_server(listener: TcpListener, reply_bytes: usize) -> Duration {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        listener.set_nonblocking(true).expect("nonblocking");
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        let (mut sock, _) = listener.accept().await.expect("accept");
        sock.set_nodelay(true).expect("nodelay");
        let start = thread_cpu();
        let mut buf = vec![0u8; READ_BUF_BYTES];
        let mut fill = 0usize;
        let mut out = Vec::with_capacity(READ_BUF_BYTES);
        loop {
            let n = match sock.read(&mut buf[fill..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            fill += n;
            out.clear();
            let used = answer(&buf[..fill], reply_bytes, &mut out);
            buf.copy_within(used..fill, 0);
            fill -= used;
            if sock.write_all(&out).await.is_err() {
                break;
            }
        }
        thread_cpu() - start
    })
}

/// The io_uring server: one ring, `Recv` then `Send` of every reply, waiting in
/// `io_uring_enter` (no SQPOLL, no busy polling).
fn uring_server(listener: TcpListener, reply_bytes: usize, zero_copy: bool) -> Duration {
    let (sock, _) = listener.accept().expect("accept");
    sock.set_nodelay(true).expect("nodelay");
    let fd = types::Fd(sock.as_raw_fd());
    let mut ring: IoUring = IoUring::builder()
        .setup_coop_taskrun()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(64)
        .expect("ring");
    let start = thread_cpu();
    let mut buf = vec![0u8; READ_BUF_BYTES];
    let mut fill = 0usize;
    let mut out: Vec<u8> = Vec::with_capacity(READ_BUF_BYTES);
    let run = |ring: &mut IoUring, entry: io_uring::squeue::Entry| -> io::Result<i32> {
        // SAFETY: the buffers named by the entry outlive the wait below, which returns only
        // after the operation's completion has been reaped.
        unsafe {
            ring.submission()
                .push(&entry)
                .map_err(|_| io::Error::other("sq full"))?
        };
        ring.submit_and_wait(1)?;
        let cqe = ring
            .completion()
            .next()
            .ok_or_else(|| io::Error::other("no cqe"))?;
        Ok(cqe.result())
    };
    'conn: loop {
        let recv =
            opcode::Recv::new(fd, buf[fill..].as_mut_ptr(), (buf.len() - fill) as u32).build();
        let n = match run(&mut ring, recv) {
            Ok(n) if n > 0 => n as usize,
            _ => break,
        };
        fill += n;
        out.clear();
        let used = answer(&buf[..fill], reply_bytes, &mut out);
        buf.copy_within(used..fill, 0);
        fill -= used;
        let mut sent = 0;
        while sent < out.len() {
            let ptr = out[sent..].as_ptr();
            let len = (out.len() - sent) as u32;
            let result = if zero_copy {
                send_zc(&mut ring, opcode::SendZc::new(fd, ptr, len).build())
            } else {
                run(&mut ring, opcode::Send::new(fd, ptr, len).build())
            };
            match result {
                Ok(n) if n > 0 => sent += n as usize,
                _ => break 'conn,
            }
        }
    }
    thread_cpu() - start
}

/// A zero-copy send: the result, then (flagged "more") the notification that the kernel
/// no longer reads the buffer; both are awaited before the buffer is touched again.
fn send_zc(ring: &mut IoUring, entry: io_uring::squeue::Entry) -> io::Result<i32> {
    // SAFETY: the caller's buffer outlives this call, which returns only after the kernel's
    // notification that it is done with the buffer.
    unsafe {
        ring.submission()
            .push(&entry)
            .map_err(|_| io::Error::other("sq full"))?
    };
    let mut result = None;
    let mut more = true;
    while result.is_none() || more {
        ring.submit_and_wait(1)?;
        for cqe in ring.completion() {
            let flags = cqe.flags();
            if io_uring::cqueue::notif(flags) {
                more = false;
            } else {
                result = Some(cqe.result());
                more = io_uring::cqueue::more(flags);
            }
        }
    }
    Ok(result.unwrap_or(-1))
}

/// The client: `depth` requests in flight on one connection for `seconds`.
fn client(
    addr: std::net::SocketAddr,
    depth: usize,
    reply_bytes: usize,
    seconds: f64,
) -> (u64, Duration) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let sock = tokio::net::TcpStream::connect(addr).await.expect("connect");
        sock.set_nodelay(true).expect("nodelay");
        let (mut rd, mut wr) = sock.into_split();
        let reply_len = HEADER_BYTES + reply_bytes;
        let mut header = [0u8; HEADER_BYTES];
        for _ in 0..depth {
            wr.write_all(&header).await.expect("send");
        }
        let mut reply = vec![0u8; reply_len];
        let mut done = 0u64;
        let begin = Instant::now();
        let deadline = begin + Duration::from_secs_f64(seconds);
        while Instant::now() < deadline {
            rd.read_exact(&mut reply).await.expect("reply");
            done += 1;
            header[0] = header[0].wrapping_add(1);
            wr.write_all(&header).await.expect("send");
        }
        let elapsed = begin.elapsed();
        for _ in 0..depth {
            rd.read_exact(&mut reply).await.expect("drain");
        }
        (done, elapsed)
    })
}

fn one(kind: &str, a: &Args) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let reply_bytes = a.reply_bytes;
    let server = match kind {
        "tokio" => std::thread::spawn(move || tokio_server(listener, reply_bytes)),
        "uring" => std::thread::spawn(move || uring_server(listener, reply_bytes, false)),
        _ => std::thread::spawn(move || uring_server(listener, reply_bytes, true)),
    };
    let (done, elapsed) = client(addr, a.depth, a.reply_bytes, a.seconds);
    // Closing the connection ends the server's loop.
    let server_cpu = server.join().expect("server thread");
    let rate = done as f64 / elapsed.as_secs_f64();
    println!(
        "{kind:>6}  depth {:>3}  {:>9.0} req/s  mean round trip {:>7.1} us  server CPU {:>5.2} us/req",
        a.depth,
        rate,
        elapsed.as_secs_f64() * 1e6 * a.depth as f64 / done as f64,
        server_cpu.as_secs_f64() * 1e6 / done as f64,
    );
}

fn main() {
    let a = parse_args();
    for _ in 0..a.rounds {
        one("tokio", &a);
        one("uring", &a);
        one("zc", &a);
    }
}

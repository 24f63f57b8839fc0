//! The protocol's connections and servers over the in-process stream network
//! (`transport::mem`), under tokio's paused clock: segmentation, delays, partitions and
//! resets, and the served-connection limits of `docs/cluster.md` ("Connections, timeouts
//! and payload budgets") at their real default values, in virtual time.

use spindle_proto::msg::{Mutation, ObjOp, Ver};
use spindle_proto::net::{
    accept_loop_via, frame_bytes, Incoming, NetError, Replier, RpcConn, ServeLimits, Service,
    FRAME_DEADLINE_MS_BASE, SERVER_IDLE_TIMEOUT_MS, WRITE_STALL_MS_MAX,
};
use spindle_proto::transport::mem::{MemNet, MemNetConfig, MemTransport};
use spindle_proto::transport::Transport;
use spindle_proto::Msg;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers a whole-object write with the same bytes; holds `GetMap` requests unanswered
/// (their repliers are kept, as a subscription's are).
#[derive(Clone)]
struct Echo {
    limits: Arc<ServeLimits>,
    held: Arc<Mutex<Vec<Replier>>>,
}

impl Service for Echo {
    fn epoch(&self) -> u64 {
        1
    }
    fn dispatch(&self, inc: Incoming, reply: Replier) {
        match inc.msg {
            Msg::ObjRequest {
                op: ObjOp::Mutate(Mutation::WriteFull(data)),
                ..
            } => {
                reply.send_owned(
                    inc.request_id,
                    1,
                    Msg::ObjReply {
                        version: Ver::default(),
                        size_bytes: data.len() as u64,
                        data,
                        listing: vec![],
                    },
                );
            }
            Msg::GetMap { .. } => self.held.lock().unwrap().push(reply),
            _ => {
                reply.send(inc.request_id, 1, &Msg::Ok);
            }
        }
    }
    fn limits(&self) -> Arc<ServeLimits> {
        self.limits.clone()
    }
}

const SERVER: &str = "osd.0:6800";

/// A network, a server on host "osd.0" listening on [`SERVER`], and the client host "c".
fn cluster(cfg: MemNetConfig) -> (MemNet, MemTransport, Echo) {
    let net = MemNet::new(cfg);
    let server = net.host("osd.0");
    let svc = Echo {
        limits: Arc::new(ServeLimits::new(256 << 20)),
        held: Arc::new(Mutex::new(Vec::new())),
    };
    let listener = server.bind(SERVER).unwrap();
    let s = svc.clone();
    tokio::spawn(async move { accept_loop_via(&server, listener, "test", s).await });
    (net.clone(), net.host("c"), svc)
}

fn write_full(i: usize, data: Vec<u8>) -> Msg {
    Msg::ObjRequest {
        pool: 1,
        pg: 0,
        name: format!("obj{i}"),
        op: ObjOp::Mutate(Mutation::WriteFull(data)),
        client: 0,
        snap_guard: 0,
    }
}

fn payload(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

fn echoed(inc: Incoming) -> Vec<u8> {
    match inc.msg {
        Msg::ObjReply { data, .. } => data,
        other => panic!("unexpected reply {}", other.name()),
    }
}

#[tokio::test(start_paused = true)]
async fn segmented_delayed_bytes_still_make_whole_checked_replies() {
    for seed in 1..=4 {
        let (net, client, _svc) = cluster(MemNetConfig {
            seed,
            // Tiny segments without delays: headers, bodies and block checksums are cut
            // at every possible place; larger ones with delays (a 200 KiB body cut into
            // 3-byte segments delayed 1.5 ms each would take minutes: past its frame
            // deadline, rightly).
            delay_ms_min: 0,
            delay_ms_max: if seed <= 2 { 0 } else { 3 },
            segment_bytes_max: if seed <= 2 {
                1 + seed as usize * 5
            } else {
                4096
            },
        });
        let conn = RpcConn::connect_via(&client, SERVER, 1_000, None)
            .await
            .unwrap();
        // 0 bytes to 200 KiB: small frames, and bodies with per-block checksums.
        let lens = [0usize, 1, 100, 4096, 65_536, 65_537, 200 << 10];
        let mut pending = Vec::new();
        for (i, &len) in lens.iter().cycle().take(21).enumerate() {
            let p = conn.start(1, &write_full(i, payload(i, len))).unwrap();
            pending.push((i, len, p));
        }
        for (i, len, p) in pending {
            let data = echoed(p.wait(60_000).await.unwrap());
            assert_eq!(
                data,
                payload(i, len),
                "seed {seed}: request {i} ({len} bytes)"
            );
        }
        assert_eq!(net.connections(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_partition_stalls_a_connection_and_healing_resumes_it() {
    let (net, client, _svc) = cluster(MemNetConfig::default());
    let conn = RpcConn::connect_via(&client, SERVER, 1_000, None)
        .await
        .unwrap();
    assert_eq!(
        echoed(
            conn.call(1, &write_full(0, vec![7; 10]), 1_000)
                .await
                .unwrap()
        ),
        vec![7; 10]
    );
    net.partition("c", "osd.0");
    let started = tokio::time::Instant::now();
    let e = conn
        .call(1, &write_full(1, vec![8; 10]), 500)
        .await
        .unwrap_err();
    assert!(matches!(e, NetError::Timeout(500)), "{e}");
    assert_eq!(started.elapsed(), Duration::from_millis(500));
    // Like TCP: the connection is still open, and a new connect hangs until its timeout.
    assert!(!conn.is_closed());
    let e = RpcConn::connect_via(&client, SERVER, 2_000, None)
        .await
        .err()
        .expect("a partitioned connect must not succeed");
    assert!(matches!(e, NetError::Connect { .. }), "{e}");
    net.heal("c", "osd.0");
    // The held bytes go through; the same connection serves the next request.
    assert_eq!(
        echoed(
            conn.call(1, &write_full(2, vec![9; 10]), 1_000)
                .await
                .unwrap()
        ),
        vec![9; 10]
    );
    assert_eq!(net.connections(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_reset_fails_requests_in_flight_and_a_new_connection_works() {
    let (net, client, svc) = cluster(MemNetConfig::default());
    let conn = RpcConn::connect_via(&client, SERVER, 1_000, None)
        .await
        .unwrap();
    let held = conn
        .start(
            1,
            &Msg::GetMap {
                have_epoch: 0,
                subscribe: true,
            },
        )
        .unwrap();
    // Let the request reach the server, then cut the link.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(svc.held.lock().unwrap().len(), 1);
    let started = tokio::time::Instant::now();
    net.reset("c", "osd.0");
    let e = held.wait(60_000).await.unwrap_err();
    assert!(matches!(e, NetError::Closed(_)), "{e}");
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "{:?}",
        started.elapsed()
    );
    assert!(conn.is_closed());
    // The server ended the connection too: the held replier sees it.
    let r = svc.held.lock().unwrap().pop().unwrap();
    tokio::time::timeout(Duration::from_secs(1), r.closed())
        .await
        .expect("the server keeps a reset connection");
    let conn = RpcConn::connect_via(&client, SERVER, 1_000, None)
        .await
        .unwrap();
    assert_eq!(
        echoed(
            conn.call(1, &write_full(3, vec![1; 3]), 1_000)
                .await
                .unwrap()
        ),
        vec![1; 3]
    );
}

#[tokio::test(start_paused = true)]
async fn nothing_listening_is_refused_at_once() {
    let (_net, client, _svc) = cluster(MemNetConfig::default());
    let started = tokio::time::Instant::now();
    let e = RpcConn::connect_via(&client, "osd.9:6800", 5_000, None)
        .await
        .err()
        .expect("nobody listens there");
    assert!(matches!(e, NetError::Connect { .. }), "{e}");
    assert_eq!(started.elapsed(), Duration::ZERO);
}

/// Waits (in virtual time) until `t` after `start`, then reads the closed count.
async fn closed_at(svc: &Echo, start: tokio::time::Instant, t_ms: u64) -> u64 {
    tokio::time::sleep_until(start + Duration::from_millis(t_ms)).await;
    svc.limits.connections_closed.load(Ordering::Relaxed)
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_stops_reading_is_dropped_after_the_write_stall_limit() {
    let (_net, client, svc) = cluster(MemNetConfig::default());
    let (mut r, mut w) = client.connect(SERVER).await.unwrap();
    // Ask for 8 MiB of replies and read none of them (the pipes hold well under 1 MiB).
    for i in 0..8 {
        w.write_all(&frame_bytes(
            i + 1,
            1,
            &write_full(i as usize, vec![5; 1 << 20]),
        ))
        .await
        .unwrap();
    }
    w.flush().await.unwrap();
    let start = tokio::time::Instant::now();
    assert_eq!(closed_at(&svc, start, WRITE_STALL_MS_MAX - 1_000).await, 0);
    assert_eq!(closed_at(&svc, start, WRITE_STALL_MS_MAX + 1_000).await, 1);
    assert_eq!(svc.limits.connections_open.load(Ordering::Relaxed), 0);
    // What was sent ends: the reader gets the buffered bytes, then the end of the stream.
    let mut sink = Vec::new();
    let n = r.read_to_end(&mut sink).await.unwrap();
    assert!(
        n < 8 << 20,
        "the server cannot have written every reply: {n}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_frame_that_stops_midway_ends_the_connection_at_its_deadline() {
    let (_net, client, svc) = cluster(MemNetConfig::default());
    let (mut r, mut w) = client.connect(SERVER).await.unwrap();
    let frame = frame_bytes(1, 1, &write_full(0, vec![3; 1000]));
    w.write_all(&frame[..frame.len() / 2]).await.unwrap();
    w.flush().await.unwrap();
    let start = tokio::time::Instant::now();
    // A 1 KiB payload has the base deadline plus one MiB's allowance.
    let deadline_ms = FRAME_DEADLINE_MS_BASE + 1_000;
    assert_eq!(closed_at(&svc, start, deadline_ms - 500).await, 0);
    assert_eq!(closed_at(&svc, start, deadline_ms + 500).await, 1);
    // The stream ends (no reply was due).
    let mut sink = Vec::new();
    r.read_to_end(&mut sink).await.unwrap();
    assert!(sink.is_empty(), "{} bytes", sink.len());
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_is_closed_after_the_idle_timeout_and_a_busy_one_is_not() {
    let (_net, client, svc) = cluster(MemNetConfig::default());
    let idle = RpcConn::connect_via(&client, SERVER, 1_000, None)
        .await
        .unwrap();
    idle.call(1, &Msg::Ok, 1_000).await.unwrap();
    // A request in progress (held by the server) keeps this one open past the timeout.
    let busy = RpcConn::connect_via(&client, SERVER, 1_000, None)
        .await
        .unwrap();
    let _waiting = busy
        .start(
            1,
            &Msg::GetMap {
                have_epoch: 0,
                subscribe: true,
            },
        )
        .unwrap();
    let start = tokio::time::Instant::now();
    assert_eq!(
        closed_at(&svc, start, SERVER_IDLE_TIMEOUT_MS - 1_000).await,
        0
    );
    assert_eq!(
        closed_at(&svc, start, SERVER_IDLE_TIMEOUT_MS + 1_000).await,
        1
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(idle.is_closed());
    assert!(!busy.is_closed());
    assert_eq!(svc.limits.connections_open.load(Ordering::Relaxed), 1);
}

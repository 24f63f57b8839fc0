//! The authentication handshake and frame MACs over the in-process stream network
//! (segmented, delayed bytes): a right key connects and every request carries the peer's
//! identity; a wrong key, an unknown entity, a missing hello, a server that cannot prove
//! the key, and a server not ready yet are each refused the way `docs/cluster.md` says;
//! MACs survive any segmentation of the byte stream.

use spindle_proto::auth::{
    AuthError, Caps, ConnectAuth, EntityKind, Identity, Key, Peer, Verifier,
};
use spindle_proto::msg::{Mutation, ObjOp};
use spindle_proto::net::{accept_loop_via, Incoming, NetError, Replier, RpcConn, Service};
use spindle_proto::transport::mem::{MemNet, MemNetConfig, MemTransport};
use spindle_proto::{ErrorCode, Msg};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Knows one entity and its key; not ready while `ready` is false; encrypts sessions
/// while `encrypt` is true.
struct OneKey {
    entity: String,
    key: Key,
    ready: AtomicBool,
    encrypt: AtomicBool,
}

impl Verifier for OneKey {
    fn encrypt(&self) -> bool {
        self.encrypt.load(Ordering::Relaxed)
    }
    fn ready(&self, _entity: &str) -> Result<(), String> {
        if self.ready.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err("booting".into())
        }
    }
    fn accept(&self, entity: &str, _ticket: &[u8]) -> Result<(Key, Arc<Peer>), AuthError> {
        if entity != self.entity {
            return Err(AuthError(format!("unknown entity {entity}")));
        }
        Ok((
            self.key.clone(),
            Arc::new(Peer {
                entity: entity.into(),
                kind: EntityKind::Client("a".into()),
                caps: Caps::parse("osd allow r").unwrap(),
            }),
        ))
    }
}

/// Echoes a write's bytes and names the authenticated peer in the reply's object name
/// slot (the listing).
#[derive(Clone)]
struct Who(Arc<OneKey>);

impl Service for Who {
    fn epoch(&self) -> u64 {
        1
    }
    fn dispatch(&self, inc: Incoming, reply: Replier) {
        let who = inc
            .peer
            .as_ref()
            .map_or("-".to_string(), |p| p.entity.clone());
        let data = match inc.msg {
            Msg::ObjRequest {
                op: ObjOp::Mutate(Mutation::WriteFull(d)),
                ..
            } => d,
            _ => Vec::new(),
        };
        reply.send_owned(
            inc.request_id,
            1,
            Msg::ObjReply {
                version: Default::default(),
                size_bytes: data.len() as u64,
                data,
                listing: vec![spindle_proto::msg::ObjectListing {
                    name: who,
                    size_bytes: 0,
                    version: Default::default(),
                }],
            },
        );
    }
    fn verifier(&self) -> Option<Arc<dyn Verifier>> {
        Some(self.0.clone())
    }
}

const SERVER: &str = "mon.0:6789";

fn setup(seed: u64, segment: usize) -> (MemTransport, Arc<OneKey>, Key) {
    let net = MemNet::new(MemNetConfig {
        seed,
        delay_ms_min: 0,
        // Tiny segments without delays (a 70 KB body in 3-byte segments, each delayed,
        // would outlast its frame deadline, rightly).
        delay_ms_max: if segment < 100 { 0 } else { 2 },
        segment_bytes_max: segment,
    });
    let key = Key::random();
    let v = Arc::new(OneKey {
        entity: "client.a".into(),
        key: key.clone(),
        ready: AtomicBool::new(true),
        encrypt: AtomicBool::new(false),
    });
    let server = net.host("mon.0");
    let listener = server.bind(SERVER).unwrap();
    let svc = Who(v.clone());
    tokio::spawn(async move { accept_loop_via(&server, listener, "test", svc).await });
    (net.host("c"), v, key)
}

fn as_key(entity: &str, key: &Key) -> ConnectAuth {
    ConnectAuth::Key(Arc::new(Identity {
        entity: entity.into(),
        key: key.clone(),
    }))
}

fn write(data: Vec<u8>) -> Msg {
    Msg::ObjRequest {
        pool: 1,
        pg: 0,
        name: "o".into(),
        op: ObjOp::Mutate(Mutation::WriteFull(data)),
        client: 0,
        snap_guard: 0,
    }
}

#[tokio::test(start_paused = true)]
async fn the_right_key_connects_and_frames_carry_macs_through_any_segmentation() {
    for (seed, segment, encrypt) in [
        (1, 3, false),
        (2, 17, false),
        (3, 4096, false),
        (4, 5, true),
        (5, 4096, true),
    ] {
        let (client, v, key) = setup(seed, segment);
        v.encrypt.store(encrypt, Ordering::Relaxed);
        let conn = RpcConn::connect_auth(&client, SERVER, 5_000, None, &as_key("client.a", &key))
            .await
            .unwrap();
        for len in [0usize, 1, 4096, 70_000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let r = conn.call(1, &write(data.clone()), 10_000).await.unwrap();
            match r.msg {
                Msg::ObjReply {
                    data: d, listing, ..
                } => {
                    assert_eq!(d, data);
                    assert_eq!(
                        listing[0].name, "client.a",
                        "the server knows who it serves"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn wrong_keys_unknown_entities_and_plain_requests_are_refused() {
    let (client, v, key) = setup(4, 64);
    let e = RpcConn::connect_auth(
        &client,
        SERVER,
        5_000,
        None,
        &as_key("client.a", &Key::random()),
    )
    .await
    .err()
    .expect("a wrong key is refused");
    assert!(
        matches!(&e, NetError::Auth(m) if m.contains("wrong proof")),
        "{e}"
    );
    let e = RpcConn::connect_auth(&client, SERVER, 5_000, None, &as_key("client.b", &key))
        .await
        .err()
        .expect("an unknown entity is refused");
    assert!(
        matches!(&e, NetError::Auth(m) if m.contains("unknown entity client.b")),
        "{e}"
    );
    // No hello: the first request gets AuthFailed, then the connection ends.
    let plain = RpcConn::connect_via(&client, SERVER, 5_000, None)
        .await
        .unwrap();
    match plain.call(1, &write(vec![1]), 10_000).await {
        Ok(inc) => match inc.msg {
            Msg::Error { code, message, .. } => {
                assert_eq!(code, ErrorCode::AuthFailed);
                assert!(message.contains("requires a key"), "{message}");
            }
            other => panic!("an unauthenticated request was served: {other:?}"),
        },
        Err(e) => panic!("expected an AuthFailed answer: {e}"),
    }
    // A server not ready yet: a retryable refusal, not an authentication failure.
    v.ready.store(false, Ordering::Relaxed);
    let e = RpcConn::connect_auth(&client, SERVER, 5_000, None, &as_key("client.a", &key))
        .await
        .err()
        .expect("not ready");
    assert!(
        matches!(&e, NetError::Closed(m) if m.contains("booting")),
        "{e}"
    );
    v.ready.store(true, Ordering::Relaxed);
    let ok = RpcConn::connect_auth(&client, SERVER, 5_000, None, &as_key("client.a", &key)).await;
    assert!(ok.is_ok());
}

/// A server that does not know the key (it answers the proof with a made-up one) is
/// refused by the client: authentication is mutual.
#[tokio::test(start_paused = true)]
async fn a_server_that_cannot_prove_the_key_is_refused_by_the_client() {
    use spindle_proto::net::{read_msg, write_msg};
    use spindle_proto::transport::Transport;
    let net = MemNet::new(MemNetConfig {
        seed: 6,
        delay_ms_min: 0,
        delay_ms_max: 0,
        segment_bytes_max: 4096,
    });
    let evil = net.host("evil");
    let listener = evil.bind("evil:1").unwrap();
    tokio::spawn(async move {
        let (mut r, mut w, _) = evil.accept(&listener).await.unwrap();
        let hello = read_msg(&mut r).await.unwrap().unwrap();
        assert!(matches!(hello.msg, Msg::AuthHello { .. }));
        write_msg(
            &mut w,
            hello.request_id,
            1,
            &Msg::AuthChallenge {
                nonce: vec![9; 32],
                encrypt: false,
            },
        )
        .await
        .unwrap();
        let proof = read_msg(&mut r).await.unwrap().unwrap();
        write_msg(
            &mut w,
            proof.request_id,
            1,
            &Msg::AuthDone { proof: vec![0; 32] },
        )
        .await
        .unwrap();
        // Keep the connection open: the client must close it itself.
        let _ = read_msg(&mut r).await;
    });
    let client = net.host("c");
    let r = RpcConn::connect_auth(
        &client,
        "evil:1",
        5_000,
        None,
        &as_key("client.a", &Key::random()),
    )
    .await;
    assert!(
        matches!(&r, Err(NetError::Auth(m)) if m.contains("could not prove")),
        "{:?}",
        r.err()
    );
}

/// Over real TCP through a proxy that records every byte: with encryption in flight the
/// payload never crosses the wire in the clear (and without it, it does: the check can
/// fail), and the exchange still works.
#[tokio::test]
async fn encrypted_sessions_keep_payloads_off_the_wire() {
    use spindle_proto::net::accept_loop;
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let marker: Vec<u8> = b"SECRET-PAYLOAD-MARKER-".repeat(200);
    for encrypt in [false, true] {
        let key = Key::random();
        let v = Arc::new(OneKey {
            entity: "client.a".into(),
            key: key.clone(),
            ready: AtomicBool::new(true),
            encrypt: AtomicBool::new(encrypt),
        });
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server_addr = server.local_addr().unwrap();
        tokio::spawn(accept_loop(server, "test", Who(v.clone())));
        // The proxy: one connection, both directions recorded.
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_addr = proxy.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::<u8>::new()));
        {
            let seen = seen.clone();
            tokio::spawn(async move {
                let (inbound, _) = proxy.accept().await.unwrap();
                let outbound = tokio::net::TcpStream::connect(server_addr).await.unwrap();
                let (mut ir, mut iw) = inbound.into_split();
                let (mut or, mut ow) = outbound.into_split();
                let seen2 = seen.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n) = or.read(&mut buf).await {
                        if n == 0 || iw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        seen2.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                });
                let mut buf = vec![0u8; 65536];
                while let Ok(n) = ir.read(&mut buf).await {
                    if n == 0 || ow.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    seen.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            });
        }
        let conn = RpcConn::connect_auth(
            &spindle_proto::transport::Tcp,
            &proxy_addr,
            5_000,
            None,
            &as_key("client.a", &key),
        )
        .await
        .unwrap();
        let r = conn.call(1, &write(marker.clone()), 10_000).await.unwrap();
        match r.msg {
            Msg::ObjReply { data, .. } => assert_eq!(data, marker, "echoed intact"),
            other => panic!("{other:?}"),
        }
        let seen = seen.lock().unwrap().clone();
        assert!(
            seen.len() > 2 * marker.len(),
            "both directions went through the proxy"
        );
        let in_clear = seen.windows(22).any(|w| w == &marker[..22]);
        assert_eq!(
            in_clear,
            !encrypt,
            "encrypt={encrypt}: the payload was {} on the wire",
            if in_clear { "readable" } else { "not readable" }
        );
    }
}

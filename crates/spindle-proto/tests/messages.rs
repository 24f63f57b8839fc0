//! Message bodies: every kind round-trips through the copying decoder and through the
//! transport's split reader (bulk bytes taken without copying); damaged bodies are errors.

use spindle_proto::msg::{
    ErrorCode, LogEntryMsg, Mutation, ObjOp, ObjectListing, PgReport, PgStateCode, Ver,
};
use spindle_proto::net::{read_frame_raw, write_msg, RpcConn};
use spindle_proto::Msg;

fn v(e: u64, s: u64) -> Ver {
    Ver { epoch: e, seq: s }
}

fn samples() -> Vec<Msg> {
    let log = vec![
        LogEntryMsg {
            version: v(3, 1),
            name: "a".into(),
            delete: false,
        },
        LogEntryMsg {
            version: v(3, 2),
            name: "b/é".into(),
            delete: true,
        },
    ];
    vec![
        Msg::OsdBoot {
            osd_id: 3,
            addr: "127.0.0.1:7000".into(),
            pid: 42,
        },
        Msg::Heartbeat {
            osd_id: 1,
            reports: vec![PgReport {
                pool: 1,
                pg: 5,
                state: PgStateCode::Backfilling,
                objects: 9,
                missing_objects: 4,
                missing_bytes: 4096,
                damaged_objects: 2,
            }],
            counters: vec![("flushes".into(), 7)],
            metrics_addr: "127.0.0.1:9283".into(),
        },
        Msg::HeartbeatAck { epoch: 9 },
        Msg::GetMap {
            have_epoch: 4,
            subscribe: true,
        },
        Msg::MapUpdate { map: vec![1, 2, 3] },
        Msg::Command {
            args: vec!["pool".into(), "ls".into()],
        },
        Msg::CommandReply {
            ok: true,
            output: "{}".into(),
        },
        Msg::MonRaft {
            rpc: 2,
            body: vec![1, 2, 3, 4],
        },
        Msg::MonRaftReply { body: vec![5, 6] },
        Msg::PeerPing { osd_id: 3 },
        Msg::PeerPong { epoch: 77 },
        Msg::AuthHello {
            entity: "client.admin".into(),
            nonce: vec![1; 32],
            ticket: vec![2, 3, 4],
        },
        Msg::AuthChallenge {
            nonce: vec![5; 32],
            encrypt: true,
        },
        Msg::AuthProof { proof: vec![6; 32] },
        Msg::AuthDone { proof: vec![7; 32] },
        Msg::AuthTicketGet,
        Msg::AuthTicket {
            ticket: vec![8, 9],
            session: vec![10],
            service: vec![],
        },
        Msg::ObjRequest {
            pool: 1,
            pg: 2,
            name: "obj".into(),
            op: ObjOp::Mutate(Mutation::WriteFull(vec![7; 5000])),
            client: 0,
            snap_guard: 0,
        },
        Msg::ObjRequest {
            pool: 1,
            pg: 2,
            name: "obj".into(),
            op: ObjOp::Mutate(Mutation::Write {
                offset: 4096,
                data: vec![1, 2, 3],
            }),
            client: 0,
            snap_guard: 0,
        },
        Msg::ObjRequest {
            pool: 1,
            pg: 2,
            name: "obj".into(),
            op: ObjOp::Mutate(Mutation::WriteExtents {
                extents: vec![
                    spindle_types::Extent {
                        offset: 10,
                        len_bytes: 2,
                    },
                    spindle_types::Extent {
                        offset: 8192,
                        len_bytes: 1,
                    },
                ],
                data: vec![4, 5, 6],
            }),
            client: 7,
            snap_guard: 0,
        },
        Msg::ObjRequest {
            pool: 1,
            pg: 2,
            name: "obj".into(),
            op: ObjOp::Mutate(Mutation::Truncate { size_bytes: 10 }),
            client: 0,
            snap_guard: 0,
        },
        Msg::ObjRequest {
            pool: 1,
            pg: 2,
            name: "obj".into(),
            op: ObjOp::Read { offset: 1, len: 2 },
            client: 0,
            snap_guard: 0,
        },
        Msg::ObjRequest {
            pool: 1,
            pg: 2,
            name: "".into(),
            op: ObjOp::List,
            client: 0,
            snap_guard: 0,
        },
        Msg::ObjRequest {
            pool: 1,
            pg: 2,
            name: "t.{rg1}.a".into(),
            op: ObjOp::Exec(spindle_proto::msg::ExecOp {
                program: [7; 32],
                jit: true,
                cache: false,
                shards: true,
                args: vec![1, 2, 3],
                more: vec!["t.{rg1}.b".into()],
                elf: vec![0x7f, b'E', b'L', b'F'],
            }),
            client: 5,
            snap_guard: 0,
        },
        Msg::ObjReply {
            version: v(1, 2),
            size_bytes: 3,
            data: vec![9; 3],
            listing: vec![ObjectListing {
                name: "x".into(),
                size_bytes: 1,
                version: v(1, 1),
            }],
        },
        Msg::RepWrite {
            pool: 1,
            pg: 0,
            name: "r".into(),
            version: v(2, 8),
            mutation: Mutation::Delete,
        },
        Msg::RepWrite {
            pool: 1,
            pg: 0,
            name: "r".into(),
            version: v(2, 9),
            mutation: Mutation::WriteFull(vec![5; 70_000]),
        },
        Msg::PgQuery { pool: 1, pg: 3 },
        Msg::PgInfo {
            last_version: v(3, 2),
            log_tail: v(0, 0),
            log: log.clone(),
            incomplete: true,
        },
        Msg::PgMark {
            pool: 1,
            pg: 3,
            incomplete: true,
        },
        Msg::PgCleanQuery { pool: 2, pg: 7 },
        Msg::ScrubPg { pool: 2, pg: 8 },
        Msg::ScrubResult {
            objects: 10,
            inconsistent: 2,
            repaired: 1,
            damaged: vec![],
        },
        Msg::ScrubResult {
            objects: 10,
            inconsistent: 5,
            repaired: 1,
            damaged: vec!["lost".into(), "gone/é".into()],
        },
        Msg::ScrubQuery {
            pool: 2,
            pg: 8,
            names: vec!["a".into(), "b".into()],
        },
        Msg::ScrubMap {
            entries: vec![spindle_proto::msg::ScrubEntry {
                name: "a".into(),
                version: v(4, 5),
                size_bytes: 77,
                digest: 0xdead_beef,
                ok: false,
            }],
        },
        Msg::PgList { pool: 1, pg: 3 },
        Msg::ObjPull {
            pool: 1,
            pg: 3,
            name: "p".into(),
        },
        Msg::ObjState {
            pool: 1,
            pg: 3,
            name: "p".into(),
            version: Some(v(3, 3)),
            data: vec![4; 10],
        },
        Msg::ObjState {
            pool: 1,
            pg: 3,
            name: "p".into(),
            version: None,
            data: vec![],
        },
        Msg::PgSetLog {
            pool: 1,
            pg: 3,
            last_version: v(3, 2),
            log_tail: v(0, 0),
            log,
        },
        Msg::ExecParts {
            version: v(1, 2),
            rets: vec![4, 5],
            lens: vec![1, 2],
            data: vec![9; 3],
            listing: vec![ObjectListing {
                name: "x".into(),
                size_bytes: 1,
                version: v(1, 1),
            }],
        },
        Msg::ShardExec {
            pool: 3,
            pg: 4,
            objects: vec![ObjectListing {
                name: "t.{rg1}.a\0\x01".into(),
                size_bytes: 40_000,
                version: v(5, 6),
            }],
            program: vec![7; 32],
            jit: true,
            cache: true,
            args: vec![1, 2],
            part: 1,
            parts: 2,
            stripe_unit: 4096,
            elf: vec![0x7f, b'E', b'L', b'F'],
        },
        Msg::ShardRead {
            pool: 3,
            pg: 4,
            name: "s".into(),
            version: v(5, 6),
            offset: 4096,
            len: 8192,
        },
        Msg::ObjRequest {
            pool: 3,
            pg: 1,
            name: "ec".into(),
            op: ObjOp::Mutate(Mutation::EcWrite {
                object_size: 12_000,
                shard_offset: 0,
                shard_len: 4096,
                full: true,
                expect: Some(v(2, 3)),
                data: vec![6; 3 * 4096],
            }),
            client: 0,
            snap_guard: 0,
        },
        Msg::ObjRequest {
            pool: 3,
            pg: 1,
            name: "ec".into(),
            op: ObjOp::Stat,
            client: 0,
            snap_guard: 0,
        },
        Msg::RepWrite {
            pool: 3,
            pg: 1,
            name: "o\0\u{1}".into(),
            version: v(2, 4),
            mutation: Mutation::EcPatch {
                base: None,
                object_size: 12_000,
                shard_size: 4096,
                shard_offset: 100,
                delta_base: None,
                data: vec![8; 50],
            },
        },
        Msg::RepWrite {
            pool: 3,
            pg: 1,
            name: "o\0d2".into(),
            version: v(2, 5),
            mutation: Mutation::EcPatch {
                base: Some(v(2, 4)),
                object_size: 12_000,
                shard_size: 4096,
                shard_offset: 100,
                delta_base: Some(1),
                data: vec![9; 50],
            },
        },
        Msg::Ok,
        Msg::Error {
            code: ErrorCode::StaleMap,
            message: "newer".into(),
            map: vec![1],
        },
        Msg::Error {
            code: ErrorCode::Busy,
            message: String::new(),
            map: vec![],
        },
    ]
}

/// `kind body-hex` per sample: the wire format of every message, pinned. Regenerate with
/// `SPINDLE_BLESS=1` only for a deliberate protocol change (and a protocol version bump).
#[test]
fn encodings_match_the_golden_vectors() {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let mut lines = String::new();
    for msg in samples() {
        // Long bulks are pinned by their length and CRC32C instead of every byte.
        let body = msg.encode();
        let shown = if body.len() > 512 {
            format!(
                "len={} crc={:08x}",
                body.len(),
                spindle_types::crc::crc32c(&body)
            )
        } else {
            hex(&body)
        };
        lines.push_str(&format!("{} {} {shown}\n", msg.kind(), msg.name()));
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/messages.txt");
    if std::env::var_os("SPINDLE_BLESS").is_some() {
        std::fs::write(path, &lines).unwrap();
    }
    let golden = std::fs::read_to_string(path).unwrap();
    for (i, (got, want)) in lines.lines().zip(golden.lines()).enumerate() {
        assert_eq!(got, want, "sample {i}");
    }
    assert_eq!(lines.lines().count(), golden.lines().count());
}

#[test]
fn every_message_round_trips_and_truncation_is_an_error() {
    for msg in samples() {
        let body = msg.encode();
        assert_eq!(
            Msg::decode(msg.kind(), &body).unwrap(),
            msg,
            "{}",
            msg.name()
        );
        for cut in 0..body.len().min(64) {
            assert!(
                Msg::decode(msg.kind(), &body[..cut]).is_err(),
                "{} cut at {cut}",
                msg.name()
            );
        }
        let mut longer = body.clone();
        longer.push(0);
        assert!(Msg::decode(msg.kind(), &longer).is_err(), "{}", msg.name());
    }
}

/// Every kind the `messages!` table declares has a sample (so the round trip above covers
/// it), its tag and name are unique, and tags map back to kinds.
#[test]
fn every_kind_is_sampled_and_tags_and_names_are_unique() {
    use spindle_proto::msg::MsgKind;
    use std::collections::BTreeSet;
    let sampled: BTreeSet<u16> = samples().iter().map(|m| m.kind()).collect();
    let (mut tags, mut names) = (BTreeSet::new(), BTreeSet::new());
    for &k in MsgKind::ALL {
        let tag = k as u16;
        assert!(tags.insert(tag), "tag {tag} declared twice");
        assert!(names.insert(k.name()), "name {} declared twice", k.name());
        assert_eq!(MsgKind::from_u16(tag), Some(k));
        assert!(sampled.contains(&tag), "{} has no sample", k.name());
    }
    assert_eq!(
        sampled.len(),
        MsgKind::ALL.len(),
        "a sample of an undeclared kind"
    );
    assert_eq!(MsgKind::from_u16(0), None);
    assert!(Msg::decode(0, &Msg::Ok.encode()).is_err());
}

/// Each message's struct in `typed` converts to its `Msg` variant and back; another kind
/// is given back unchanged.
#[test]
fn typed_structs_convert_to_and_from_their_variant() {
    use spindle_proto::msg::typed;
    for msg in samples() {
        let back = match msg.clone() {
            m @ Msg::ObjReply { .. } => Msg::from(typed::ObjReply::try_from(m).unwrap()),
            m @ Msg::Heartbeat { .. } => Msg::from(typed::Heartbeat::try_from(m).unwrap()),
            m @ Msg::Ok => Msg::from(typed::Ok::try_from(m).unwrap()),
            m => {
                assert_eq!(typed::Ok::try_from(m.clone()), Err(m.clone()));
                m
            }
        };
        assert_eq!(back, msg);
    }
    let q = typed::PgQuery { pool: 1, pg: 2 };
    assert_eq!(Msg::from(q.clone()), Msg::PgQuery { pool: 1, pg: 2 });
    assert_eq!(typed::PgQuery::KIND.name(), "pg_query");
}

/// A multi-extent write whose extents do not match its bytes, overlap, or are too many is
/// a decoding error (the daemon answers Invalid), never applied.
#[test]
fn bad_extent_lists_are_decoding_errors() {
    let ext = |offset, len_bytes| spindle_types::Extent { offset, len_bytes };
    let req = |extents, data| Msg::ObjRequest {
        pool: 1,
        pg: 2,
        name: "obj".into(),
        op: ObjOp::Mutate(Mutation::WriteExtents { extents, data }),
        client: 0,
        snap_guard: 0,
    };
    let ok = req(vec![ext(0, 2), ext(2, 1)], vec![1, 2, 3]);
    assert_eq!(Msg::decode(ok.kind(), &ok.encode()).unwrap(), ok);
    for bad in [
        req(vec![ext(0, 2), ext(2, 1)], vec![1, 2]),
        req(vec![ext(4, 2), ext(5, 1)], vec![1, 2, 3]),
        req(vec![ext(0, 0)], vec![]),
        req(vec![], vec![]),
        req(vec![ext(u64::MAX, 1)], vec![1]),
        req(
            (0..spindle_types::limits::WRITE_EXTENTS_MAX as u64 + 1)
                .map(|i| ext(i * 2, 1))
                .collect(),
            vec![0; spindle_types::limits::WRITE_EXTENTS_MAX + 1],
        ),
    ] {
        assert!(Msg::decode(bad.kind(), &bad.encode()).is_err(), "{bad:?}");
    }
}

#[test]
fn bulk_bytes_on_a_message_without_data_are_rejected() {
    let mut body = Msg::Ok.encode();
    body[0] = 2;
    body.splice(4..4, [1u8, 2]);
    assert!(Msg::decode(Msg::Ok.kind(), &body).is_err());
}

#[tokio::test]
async fn the_split_reader_matches_the_copying_decoder() {
    let (mut a, mut b) = tokio::io::duplex(1 << 20);
    let msgs = samples();
    let expected = msgs.clone();
    let writer = tokio::spawn(async move {
        for (i, m) in msgs.iter().enumerate() {
            write_msg(&mut a, i as u64 + 1, 5, m).await.unwrap();
        }
    });
    for (i, m) in expected.iter().enumerate() {
        let f = read_frame_raw(&mut b).await.unwrap().unwrap();
        assert_eq!(f.request_id, i as u64 + 1);
        assert_eq!(f.epoch, 5);
        assert_eq!(&f.bulk[..], m.bulk(), "{}", m.name());
        assert_eq!(&f.decode().unwrap(), m);
    }
    writer.await.unwrap();
}

/// A large bulk arrives with the CRC32C of each 4 KiB block, computed in the pass that
/// verifies the frame (its checksum is combined from them): a flipped bulk byte still
/// fails the frame, and small bulks get none.
#[tokio::test]
async fn large_bulks_arrive_with_block_checksums() {
    use spindle_proto::net::{read_msg, BULK_BLOCK_BYTES, BULK_BLOCK_CRCS_BYTES_MIN};
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 31 + 7) as u8).collect();
    let big = Msg::ObjRequest {
        pool: 1,
        pg: 2,
        name: "o".into(),
        op: ObjOp::Mutate(Mutation::WriteFull(data.clone())),
        client: 0,
        snap_guard: 0,
    };
    let small = Msg::ObjRequest {
        pool: 1,
        pg: 2,
        name: "o".into(),
        op: ObjOp::Mutate(Mutation::WriteFull(vec![3; BULK_BLOCK_CRCS_BYTES_MIN - 1])),
        client: 0,
        snap_guard: 0,
    };
    let frame = spindle_proto::net::frame_bytes(9, 1, &big);
    let mut both = frame.clone();
    both.extend_from_slice(&spindle_proto::net::frame_bytes(10, 1, &small));
    let mut r = &both[..];
    let inc = read_msg(&mut r).await.unwrap().unwrap();
    assert_eq!(inc.msg, big);
    let expected: Vec<u32> = data
        .chunks(BULK_BLOCK_BYTES)
        .map(spindle_types::crc::crc32c)
        .collect();
    assert_eq!(inc.bulk_block_crcs, expected);
    let inc = read_msg(&mut r).await.unwrap().unwrap();
    assert_eq!(inc.msg, small);
    assert!(inc.bulk_block_crcs.is_empty());
    // Replies (read data) get none: nobody stores them.
    let reply = Msg::ObjReply {
        version: v(1, 1),
        size_bytes: data.len() as u64,
        data: data.clone(),
        listing: vec![],
    };
    let bytes = spindle_proto::net::frame_bytes(11, 1, &reply);
    let inc = read_msg(&mut &bytes[..]).await.unwrap().unwrap();
    assert_eq!(inc.msg, reply);
    assert!(inc.bulk_block_crcs.is_empty());
    // One bad byte in the middle of the bulk: the frame is refused.
    let mut bad = frame.clone();
    let at = bad.len() / 2;
    bad[at] ^= 1;
    assert!(read_msg(&mut &bad[..]).await.is_err());
}

#[tokio::test]
async fn rpc_round_trip_over_tcp_with_shared_bodies() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        spindle_proto::net::serve(
            stream,
            "test",
            || 1,
            |inc, reply| {
                // Echo the bulk back in an ObjReply.
                let data = inc.msg.bulk().to_vec();
                reply.send_owned(
                    inc.request_id,
                    1,
                    Msg::ObjReply {
                        version: v(0, 0),
                        size_bytes: data.len() as u64,
                        data,
                        listing: vec![],
                    },
                );
            },
        )
        .await;
    });
    let conn = RpcConn::connect(&addr, 2000, None).await.unwrap();
    let msg = Msg::RepWrite {
        pool: 1,
        pg: 1,
        name: "n".into(),
        version: v(1, 1),
        mutation: Mutation::WriteFull((0..100_000u32).map(|i| i as u8).collect()),
    };
    let prepared = spindle_proto::net::Prepared::new(&msg);
    let mut pending = Vec::new();
    for _ in 0..3 {
        pending.push(conn.start_prepared(1, &prepared).unwrap());
    }
    for p in pending {
        match p.wait(5000).await.unwrap().msg {
            Msg::ObjReply { data, .. } => assert_eq!(data, msg.bulk()),
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn a_connection_gets_at_most_its_admission_limit_of_requests_in_progress() {
    use spindle_proto::net::{Replier, REQUESTS_IN_FLIGHT_PER_CONNECTION as LIMIT};
    use std::sync::{Arc, Mutex};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let held: Arc<Mutex<Vec<Replier>>> = Arc::default();
    let held2 = held.clone();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        // Never answers: every request stays in progress while its replier is held.
        spindle_proto::net::serve(
            stream,
            "test",
            || 1,
            move |_inc, reply| held2.lock().unwrap().push(reply),
        )
        .await;
    });
    let conn = RpcConn::connect(&addr, 2000, None).await.unwrap();
    for _ in 0..LIMIT + 36 {
        conn.send_oneway(1, &Msg::PgQuery { pool: 1, pg: 1 })
            .unwrap();
    }
    let count = || held.lock().unwrap().len();
    let wait_for = |n: usize| async move {
        for _ in 0..200 {
            if count() >= n {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    wait_for(LIMIT).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(count(), LIMIT, "more requests admitted than the limit");
    // Finishing 10 requests admits 10 more.
    held.lock().unwrap().drain(..10);
    wait_for(LIMIT).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(count(), LIMIT);
    // 100 sent, 74 admitted so far: the last 26 come in once the slots are free.
    held.lock().unwrap().clear();
    wait_for(26).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(count(), 26, "the rest was admitted once slots freed");
}

/// `RpcConn::request`: the typed reply, an `Error` reply as a typed remote error with its
/// code, and a reply of the wrong kind as a protocol error.
#[tokio::test]
async fn typed_requests_get_typed_replies_and_errors() {
    use spindle_proto::msg::typed;
    use spindle_proto::CallError;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        spindle_proto::net::serve(
            stream,
            "test",
            || 1,
            |inc, reply| {
                let answer = match inc.msg {
                    Msg::PgQuery { pool: 1, .. } => Msg::PgInfo {
                        last_version: v(2, 3),
                        log_tail: v(0, 0),
                        log: vec![],
                        incomplete: false,
                    },
                    Msg::PgQuery { .. } => Msg::error(ErrorCode::NoSuchPool, "no pool"),
                    _ => Msg::Ok,
                };
                reply.send(inc.request_id, 1, &answer);
            },
        )
        .await;
    });
    let conn = RpcConn::connect(&addr, 2000, None).await.unwrap();
    let info = conn
        .request(1, typed::PgQuery { pool: 1, pg: 0 }, 5000)
        .await
        .unwrap();
    assert_eq!(info.last_version, v(2, 3));
    let e = conn
        .request(1, typed::PgQuery { pool: 9, pg: 0 }, 5000)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NoSuchPool), "{e}");
    let e = conn
        .request(
            1,
            typed::ObjPull {
                pool: 1,
                pg: 0,
                name: "x".into(),
            },
            5000,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            CallError::Unexpected {
                expected: "ObjState",
                got: "ok"
            }
        ),
        "{e}"
    );
}

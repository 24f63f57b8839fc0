//! Authentication and capabilities against a real cluster (`spindle up`, which makes keys
//! by default): a connection without a key, with a wrong key, of an unknown entity, or
//! replaying a captured handshake is refused; a frame altered in flight ends the
//! connection; a read-only client cannot write; a client without `images` cannot touch
//! an image's header or data objects (the attacks of issue #20: `spindle rm
//! img.victim.0000000000000000` and `spindle put img.fs1.header junk`); every refusal is
//! logged, and the daemons stay up.

mod common;

use common::{run_ok, spindle, Cluster};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Runs `spindle ARGS` as `entity` with the keyring at `keyring` (None: no keyring at
/// all) against the cluster's monitors.
fn as_entity(c: &Cluster, keyring: Option<&Path>, entity: &str, args: &[&str]) -> Output {
    let mut cmd = spindle();
    cmd.args(args)
        .args(["--mon", &c.mon_addr(), "--name", entity])
        // Another directory than the cluster's, so its admin keyring is not found there.
        .env("SPINDLE_DIR", c.dir.join("elsewhere"))
        .env_remove("SPINDLE_KEYRING");
    if let Some(k) = keyring {
        cmd.arg("--keyring").arg(k);
    }
    cmd.output().expect("spawn spindle")
}

fn refused(out: &Output, want: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(want),
        "expected a refusal containing {want:?}; status {:?}, stderr: {err}, stdout: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn logs_of(c: &Cluster) -> String {
    let mut all = std::fs::read_to_string(c.mon_dir(0).join("log")).unwrap_or_default();
    for id in 0..c.osds {
        all.push_str(&std::fs::read_to_string(c.osd_dir(id).join("log")).unwrap_or_default());
    }
    all
}

/// Frame lengths of a byte stream from a client: the first two frames (hello, proof) have
/// no MAC; later frames end with a 16-byte MAC.
fn frame_ends(bytes: &[u8]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut at = 0;
    while at + 40 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 28..at + 32].try_into().unwrap()) as usize;
        let mac = if ends.len() < 2 { 0 } else { 16 };
        at += 40 + len + mac;
        ends.push(at);
    }
    ends
}

/// A TCP proxy to `target` for one connection: records what the client sends; with
/// `flip_trailer_of`, flips the first MAC byte of the client's frame of that index.
fn proxy(target: String, flip_trailer_of: Option<usize>) -> (String, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let rec = recorded.clone();
    std::thread::spawn(move || {
        let (mut client, _) = l.accept().unwrap();
        // One connection only: a retry by the client finds nobody listening.
        drop(l);
        let mut server = TcpStream::connect(&target).unwrap();
        let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut s2, &mut c2);
            let _ = c2.shutdown(std::net::Shutdown::Write);
        });
        let mut buf = [0u8; 65536];
        let mut flipped = false;
        loop {
            let n = match client.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let start = rec.lock().unwrap().len();
            rec.lock().unwrap().extend_from_slice(&buf[..n]);
            let mut chunk = buf[..n].to_vec();
            if let (Some(i), false) = (flip_trailer_of, flipped) {
                let all = rec.lock().unwrap().clone();
                let ends = frame_ends(&all);
                if ends.len() > i {
                    // The frame's MAC is its last 16 bytes.
                    let pos = ends[i] - 16;
                    if pos >= start && pos < start + n {
                        chunk[pos - start] ^= 0x01;
                        flipped = true;
                    }
                }
            }
            if server.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = server.shutdown(std::net::Shutdown::Write);
    });
    (addr, recorded)
}

/// Runs `spindle pool rm NAME` (refused: no such pool) through a recording proxy to the
/// first monitor: whether `name` crossed the wire readable.
fn name_on_the_wire(c: &Cluster, keyring: &Path, name: &str) -> bool {
    let (via, recorded) = proxy(c.mon_addr_of(0), None);
    let out = spindle()
        .args(["pool", "rm", name, "--mon", &via, "--keyring"])
        .arg(keyring)
        .env("SPINDLE_DIR", c.dir.join("elsewhere"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(name),
        "the monitor answered the command: {err}"
    );
    let sent = recorded.lock().unwrap().clone();
    assert!(frame_ends(&sent).len() >= 3, "the command went through");
    sent.windows(name.len()).any(|w| w == name.as_bytes())
}

/// The first handshake step with a server: whether its challenge says the session will
/// be encrypted.
async fn challenge_encrypts(addr: &str, entity: &str, ticket: Vec<u8>) -> bool {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    spindle_proto::net::write_msg(
        &mut s,
        1,
        0,
        &spindle_proto::Msg::AuthHello {
            entity: entity.into(),
            nonce: spindle_proto::auth::nonce().to_vec(),
            ticket,
        },
    )
    .await
    .unwrap();
    match spindle_proto::net::read_msg(&mut s)
        .await
        .unwrap()
        .unwrap()
        .msg
    {
        spindle_proto::Msg::AuthChallenge { encrypt, .. } => encrypt,
        other => panic!("{addr} answered a hello with {other:?}"),
    }
}

/// `spindle up --encrypt`: monitors and daemons tell every peer to encrypt, nothing a
/// client sends is readable on the wire, and data written, replicated and recovered
/// through encrypted sessions reads back intact (also after a daemon restarts: the
/// setting is kept in the cluster directory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encryption_in_flight_hides_what_clients_send_and_the_cluster_works() {
    let c = Cluster::start_with("auth-encrypt", 3, 16, &["--encrypt"]);
    let keyring = c.dir.join("keyring");
    assert!(!name_on_the_wire(&c, &keyring, "encrypted-pool-marker"));
    // Every server says "encrypt" in its challenge: the monitor to a key, each daemon to
    // a ticket the monitor issued.
    assert!(challenge_encrypts(&c.mon_addr_of(0), "client.admin", Vec::new()).await);
    let id = spindle_proto::auth::Keyring::load(&keyring)
        .unwrap()
        .identity("client.admin")
        .unwrap();
    let creds = spindle_proto::tickets::Credentials::new(id);
    let mon = spindle_proto::net::RpcConn::connect_auth(
        &spindle_proto::transport::Tcp,
        &c.mon_addr_of(0),
        5_000,
        None,
        &creds.mon_auth(),
    )
    .await
    .unwrap();
    creds.fetch_ticket(&mon).await.unwrap();
    let Some(spindle_proto::auth::ConnectAuth::Ticket { ticket, .. }) = creds.osd_auth() else {
        panic!("no ticket")
    };
    for o in c.status()["osds"].as_array().unwrap() {
        let addr = o["addr"].as_str().unwrap();
        assert!(
            challenge_encrypts(addr, "client.admin", ticket.to_vec()).await,
            "{addr}"
        );
    }
    // Data through encrypted sessions: a 3 MiB object (bulk frames, block checksums
    // taken after decryption), replicated to 3 daemons.
    let data: Vec<u8> = (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let file = c.dir.join("big.bin");
    std::fs::write(&file, &data).unwrap();
    let admin = |args: &[&str]| run_ok(spindle().args(args).arg("--dir").arg(&c.dir));
    admin(&["put", "big", file.to_str().unwrap()]);
    let back = c.dir.join("back.bin");
    admin(&["get", "big", back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == data, "read back intact");
    // A daemon restarted by `spindle up` keeps encrypting; an object written while it was
    // down is recovered to it over encrypted sessions.
    c.kill_osd(1);
    c.wait_osd_up(1, false);
    admin(&["put", "while-down", file.to_str().unwrap()]);
    c.up();
    c.wait_clean();
    let addr = c.status()["osds"][1]["addr"].as_str().unwrap().to_string();
    assert!(challenge_encrypts(&addr, "client.admin", ticket.to_vec()).await);
    admin(&["get", "while-down", back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == data, "read back intact");
    // No frame failed to open (the only refusals logged are this test's own handshakes,
    // closed after the challenge).
    let logs = logs_of(&c);
    for bad in ["does not open", "MAC mismatch", "wrong proof"] {
        assert!(!logs.contains(bad), "logged {bad:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_required_handshakes_cannot_be_replayed_and_capabilities_hold() {
    let c = Cluster::start("auth", 3, 16);
    let admin_keyring = c.dir.join("keyring");
    // Keys exist and are private.
    assert_eq!(mode(&admin_keyring), 0o600);
    assert_eq!(mode(&c.mon_dir(0).join("keyring")), 0o600);
    for id in 0..3 {
        assert_eq!(mode(&c.osd_dir(id).join("keyring")), 0o600);
    }
    let data = c.dir.join("data.txt");
    std::fs::write(&data, b"some bytes").unwrap();
    let admin = |args: &[&str]| ok(&as_entity(&c, Some(&admin_keyring), "client.admin", args));
    admin(&["put", "plain", data.to_str().unwrap()]);
    admin(&["image", "create", "victim", "--size", "16M"]);
    // A data object of the image, as its block layer would write it.
    admin(&["put", "img.victim.0000000000000000", data.to_str().unwrap()]);

    // No key at all: refused by the monitor, with a clear error.
    refused(
        &as_entity(&c, None, "client.admin", &["get", "plain", "-"]),
        "requires a key",
    );
    // A wrong key.
    let text = std::fs::read_to_string(&admin_keyring).unwrap();
    let key_at = text.find("key = ").unwrap() + 6;
    let mut bad = text.clone();
    let flipped = if &text[key_at..key_at + 1] == "0" {
        "1"
    } else {
        "0"
    };
    bad.replace_range(key_at..key_at + 1, flipped);
    let bad_keyring = c.dir.join("bad.keyring");
    std::fs::write(&bad_keyring, bad).unwrap();
    std::fs::set_permissions(&bad_keyring, std::fs::Permissions::from_mode(0o600)).unwrap();
    refused(
        &as_entity(&c, Some(&bad_keyring), "client.admin", &["status"]),
        "wrong proof",
    );
    // A keyring others can read is not used.
    let open_keyring = c.dir.join("open.keyring");
    std::fs::copy(&admin_keyring, &open_keyring).unwrap();
    std::fs::set_permissions(&open_keyring, std::fs::Permissions::from_mode(0o644)).unwrap();
    refused(
        &as_entity(&c, Some(&open_keyring), "client.admin", &["status"]),
        "chmod 600",
    );

    // Entities with narrower capabilities.
    let ro = c.dir.join("ro.keyring");
    let noimg = c.dir.join("noimg.keyring");
    let other = c.dir.join("other.keyring");
    let img = c.dir.join("img.keyring");
    for (entity, caps, path) in [
        ("client.ro", "allow r pool=default", &ro),
        ("client.noimg", "allow rw pool=default", &noimg),
        ("client.other", "allow rw pool=other", &other),
        ("client.img", "allow rw pool=default images", &img),
    ] {
        let out = admin(&[
            "auth",
            "add",
            entity,
            "mon",
            "allow r",
            "osd",
            caps,
            "--out",
            path.to_str().unwrap(),
        ]);
        assert!(out.contains("mode 0600"), "{out}");
        assert_eq!(mode(path), 0o600);
    }
    // An unknown entity (a key of its own, never added).
    let nobody = c.dir.join("nobody.keyring");
    std::fs::write(
        &nobody,
        format!("[client.nobody]\n    key = {}\n", "ab".repeat(32)),
    )
    .unwrap();
    std::fs::set_permissions(&nobody, std::fs::Permissions::from_mode(0o600)).unwrap();
    refused(
        &as_entity(&c, Some(&nobody), "client.nobody", &["status"]),
        "unknown entity client.nobody",
    );
    let listed = admin(&["auth", "ls"]);
    for e in ["client.admin", "client.ro", "client.img", "osd.0", "osd.2"] {
        assert!(listed.contains(e), "{listed}");
    }
    assert!(!listed.contains("key"), "auth ls shows no keys: {listed}");

    // Read-only: reads, cannot write or delete, cannot change the map or read keys.
    let read = ok(&as_entity(
        &c,
        Some(&ro),
        "client.ro",
        &["get", "plain", "-"],
    ));
    assert_eq!(read, "some bytes");
    let d = data.to_str().unwrap();
    refused(
        &as_entity(&c, Some(&ro), "client.ro", &["put", "plain", d]),
        "may not write plain",
    );
    refused(
        &as_entity(&c, Some(&ro), "client.ro", &["rm", "plain"]),
        "may not write plain",
    );
    refused(
        &as_entity(&c, Some(&ro), "client.ro", &["pool", "rm", "default"]),
        "mon allow rw",
    );
    refused(
        &as_entity(&c, Some(&ro), "client.ro", &["auth", "ls"]),
        "mon allow *",
    );
    // Read and write, but not image internals: the issue's two attacks fail.
    ok(&as_entity(
        &c,
        Some(&noimg),
        "client.noimg",
        &["put", "mine", d],
    ));
    refused(
        &as_entity(
            &c,
            Some(&noimg),
            "client.noimg",
            &["rm", "img.victim.0000000000000000"],
        ),
        "needs `images`",
    );
    refused(
        &as_entity(
            &c,
            Some(&noimg),
            "client.noimg",
            &["put", "img.victim.header", d],
        ),
        "needs `images`",
    );
    refused(
        &as_entity(
            &c,
            Some(&noimg),
            "client.noimg",
            &["get", "img.victim.header", "-"],
        ),
        "needs `images`",
    );
    // Another pool's client touches nothing here.
    refused(
        &as_entity(&c, Some(&other), "client.other", &["get", "plain", "-"]),
        "may not read plain",
    );
    // With `images`, the image is usable.
    let info = ok(&as_entity(
        &c,
        Some(&img),
        "client.img",
        &["image", "info", "victim"],
    ));
    assert!(info.contains("16"), "{info}");
    // The image is intact after the refused attacks.
    let got = admin(&["get", "img.victim.0000000000000000", "-"]);
    assert_eq!(got, "some bytes");
    ok(&as_entity(
        &c,
        Some(&img),
        "client.img",
        &["image", "info", "victim"],
    ));

    // Capabilities change: the read-only client may write once it holds a new ticket
    // (every CLI run is a new client); removed, it cannot connect.
    admin(&[
        "auth",
        "caps",
        "client.ro",
        "mon",
        "allow r",
        "osd",
        "allow rw pool=default",
    ]);
    ok(&as_entity(
        &c,
        Some(&ro),
        "client.ro",
        &["put", "from-ro", d],
    ));
    admin(&["auth", "rm", "client.ro"]);
    refused(
        &as_entity(&c, Some(&ro), "client.ro", &["status"]),
        "unknown entity client.ro",
    );

    // A captured handshake replayed on a new connection: the server's nonce differs, so
    // the recorded proof is refused.
    let mon = c.mon_addr_of(0);
    let (via, recorded) = proxy(mon.clone(), None);
    let out = spindle()
        .args(["status", "--mon", &via, "--keyring"])
        .arg(&admin_keyring)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let captured = recorded.lock().unwrap().clone();
    assert!(
        frame_ends(&captured).len() >= 3,
        "hello, proof and a request were sent"
    );
    let mut s = tokio::net::TcpStream::connect(&mon).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut s, &captured)
        .await
        .unwrap();
    let first = spindle_proto::net::read_msg(&mut s).await.unwrap().unwrap();
    assert!(
        matches!(
            first.msg,
            spindle_proto::Msg::AuthChallenge { encrypt: false, .. }
        ),
        "a cluster made without --encrypt MACs its frames: {:?}",
        first.msg
    );
    let second = spindle_proto::net::read_msg(&mut s).await.unwrap().unwrap();
    match second.msg {
        spindle_proto::Msg::Error { code, message, .. } => {
            assert_eq!(code, spindle_proto::ErrorCode::AuthFailed);
            assert!(message.contains("wrong proof"), "{message}");
        }
        other => panic!("a replayed handshake was not refused: {other:?}"),
    }
    // And the connection is closed after the refusal.
    let end = tokio::time::timeout(Duration::from_secs(5), spindle_proto::net::read_msg(&mut s))
        .await
        .expect("the monitor closes the connection");
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");

    // Without encryption, what a client sends is readable on the wire (the check of the
    // encrypted cluster below can fail).
    assert!(name_on_the_wire(
        &c,
        &admin_keyring,
        "cleartext-pool-marker"
    ));

    // A frame altered in flight (its MAC flipped): the monitor drops the connection.
    let (via, _) = proxy(mon.clone(), Some(2));
    let out = spindle()
        .args(["status", "--mon", &via, "--keyring"])
        .arg(&admin_keyring)
        .env("SPINDLE_DIR", c.dir.join("elsewhere"))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "an altered frame was accepted: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Garbage instead of a hello: an error frame, then the connection closes.
    let mut s = tokio::net::TcpStream::connect(&mon).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut s, &[0xAB; 1000])
        .await
        .unwrap();
    match spindle_proto::net::read_msg(&mut s)
        .await
        .unwrap()
        .unwrap()
        .msg
    {
        spindle_proto::Msg::Error { code, .. } => {
            assert_eq!(code, spindle_proto::ErrorCode::Invalid)
        }
        other => panic!("garbage was answered with {other:?}"),
    }
    let end = tokio::time::timeout(Duration::from_secs(5), spindle_proto::net::read_msg(&mut s))
        .await
        .expect("the monitor closes the connection");
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");

    // Before authenticating, a peer cannot make a server read a large frame: a header
    // announcing 64 MiB is refused at once.
    let mut big = Vec::new();
    spindle_proto::encode_frame(80, 1, 0, &[], &mut big);
    big[28..32].copy_from_slice(&(64u32 << 20).to_le_bytes());
    let crc = spindle_ec::crc32c::crc32c(&big[..36]);
    big[36..40].copy_from_slice(&crc.to_le_bytes());
    let mut s = tokio::net::TcpStream::connect(&mon).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut s, &big)
        .await
        .unwrap();
    match spindle_proto::net::read_msg(&mut s)
        .await
        .unwrap()
        .unwrap()
        .msg
    {
        spindle_proto::Msg::Error { message, .. } => {
            assert!(message.contains("exceeds"), "{message}")
        }
        other => panic!("a 64 MiB hello was answered with {other:?}"),
    }

    // A storage daemon refuses a connection without a ticket, or with plain requests.
    let osd_addr = c.status()["osds"][0]["addr"].as_str().unwrap().to_string();
    let mut s = tokio::net::TcpStream::connect(&osd_addr).await.unwrap();
    spindle_proto::net::write_msg(
        &mut s,
        1,
        0,
        &spindle_proto::Msg::AuthHello {
            entity: "client.admin".into(),
            nonce: vec![7; 32],
            ticket: Vec::new(),
        },
    )
    .await
    .unwrap();
    match spindle_proto::net::read_msg(&mut s)
        .await
        .unwrap()
        .unwrap()
        .msg
    {
        spindle_proto::Msg::Error { code, message, .. } => {
            assert_eq!(code, spindle_proto::ErrorCode::AuthFailed);
            assert!(message.contains("needs a ticket"), "{message}");
        }
        other => panic!("a daemon accepted a hello without a ticket: {other:?}"),
    }
    let mut s = tokio::net::TcpStream::connect(&osd_addr).await.unwrap();
    spindle_proto::net::write_msg(
        &mut s,
        1,
        0,
        &spindle_proto::Msg::GetMap {
            have_epoch: 0,
            subscribe: false,
        },
    )
    .await
    .unwrap();
    match spindle_proto::net::read_msg(&mut s)
        .await
        .unwrap()
        .unwrap()
        .msg
    {
        spindle_proto::Msg::Error { code, .. } => {
            assert_eq!(code, spindle_proto::ErrorCode::AuthFailed)
        }
        other => panic!("a daemon served an unauthenticated request: {other:?}"),
    }

    // Every refusal is in the logs, and every process is still up and serving.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let logs = logs_of(&c);
    for want in [
        "no authentication (first message",
        "wrong proof",
        "unknown entity client.nobody",
        "frame MAC mismatch",
        "needs a ticket",
        "may not write plain",
        "needs `images`",
        "has no `mon allow *`",
    ] {
        assert!(logs.contains(want), "not logged: {want}");
    }
    c.wait_clean();
    let status = run_ok(spindle().args(["status", "--dir"]).arg(&c.dir));
    assert!(status.contains("3 up"), "{status}");
    assert_eq!(admin(&["get", "plain", "-"]), "some bytes");
}

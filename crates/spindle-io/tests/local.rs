//! `LocalRing`: the caller-driven ring of the thread-per-core data path.

use std::io::Write as _;
use std::os::fd::AsRawFd;

use spindle_io::{LocalRing, Op, SubmitError};

fn temp_file(name: &str) -> (std::path::PathBuf, std::fs::File) {
    let path = std::env::temp_dir().join(format!("spindle-io-local-{}-{name}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    (path, file)
}

/// Pushes `op`, waits for its completion and returns it.
fn run(ring: &mut LocalRing, op: Op) -> spindle_io::Completion {
    let token = ring.push(op).unwrap();
    ring.wait(1).unwrap();
    let (got, completion) = ring.pop().expect("a completion");
    assert_eq!(got, token);
    completion
}

#[test]
fn writes_and_reads_land_at_their_offsets() {
    let (path, file) = temp_file("rw");
    let fd = file.as_raw_fd();
    let mut ring = LocalRing::new(16).unwrap();
    // 64 writes of distinct 512-byte patterns, in flight together, at scattered offsets.
    for i in 0..64u64 {
        let offset = (i * 7919 % 64) * 512;
        ring.push(Op::write(fd, offset, vec![(offset / 512) as u8; 512]))
            .map(|_| ())
            .unwrap_or_else(|e| {
                // Ring full: drain and retry.
                ring.wait(16).unwrap();
                while ring.pop().is_some() {}
                ring.push(e.into_op()).unwrap();
            });
        if ring.in_flight() == ring.capacity() {
            ring.wait(1).unwrap();
            while let Some((_, c)) = ring.pop() {
                assert_eq!(c.result.unwrap(), 512);
            }
        }
    }
    ring.wait(ring.in_flight()).unwrap();
    while let Some((_, c)) = ring.pop() {
        assert_eq!(c.result.unwrap(), 512);
    }
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(on_disk.len(), 64 * 512);
    for (block, chunk) in on_disk.chunks(512).enumerate() {
        assert!(chunk.iter().all(|&b| b == block as u8), "block {block}");
    }
    // Read back through the ring, including a read that ends past EOF (short, not an error).
    let done = run(&mut ring, Op::read(fd, 63 * 512 + 256, vec![0u8; 4096]));
    assert_eq!(
        done.result.unwrap(),
        256,
        "end of file gives a short result"
    );
    assert!(done.buf.unwrap()[..256].iter().all(|&b| b == 63));
    let done = run(&mut ring, Op::read(fd, 5 * 512, vec![0u8; 1024]));
    assert_eq!(done.result.unwrap(), 1024);
    let buf = done.buf.unwrap();
    assert!(buf[..512].iter().all(|&b| b == 5) && buf[512..].iter().all(|&b| b == 6));
    let _ = std::fs::remove_file(path);
}

#[test]
fn short_pipe_reads_are_resubmitted_until_complete() {
    let (reader, mut writer) = std::io::pipe().unwrap();
    let expected: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let payload = expected.clone();
    let feeder = std::thread::spawn(move || {
        for piece in payload.chunks(97) {
            writer.write_all(piece).unwrap();
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    });
    let mut ring = LocalRing::new(4).unwrap();
    let done = run(
        &mut ring,
        Op::read_stream(reader.as_raw_fd(), vec![0u8; 10_000]),
    );
    assert_eq!(done.result.unwrap(), 10_000);
    assert_eq!(done.transferred, 10_000);
    assert_eq!(&done.buf.unwrap()[..], &expected[..]);
    feeder.join().unwrap();
}

#[test]
fn errors_are_os_errors_and_a_full_ring_hands_the_op_back() {
    let mut ring = LocalRing::new(2).unwrap();
    let done = run(&mut ring, Op::read(-1, 0, vec![0u8; 16]));
    assert_eq!(done.result.unwrap_err().raw_os_error(), Some(libc::EBADF));
    assert!(done.buf.is_some(), "the buffer comes back even on error");

    let (reader, _writer) = std::io::pipe().unwrap();
    ring.push(Op::read_stream(reader.as_raw_fd(), vec![0u8; 8]))
        .unwrap();
    ring.push(Op::read_stream(reader.as_raw_fd(), vec![0u8; 8]))
        .unwrap();
    match ring.push(Op::read_stream(reader.as_raw_fd(), vec![7u8; 8])) {
        Err(SubmitError::Invalid {
            op: Op::Read { buf, .. },
            ..
        }) => assert_eq!(&buf[..], &[7u8; 8]),
        other => panic!("expected the op back, got {other:?}"),
    }
    assert!(LocalRing::new(0).is_err());
    // Dropping the ring with two reads pending on an idle pipe must not hang.
    drop(ring);
}

#[test]
fn token_slots_are_unique_until_popped() {
    let mut ring = LocalRing::new(4).unwrap();
    let tokens: Vec<_> = (0..4).map(|_| ring.push(Op::Nop).unwrap()).collect();
    ring.wait(4).unwrap();
    // All four are done but not popped: their slots are still taken.
    assert!(matches!(
        ring.push(Op::Nop),
        Err(SubmitError::Invalid { .. })
    ));
    let mut slots: Vec<usize> = tokens.iter().map(|t| t.slot()).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), 4);
    assert!(slots.iter().all(|&s| s < ring.capacity()));
    let (first, done) = ring.pop().unwrap();
    assert_eq!(done.result.unwrap(), 0);
    // Only the popped slot is reused.
    let next = ring.push(Op::Nop).unwrap();
    assert_eq!(next.slot(), first.slot());
    assert_ne!(next, first, "a reused slot gets a new token");
    ring.wait(ring.in_flight()).unwrap();
    let mut n = 0;
    while ring.pop().is_some() {
        n += 1;
    }
    assert_eq!(n, 4);
}

//! Registered buffers and files, linked timeouts (per-request deadlines) and IOPOLL, on every
//! engine flavour and on `LocalRing`.

mod common;

use std::io::{ErrorKind, Write as _};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use spindle_io::{
    BackendChoice, Config, EngineError, FileRef, LocalRing, Op, RingThreads, SubmitError,
};

use common::{engine, flavours, pattern, scratch_dir};

fn open_rw(path: &std::path::Path, direct: bool) -> std::fs::File {
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path).unwrap()
}

#[test]
fn engine_fixed_buffers_and_files_round_trip() {
    for (name, config) in flavours() {
        let dir = scratch_dir("fixed");
        let path = dir.join("data");
        let file = open_rw(&path, false);
        let engine = engine(config);
        let pool = engine.register_buffers(4, 8192).unwrap();
        assert_eq!(
            (pool.count(), pool.buf_size(), pool.available()),
            (4, 8192, 4)
        );
        // One set per engine.
        let again = engine.register_buffers(1, 4096).unwrap_err();
        assert_eq!(again.raw_os_error(), Some(libc::EBUSY), "{name}");
        let files = engine.register_files(&[file.as_raw_fd()]).unwrap();
        assert_eq!(files.len(), 1);

        // Write two blocks through the registered file, from registered buffers.
        for block in 0..2u64 {
            let mut buf = pool.take().unwrap();
            buf.copy_from_slice(&pattern(block, 8192));
            let done = engine
                .submit(Op::write_fixed(files[0], block * 8192, buf))
                .unwrap()
                .wait();
            assert_eq!(done.result.unwrap(), 8192, "{name}");
            assert!(done.fixed_buf.is_some(), "{name}: buffer handed back");
        }
        assert_eq!(pool.available(), 4, "{name}: buffers returned to the pool");
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(&on_disk[..8192], &pattern(0, 8192)[..], "{name}");
        assert_eq!(&on_disk[8192..], &pattern(1, 8192)[..], "{name}");

        // Read back: through the plain fd and through the registered file; a read that
        // crosses the end of file is short, not an error.
        let mut buf = pool.take().unwrap();
        buf.set_len(4096);
        let done = engine
            .submit(Op::read_fixed(file.as_raw_fd(), 8192 + 100, buf))
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 4096, "{name}");
        let buf = done.fixed_buf.unwrap();
        assert_eq!(&buf[..], &pattern(1, 8192)[100..4196], "{name}");
        let done = engine
            .submit(Op::read_fixed(files[0], 12288, buf))
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 4096, "{name}");
        assert_eq!(
            &done.fixed_buf.unwrap()[..],
            &pattern(1, 8192)[4096..],
            "{name}"
        );
        let mut buf = pool.take().unwrap();
        buf.set_len(8192);
        let done = engine
            .submit(Op::read_fixed(files[0], 12288, buf))
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 4096, "{name}: short at end of file");

        // After unregistering, the fixed file is a bad descriptor.
        engine.unregister_files(&files).unwrap();
        let buf = pool.take().unwrap();
        let done = engine
            .submit(Op::read_fixed(files[0], 0, buf))
            .unwrap()
            .wait();
        let err = done.result.unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF), "{name}: {err}");
        drop(engine);
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn engine_fixed_reads_with_o_direct() {
    for (name, config) in flavours() {
        let dir = scratch_dir("fixed-direct");
        let path = dir.join("data");
        std::fs::write(&path, pattern(7, 64 * 1024)).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        let engine = engine(config);
        let pool = engine.register_buffers(32, 4096).unwrap();
        let files = engine.register_files(&[file.as_raw_fd()]).unwrap();
        let requests: Vec<_> = (0..16u64)
            .map(|i| {
                let file: FileRef = if i % 2 == 0 {
                    files[0].into()
                } else {
                    file.as_raw_fd().into()
                };
                let op = Op::read_fixed(file, i * 4096, pool.take().unwrap());
                engine.submit(op).unwrap()
            })
            .collect();
        engine.block_on(&requests);
        let expected = pattern(7, 64 * 1024);
        for (i, request) in requests.into_iter().enumerate() {
            let done = request.wait();
            assert_eq!(done.result.unwrap(), 4096, "{name}");
            assert_eq!(
                &done.fixed_buf.unwrap()[..],
                &expected[i * 4096..(i + 1) * 4096],
                "{name} block {i}"
            );
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn local_ring_fixed_buffers_and_files() {
    let dir = scratch_dir("local-fixed");
    let path = dir.join("data");
    let file = open_rw(&path, false);
    let mut ring = LocalRing::new(8).unwrap();
    let pool = ring.register_buffers(8, 4096).unwrap();
    assert_eq!(
        ring.register_buffers(1, 4096).unwrap_err().raw_os_error(),
        Some(libc::EBUSY)
    );
    let files = ring.register_files(&[file.as_raw_fd()]).unwrap();
    for i in 0..8u64 {
        let mut buf = pool.take().unwrap();
        buf.copy_from_slice(&pattern(i, 4096));
        ring.push(Op::write_fixed(files[0], i * 4096, buf)).unwrap();
    }
    assert!(pool.take().is_none(), "all 8 buffers are in flight");
    ring.wait(8).unwrap();
    let mut n = 0;
    while let Some((_, done)) = ring.pop() {
        assert_eq!(done.result.unwrap(), 4096);
        drop(done.fixed_buf.unwrap());
        n += 1;
    }
    assert_eq!((n, pool.available()), (8, 8));
    assert_eq!(std::fs::read(&path).unwrap().len(), 8 * 4096);
    for i in 0..8u64 {
        let file: FileRef = if i % 2 == 0 {
            files[0].into()
        } else {
            file.as_raw_fd().into()
        };
        ring.push(Op::read_fixed(file, i * 4096, pool.take().unwrap()))
            .unwrap();
    }
    ring.wait(8).unwrap();
    let mut seen = 0;
    while let Some((_, done)) = ring.pop() {
        assert_eq!(done.result.unwrap(), 4096);
        let buf = done.fixed_buf.unwrap();
        let block = (0..8u64)
            .find(|&i| buf[..] == pattern(i, 4096)[..])
            .expect("read returned one of the written blocks");
        seen |= 1 << block;
    }
    assert_eq!(seen, 0xff, "every block read back");
    ring.unregister_files(&files).unwrap();
    ring.push(Op::read_fixed(files[0], 0, pool.take().unwrap()))
        .unwrap();
    ring.wait(1).unwrap();
    let (_, done) = ring.pop().unwrap();
    assert_eq!(done.result.unwrap_err().raw_os_error(), Some(libc::EBADF));
    let _ = std::fs::remove_dir_all(dir);
}

/// A pipe whose writer sends `first` bytes at once and then nothing (kept open).
fn stalled_pipe(first: usize) -> (std::io::PipeReader, std::io::PipeWriter) {
    let (reader, mut writer) = std::io::pipe().unwrap();
    writer.write_all(&vec![9u8; first]).unwrap();
    (reader, writer)
}

#[test]
fn engine_deadline_times_out_and_covers_resubmissions() {
    // A broken linked timeout would hang: fail after 20 s instead.
    within_deadline(engine_deadline_body);
}

fn engine_deadline_body() {
    for (name, config) in flavours() {
        let engine = engine(config);
        // Nothing ever arrives: the read times out, its buffer comes back.
        let (reader, _writer) = stalled_pipe(0);
        let t0 = Instant::now();
        let done = engine
            .submit_with_timeout(
                Op::read_stream(reader.as_raw_fd(), vec![0u8; 64]),
                Duration::from_millis(50),
            )
            .unwrap()
            .wait();
        let waited = t0.elapsed();
        let err = done.result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TimedOut, "{name}: {err}");
        assert_eq!(err.raw_os_error(), Some(libc::ETIMEDOUT), "{name}");
        assert!(done.buf.is_some(), "{name}: buffer handed back");
        assert!(
            waited >= Duration::from_millis(50) && waited < Duration::from_secs(5),
            "{name}: waited {waited:?}"
        );

        // 100 bytes arrive, then nothing: the resubmitted remainder runs into the same
        // deadline (not a fresh one), and the completion says 100 bytes were read.
        let (reader, _writer) = stalled_pipe(100);
        let t0 = Instant::now();
        let done = engine
            .submit_with_timeout(
                Op::read_stream(reader.as_raw_fd(), vec![0u8; 1000]),
                Duration::from_millis(80),
            )
            .unwrap()
            .wait();
        let waited = t0.elapsed();
        assert_eq!(
            done.result.unwrap_err().kind(),
            ErrorKind::TimedOut,
            "{name}"
        );
        assert_eq!(done.transferred, 100, "{name}");
        assert!(done.buf.unwrap()[..100].iter().all(|&b| b == 9), "{name}");
        assert!(waited < Duration::from_secs(5), "{name}: {waited:?}");

        // An op that finishes in time is unaffected.
        let (reader, _writer) = stalled_pipe(64);
        let done = engine
            .submit_with_timeout(
                Op::read_stream(reader.as_raw_fd(), vec![0u8; 64]),
                Duration::from_secs(10),
            )
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 64, "{name}");
        // A deadline that has already passed times out without running the op.
        let done = engine
            .submit_with_timeout(Op::Nop, Duration::ZERO)
            .unwrap()
            .wait();
        assert_eq!(
            done.result.unwrap_err().kind(),
            ErrorKind::TimedOut,
            "{name}"
        );
        // A timeout op longer than its deadline times out; a shorter one completes.
        let done = engine
            .submit_with_timeout(
                Op::Timeout {
                    duration: Duration::from_secs(10),
                },
                Duration::from_millis(30),
            )
            .unwrap()
            .wait();
        assert_eq!(
            done.result.unwrap_err().kind(),
            ErrorKind::TimedOut,
            "{name}"
        );
        let done = engine
            .submit_with_timeout(
                Op::Timeout {
                    duration: Duration::from_millis(5),
                },
                Duration::from_secs(10),
            )
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 0, "{name}");
        // Many requests with deadlines in flight at once, all completing normally.
        let dir = scratch_dir("deadline");
        let file = open_rw(&dir.join("f"), false);
        let requests: Vec<_> = (0..200u64)
            .map(|i| {
                engine
                    .submit_with_timeout(
                        Op::write(file.as_raw_fd(), i * 512, vec![i as u8; 512]),
                        Duration::from_secs(30),
                    )
                    .unwrap()
            })
            .collect();
        for request in requests {
            assert_eq!(request.wait().result.unwrap(), 512, "{name}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn local_ring_deadline() {
    within_deadline(local_ring_deadline_body);
}

fn local_ring_deadline_body() {
    let mut ring = LocalRing::new(4).unwrap();
    let (reader, _writer) = stalled_pipe(100);
    let t0 = Instant::now();
    let token = ring
        .push_with_timeout(
            Op::read_stream(reader.as_raw_fd(), vec![0u8; 1000]),
            Duration::from_millis(60),
        )
        .unwrap();
    // A plain op alongside is unaffected.
    let nop = ring.push(Op::Nop).unwrap();
    ring.wait(2).unwrap();
    let mut got = Vec::new();
    while let Some((t, done)) = ring.pop() {
        got.push(t);
        if t == token {
            assert_eq!(done.result.unwrap_err().kind(), ErrorKind::TimedOut);
            assert_eq!(done.transferred, 100);
            assert!(t0.elapsed() >= Duration::from_millis(60));
        } else {
            assert_eq!(t, nop);
            assert_eq!(done.result.unwrap(), 0);
        }
    }
    assert_eq!(got.len(), 2);
    // In time: completes normally.
    let (reader, _writer) = stalled_pipe(10);
    ring.push_with_timeout(
        Op::read_stream(reader.as_raw_fd(), vec![0u8; 10]),
        Duration::from_secs(10),
    )
    .unwrap();
    ring.wait(1).unwrap();
    assert_eq!(ring.pop().unwrap().1.result.unwrap(), 10);
    assert_eq!(ring.in_flight(), 0);
}

/// Whether the block device under `path` polls (`/sys/dev/block/M:m/queue/io_poll`, or the
/// parent device's for a partition).
fn device_polls(path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).unwrap().dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let base = format!("/sys/dev/block/{major}:{minor}");
    for candidate in [
        format!("{base}/queue/io_poll"),
        format!("{base}/../queue/io_poll"),
    ] {
        if let Ok(text) = std::fs::read_to_string(&candidate) {
            return text.trim() == "1";
        }
    }
    false
}

fn assert_iopoll_error(err: &std::io::Error) {
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("IOPOLL"), "{err}");
}

/// Runs `f` on another thread and fails (rather than hang) if it takes more than 20 s.
fn within_deadline(f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(()) => handle.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            // The closure panicked: propagate its message.
            if let Err(panic) = handle.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(e) => panic!("test did not finish within 20 s (hung): {e}"),
    }
}

#[test]
fn local_ring_iopoll() {
    within_deadline(|| {
        let dir = scratch_dir("iopoll");
        let path = dir.join("data");
        std::fs::write(&path, pattern(3, 64 * 1024)).unwrap();
        let polls = device_polls(&path);
        let mut ring = LocalRing::builder(8).iopoll(true).build().unwrap();
        assert!(ring.is_iopoll());
        // Only reads and writes are accepted; no linked timeouts.
        assert!(matches!(
            ring.push(Op::Nop),
            Err(SubmitError::Invalid { .. })
        ));
        let buffered = std::fs::File::open(&path).unwrap();
        assert!(matches!(
            ring.push_with_timeout(
                Op::read(buffered.as_raw_fd(), 0, vec![0u8; 4096]),
                Duration::from_secs(1)
            ),
            Err(SubmitError::Invalid { .. })
        ));
        // A buffered file cannot be polled: a clear error, not a hang.
        ring.push(Op::read(buffered.as_raw_fd(), 0, vec![0u8; 4096]))
            .unwrap();
        ring.wait(1).unwrap();
        assert_iopoll_error(&ring.pop().unwrap().1.result.unwrap_err());

        // O_DIRECT on the test file system's device.
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        let pool = ring.register_buffers(4, 4096).unwrap();
        let check = spindle_io::check_iopoll(direct.as_raw_fd());
        for i in 0..4u64 {
            ring.push(Op::read_fixed(
                direct.as_raw_fd(),
                i * 4096,
                pool.take().unwrap(),
            ))
            .unwrap();
        }
        ring.wait(4).unwrap();
        let expected = pattern(3, 64 * 1024);
        let mut done_count = 0;
        while let Some((_, done)) = ring.pop() {
            done_count += 1;
            if polls {
                assert!(check.is_ok(), "{check:?}");
                assert_eq!(done.result.unwrap(), 4096);
                let buf = done.fixed_buf.unwrap();
                assert!(expected.chunks(4096).any(|c| c == &buf[..]));
            } else {
                // The device has no poll queues: `check_iopoll` says so clearly, and the
                // kernel refuses polled I/O (EOPNOTSUPP), reported as the same clear error.
                assert_iopoll_error(check.as_ref().unwrap_err());
                assert_iopoll_error(&done.result.unwrap_err());
                assert!(done.fixed_buf.is_some(), "buffer handed back");
            }
        }
        assert_eq!(done_count, 4);
        let _ = std::fs::remove_dir_all(dir);
    });
}

#[test]
fn engine_iopoll() {
    let bad = spindle_io::Engine::new(Config {
        iopoll: true,
        ring_threads: RingThreads::Two,
        ..Config::default()
    });
    assert!(matches!(bad, Err(EngineError::InvalidConfig(_))));
    within_deadline(|| {
        let dir = scratch_dir("engine-iopoll");
        let path = dir.join("data");
        std::fs::write(&path, pattern(4, 64 * 1024)).unwrap();
        let polls = device_polls(&path);
        let engine = engine(Config {
            backend: BackendChoice::IoUring,
            iopoll: true,
            ..Config::default()
        });
        assert!(matches!(
            engine.submit(Op::Nop),
            Err(SubmitError::Invalid { .. })
        ));
        let buffered = std::fs::File::open(&path).unwrap();
        let done = engine
            .submit(Op::read(buffered.as_raw_fd(), 0, vec![0u8; 4096]))
            .unwrap()
            .wait();
        assert_iopoll_error(&done.result.unwrap_err());
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        let pool = engine.register_buffers(8, 4096).unwrap();
        let files = engine.register_files(&[direct.as_raw_fd()]).unwrap();
        let requests: Vec<_> = (0..8u64)
            .map(|i| {
                engine
                    .submit(Op::read_fixed(files[0], i * 4096, pool.take().unwrap()))
                    .unwrap()
            })
            .collect();
        let expected = pattern(4, 64 * 1024);
        for (i, request) in requests.into_iter().enumerate() {
            let done = request.wait();
            if polls {
                assert_eq!(done.result.unwrap(), 4096);
                assert_eq!(
                    &done.fixed_buf.unwrap()[..],
                    &expected[i * 4096..(i + 1) * 4096]
                );
            } else {
                // No poll queues: the kernel refuses, and says so clearly (no hang).
                assert_iopoll_error(&done.result.unwrap_err());
            }
        }
        let check = spindle_io::check_iopoll(direct.as_raw_fd());
        assert_eq!(check.is_ok(), polls, "{check:?}");
        drop(engine);
        let _ = std::fs::remove_dir_all(dir);
    });
}

//! Every operation on every backend, including errors, EOF and cancellation.

mod common;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use common::{engine, flavours, pattern, scratch_dir};
use spindle_io::{BackendChoice, BackendKind, Config, Engine, EngineError, IoBuf, Op, SubmitError};

fn each(test: impl Fn(&str, Engine)) {
    for (name, config) in flavours() {
        test(name, engine(config));
    }
}

#[test]
fn write_then_read_back_and_eof_is_short_not_error() {
    each(|name, engine| {
        let dir = scratch_dir("rw");
        let path = dir.join("f");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let fd = file.as_raw_fd();
        let data = pattern(1, 10_000);
        let done = engine
            .submit(Op::write(fd, 100, data.clone()))
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 10_000, "{name}");
        assert_eq!(done.buf.unwrap().len(), 10_000);
        // Read across EOF: 10_100 bytes exist, ask for 20_000 from 0.
        let done = engine
            .submit(Op::read(fd, 0, vec![0u8; 20_000]))
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 10_100, "{name}");
        assert_eq!(done.transferred, 10_100);
        let buf = done.buf.unwrap();
        assert_eq!(&buf[..100], &[0u8; 100][..]);
        assert_eq!(&buf[100..10_100], &data[..]);
        // Read entirely past EOF: 0, not an error.
        let done = engine
            .submit(Op::read(fd, 1 << 20, vec![0u8; 10]))
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 0, "{name}");
        // Vectored.
        let bufs = vec![
            IoBuf::from(pattern(2, 3)),
            IoBuf::from(pattern(3, 5000)),
            IoBuf::zeroed(0),
        ];
        let done = engine
            .submit(Op::Writev {
                fd,
                offset: Some(7),
                bufs,
            })
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 5003, "{name}");
        let bufs = vec![IoBuf::zeroed(1), IoBuf::zeroed(5002), IoBuf::zeroed(10)];
        let done = engine
            .submit(Op::Readv {
                fd,
                offset: Some(7),
                bufs,
            })
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 5013, "{name}");
        let got: Vec<u8> = done.bufs.iter().flat_map(|b| b.iter().copied()).collect();
        let mut want = pattern(2, 3);
        want.extend(pattern(3, 5000));
        assert_eq!(&got[..5003], &want[..]);
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(&on_disk[7..5010], &want[..]);
        // Sync ops and fallocate.
        for op in [Op::Fsync { fd }, Op::Fdatasync { fd }] {
            assert_eq!(
                engine.submit(op).unwrap().wait().result.unwrap(),
                0,
                "{name}"
            );
        }
        let op = Op::Fallocate {
            fd,
            mode: 0,
            offset: 0,
            len: 1 << 20,
        };
        assert_eq!(
            engine.submit(op).unwrap().wait().result.unwrap(),
            0,
            "{name}"
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
        // statx.
        let done = engine.submit(Op::statx_fd(fd)).unwrap().wait();
        assert_eq!(done.result.unwrap(), 0);
        assert_eq!(done.statx.unwrap().stx_size, 1 << 20, "{name}");
        drop(file);
        std::fs::remove_dir_all(dir).unwrap();
    });
}

#[test]
fn sqpoll_rings_work() {
    for threads in [spindle_io::RingThreads::One, spindle_io::RingThreads::Two] {
        let config = Config {
            backend: BackendChoice::IoUring,
            ring_threads: threads,
            sqpoll_idle: Some(Duration::from_millis(10)),
            ..Config::default()
        };
        let engine = engine(config);
        let dir = scratch_dir("sqpoll");
        let file = std::fs::File::create_new(dir.join("f")).unwrap();
        let fd = file.as_raw_fd();
        let reqs: Vec<_> = (0..64u64)
            .map(|i| {
                engine
                    .submit(Op::write(fd, i * 512, pattern(i, 512)))
                    .unwrap()
            })
            .collect();
        engine.block_on(&reqs);
        for r in reqs {
            assert_eq!(r.wait().result.unwrap(), 512, "{threads:?}");
        }
        let want: Vec<u8> = (0..64u64).flat_map(|i| pattern(i, 512)).collect();
        let done = engine
            .submit(Op::read(fd, 0, vec![0u8; 64 * 512]))
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 64 * 512, "{threads:?}");
        assert!(done.buf.unwrap()[..] == want[..]);
        assert!(std::fs::read(dir.join("f")).unwrap() == want);
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn open_close_and_statx_by_path() {
    each(|name, engine| {
        let dir = scratch_dir("open");
        let path = dir.join("new");
        let op = Op::open(&path, libc::O_CREAT | libc::O_RDWR | libc::O_CLOEXEC, 0o644).unwrap();
        let fd = engine.submit(op).unwrap().wait().result.unwrap() as i32;
        assert!(fd >= 0);
        let done = engine
            .submit(Op::write(fd, 0, b"hello".to_vec()))
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 5);
        let done = engine.submit(Op::Close { fd }).unwrap().wait();
        assert_eq!(done.result.unwrap(), 0, "{name}");
        assert_eq!(std::fs::read(&path).unwrap(), b"hello");
        let cpath = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        let op = Op::Statx {
            fd: libc::AT_FDCWD,
            path: cpath,
            flags: 0,
            mask: libc::STATX_SIZE,
        };
        let done = engine.submit(op).unwrap().wait();
        assert_eq!(done.statx.unwrap().stx_size, 5, "{name}");
        // Missing file: ENOENT with the OS code.
        let op = Op::open(&dir.join("missing"), libc::O_RDONLY, 0).unwrap();
        let err = engine.submit(op).unwrap().wait().result.unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{name}");
        std::fs::remove_dir_all(dir).unwrap();
    });
}

#[test]
fn invalid_descriptors_and_offsets_are_errors() {
    each(|name, engine| {
        let bad_fd = 1_000_000;
        for op in [
            Op::read(bad_fd, 0, vec![0u8; 10]),
            Op::write(bad_fd, 0, vec![1u8; 10]),
            Op::Fsync { fd: bad_fd },
            Op::Close { fd: bad_fd },
            Op::statx_fd(bad_fd),
            Op::Recv {
                fd: bad_fd,
                buf: IoBuf::zeroed(4),
                flags: 0,
            },
        ] {
            let done = engine.submit(op).unwrap().wait();
            let err = done.result.unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EBADF), "{name}: {err}");
        }
        let dir = scratch_dir("badoff");
        let file = std::fs::File::create(dir.join("f")).unwrap();
        let fd = file.as_raw_fd();
        // Offsets beyond i64::MAX are negative to the kernel: EINVAL, never a hang.
        for op in [
            Op::read(fd, u64::MAX - 10, vec![0u8; 10]),
            Op::write(fd, 1 << 63, vec![1u8; 10]),
        ] {
            let err = engine.submit(op).unwrap().wait().result.unwrap_err();
            assert!(err.raw_os_error().is_some(), "{name}: {err}");
        }
        // Read on a write-only descriptor.
        let err = engine
            .submit(Op::read(fd, 0, vec![0u8; 1]))
            .unwrap()
            .wait()
            .result
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF), "{name}");
        std::fs::remove_dir_all(dir).unwrap();
    });
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: fresh descriptors owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Writes `data` in `piece`-byte chunks with pauses, so every read returns partial data.
fn trickle(
    mut out: impl Write + Send + 'static,
    data: Vec<u8>,
    piece: usize,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for chunk in data.chunks(piece) {
            out.write_all(chunk).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
    })
}

#[test]
fn short_reads_on_pipes_are_resubmitted_to_the_right_offset() {
    each(|name, engine| {
        let (r, w) = pipe();
        let data = pattern(9, 3000);
        let writer = trickle(std::fs::File::from(w), data.clone(), 97);
        let before = engine.stats().resubmitted;
        let done = engine
            .submit(Op::read_stream(r.as_raw_fd(), vec![0u8; 2000]))
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 2000, "{name}");
        assert_eq!(&done.buf.unwrap()[..], &data[..2000], "{name}");
        // The rest, then EOF (writer closes): short result, not an error.
        let done = engine
            .submit(Op::read_stream(r.as_raw_fd(), vec![0u8; 5000]))
            .unwrap()
            .wait();
        writer.join().unwrap();
        assert_eq!(done.result.unwrap(), 1000, "{name}");
        assert_eq!(&done.buf.unwrap()[..1000], &data[2000..], "{name}");
        assert!(
            engine.stats().resubmitted - before >= 10,
            "{name}: {:?}",
            engine.stats()
        );
    });
}

#[test]
fn short_writes_on_pipes_and_sockets_complete() {
    each(|name, engine| {
        // A pipe holds 64 KiB: a 1 MiB write must be resubmitted as the reader drains it.
        let (r, w) = pipe();
        let data = pattern(4, 1 << 20);
        let reader = std::thread::spawn(move || {
            let mut f = std::fs::File::from(r);
            let mut got = Vec::new();
            let mut chunk = vec![0u8; 7000];
            loop {
                let n = f.read(&mut chunk).unwrap();
                if n == 0 {
                    break got;
                }
                got.extend_from_slice(&chunk[..n]);
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let done = engine
            .submit(Op::write_stream(w.as_raw_fd(), data.clone()))
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 1 << 20, "{name}");
        drop(w);
        assert!(reader.join().unwrap() == data, "{name}: pipe bytes differ");

        // Sockets: send all of a large buffer; read it in pieces; trickled reads fill up.
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let data = pattern(5, 600_000);
        let b2 = b.try_clone().unwrap();
        let reader = std::thread::spawn(move || {
            let mut b2 = b2;
            let mut got = vec![0u8; 600_000];
            b2.read_exact(&mut got).unwrap();
            got
        });
        let op = Op::Send {
            fd: a.as_raw_fd(),
            buf: data.clone().into(),
            flags: 0,
        };
        assert_eq!(
            engine.submit(op).unwrap().wait().result.unwrap(),
            600_000,
            "{name}"
        );
        assert!(
            reader.join().unwrap() == data,
            "{name}: socket bytes differ"
        );
        let small = pattern(6, 1500);
        let writer = trickle(a.try_clone().unwrap(), small.clone(), 100);
        let done = engine
            .submit(Op::read_stream(b.as_raw_fd(), vec![0u8; 1500]))
            .unwrap()
            .wait();
        writer.join().unwrap();
        assert_eq!(done.result.unwrap(), 1500, "{name}");
        assert_eq!(&done.buf.unwrap()[..], &small[..], "{name}");
        // Recv is one call: returns what is there.
        (&a).write_all(b"xyz").unwrap();
        let op = Op::Recv {
            fd: b.as_raw_fd(),
            buf: IoBuf::zeroed(100),
            flags: 0,
        };
        let done = engine.submit(op).unwrap().wait();
        assert_eq!(done.result.unwrap(), 3, "{name}");
        assert_eq!(&done.buf.unwrap()[..3], b"xyz");
    });
}

#[test]
fn tcp_accept_connect_send_recv() {
    each(|name, engine| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let accept = engine
            .submit(Op::Accept {
                fd: listener.as_raw_fd(),
            })
            .unwrap();
        // SAFETY: plain socket creation.
        let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        assert!(s >= 0);
        // SAFETY: fresh descriptor.
        let client = unsafe { OwnedFd::from_raw_fd(s) };
        let done = engine
            .submit(Op::Connect {
                fd: client.as_raw_fd(),
                addr,
            })
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 0, "{name}");
        let server_fd = accept.wait().result.unwrap() as i32;
        // SAFETY: accept returned a fresh descriptor.
        let server = unsafe { OwnedFd::from_raw_fd(server_fd) };
        let op = Op::Send {
            fd: client.as_raw_fd(),
            buf: b"ping".to_vec().into(),
            flags: 0,
        };
        assert_eq!(engine.submit(op).unwrap().wait().result.unwrap(), 4);
        let op = Op::read_stream(server.as_raw_fd(), vec![0u8; 4]);
        let done = engine.submit(op).unwrap().wait();
        assert_eq!(&done.buf.unwrap()[..], b"ping", "{name}");
    });
}

#[test]
fn timeouts_and_cancellation() {
    each(|name, engine| {
        let t0 = Instant::now();
        let done = engine
            .submit(Op::Timeout {
                duration: Duration::from_millis(30),
            })
            .unwrap()
            .wait();
        assert_eq!(done.result.unwrap(), 0, "{name}");
        assert!(t0.elapsed() >= Duration::from_millis(29), "{name}");
        if engine.backend() == BackendKind::IoUring {
            // A read on an empty pipe waits forever until cancelled.
            let (r, _w) = pipe();
            let read = engine
                .submit(Op::read_stream(r.as_raw_fd(), vec![0u8; 8]))
                .unwrap();
            std::thread::sleep(Duration::from_millis(20));
            let cancel = engine.cancel(&read).unwrap().wait();
            assert_eq!(cancel.result.unwrap(), 0, "{name}");
            let err = read.wait().result.unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::ECANCELED), "{name}");
        } else {
            // Thread pool: a request still queued behind busy workers can be cancelled.
            let (r, w) = pipe();
            let blockers: Vec<_> = (0..8)
                .map(|_| {
                    engine
                        .submit(Op::read_stream(r.as_raw_fd(), vec![0u8; 1]))
                        .unwrap()
                })
                .collect();
            std::thread::sleep(Duration::from_millis(20));
            let queued = engine.submit(Op::Nop).unwrap();
            let cancel = engine.cancel(&queued).unwrap();
            // Unblock the workers.
            std::fs::File::from(w).write_all(&[0u8; 8]).unwrap();
            engine.block_on(&blockers);
            let c = cancel.wait();
            let q = queued.wait();
            match c.result {
                Ok(0) => assert_eq!(q.result.unwrap_err().raw_os_error(), Some(libc::ECANCELED)),
                Ok(n) => panic!("{name}: cancel returned {n}"),
                Err(e) => {
                    assert!(
                        e.raw_os_error() == Some(libc::EALREADY)
                            || e.raw_os_error() == Some(libc::ENOENT)
                    );
                    assert_eq!(q.result.unwrap(), 0);
                }
            }
        }
    });
}

#[test]
fn dropped_requests_and_shutdown_never_hang_or_free_early() {
    for (name, mut config) in flavours() {
        config.shutdown_grace = Duration::from_millis(50);
        let pool = config.backend == BackendChoice::ThreadPool;
        let engine = engine(config);
        let (r, w) = pipe();
        // Dropped while the kernel may write into the buffer: the buffer stays alive.
        for _ in 0..4 {
            drop(
                engine
                    .submit(Op::read_stream(r.as_raw_fd(), vec![0u8; 64]))
                    .unwrap(),
            );
        }
        let pending = engine
            .submit(Op::read_stream(r.as_raw_fd(), vec![0u8; 64]))
            .unwrap();
        if pool {
            // Blocking reads cannot be cancelled: let them finish through EOF.
            drop(w);
        }
        let t0 = Instant::now();
        engine.shutdown();
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{name}: shutdown too slow"
        );
        let done = pending.wait();
        match done.result {
            Ok(n) => assert_eq!(n, 0, "{name}"),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ECANCELED), "{name}"),
        }
    }
}

#[test]
fn submit_after_shutdown_returns_the_op() {
    let engine = Engine::new(Config::default()).unwrap();
    let e2 = Arc::new(engine);
    let engine = Arc::try_unwrap(e2).unwrap();
    // Rejected ops come back with their buffer.
    let err = engine
        .submit(Op::Readv {
            fd: 0,
            offset: None,
            bufs: (0..2000).map(|_| IoBuf::zeroed(1)).collect(),
        })
        .unwrap_err();
    assert!(matches!(err, SubmitError::Invalid { .. }));
    match err.into_op() {
        Op::Readv { bufs, .. } => assert_eq!(bufs.len(), 2000),
        other => panic!("wrong op back: {other:?}"),
    }
    engine.shutdown();
}

#[test]
fn ring_setup_failure_falls_back_or_errors() {
    let failing: spindle_io::RingFactory =
        Arc::new(|_| Err(std::io::Error::from_raw_os_error(libc::EPERM)));
    let config = Config {
        ring_factory: failing.clone(),
        rings: 2,
        ..Config::default()
    };
    let engine = Engine::new(config).unwrap();
    assert_eq!(engine.backend(), BackendKind::ThreadPool);
    let done = engine.submit(Op::Nop).unwrap().wait();
    assert_eq!(done.result.unwrap(), 0);
    // Second ring failing after the first succeeded also falls back cleanly.
    let second_fails: spindle_io::RingFactory = Arc::new(|setup| {
        if setup.index == 1 {
            Err(std::io::Error::from_raw_os_error(libc::ENOMEM))
        } else {
            (spindle_io::default_ring_factory())(setup)
        }
    });
    let config = Config {
        ring_factory: second_fails,
        rings: 2,
        ..Config::default()
    };
    assert_eq!(
        Engine::new(config).unwrap().backend(),
        BackendKind::ThreadPool
    );
    let config = Config {
        ring_factory: failing,
        backend: BackendChoice::IoUring,
        ..Config::default()
    };
    match Engine::new(config) {
        Err(EngineError::RingSetup { index: 0, source }) => {
            assert_eq!(source.raw_os_error(), Some(libc::EPERM))
        }
        other => panic!("expected RingSetup error, got {other:?}"),
    }
    let config = Config {
        rings: 0,
        ..Config::default()
    };
    assert!(matches!(
        Engine::new(config),
        Err(EngineError::InvalidConfig(_))
    ));
}

struct Flag(std::sync::atomic::AtomicBool, std::thread::Thread);
impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        self.1.unpark();
    }
}

#[test]
fn requests_are_futures() {
    each(|name, engine| {
        let flag = Arc::new(Flag(false.into(), std::thread::current()));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let mut req = engine
            .submit(Op::Timeout {
                duration: Duration::from_millis(10),
            })
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let completion = loop {
            match std::pin::Pin::new(&mut req).poll(&mut cx) {
                Poll::Ready(c) => break c,
                Poll::Pending => {
                    assert!(Instant::now() < deadline, "{name}: future never woke");
                    std::thread::park_timeout(Duration::from_millis(100));
                }
            }
        };
        assert_eq!(completion.result.unwrap(), 0);
        assert!(
            flag.0.load(std::sync::atomic::Ordering::SeqCst),
            "{name}: waker not called"
        );
        assert!(req.is_done());
    });
}

use std::future::Future;

#[test]
fn poll_block_on_and_counters() {
    each(|name, engine| {
        let reqs: Vec<_> = (0..100).map(|_| engine.submit(Op::Nop).unwrap()).collect();
        engine.block_on(&reqs);
        assert_eq!(engine.poll(&reqs), 100, "{name}");
        let stats = engine.stats();
        assert_eq!(stats.submitted, 100);
        assert_eq!(stats.completed, 100);
        assert_eq!(stats.in_flight, 0);
        assert_eq!(stats.latency.count, 100);
        assert!(stats.latency.p99_ns >= stats.latency.p50_ns);
        assert!(!stats.rings.is_empty());
        for mut r in reqs {
            assert_eq!(r.try_take().unwrap().result.unwrap(), 0);
        }
    });
}

/// A shared buffer is written from the bytes others hold (no copy), on every backend; a
/// read into it is refused at submission (others read those bytes), and the other holder
/// still sees them unchanged.
#[test]
fn shared_buffers_are_written_and_never_read_into() {
    each(|name, engine| {
        let dir = scratch_dir("shared");
        let path = dir.join("f");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let fd = file.as_raw_fd();
        let data = Arc::new(pattern(7, 300_000));
        let buf = IoBuf::shared(data.clone());
        assert!(buf.is_shared());
        assert_eq!(<[u8]>::as_ptr(&buf), data.as_ptr(), "{name}: no copy");
        let done = engine.submit(Op::write(fd, 0, buf)).unwrap().wait();
        assert_eq!(done.result.unwrap(), 300_000, "{name}");
        assert!(done.buf.is_some_and(|b| b.is_shared()), "{name}");
        assert_eq!(std::fs::read(&path).unwrap(), *data, "{name}");
        for op in [
            Op::Read {
                fd,
                offset: Some(0),
                buf: IoBuf::shared(data.clone()),
            },
            Op::Readv {
                fd,
                offset: Some(0),
                bufs: vec![IoBuf::zeroed(10), IoBuf::shared(data.clone())],
            },
        ] {
            let err = engine.submit(op).unwrap_err();
            assert!(matches!(err, SubmitError::Invalid { .. }), "{name}: {err}");
        }
        assert_eq!(*data, pattern(7, 300_000), "{name}");
        assert_eq!(Arc::strong_count(&data), 1, "{name}: every view released");
        drop(file);
        std::fs::remove_dir_all(&dir).unwrap();
    });
}

#[test]
#[should_panic(expected = "shared buffer")]
fn mutable_access_to_a_shared_buffer_is_a_bug() {
    let mut buf = IoBuf::shared(Arc::new(vec![1, 2, 3]));
    buf[0] = 9;
}

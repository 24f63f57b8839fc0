//! Property test: random operation sequences through the engine give the same results and
//! the same file contents as the same sequence through `std::fs`, for both backends.

mod common;

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

use proptest::prelude::*;
use spindle_io::{BackendChoice, Config, Engine, IoBuf, Op, RingThreads};

#[derive(Debug, Clone)]
enum Step {
    Write {
        offset: u64,
        len: usize,
        seed: u64,
    },
    Read {
        offset: u64,
        len: usize,
    },
    Writev {
        offset: u64,
        lens: Vec<usize>,
        seed: u64,
    },
    Readv {
        offset: u64,
        lens: Vec<usize>,
    },
    Fallocate {
        offset: u64,
        len: u64,
    },
    Fdatasync,
    Size,
}

fn step() -> impl Strategy<Value = Step> {
    let offset = 0u64..70_000;
    prop_oneof![
        (offset.clone(), 0usize..9000, any::<u64>()).prop_map(|(offset, len, seed)| Step::Write {
            offset,
            len,
            seed
        }),
        (offset.clone(), 0usize..9000).prop_map(|(offset, len)| Step::Read { offset, len }),
        (
            offset.clone(),
            prop::collection::vec(0usize..3000, 0..5),
            any::<u64>()
        )
            .prop_map(|(offset, lens, seed)| Step::Writev { offset, lens, seed }),
        (offset.clone(), prop::collection::vec(0usize..3000, 0..5))
            .prop_map(|(offset, lens)| Step::Readv { offset, lens }),
        (offset, 1u64..20_000).prop_map(|(offset, len)| Step::Fallocate { offset, len }),
        Just(Step::Fdatasync),
        Just(Step::Size),
    ]
}

/// std reference for a read: read until full or EOF.
fn read_full(file: &std::fs::File, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = file
            .read_at(&mut buf[done..], offset + done as u64)
            .unwrap();
        if n == 0 {
            break;
        }
        done += n;
    }
    buf.truncate(done);
    buf
}

fn check(engine: &Engine, steps: &[Step]) {
    let dir = common::scratch_dir("model");
    let open = |name: &str| {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(dir.join(name))
            .unwrap()
    };
    let ours = open("engine");
    let reference = open("std");
    let fd = ours.as_raw_fd();
    for step in steps {
        match step {
            Step::Write { offset, len, seed } => {
                let data = common::pattern(*seed, *len);
                reference.write_all_at(&data, *offset).unwrap();
                let c = engine.submit(Op::write(fd, *offset, data)).unwrap().wait();
                assert_eq!(c.result.unwrap(), *len);
            }
            Step::Read { offset, len } => {
                let want = read_full(&reference, *offset, *len);
                let c = engine
                    .submit(Op::read(fd, *offset, vec![0u8; *len]))
                    .unwrap()
                    .wait();
                let n = c.result.unwrap();
                assert_eq!(&c.buf.unwrap()[..n], &want[..], "{step:?}");
            }
            Step::Writev { offset, lens, seed } => {
                let total: usize = lens.iter().sum();
                let data = common::pattern(*seed, total);
                reference.write_all_at(&data, *offset).unwrap();
                let mut bufs = Vec::new();
                let mut at = 0;
                for len in lens {
                    bufs.push(IoBuf::from(data[at..at + len].to_vec()));
                    at += len;
                }
                let op = Op::Writev {
                    fd,
                    offset: Some(*offset),
                    bufs,
                };
                assert_eq!(engine.submit(op).unwrap().wait().result.unwrap(), total);
            }
            Step::Readv { offset, lens } => {
                let total: usize = lens.iter().sum();
                let want = read_full(&reference, *offset, total);
                let bufs = lens.iter().map(|&l| IoBuf::zeroed(l)).collect();
                let op = Op::Readv {
                    fd,
                    offset: Some(*offset),
                    bufs,
                };
                let c = engine.submit(op).unwrap().wait();
                let n = c.result.unwrap();
                let got: Vec<u8> = c.bufs.iter().flat_map(|b| b.iter().copied()).collect();
                assert_eq!(&got[..n], &want[..], "{step:?}");
            }
            Step::Fallocate { offset, len } => {
                // SAFETY: plain system call on an open descriptor.
                let r = unsafe {
                    libc::fallocate(reference.as_raw_fd(), 0, *offset as i64, *len as i64)
                };
                assert_eq!(r, 0);
                let op = Op::Fallocate {
                    fd,
                    mode: 0,
                    offset: *offset,
                    len: *len,
                };
                assert_eq!(engine.submit(op).unwrap().wait().result.unwrap(), 0);
            }
            Step::Fdatasync => {
                reference.sync_data().unwrap();
                let c = engine.submit(Op::Fdatasync { fd }).unwrap().wait();
                assert_eq!(c.result.unwrap(), 0);
            }
            Step::Size => {
                let want = reference.metadata().unwrap().len();
                let c = engine.submit(Op::statx_fd(fd)).unwrap().wait();
                assert_eq!(c.statx.unwrap().stx_size, want);
            }
        }
    }
    assert!(std::fs::read(dir.join("engine")).unwrap() == std::fs::read(dir.join("std")).unwrap());
    drop((ours, reference));
    std::fs::remove_dir_all(dir).unwrap();
}

fn uring() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        let config = Config {
            rings: 2,
            backend: BackendChoice::IoUring,
            ..Config::default()
        };
        Engine::new(config).unwrap()
    })
}

fn uring_two_threads() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        let config = Config {
            rings: 2,
            ring_threads: RingThreads::Two,
            backend: BackendChoice::IoUring,
            ..Config::default()
        };
        Engine::new(config).unwrap()
    })
}

fn pool() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        let config = Config {
            rings: 2,
            backend: BackendChoice::ThreadPool,
            ..Config::default()
        };
        Engine::new(config).unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn io_uring_matches_std_fs(steps in prop::collection::vec(step(), 1..40)) {
        check(uring(), &steps);
    }

    #[test]
    fn io_uring_two_threads_matches_std_fs(steps in prop::collection::vec(step(), 1..40)) {
        check(uring_two_threads(), &steps);
    }

    #[test]
    fn thread_pool_matches_std_fs(steps in prop::collection::vec(step(), 1..40)) {
        check(pool(), &steps);
    }
}

//! The submit/poll engine interface with the CPU engine: results, ordering, backpressure and
//! per-job errors that hand the buffers back.

use std::collections::VecDeque;

use spindle_ec::accel::{CodeSpec, CodingEngine, Completion, CpuEngine, Job, JobId};
use spindle_ec::{crc32c, EcError, EngineKind, MatrixKind, ReedSolomon};

fn stripe(k: usize, m: usize, len: usize, seed: u8) -> Vec<Vec<u8>> {
    (0..k + m)
        .map(|i| {
            if i < k {
                (0..len)
                    .map(|b| (b as u8).wrapping_mul(31).wrapping_add(seed ^ i as u8))
                    .collect()
            } else {
                vec![0u8; len]
            }
        })
        .collect()
}

fn engines() -> Vec<EngineKind> {
    EngineKind::CONCRETE
        .into_iter()
        .filter(|e| e.is_available())
        .collect()
}

#[test]
fn cpu_engine_runs_every_job_kind() {
    let code = CodeSpec {
        data_chunks: 6,
        parity_chunks: 3,
        matrix: MatrixKind::IsalCauchy,
    };
    for kind in engines() {
        let mut engine = CpuEngine::new(kind).unwrap();
        assert_eq!(engine.name(), format!("cpu-{kind}"));
        let reference =
            ReedSolomon::with_engine(6, 3, MatrixKind::IsalCauchy, EngineKind::Scalar).unwrap();
        let mut expected = stripe(6, 3, 5000, 1);
        let (data, parity) = expected.split_at_mut(6);
        reference.encode(data, parity).unwrap();

        let mut damaged = expected.clone();
        damaged[1].fill(0);
        damaged[7].fill(0);
        let mut jobs = VecDeque::from(vec![
            Job::Encode {
                code,
                chunks: stripe(6, 3, 5000, 1),
            },
            Job::EncodeWithCrc {
                code,
                chunks: stripe(6, 3, 5000, 1),
            },
            Job::Decode {
                code,
                chunks: damaged,
                erasures: vec![1, 7],
            },
            Job::Crc32c {
                buffers: vec![b"123456789".to_vec(), Vec::new()],
            },
        ]);
        let ids = engine.submit(&mut jobs);
        assert!(jobs.is_empty());
        assert_eq!(ids.len(), 4);
        let mut done: Vec<Completion> = Vec::new();
        while engine.in_flight() > 0 {
            engine.wait(&mut done, 2);
        }
        assert_eq!(done.len(), 4);
        done.sort_by_key(|c| c.id);
        assert_eq!(done.iter().map(|c| c.id).collect::<Vec<JobId>>(), ids);
        for completion in &done {
            assert_eq!(completion.status, Ok(()), "{kind}");
        }
        assert_eq!(done[0].buffers, expected);
        assert!(done[0].crcs.is_empty());
        assert_eq!(done[1].buffers, expected);
        let crcs: Vec<u32> = expected.iter().map(|c| crc32c::crc32c(c)).collect();
        assert_eq!(done[1].crcs, crcs);
        assert_eq!(done[2].buffers, expected);
        assert_eq!(done[3].crcs, vec![crc32c::CHECK_VALUE, 0]);
    }
}

#[test]
fn queue_depth_gives_backpressure() {
    let mut engine = CpuEngine::with_queue_depth(EngineKind::Auto, 3).unwrap();
    assert_eq!(engine.queue_depth_max(), 3);
    let mut jobs: VecDeque<Job> = (0..5)
        .map(|i| Job::Crc32c {
            buffers: vec![vec![i as u8; 10]],
        })
        .collect();
    let first = engine.submit(&mut jobs);
    assert_eq!(first.len(), 3);
    assert_eq!(jobs.len(), 2, "jobs that did not fit stay with the caller");
    assert!(
        engine.submit(&mut jobs).is_empty(),
        "a full engine accepts nothing"
    );
    let mut done = Vec::new();
    assert_eq!(engine.poll(&mut done, 1), 1);
    let second = engine.submit(&mut jobs);
    assert_eq!(second.len(), 1);
    assert!(second[0] > first[2], "ids keep increasing");
    assert_eq!(engine.poll(&mut done, 10), 3);
    assert_eq!(engine.in_flight(), 0);
    assert_eq!(engine.poll(&mut done, 10), 0);
}

#[test]
fn bad_jobs_complete_with_errors_and_return_buffers() {
    let mut engine = CpuEngine::new(EngineKind::Auto).unwrap();
    let bad_code = CodeSpec {
        data_chunks: 0,
        parity_chunks: 2,
        matrix: MatrixKind::IsalRs,
    };
    let code = CodeSpec {
        data_chunks: 2,
        parity_chunks: 1,
        matrix: MatrixKind::IsalRs,
    };
    let mut jobs = VecDeque::from(vec![
        Job::Encode {
            code: bad_code,
            chunks: vec![vec![1, 2, 3]],
        },
        Job::Encode {
            code,
            chunks: vec![vec![1, 2, 3], vec![4, 5, 6]],
        },
        Job::EncodeWithCrc {
            code,
            chunks: vec![vec![1, 2, 3], vec![4, 5], vec![0, 0, 0]],
        },
        Job::Decode {
            code,
            chunks: stripe(2, 1, 8, 3),
            erasures: vec![0, 1],
        },
    ]);
    engine.submit(&mut jobs);
    let mut done = Vec::new();
    engine.poll(&mut done, usize::MAX);
    assert_eq!(done[0].status, Err(EcError::NoDataChunks));
    assert_eq!(done[0].buffers, vec![vec![1, 2, 3]]);
    assert!(matches!(
        done[1].status,
        Err(EcError::BufferCount { what: "chunk", .. })
    ));
    assert_eq!(done[1].buffers.len(), 2);
    assert!(matches!(
        done[2].status,
        Err(EcError::ChunkLength { index: 1, .. })
    ));
    assert!(matches!(
        done[3].status,
        Err(EcError::TooManyErasures { .. })
    ));
    assert_eq!(done[3].buffers.len(), 3);
}

#[test]
fn unavailable_engine_is_an_error() {
    for kind in EngineKind::CONCRETE {
        if !kind.is_available() {
            assert_eq!(
                CpuEngine::new(kind).unwrap_err(),
                EcError::EngineUnavailable(kind)
            );
        }
    }
}

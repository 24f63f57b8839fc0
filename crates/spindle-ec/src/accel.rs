//! The engine interface through which clients hand coding and checksum work to an engine —
//! the CPU today, a GPU, FPGA or SmartNIC tomorrow — without knowing which.
//!
//! The model is submit/poll, as with io_uring or an accelerator's command queue:
//! - [`CodingEngine::submit`] takes jobs from the front of the caller's queue, as many as the
//!   engine has room for, and returns their [`JobId`]s. Jobs own their buffers (`Vec<u8>`),
//!   so an engine can DMA them or keep them across an asynchronous completion.
//! - [`CodingEngine::poll`] returns finished jobs, in any order, each with its buffers (always
//!   handed back, also on error) and CRCs.
//! - Backpressure: an engine accepts at most [`CodingEngine::queue_depth_max`] jobs that have
//!   not been polled yet; jobs it cannot take stay in the caller's queue.
//!
//! [`CpuEngine`] implements the trait with the SIMD kernels of this crate, executing each job
//! synchronously at submit time.

use std::collections::VecDeque;

use crate::{crc32c, EcError, EngineKind, MatrixKind, ReedSolomon};

/// Identifies a code: k, m and the coding matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CodeSpec {
    pub data_chunks: usize,
    pub parity_chunks: usize,
    pub matrix: MatrixKind,
}

/// One unit of work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// `chunks` holds k data chunks then m parity buffers of the same length; the parity
    /// buffers are overwritten.
    Encode {
        code: CodeSpec,
        chunks: Vec<Vec<u8>>,
    },
    /// Like `Encode`, and the completion carries the CRC32C of all k + m chunks.
    EncodeWithCrc {
        code: CodeSpec,
        chunks: Vec<Vec<u8>>,
    },
    /// `chunks` holds all k + m chunks; those listed in `erasures` are rebuilt in place.
    Decode {
        code: CodeSpec,
        chunks: Vec<Vec<u8>>,
        erasures: Vec<usize>,
    },
    /// The completion carries the CRC32C of every buffer.
    Crc32c { buffers: Vec<Vec<u8>> },
}

impl Job {
    fn into_buffers(self) -> Vec<Vec<u8>> {
        match self {
            Job::Encode { chunks, .. }
            | Job::EncodeWithCrc { chunks, .. }
            | Job::Decode { chunks, .. } => chunks,
            Job::Crc32c { buffers } => buffers,
        }
    }
}

/// Handle of a submitted job, unique per engine instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub u64);

/// A finished job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub id: JobId,
    /// The job's buffers, returned whatever the outcome (parity or rebuilt chunks filled in
    /// on success).
    pub buffers: Vec<Vec<u8>>,
    /// CRC32C per buffer for `EncodeWithCrc` and `Crc32c` jobs, empty otherwise.
    pub crcs: Vec<u32>,
    pub status: Result<(), EcError>,
}

/// An engine that executes coding and checksum jobs.
pub trait CodingEngine: Send {
    /// Human-readable name, e.g. "cpu-avx2".
    fn name(&self) -> String;

    /// Most jobs accepted but not yet returned by `poll`.
    fn queue_depth_max(&self) -> usize;

    /// Jobs accepted and not yet returned by `poll`.
    fn in_flight(&self) -> usize;

    /// Moves jobs from the front of `jobs` into the engine while it has room, returning the
    /// ids of the accepted jobs in order. Jobs left in `jobs` were not accepted.
    fn submit(&mut self, jobs: &mut VecDeque<Job>) -> Vec<JobId>;

    /// Appends up to `max` finished jobs to `completions` without blocking; returns how many.
    fn poll(&mut self, completions: &mut Vec<Completion>, max: usize) -> usize;

    /// Like `poll`, but blocks until at least one job has finished if any is in flight.
    fn wait(&mut self, completions: &mut Vec<Completion>, max: usize) -> usize;
}

/// Default queue depth of [`CpuEngine`].
pub const CPU_QUEUE_DEPTH_MAX: usize = 256;

/// Most distinct codes whose codec (matrix, tables, decode cache) a [`CpuEngine`] keeps.
pub const CPU_CODECS_MAX: usize = 16;

/// The CPU engine: runs each job at submit time with the kernels of one [`EngineKind`].
#[derive(Debug)]
pub struct CpuEngine {
    kind: EngineKind,
    queue_depth_max: usize,
    next_id: u64,
    done: VecDeque<Completion>,
    codecs: Vec<(CodeSpec, ReedSolomon)>,
}

impl CpuEngine {
    /// An engine with the given kernels (`Auto` resolves through the environment and CPU).
    pub fn new(kind: EngineKind) -> Result<Self, EcError> {
        Self::with_queue_depth(kind, CPU_QUEUE_DEPTH_MAX)
    }

    pub fn with_queue_depth(kind: EngineKind, queue_depth_max: usize) -> Result<Self, EcError> {
        let kind = kind.resolve()?;
        Ok(CpuEngine {
            kind,
            queue_depth_max: queue_depth_max.max(1),
            next_id: 0,
            done: VecDeque::new(),
            codecs: Vec::new(),
        })
    }

    fn codec(&mut self, code: CodeSpec) -> Result<&ReedSolomon, EcError> {
        let position = match self.codecs.iter().position(|(spec, _)| *spec == code) {
            Some(position) => position,
            None => {
                let codec = ReedSolomon::with_engine(
                    code.data_chunks,
                    code.parity_chunks,
                    code.matrix,
                    self.kind,
                )?;
                if self.codecs.len() >= CPU_CODECS_MAX {
                    self.codecs.remove(0);
                }
                self.codecs.push((code, codec));
                self.codecs.len() - 1
            }
        };
        Ok(&self.codecs[position].1)
    }

    fn encode_job(
        &mut self,
        code: CodeSpec,
        chunks: &mut [Vec<u8>],
        with_crc: bool,
    ) -> Result<Vec<u32>, EcError> {
        let codec = self.codec(code)?;
        if chunks.len() != codec.total_chunks() {
            return Err(EcError::BufferCount {
                what: "chunk",
                expected: codec.total_chunks(),
                actual: chunks.len(),
            });
        }
        let (data, parity) = chunks.split_at_mut(codec.data_chunks());
        if with_crc {
            let mut crcs = vec![0; codec.total_chunks()];
            codec.encode_with_crc(data, parity, &mut crcs)?;
            Ok(crcs)
        } else {
            codec.encode(data, parity)?;
            Ok(Vec::new())
        }
    }

    fn execute(&mut self, job: &mut Job) -> Result<Vec<u32>, EcError> {
        match job {
            Job::Encode { code, chunks } => self.encode_job(*code, chunks, false),
            Job::EncodeWithCrc { code, chunks } => self.encode_job(*code, chunks, true),
            Job::Decode {
                code,
                chunks,
                erasures,
            } => {
                let codec = self.codec(*code)?;
                codec.decode(chunks, erasures)?;
                Ok(Vec::new())
            }
            Job::Crc32c { buffers } => {
                let engine = self.kind.crc_engine();
                Ok(buffers
                    .iter()
                    .map(|b| crc32c::crc32c_append_with(engine, 0, b))
                    .collect())
            }
        }
    }
}

impl CodingEngine for CpuEngine {
    fn name(&self) -> String {
        format!("cpu-{}", self.kind.name())
    }

    fn queue_depth_max(&self) -> usize {
        self.queue_depth_max
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn submit(&mut self, jobs: &mut VecDeque<Job>) -> Vec<JobId> {
        let mut ids = Vec::new();
        while self.done.len() < self.queue_depth_max {
            let Some(mut job) = jobs.pop_front() else {
                break;
            };
            let id = JobId(self.next_id);
            self.next_id += 1;
            let result = self.execute(&mut job);
            let (crcs, status) = match result {
                Ok(crcs) => (crcs, Ok(())),
                Err(error) => (Vec::new(), Err(error)),
            };
            self.done.push_back(Completion {
                id,
                buffers: job.into_buffers(),
                crcs,
                status,
            });
            ids.push(id);
        }
        assert!(self.done.len() <= self.queue_depth_max);
        ids
    }

    fn poll(&mut self, completions: &mut Vec<Completion>, max: usize) -> usize {
        let count = max.min(self.done.len());
        completions.extend(self.done.drain(..count));
        count
    }

    fn wait(&mut self, completions: &mut Vec<Completion>, max: usize) -> usize {
        // Jobs finish at submit time, so there is never anything to block on.
        self.poll(completions, max)
    }
}

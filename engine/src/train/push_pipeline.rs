//! One round's pushes, made as the gradients become ready: each parameter tensor's partitions
//! are encoded (with their error-feedback memories) on rayon's pool the moment the backward
//! pass hands the tensor over, and pushed as soon as they are encoded, while the pass goes on
//! to earlier layers. This is data parallelism's overlap of communication with the backward
//! pass (DDP's buckets; here a bucket is a tensor's partitions).
//!
//! The bits do not depend on the order: each partition's code depends only on its gradient,
//! its own memory and its codec context, so a round pushes the payloads it would push with
//! every tensor handed over at once.

use std::sync::{mpsc, Arc};
use std::time::Instant;

use crate::comm::partition::Partition;
use crate::comm::{codec_context, Collective, Key};
use crate::compress::clipped_codes;
use crate::error::{Error, Result};
use crate::feedback::Feedback;

/// A partition's payload with its clipped LoCo codes and their count, where it has any.
type Encoded = (Key, Vec<u8>, Option<(usize, usize)>);

/// What an encoding job sends back: the partitions it encoded (by index), their memories,
/// and the payloads or the error.
struct Job {
    parts: Vec<usize>,
    memories: Vec<Feedback>,
    encoded: Result<Vec<Encoded>>,
}

/// The pushes of one round in progress.
pub(super) struct PushPipeline {
    parts: Arc<[Partition]>,
    /// Each partition's memory; `None` while a job encodes with it.
    memories: Vec<Option<Feedback>>,
    seed: u64,
    step: u64,
    rank: usize,
    samples: u32,
    done_tx: mpsc::Sender<Job>,
    done_rx: mpsc::Receiver<Job>,
    /// Jobs started whose results have not come back.
    outstanding: usize,
    /// Every payload made, pushed or not: the memories moved for all of them.
    kept: Vec<(Key, Vec<u8>)>,
    clipped: Option<(usize, usize)>,
    encoding_failed: Option<Error>,
    push_failed: Option<Error>,
    first_push: Option<Instant>,
}

/// A round's pushes once every job is back.
pub(super) struct Pushed {
    /// Every payload made, in the order they were made.
    pub kept: Vec<(Key, Vec<u8>)>,
    /// Clipped LoCo codes over all LoCo codes pushed, where any were.
    pub clipped: Option<(usize, usize)>,
    /// When the first push left, if one did.
    pub first_push: Option<Instant>,
    /// The first push that failed (the link): the payloads are kept all the same, to be
    /// pushed again with the same bytes.
    pub push_failed: Option<Error>,
}

impl PushPipeline {
    /// A round `step` of `rank`, whose pushes stand for `samples` samples, encoding with
    /// `memories` (one per partition, in order).
    pub fn new(
        parts: Arc<[Partition]>,
        memories: Vec<Feedback>,
        seed: u64,
        step: u64,
        rank: usize,
        samples: u32,
    ) -> Self {
        let (done_tx, done_rx) = mpsc::channel();
        PushPipeline {
            parts,
            memories: memories.into_iter().map(Some).collect(),
            seed,
            step,
            rank,
            samples,
            done_tx,
            done_rx,
            outstanding: 0,
            kept: Vec::new(),
            clipped: None,
            encoding_failed: None,
            push_failed: None,
            first_push: None,
        }
    }

    /// Tensor `tensor`'s gradient is final: its partitions are encoded on rayon's pool (this
    /// thread goes on), and whatever earlier jobs finished is pushed now.
    pub fn ready<C: Collective>(&mut self, tensor: usize, grad: Vec<f32>, collective: &mut C) {
        let parts: Vec<usize> = (0..self.parts.len())
            .filter(|&i| self.parts[i].tensor == tensor)
            .collect();
        let memories: Option<Vec<Feedback>> =
            parts.iter().map(|&i| self.memories[i].take()).collect();
        let Some(mut memories) = memories else {
            self.encoding_failed
                .get_or_insert(Error::Data(format!("tensor {tensor} handed over twice")));
            return;
        };
        if !parts.is_empty() {
            let (all, done) = (Arc::clone(&self.parts), self.done_tx.clone());
            let (seed, step, rank) = (self.seed, self.step, self.rank);
            self.outstanding += 1;
            rayon::spawn(move || {
                use rayon::prelude::*;
                // A panic on rayon's pool would abort the process: it becomes this round's
                // error.
                let encoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    parts
                        .par_iter()
                        .zip(memories.par_iter_mut())
                        .map(|(&i, memory)| {
                            let p = &all[i];
                            let ctx = codec_context(seed, step, p.key).sent_by(rank);
                            let bytes = memory.encode(&grad[p.offset..p.offset + p.len], &ctx)?;
                            let clipped = clipped_codes(memory.codec().spec(), &bytes, p.len)
                                .map(|c| (c, p.len));
                            Ok((p.key, bytes, clipped))
                        })
                        .collect::<Result<Vec<Encoded>>>()
                }))
                .unwrap_or_else(|_| Err(Error::Data("encoding a partition panicked".into())));
                // The pipeline waits for every job it started, so it is still listening.
                let _ = done.send(Job {
                    parts,
                    memories,
                    encoded,
                });
            });
        }
        while let Ok(job) = self.done_rx.try_recv() {
            self.take(job, collective);
        }
    }

    /// Waits for every job started, pushes what they made, and gives back the memories (all
    /// of them, whatever failed) with the round's pushes, or the first encoding error.
    pub fn finish<C: Collective>(mut self, collective: &mut C) -> (Vec<Feedback>, Result<Pushed>) {
        while self.outstanding > 0 {
            match self.done_rx.recv() {
                Ok(job) => self.take(job, collective),
                // Not while this pipeline holds a sender.
                Err(_) => break,
            }
        }
        let memories: Option<Vec<Feedback>> = self.memories.into_iter().collect();
        let Some(memories) = memories else {
            unreachable!("every job returns its memories before finish returns");
        };
        let pushed = match self.encoding_failed {
            Some(e) => Err(e),
            None => Ok(Pushed {
                kept: self.kept,
                clipped: self.clipped,
                first_push: self.first_push,
                push_failed: self.push_failed,
            }),
        };
        (memories, pushed)
    }

    /// Takes a finished job back: its memories return, its payloads are pushed (unless a push
    /// failed before) and kept.
    fn take<C: Collective>(&mut self, job: Job, collective: &mut C) {
        self.outstanding -= 1;
        for (i, memory) in job.parts.into_iter().zip(job.memories) {
            self.memories[i] = Some(memory);
        }
        let encoded = match job.encoded {
            Ok(encoded) => encoded,
            Err(e) => {
                self.encoding_failed.get_or_insert(e);
                return;
            }
        };
        for (key, bytes, codes) in encoded {
            if let Some((c, n)) = codes {
                let (sum_c, sum_n) = self.clipped.get_or_insert((0, 0));
                (*sum_c, *sum_n) = (*sum_c + c, *sum_n + n);
            }
            if self.push_failed.is_none() && self.encoding_failed.is_none() {
                self.first_push.get_or_insert_with(Instant::now);
                if let Err(e) = collective.push(self.step, key, self.samples, bytes.clone()) {
                    self.push_failed = Some(e);
                }
            }
            self.kept.push((key, bytes));
        }
    }
}

//! A shard's state file is file input: a damaged or doctored one must give an error, never a
//! panic, and never an allocation sized by an unchecked length, when it is read, when a
//! shard is restored from it, and when the restored sample queue hands out rounds.
//!
//! The input is the file's body: the target frames it (magic, length, CRC) so that the
//! fuzzer reaches what lies behind the frame's checks. Seeds: the bodies of two shards'
//! `state` files from `murmur swarm --respawn` (seeds/state_decode).
#![no_main]

use libfuzzer_sys::fuzz_target;
use murmur_net::ps::durable::{Loaded, SavedShard, MAGIC};
use murmur_net::ps::state::ShardState;
use murmur_net::state_file;
use murmur_net::wire::Limits;

fuzz_target!(|body: &[u8]| {
    let mut file = MAGIC.to_vec();
    file.extend((body.len() as u64).to_le_bytes());
    file.extend(crc32fast::hash(body).to_le_bytes());
    file.extend(body);
    let Ok(saved) = state_file::decode::<SavedShard>(MAGIC, &file) else {
        return;
    };
    let (shard, job, queue) = (saved.shard, saved.job.clone(), saved.queue.clone());
    let loaded = Loaded {
        shard: saved,
        rounds: Vec::new(),
        snapshot: None,
    };
    if ShardState::restore(shard, &job, Limits::default(), 64, loaded).is_err() {
        return;
    }
    // What a restored shard 0 does with its queue: settle the open round (saved with the
    // state), measure, cut the next; a late member folds, one leaves.
    if let Some(mut queue) = queue {
        for round in 0..4u16 {
            let open = queue.open().clone();
            for (i, share) in open.shares.iter().enumerate() {
                queue.observe(share.rank, share.samples(), 0.1 * (i + 1) as f64, i == 2);
            }
            queue.settle_folding(&[0, 1], &[round % 3 + 2], |rank| {
                open.share_of(rank).map_or(0, |(share, _)| share.samples())
            });
            if round == 2 {
                queue.forget(3);
            }
            queue.assign(&[0, 1, round % 3 + 2]);
        }
    }
});

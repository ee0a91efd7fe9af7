//! The allocator choices in `murmur_node::platform` take effect: a training process keeps a
//! freed block of a CNN step's size for the next one, a shard hands it back. A test binary of
//! its own, with one test, because the choices are process-wide.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn training_reuses_a_steps_blocks_and_a_shard_unmaps_them() {
    use murmur_node::platform::{keep_large_blocks_for_reuse, return_large_frees_to_the_system};

    // Bytes in blocks glibc mapped on their own.
    fn mapped_bytes() -> usize {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        unsafe { libc::mallinfo2() }.hblkhd
    }
    // The size of the CNN's largest per-step block, its second convolution's im2col.
    const BLOCK: usize = 14_450_688 / 4;
    let allocate_and_measure = || {
        let before = mapped_bytes();
        let block = std::hint::black_box(vec![1.0f32; BLOCK]);
        let grown = mapped_bytes().saturating_sub(before);
        drop(block);
        grown
    };

    // The shard first: once a block has come from the arenas, what it leaves free there
    // serves the next one whatever the threshold.
    return_large_frees_to_the_system();
    assert!(
        allocate_and_measure() >= 4 * BLOCK,
        "a shard kept a 14 MB block in its arenas"
    );
    keep_large_blocks_for_reuse();
    assert_eq!(
        allocate_and_measure(),
        0,
        "a training process mapped a 14 MB block on its own"
    );
}

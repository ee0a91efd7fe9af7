//! Element-wise loops compiled for the widest vector unit the CPU has, chosen at run time.
//!
//! The release build targets x86-64's baseline, whose vector unit is SSE2's 4 lanes; the same
//! loop compiled with AVX2 runs 8 lanes and with AVX-512 16. The bits do not change: Rust never
//! lets the compiler fuse a multiply and an add or reorder float arithmetic, so every lane
//! computes what the scalar reference computes, in the same order.

/// Runs `f` compiled, through inlining, for the widest vector unit of this CPU. `f` should be
/// a loop over elements: the work to vectorise must be inlined into it (the CPU path's math is
/// `#[inline(always)]`).
#[inline(always)]
pub fn widest<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: this CPU has AVX-512F.
            return unsafe { x86::avx512(f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: this CPU has AVX2.
            return unsafe { x86::avx2(f) };
        }
    }
    f()
}

/// The mask of an AVX-512 vector's first `count` lanes (all 16 from 16 on): a partial
/// block's loads and stores in the CPU path's intrinsic kernels.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn first_lanes(count: usize) -> std::arch::x86_64::__mmask16 {
    ((1u32 << count.min(16)) - 1) as std::arch::x86_64::__mmask16
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
        f()
    }

    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

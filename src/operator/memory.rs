//! Gives freed heap back to the kernel. glibc's allocator keeps freed memory in its arenas for
//! reuse and by itself returns only what sits at the top of a heap. A controller's memory comes
//! in waves (a 1 000-node launch, a disruption pass's simulations, a re-list of 10 000 pods), so
//! after a wave its RSS stayed near the wave's high-water mark: after a 1 000-node launch,
//! `malloc_trim(0)` called from a debugger took RSS from 303 to 234 MB. Trimming every few
//! seconds makes RSS follow what is live.
//!
//! musl's allocator (the released image is a static musl binary) returns freed memory by
//! itself; there, and on any other libc, [`release_free_heap`] does nothing.

use std::time::Duration;

/// How often freed heap is given back. A trim walks the free chunks of every arena (a few
/// milliseconds with a 150 MB heap); memory in a wave is reused long before this.
pub const RELEASE_INTERVAL: Duration = Duration::from_secs(10);

/// Returns the allocator's free pages to the kernel; whether any were returned.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_free_heap() -> bool {
    // SAFETY: malloc_trim takes the arena locks itself and only releases pages of chunks that
    // are free; it touches no memory the program holds.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Returns the allocator's free pages to the kernel; whether any were returned. Not needed with
/// this allocator.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free_heap() -> bool {
    false
}

/// Calls [`release_free_heap`] every `interval`, off the async workers (a trim holds each arena's
/// lock while it walks it). Runs until dropped.
pub async fn release_periodically(interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if tokio::task::spawn_blocking(release_free_heap)
            .await
            .is_err()
        {
            return;
        }
    }
}

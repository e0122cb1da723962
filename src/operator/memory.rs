//! How the controller's heap is managed. Its memory comes in waves (a 1 000-node launch, a
//! disruption pass's simulations, a re-list of 10 000 pods) over a long-lived base (held pods,
//! Nodes, NodeClaims, metric series), so what matters is how much freed memory the allocator
//! keeps after a wave.
//!
//! On glibc Linux the binary uses jemalloc (`main.rs`). glibc's allocator returns only whole
//! free pages at the top of a heap: with a `malloc_trim(0)` every 10 s the controller's RSS
//! after the 1 000-node launch was still 132–139 MB over ~80–98 MB of live heap. jemalloc keeps
//! small objects of one size together and gives back pages its arenas have not used for
//! [`MALLOC_CONF`]'s decay time, from a background thread, without the controller calling it:
//! 117 MB at the same point.
//!
//! The released image is a static musl binary and keeps musl's allocator, which returns freed
//! memory by itself.

/// jemalloc's settings, read at its first allocation; `_RJEM_MALLOC_CONF` in the environment
/// overrides them. Dirty pages go back after a second unused (jemalloc's default is 10 s:
/// a wave's memory then stays through the next pass), in a background thread (otherwise only an
/// allocating thread purges, so an idle controller keeps its last wave); "muzzy" pages (given
/// back lazily) are skipped, so RSS shows what is held. One arena instead of jemalloc's four
/// per CPU: each arena keeps its own partly used pages, and the controller's threads took turns
/// on all of them; with one, RSS after the 1 000-node launch was 92 MB instead of 103 MB on a
/// 2-CPU machine, with less CPU (28 s against 37 s). Threads still allocate from their own
/// caches; the arena is locked only to refill or drain them.
/// NUL-terminated: jemalloc reads it as a C string.
pub const MALLOC_CONF: &[u8] =
    b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:1\0";

#[cfg(test)]
mod tests {
    #[test]
    fn the_settings_are_one_c_string() {
        let (last, text) = super::MALLOC_CONF.split_last().unwrap();
        assert_eq!(*last, 0);
        assert!(!text.contains(&0) && text.is_ascii());
    }
}

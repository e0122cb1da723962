//! Freed heap goes back to the kernel (`operator::memory`). Its own test binary: RSS is
//! per process, and other tests allocating beside it would blur the figures.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use karpenter_exoscale::operator::memory::release_free_heap;

/// Resident set size of this process: resident pages from /proc times the system's page size.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let resident: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf reads a constant of the running system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    resident * page
}

#[test]
fn freed_heap_between_live_allocations_is_given_back() {
    const CHUNK: usize = 1024;
    const CHUNKS: usize = 96 * 1024; // 96 MiB
    let mut chunks: Vec<Option<Box<[u8]>>> = (0..CHUNKS)
        .map(|i| Some(vec![(i % 251) as u8; CHUNK].into_boxed_slice()))
        .collect();
    // Keep one chunk in every 32: what is freed lies between live allocations, where the
    // allocator on its own never returns it (it trims only the top of a heap).
    for (i, chunk) in chunks.iter_mut().enumerate() {
        if i % 32 != 0 {
            *chunk = None;
        }
    }
    let before = rss_bytes();
    assert!(release_free_heap(), "nothing was returned");
    let after = rss_bytes();
    let released = before.saturating_sub(after);
    assert!(
        released > 48 << 20,
        "RSS {before} → {after} bytes: only {released} released of ~93 MiB freed"
    );
    // The live chunks are intact.
    for (i, chunk) in chunks.iter().enumerate().filter(|(i, _)| i % 32 == 0) {
        assert!(
            chunk
                .as_ref()
                .unwrap()
                .iter()
                .all(|b| *b == (i % 251) as u8)
        );
    }
}

//! The released binary runs on jemalloc with the settings of `operator::memory` (glibc Linux
//! builds). jemalloc prints the options in effect when asked to through its environment
//! variable, which adds to the embedded settings and does not replace them.

#![cfg(all(
    target_os = "linux",
    target_env = "gnu",
    not(feature = "system-allocator")
))]

use std::process::Command;

/// jemalloc's statistics as the binary prints them on exit.
fn allocator_stats(extra: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_karpenter-exoscale"))
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", format!("stats_print:true{extra}"))
        .output()
        .expect("run the binary");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_binary_runs_on_jemalloc_with_its_settings() {
    let stats = allocator_stats("");
    assert!(stats.contains("jemalloc statistics"), "{stats}");
    for option in [
        "opt.background_thread: true",
        "opt.dirty_decay_ms: 1000",
        "opt.muzzy_decay_ms: 0",
        "opt.narenas: 1",
    ] {
        assert!(stats.contains(option), "{option} not in effect:\n{stats}");
    }
}

#[test]
fn the_environment_still_overrides_a_setting() {
    let stats = allocator_stats(",dirty_decay_ms:5000");
    assert!(stats.contains("opt.dirty_decay_ms: 5000"), "{stats}");
    assert!(stats.contains("opt.background_thread: true"), "{stats}");
}

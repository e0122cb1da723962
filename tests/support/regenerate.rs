//! The `UPDATE_*` switches that rewrite expected files from the current output.

/// Whether `var` asks to rewrite expected files. Refused under `CI=true`: a CI run that
/// rewrote its own expectations could never fail.
pub fn requested(var: &str) -> bool {
    let set = std::env::var_os(var).is_some();
    if set && std::env::var("CI").as_deref() == Ok("true") {
        panic!("{var} is set with CI=true: expected files are never regenerated in CI");
    }
    set
}

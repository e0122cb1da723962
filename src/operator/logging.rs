//! Structured logs: JSON by default (one object per line), text for humans.

use tracing_subscriber::EnvFilter;

use super::config::{LogFormat, LogLevel};

/// Installs the global subscriber; `RUST_LOG` refines the level when set.
pub fn init(level: LogLevel, format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{},kube=warn,hyper=warn", level.as_filter())));
    // Colour only for a terminal: redirected logs (files, CI, `kubectl logs`) stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_target(true);
    // A second call (tests) keeps the first subscriber.
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

//! Durations as the CRDs write them: `<n>s|m|h` parts (`1h30m`), optionally `Never`.

use std::time::Duration;

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DurationError {
    #[error("invalid duration {0:?}: expected parts like 90s, 10m, 1h30m{1}")]
    Invalid(String, &'static str),
}

/// Parses `1h30m`, `45s`, `720h`; returns an error naming the value otherwise.
pub fn parse_duration(value: &str) -> Result<Duration, DurationError> {
    let invalid = || DurationError::Invalid(value.to_string(), "");
    if value.is_empty() {
        return Err(invalid());
    }
    let mut total: u64 = 0;
    let mut digits = String::new();
    for ch in value.chars() {
        if ch.is_ascii_digit() {
            digits.push(ch);
            continue;
        }
        let unit = match ch {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            _ => return Err(invalid()),
        };
        let n: u64 = digits.parse().map_err(|_| invalid())?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(invalid)?;
        digits.clear();
    }
    if !digits.is_empty() {
        return Err(invalid());
    }
    Ok(Duration::from_secs(total))
}

/// Parses a duration that may be `Never` (returned as `None`).
pub fn parse_nillable_duration(value: &str) -> Result<Option<Duration>, DurationError> {
    if value == "Never" {
        return Ok(None);
    }
    parse_duration(value)
        .map(Some)
        .map_err(|_| DurationError::Invalid(value.to_string(), " or Never"))
}

/// Formats a duration the way the CRDs store it (`1h30m0s` style is accepted, we emit `5400s`
/// only where exactness matters; this keeps hours and minutes readable).
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_compound_durations() {
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(
            parse_duration("720h").unwrap(),
            Duration::from_secs(720 * 3600)
        );
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_nillable_duration("Never").unwrap(), None);
    }

    #[test]
    fn rejects_malformed_durations_naming_the_value() {
        for bad in ["", "10", "1d", "h", "1.5h", "-1h", "5 minutes"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        assert!(parse_nillable_duration("never").is_err());
    }

    #[test]
    fn formats_round_trip() {
        for s in ["1h30m", "45s", "720h", "0s", "2h0m5s"] {
            let d = parse_duration(s).unwrap();
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
    }
}

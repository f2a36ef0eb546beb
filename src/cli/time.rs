//! Durations read from the command line and instants printed in its tables, both through
//! `humantime`, one syntax and one format for every command (`docs/cli.md`, "Durations
//! and times").
//!
//! A duration is a number and a unit, and may chain them: `250ms`, `30s`, `1m30s`,
//! `2h 15m`, `2d`. Flags that took a bare number before keep taking one, in their old
//! unit (`--interval-ms 50`, `--request-timeout 60`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The hint every refusal ends with.
const EXAMPLES: &str = "e.g. 250ms, 30s, 1m30s, 2h, 2d";

/// Parses a duration that must carry its unit(s).
pub fn parse(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("bad duration {text:?}: {e} ({EXAMPLES})"))
}

/// Parses a duration into whole milliseconds, as queue policies store them.
pub fn parse_ms(text: &str) -> Result<i64, String> {
    let d = parse(text)?;
    i64::try_from(d.as_millis()).map_err(|_| format!("duration {text:?} is too long"))
}

/// A duration, where a bare number counts `unit`s (the flag's old form).
fn parse_or_bare(text: &str, unit: Duration) -> Result<Duration, String> {
    match text.trim().parse::<u64>() {
        Ok(n) => unit
            .checked_mul(u32::try_from(n).map_err(|_| format!("duration {text:?} is too long"))?)
            .ok_or_else(|| format!("duration {text:?} is too long")),
        Err(_) => parse(text),
    }
}

/// A duration where a bare number is seconds (`--request-timeout 60`).
pub fn parse_secs_or_duration(text: &str) -> Result<Duration, String> {
    parse_or_bare(text, Duration::from_secs(1))
}

/// A duration where a bare number is milliseconds (`--interval-ms 50`).
pub fn parse_ms_or_duration(text: &str) -> Result<Duration, String> {
    parse_or_bare(text, Duration::from_millis(1))
}

/// The last millisecond of the year 9999, the latest instant RFC 3339 can write.
const LAST_RFC3339_MS: i64 = 253_402_300_799_999;

/// Milliseconds since the epoch as an RFC 3339 instant in UTC, to the second:
/// `2026-12-01T11:28:28Z`. A time before 1970 or after 9999 (which a fact read from a
/// peer may carry) is written as its number: `-1 ms since 1970`.
pub fn format_ms(ms: i64) -> String {
    if !(0..=LAST_RFC3339_MS).contains(&ms) {
        return format!("{ms} ms since 1970");
    }
    format_instant(UNIX_EPOCH + Duration::from_millis(ms.unsigned_abs()))
}

fn format_instant(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

/// A duration in milliseconds as people read it: `1m 30s`, `250ms`.
pub fn format_duration_ms(ms: i64) -> String {
    humantime::format_duration(Duration::from_millis(ms.max(0).unsigned_abs())).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_millisecond_count_formats_without_panicking() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_ms(LAST_RFC3339_MS), "9999-12-31T23:59:59Z");
        assert_eq!(format_ms(-1), "-1 ms since 1970");
        assert_eq!(
            format_ms(LAST_RFC3339_MS + 1),
            "253402300800000 ms since 1970"
        );
        assert_eq!(format_ms(i64::MIN), format!("{} ms since 1970", i64::MIN));
        assert_eq!(format_ms(i64::MAX), format!("{} ms since 1970", i64::MAX));
    }

    #[test]
    fn durations_chain_units_and_old_forms_keep_their_unit() {
        assert_eq!(parse_ms("1m30s"), Ok(90_000));
        assert_eq!(parse_ms("250ms"), Ok(250));
        assert_eq!(parse_ms("2d"), Ok(172_800_000));
        assert!(parse_ms("30").unwrap_err().contains("bad duration"));
        assert!(parse_ms("5x").unwrap_err().contains("1m30s"));
        assert_eq!(parse_secs_or_duration("60"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_secs_or_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_ms_or_duration("50"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_ms_or_duration("2s"), Ok(Duration::from_secs(2)));
    }

    #[test]
    fn instants_are_rfc3339_utc() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_ms(1_764_588_508_999), "2025-12-01T11:28:28Z");
        assert_eq!(format_duration_ms(90_000), "1m 30s");
    }
}

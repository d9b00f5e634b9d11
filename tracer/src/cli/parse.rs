//! The parsers of option values, each with an error that says what is wanted.

use std::time::Duration;

use anyhow::{bail, Result};

use super::MAX_SECONDS;

/// A process id: a positive number.
pub(super) fn parse_pid(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(pid) if pid > 0 => Ok(pid),
        _ => Err("not a process id (want a number from 1)".to_owned()),
    }
}

/// A number of seconds from `min` to MAX_SECONDS.
pub(super) fn parse_seconds(text: &str, min: f64, min_inclusive: bool) -> Result<f64, String> {
    let range = || {
        let low = if min_inclusive {
            "at least"
        } else {
            "more than"
        };
        format!("{low} {min} and at most {MAX_SECONDS} seconds, 10 years")
    };
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("not a number of seconds (want {})", range()))?;
    let above_min = if min_inclusive {
        seconds >= min
    } else {
        seconds > min
    };
    // NaN fails both comparisons.
    if !(above_min && seconds <= MAX_SECONDS) {
        return Err(format!("out of range (want {})", range()));
    }
    Ok(seconds)
}

pub(super) fn parse_duration_secs(text: &str) -> Result<f64, String> {
    parse_seconds(text, 0.0, false)
}

pub(super) fn parse_interval(text: &str) -> Result<Duration, String> {
    parse_seconds(text, 0.05, true).map(Duration::from_secs_f64)
}

/// A ring buffer size the kernel accepts: a power of two, a page at least.
pub(super) fn parse_ring_bytes(text: &str) -> Result<u32, String> {
    let bytes: u32 = text.parse().map_err(|e| format!("{e}"))?;
    if bytes < 4096 || !bytes.is_power_of_two() {
        return Err("must be a power of two of at least 4096".to_owned());
    }
    Ok(bytes)
}

/// Parses `0`, `750ns`, `10us`, `10µs`, `2ms`, `1s` (a bare number means microseconds).
pub fn parse_duration_ns(text: &str) -> Result<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = match number.parse() {
        Ok(v) => v,
        Err(_) => bail!("not a duration: {text:?} (examples: 0, 500ns, 10us, 2ms)"),
    };
    let scale = match unit.trim() {
        "ns" => 1.0,
        "" | "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        other => bail!("unknown unit {other:?} in {text:?} (use ns, us, ms or s)"),
    };
    Ok((value * scale).round() as u64)
}

/// A directory that exists (a typo would otherwise only show as frames left unnamed).
pub(super) fn parse_directory(text: &str) -> Result<std::path::PathBuf, String> {
    let path = std::path::PathBuf::from(text);
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => Ok(path),
        Ok(_) => Err("not a directory".to_owned()),
        Err(err) => Err(format!("{err}")),
    }
}

//! Whether we may load and attach tracing programs: root, or CAP_BPF + CAP_PERFMON.

use anyhow::{bail, Result};

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Parses the CapEff mask from /proc/self/status text.
pub fn effective_caps(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// Names the capabilities missing from `caps` for tracing, or None when enough.
pub fn missing_for_tracing(caps: u64) -> Option<&'static str> {
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return None;
    }
    Some(match (has(CAP_BPF), has(CAP_PERFMON)) {
        (false, false) => "CAP_BPF and CAP_PERFMON",
        (false, true) => "CAP_BPF",
        _ => "CAP_PERFMON",
    })
}

pub fn check_tracing_privilege() -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let caps = effective_caps(&status).unwrap_or(0);
    if let Some(missing) = missing_for_tracing(caps) {
        bail!("not enough privilege: tracing needs {missing} (or run as root)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cap_eff() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(effective_caps(status), Some(0x1ff_ffff_ffff));
        assert_eq!(effective_caps("Name: x\n"), None);
    }

    #[test]
    fn names_the_missing_capability() {
        assert_eq!(missing_for_tracing(0), Some("CAP_BPF and CAP_PERFMON"));
        assert_eq!(missing_for_tracing(1 << CAP_PERFMON), Some("CAP_BPF"));
        assert_eq!(missing_for_tracing(1 << CAP_BPF), Some("CAP_PERFMON"));
        assert_eq!(
            missing_for_tracing((1 << CAP_BPF) | (1 << CAP_PERFMON)),
            None
        );
        assert_eq!(missing_for_tracing(1 << CAP_SYS_ADMIN), None);
    }
}

//! Why loading or attaching failed, in one line a user can act on: the capability missing, the
//! verifier's verdict; and how close each program came to the verifier's limit.

use std::time::Duration;

use anyhow::anyhow;
use aya::programs::{ProgramError, ProgramInfo};

/// A classic tracepoint's perf_event_open refused for want of privilege: EACCES (Debian's
/// kernel.perf_event_paranoid 3 without CAP_SYS_ADMIN) or EPERM, found in the error's source
/// chain (aya's message names the syscall only: "`perf_event_open_trace_point` failed").
pub(super) fn is_refused(err: &aya::programs::ProgramError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cause {
        let errno = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error);
        if matches!(errno, Some(libc::EACCES | libc::EPERM)) {
            return true;
        }
        cause = e.source();
    }
    false
}

/// Why perf_event_open refuses a process with CAP_PERFMON: Debian's kernels read
/// kernel.perf_event_paranoid 3 (their default) as perf events for CAP_SYS_ADMIN only.
pub(super) fn perf_paranoia_hint() -> String {
    let level = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap_or_default();
    match level.trim().parse::<i32>() {
        Ok(level) if level >= 3 => format!(
            "; kernel.perf_event_paranoid is {level}, which leaves classic tracepoints to \
             CAP_SYS_ADMIN on Debian's kernels (sysctl kernel.perf_event_paranoid=2, or root, \
             lets them attach)"
        ),
        _ => String::new(),
    }
}

/// How close a loaded program came to the verifier's limit of a million instructions (the
/// margin that older kernels' verifiers, which prune less, eat into; the project holds each
/// program to VERIFIER_BUDGET), and how long loading it took: most of the time to attach.
pub(crate) fn log_verified(name: &str, info: Result<ProgramInfo, ProgramError>, took: Duration) {
    if let Some(count) = info.ok().and_then(|info| info.verified_instruction_count()) {
        log::info!(
            "{name}: the verifier processed {count} instructions (budget {VERIFIER_BUDGET}), \
             loaded in {} ms",
            took.as_millis()
        );
    }
}

/// The most instructions the verifier may process for one program, on every kernel the tests
/// run on: a fifth of its limit of a million, so that a stricter or less pruning verifier still
/// takes the programs, and loading stays well under a second.
pub const VERIFIER_BUDGET: u32 = 150_000;

/// A program's load error, with the verifier's log cut to what says why (its whole log, often
/// thousands of lines, would be the "one line" of the error; -vv logs it).
pub(crate) fn load_failed(err: aya::programs::ProgramError, doing: &str) -> anyhow::Error {
    if let aya::programs::ProgramError::LoadError {
        io_error,
        verifier_log,
    } = &err
    {
        let log = verifier_log.to_string();
        log::debug!("verifier log of {doing}:\n{log}");
        return explain_permission(
            anyhow!(
                "BPF_PROG_LOAD: {io_error}; the verifier said: {}",
                verifier_summary(&log)
            ),
            doing,
        );
    }
    explain_permission(anyhow!(err), doing)
}

/// The verifier's last word (its verdict ends the instruction trace) and its instruction
/// count, from a log that ends with statistics.
pub(super) fn verifier_summary(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let is_statistic = |l: &&str| {
        l.starts_with("processed ")
            || l.starts_with("verification time")
            || l.starts_with("stack depth")
    };
    let verdict = lines
        .iter()
        .rev()
        .find(|l| !is_statistic(l))
        .copied()
        .unwrap_or("no log");
    let processed = lines.iter().find(|l| l.starts_with("processed "));
    let mut summary: String = verdict.chars().take(240).collect();
    if let Some(processed) = processed {
        summary.push_str(" (");
        summary.extend(processed.chars().take(120));
        summary.push(')');
    }
    summary
}

/// Turns EPERM from the kernel into the capability the user must add.
pub(super) fn explain_permission(err: anyhow::Error, doing: &str) -> anyhow::Error {
    let text = crate::text::error_line(&err);
    if text.contains("Operation not permitted") || text.contains("EPERM") {
        anyhow!("not enough privilege for {doing}: needs CAP_BPF and CAP_PERFMON (or root): {text}")
    } else {
        err.context(format!("{doing} failed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verifier_log_is_cut_to_its_verdict_and_count() {
        let log = "0: R1=ctx() R10=fp0\n; let x = 1;\n\
                   3207: (2d) if r1 > r2 goto pc-747 BPF program is too large. Processed 1000001 insn\n\
                   verification time 47047524 usec\nstack depth 368+0+120+72\n\
                   processed 1000001 insns (limit 1000000) max_states_per_insn 58\n";
        let summary = verifier_summary(log);
        assert!(summary.starts_with("3207: (2d)"), "{summary}");
        assert!(summary.contains("BPF program is too large"), "{summary}");
        assert!(
            summary.contains("(processed 1000001 insns (limit 1000000)"),
            "{summary}"
        );
        assert!(!summary.contains('\n'));
        assert_eq!(verifier_summary(""), "no log");
    }

    #[test]
    fn a_perf_event_open_refused_for_privilege_is_told_apart_from_other_failures() {
        let failed = |errno| {
            aya::programs::ProgramError::SyscallError(aya::sys::SyscallError {
                call: "perf_event_open_trace_point",
                io_error: std::io::Error::from_raw_os_error(errno),
            })
        };
        assert!(is_refused(&failed(libc::EACCES)));
        assert!(is_refused(&failed(libc::EPERM)));
        assert!(!is_refused(&failed(libc::ENOENT)));
        assert!(!is_refused(&aya::programs::ProgramError::NotLoaded));
    }
}

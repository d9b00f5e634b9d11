//! The tracer's share of the CPU against its target. A target of thousands of runnable threads
//! leaves an ordinary process a few thousandths of a CPU: loading the programs (the verifier's
//! seconds of CPU) then took tens of seconds before "attached", and the report was late by as
//! much. The tracer runs at the highest nice level, and loads and attaches its programs under
//! SCHED_FIFO, which runs ahead of every ordinary thread for the bounded time the verifier takes.

/// Puts the calling thread (and the threads it starts from now on) at nice -20. Best effort: a
/// tracer without CAP_SYS_NICE keeps its level.
pub fn raise_nice() {
    // SAFETY: plain syscall on the calling thread.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -20) } != 0 {
        log::debug!(
            "cannot raise the tracer's nice level: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// SCHED_FIFO for the calling thread until dropped, then back to the ordinary policy at the
/// nice level it had. None when the kernel refuses (no CAP_SYS_NICE, a cgroup without
/// real-time budget): setup then just takes longer on a saturated machine.
pub struct RealTime(());

impl RealTime {
    pub fn enter() -> Option<Self> {
        let param = libc::sched_param { sched_priority: 1 };
        // SAFETY: plain syscall on the calling thread with a valid parameter.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
            log::debug!(
                "cannot run setup under SCHED_FIFO: {}",
                std::io::Error::last_os_error()
            );
            return None;
        }
        Some(Self(()))
    }
}

impl Drop for RealTime {
    fn drop(&mut self) {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: as above. SCHED_OTHER keeps the thread's nice value.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) } != 0 {
            log::warn!(
                "cannot leave SCHED_FIFO after setup: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> i32 {
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn real_time_ends_with_its_guard() {
        // Runs on its own thread: the policy is per thread.
        std::thread::spawn(|| {
            let before = policy();
            match RealTime::enter() {
                Some(guard) => {
                    assert_eq!(policy(), libc::SCHED_FIFO);
                    drop(guard);
                    assert_eq!(policy(), libc::SCHED_OTHER);
                }
                // Unprivileged test runs cannot enter it; the policy must be untouched.
                None => assert_eq!(policy(), before),
            }
        })
        .join()
        .unwrap();
    }
}

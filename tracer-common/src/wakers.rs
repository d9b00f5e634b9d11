//! The wakers family: who woke a thread that slept while holding a target's mmap_lock. A
//! writer holding it while it waits for per-VMA lock readers to leave (6.4 on) is woken by the
//! last of them: the thread whose page fault it waited for.

/// One kind of sleep of a holder and the task that ended it: the holder's process (the
/// target whose lock it held), thread, mode and the kernel stack it slept in; the waker's
/// process, thread and stacks, walked in the waker (in an interrupt, of whatever it
/// interrupted: its kernel stack says so).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WakeKey {
    pub pid: u32,
    pub holder_tid: u32,
    pub sleep_stack: i32,
    pub waker_pid: u32,
    pub waker_tid: u32,
    pub waker_kernel_stack: i32,
    pub waker_user_stack: i32,
    pub mode: u8,
    pub _pad: [u8; 3],
}

/// How often a holder's sleep was ended that way, and how long it had slept until then.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WakeValue {
    pub count: u64,
    pub asleep_ns: u64,
}

impl WakeValue {
    pub fn merge(&mut self, other: &WakeValue) {
        self.count += other.count;
        self.asleep_ns += other.asleep_ns;
    }

    pub fn since(&self, before: &WakeValue) -> WakeValue {
        WakeValue {
            count: self.count.saturating_sub(before.count),
            asleep_ns: self.asleep_ns.saturating_sub(before.asleep_ns),
        }
    }
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for WakeKey {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for WakeValue {}

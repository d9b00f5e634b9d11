//! The lock contention family (lock:contention_begin/end): the sleeping part of each wait.

/// Where the classic tracepoints keep `lock_addr` (lock:contention_begin / contention_end).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContentionConfig {
    pub begin_lock: u32,
    pub end_lock: u32,
}

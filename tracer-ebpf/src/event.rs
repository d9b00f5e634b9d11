//! One hit of the mmap_lock tracepoints, decoded: its hook, its arguments, and what the lock
//! operation's state machine makes of it.

use tracer_common::{LockEvent, MODE_READ, MODE_WRITE, NO_STACK};

use crate::filter::{fatal_signal_pending, Locker, NO_SLOT};

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    StartLocking,
    AcquireReturned,
    Released,
}

/// One hit's arguments, however the tracepoint carried them.
#[derive(Clone, Copy)]
pub struct LockArgs {
    pub hook: Hook,
    pub mm: u64,
    pub write: bool,
    /// acquire_returned only.
    pub success: bool,
}

/// One hit as a program hands it to the family's global function, on the program's stack (a
/// global function takes scalars and pointers to memory; the tp_btf `mm` is a typed pointer
/// that the verifier passes only inside memory). The function may ask for the stacks
/// (`WANTS_STACKS`) before it changes anything; the program then walks them, which needs its
/// context, and calls again with them.
#[repr(C)]
pub struct LockCall {
    pub mm: u64,
    pub write: u32,
    pub success: u32,
    /// Walked by the program when the first call asked for them (`walked` 1), else NO_STACK.
    pub kernel_stack: i32,
    pub user_stack: i32,
    pub walked: u32,
    /// The thread's state was created for this hit (its first event since the tracer attached,
    /// or since its entry was evicted), by the program.
    pub first_seen: u32,
    /// The sampler picked this operation, in the first call: the second must not draw again.
    pub sampled: u32,
    pub _pad: u32,
    /// Who locks, as the target filter found it.
    pub locker: Locker,
}

pub const HOOK_START: u32 = 0;
pub const HOOK_ACQUIRE: u32 = 1;
pub const HOOK_RELEASE: u32 = 2;

impl LockCall {
    #[inline(always)]
    pub fn new(mm: u64, write: bool, success: bool) -> Self {
        const NOBODY: Locker = Locker {
            pid: 0,
            tid: 0,
            outside_pid: 0,
            _pad: 0,
            slot: NO_SLOT,
        };
        LockCall {
            mm,
            write: write as u32,
            success: success as u32,
            kernel_stack: NO_STACK,
            user_stack: NO_STACK,
            walked: 0,
            first_seen: 0,
            sampled: 0,
            _pad: 0,
            locker: NOBODY,
        }
    }

    /// The hit's arguments; `hook` is the global function's own, known to the verifier.
    #[inline(always)]
    pub fn args(&self, hook: Hook) -> LockArgs {
        LockArgs {
            hook,
            mm: self.mm,
            write: self.write != 0,
            success: self.success != 0,
        }
    }
}

#[inline(always)]
pub fn decode_mode(args: &LockArgs) -> u8 {
    if args.write {
        MODE_WRITE
    } else {
        MODE_READ
    }
}

/// The state machine's view of one hit.
#[inline(always)]
pub fn decode(args: &LockArgs) -> LockEvent {
    let mode = if args.write { MODE_WRITE } else { MODE_READ };
    match args.hook {
        Hook::StartLocking => LockEvent::StartLocking { mode },
        Hook::Released => LockEvent::Released { mode },
        Hook::AcquireReturned => LockEvent::AcquireReturned {
            mode,
            success: args.success,
            fatal_signal: !args.success && fatal_signal_pending(),
        },
    }
}

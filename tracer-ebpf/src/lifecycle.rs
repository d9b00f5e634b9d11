//! The process lifecycle programs (sched_process_exit, _fork, _exec): a target's mm let go
//! when its last thread exits, the lifetimes of its threads added up, its children followed
//! with `-- CMD`, a process renamed at exec.

use aya_ebpf::helpers::{
    bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns,
    bpf_probe_read_kernel,
};
use aya_ebpf::{
    macros::{btf_tracepoint, map},
    maps::{LruHashMap, PerCpuArray},
    programs::BtfTracePointContext,
};
use tracer_common::{
    Config, Counter, StateKey, EXITED_LIFETIME_NS, EXITED_PROCESSES, EXITED_THREADS,
    THREAD_EXITS_SLOTS,
};

use crate::{
    filter::{
        is_listed_target, slot_of_pid, EXEC_COMMS, LOCKER_COMMS, MM_OF_TARGET, NO_SLOT, TARGET_MMS,
        TARGET_SLOTS, TARGET_TGIDS,
    },
    lean,
    maps::{add_to, armed, config, count, TID_HOLDING, TRACE_START},
    pending,
};

/// See tracer_common::EXITED_LIFETIME_NS.
#[map]
pub static THREAD_EXITS: PerCpuArray<u64> = PerCpuArray::with_max_entries(THREAD_EXITS_SLOTS, 0);

/// System-wide, the traced processes whose last thread has exited (pid -> how long that thread
/// lived, in ns: short-lived processes are folded by name), until user space
/// lets go of them: all their lock operations are in the maps by then, so the next read of the
/// maps is their last (instead of a second look in /proc, a read later, while a busy machine's
/// short-lived processes fill the maps). An LRU: one user space has not drained is looked up
/// in /proc instead.
#[map]
pub static EXITED_PIDS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(1024, 0);

/// A process's last thread exits: its mm stops being a target's. The mm_struct is freed once
/// its lazy users are done and is soon reused by another process, whose exec and first locks
/// would otherwise be counted as outside lockers of the dead target (exec locks the new mm from
/// a task whose `mm` is still the old one). exit_mm has cleared the task's `mm` by now; its
/// `active_mm` still names the mm it left.
///
/// Every exiting target thread also adds the time it lived inside the trace to THREAD_EXITS:
/// the thread time that wait shares are measured against comes from real lifetimes. Every
/// exiting thread frees its LEAN_THREADS and TID_HOLDING entries (the latter stays between
/// holds so that a hold costs no insert; a busy machine's short-lived threads would otherwise
/// fill it, an LRU, and push out the living).
#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(_ctx: BtfTracePointContext) -> i32 {
    let cfg = config();
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let mm_field = task.wrapping_add(cfg.task_active_mm_offset as usize) as *const u64;
    let Ok(mm) = (unsafe { bpf_probe_read_kernel(mm_field) }) else {
        return 0;
    };
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let tid = bpf_get_current_pid_tgid() as u32;
    lean::forget_thread(tid);
    let _ = TID_HOLDING.remove(&tid);
    let owns_target_mm = unsafe { TARGET_MMS.get(&mm) }.is_some_and(|owner| *owner == tgid);
    let traced = armed() && tgid != cfg.tracer_tgid && (owns_target_mm || is_listed_target(tgid));
    if traced {
        add_lifetime(task, cfg);
        // The thread locks nothing more: what its last lock operation left is aggregated now.
        pending::flush_thread(&StateKey { tid, _pad: 0, mm });
    }
    if !process_is_gone(task, cfg) {
        return 0;
    }
    if traced {
        add_to(&THREAD_EXITS, EXITED_PROCESSES, 1);
        if cfg.system_wide != 0 {
            let _ = EXITED_PIDS.insert(&tgid, &lifetime(task, cfg), 0);
        }
    }
    if owns_target_mm {
        let _ = TARGET_MMS.remove(&mm);
    }
    let _ = MM_OF_TARGET.remove(&tgid);
    if cfg.inherit != 0 {
        // An inherited child is a target no longer (the command itself stays listed: user
        // space watches it).
        if unsafe { TARGET_TGIDS.get(&tgid) }.is_some_and(|&parent| parent != 0) {
            let _ = TARGET_TGIDS.remove(&tgid);
        }
    }
    if let Some(targets) = TARGET_SLOTS.get_ptr_mut(0) {
        let targets = unsafe { &mut *targets };
        let slot = slot_of_pid(targets, tgid);
        if slot != NO_SLOT {
            targets.mms[slot] = 0;
        }
    }
    0
}

/// How long the exiting thread has lived (u64::MAX when its start cannot be read).
#[inline(always)]
fn lifetime(task: *const u8, cfg: &Config) -> u64 {
    let start_field = task.wrapping_add(cfg.task_start_time_offset as usize) as *const u64;
    match unsafe { bpf_probe_read_kernel(start_field) } {
        Ok(started) => unsafe { bpf_ktime_get_ns() }.saturating_sub(started),
        Err(_) => u64::MAX,
    }
}

/// Adds the exiting thread's life since the trace started (or since it was created, if later).
#[inline(always)]
fn add_lifetime(task: *const u8, cfg: &Config) {
    let start_field = task.wrapping_add(cfg.task_start_time_offset as usize) as *const u64;
    let Ok(started) = (unsafe { bpf_probe_read_kernel(start_field) }) else {
        return;
    };
    let trace_start = TRACE_START.get(0).copied().unwrap_or(0);
    let now = unsafe { bpf_ktime_get_ns() };
    add_to(
        &THREAD_EXITS,
        EXITED_LIFETIME_NS,
        now.saturating_sub(started.max(trace_start)),
    );
    add_to(&THREAD_EXITS, EXITED_THREADS, 1);
}

/// With `-- CMD`, a new process forked by a target is a target too, from its first lock (its
/// mm, a copy of the parent's, and after an exec the new one, registers like any target's).
/// Threads (same tgid) are already covered.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork(ctx: BtfTracePointContext) -> i32 {
    let cfg = config();
    if cfg.inherit == 0 {
        return 0;
    }
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_listed_target(parent) {
        return 0;
    }
    let child: u64 = ctx.arg(1);
    let field = |offset: u32| -> u32 {
        let at = (child + offset as u64) as *const i32;
        unsafe { bpf_probe_read_kernel(at) }.unwrap_or(0) as u32
    };
    let (pid, tgid) = (field(cfg.task_pid_offset), field(cfg.task_tgid_offset));
    if pid != 0 && pid == tgid && TARGET_TGIDS.insert(&tgid, &parent, 0).is_err() {
        count(Counter::TargetMapFull);
    }
    0
}

/// An exec renames its process, after the first locks of the new mm have registered it (and
/// named it) under the name it had before: the parent's, for a child just spawned, whose
/// exec may take long enough (a binary read from a slow disk) for user space to read that
/// name in /proc too. The new name is recorded here, so that a process is reported under the
/// program it ran. A process not named yet (BPF_EXIST) is named at its next lock.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(_ctx: BtfTracePointContext) -> i32 {
    const BPF_EXIST: u64 = 2;
    let cfg = config();
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let traced = if cfg.system_wide != 0 {
        tgid != cfg.tracer_tgid
    } else {
        is_listed_target(tgid) || unsafe { LOCKER_COMMS.get(&tgid) }.is_some()
    };
    if !traced {
        return 0;
    }
    if let Ok(comm) = bpf_get_current_comm() {
        let _ = LOCKER_COMMS.insert(&tgid, &comm, BPF_EXIST);
        let _ = EXEC_COMMS.insert(&tgid, &comm, 0);
    }
    0
}

/// True when the exiting task was its process's last live thread (do_exit decrements
/// `signal->live` before this tracepoint).
#[inline(always)]
fn process_is_gone(task: *const u8, cfg: &Config) -> bool {
    let signal_field = task.wrapping_add(cfg.task_signal_offset as usize) as *const u64;
    let Ok(signal) = (unsafe { bpf_probe_read_kernel(signal_field) }) else {
        return false;
    };
    let live = (signal as *const u8).wrapping_add(cfg.signal_live_offset as usize) as *const i32;
    unsafe { bpf_probe_read_kernel(live) }.is_ok_and(|n| n == 0)
}

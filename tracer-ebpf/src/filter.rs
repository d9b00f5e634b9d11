//! Which lock events concern a target: the target's mm, whoever locks it. The maps and the
//! tests the programs filter with; the programs that keep them current as processes fork,
//! exec and exit are in `lifecycle`.

use aya_ebpf::helpers::{
    bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
    bpf_get_current_task, bpf_probe_read_kernel,
};
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap},
};
use tracer_common::{Config, Counter, FastTargets, FAST_TARGETS};

use crate::maps::{config, count, BPF_F_MMAPABLE};

/// Target tgids given on the command line (value unused).
#[map]
pub static TARGET_TGIDS: HashMap<u32, u32> = HashMap::with_max_entries(64, 0);

/// mm_struct address -> the target tgid that owns it. Filled by the programs themselves;
/// enlarged by user space in system-wide mode (one entry per process that locks its mm).
#[map]
pub static TARGET_MMS: HashMap<u64, u32> = HashMap::with_max_entries(256, 0);

/// Target tgid -> the mm registered for it last: the one it left at an exec is let go of when
/// the new one registers. Freed, its address soon belongs to another process's new mm, whose
/// exec (which locks it from the old one) would otherwise count as an outside locker of this
/// process. Enlarged like TARGET_MMS.
#[map]
pub static MM_OF_TARGET: HashMap<u32, u64> = HashMap::with_max_entries(256, 0);

/// Slot 0: the target tgid whose mm the tracer is discovering right now (0 when none).
#[map]
pub static DISCOVER: Array<u32> = Array::with_max_entries(1, 0);

/// Comm of outside lockers, and of every process in system-wide mode (tgid -> comm), so the
/// report can name a process that already exited. Enlarged by user space in system-wide mode.
#[map]
pub static LOCKER_COMMS: HashMap<u32, [u8; 16]> = HashMap::with_max_entries(1024, 0);

/// The name each traced process took at its last exec during the trace (tgid -> comm): the
/// program it runs, which user space prefers to a name it read from /proc, perhaps while the
/// process was still in its exec under its parent's name. Enlarged like LOCKER_COMMS.
#[map]
pub static EXEC_COMMS: LruHashMap<u32, [u8; 16]> = LruHashMap::with_max_entries(1024, 0);

/// The cgroup (v2) of each process named in LOCKER_COMMS or registered as an mm owner (tgid ->
/// cgroup id, the cgroup directory's inode): taken when it registers its mm (after an exec, in
/// the cgroup the exec ran in) or first locks a target's. User space resolves ids to paths.
/// Enlarged like LOCKER_COMMS.
#[map]
pub static PROCESS_CGROUPS: HashMap<u32, u64> = HashMap::with_max_entries(1024, 0);

/// `--cgroup`: the ids of the given cgroups and of their descendants (value unused), which user
/// space keeps current as cgroups come and go. System-wide, only their processes register.
#[map]
pub static CGROUP_FILTER: HashMap<u64, u8> = HashMap::with_max_entries(4096, 0);

const EEXIST: i32 = 17;

/// Who locked a target's mm. `#[repr(C)]` and padded: the lock programs hand it to their
/// global functions in memory (`LockCall`, `Ended`), every byte written.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Locker {
    /// The target owning the mm.
    pub pid: u32,
    /// The locking thread.
    pub tid: u32,
    /// Tgid of the locker when it is not the target itself, else 0.
    pub outside_pid: u32,
    pub _pad: u32,
    /// The target's index in TARGET_SLOTS, or NO_SLOT when the targets are found by hash.
    pub slot: usize,
}

/// The listed targets, when there are at most FAST_TARGETS of them (`Config::target_slots`):
/// slot i is target `pids[i]` (0: free), whose mm is `mms[i]` once learnt. Looking through
/// them is a few compares in an array the verifier inlines, instead of a hash lookup on every
/// lock event of every process on the machine. Page-aligned, the pids and the first four mms
/// share one cache line.
#[map]
pub static TARGET_SLOTS: Array<FastTargets> = Array::with_max_entries(1, BPF_F_MMAPABLE);

pub const NO_SLOT: usize = FAST_TARGETS;

/// Returns the locker when `mm` belongs to a target, learning target mms on the way: a target's
/// thread locking its own mm, or the tracer locking a target's mm on purpose (discovery). In
/// system-wide mode every user process is a target, registered by its first lock of its own mm.
#[inline(always)]
pub fn classify(mm: u64) -> Option<Locker> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let cfg = config();
    if tgid == cfg.tracer_tgid {
        // The tracer's own locks of a target's mm (reading /proc/PID/maps, map_files, cmdline)
        // are an outside locker like any other, so that its effect on the target is in the
        // report; its other locks are not traced.
        discover(mm, cfg.task_mm_offset);
        return tracer_as_outside_locker(mm, tgid, tid, cfg);
    }
    if cfg.target_slots != 0 {
        let locker = classify_by_slot(mm, tgid, tid, cfg);
        if locker.is_some() || !hashes_targets(cfg) {
            return locker;
        }
    }
    let system_wide = cfg.system_wide != 0;
    if let Some(owner) = unsafe { TARGET_MMS.get(&mm) } {
        let owner = *owner;
        if tgid == owner {
            return Some(own_lock(tgid, tid));
        }
        if owns_as_user_process(mm, cfg) {
            // The owner exited and its mm_struct was freed and reused by this process: a real
            // outside locker locks someone else's mm. The new owner takes the entry over when
            // it is traced itself; otherwise the stale registration is forgotten.
            if (system_wide || is_listed_target(tgid))
                && register(mm, tgid, system_wide || cfg.inherit != 0)
            {
                return Some(own_lock(tgid, tid));
            }
            let _ = TARGET_MMS.remove(&mm);
            return None;
        }
        // Another process, or a kernel thread (khugepaged, kthread_use_mm users).
        remember_comm(tgid);
        return Some(Locker {
            pid: owner,
            tid,
            outside_pid: tgid,
            _pad: 0,
            slot: NO_SLOT,
        });
    }
    if is_listed_target(tgid) {
        // A target thread may lock another process's mm (reading its /proc files): only its own
        // mm is a target mm.
        if current_mm(cfg.task_mm_offset) == mm {
            // Inherited children are named, as in system-wide mode: they may exit before the
            // report names them.
            return register(mm, tgid, cfg.inherit != 0).then(|| own_lock(tgid, tid));
        }
        return None;
    }
    // System-wide, a user process locking its own mm registers it. Anyone else locking an mm
    // not known yet (a kernel thread, a /proc reader) is skipped: whose mm it is is not known.
    if system_wide
        && owns_as_user_process(mm, cfg)
        && in_filtered_cgroups(cfg)
        && register(mm, tgid, true)
    {
        return Some(own_lock(tgid, tid));
    }
    None
}

/// `classify` as a global function, verified once: its many outcomes (registering, discovery,
/// reused mms, outside lockers) would otherwise multiply every path after it. `mm` is read
/// from memory (a tp_btf program's `mm` is a typed pointer, which a global function takes only
/// there). Returns the locker packed by `Locker::pack`, or NOT_TRACED.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn target_classify(mm: *const u64) -> i64 {
    match unsafe { mm.as_ref() } {
        Some(mm) => classify(*mm).map_or(NOT_TRACED, |locker| locker.pack()),
        None => NOT_TRACED,
    }
}

const NOT_TRACED: i64 = -1;
const SLOT_SHIFT: u32 = 32;
const OUTSIDE_BIT: i64 = 1 << 40;

/// The locker of the current task's lock of the mm at `mm`, if it concerns a target. A listed
/// target's own lock of its known mm, nearly every event of `-p`, is found inline, as
/// `classify_by_slot` would find it: a few compares, without the call and the packing.
#[inline(always)]
pub fn classified(mm: &u64) -> Option<Locker> {
    if let Some(locker) = own_lock_by_slot(*mm) {
        return Some(locker);
    }
    let packed = target_classify(mm);
    (packed >= 0).then(|| Locker::unpack(packed))
}

#[inline(always)]
fn own_lock_by_slot(mm: u64) -> Option<Locker> {
    let cfg = config();
    if cfg.target_slots == 0 {
        return None;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == cfg.tracer_tgid {
        return None;
    }
    let targets = TARGET_SLOTS.get(0)?;
    let slot = slot_of_pid(targets, tgid);
    (slot != NO_SLOT && targets.mms[slot] == mm).then_some(Locker {
        slot,
        ..own_lock(tgid, pid_tgid as u32)
    })
}

impl Locker {
    /// The target's pid, its slot and whether the locker is outside it, in one scalar: what
    /// `target_classify` returns (a global function returns an integer); the thread and,
    /// outside, its process are the current task's (see `classify`).
    #[inline(always)]
    fn pack(&self) -> i64 {
        let outside = if self.outside_pid != 0 {
            OUTSIDE_BIT
        } else {
            0
        };
        self.pid as i64 | ((self.slot as i64) << SLOT_SHIFT) | outside
    }

    /// The locker `pack` gave, in the current task.
    #[inline(always)]
    fn unpack(packed: i64) -> Locker {
        let pid_tgid = bpf_get_current_pid_tgid();
        let slot = ((packed >> SLOT_SHIFT) & 0xff) as usize;
        Locker {
            pid: packed as u32,
            tid: pid_tgid as u32,
            outside_pid: if packed & OUTSIDE_BIT != 0 {
                (pid_tgid >> 32) as u32
            } else {
                0
            },
            _pad: 0,
            slot: if slot > NO_SLOT { NO_SLOT } else { slot },
        }
    }
}

#[inline(always)]
fn tracer_as_outside_locker(mm: u64, tgid: u32, tid: u32, cfg: &Config) -> Option<Locker> {
    let (pid, slot) = match slot_target_of_mm(mm, cfg) {
        Some(found) => found,
        None if hashes_targets(cfg) => (*unsafe { TARGET_MMS.get(&mm) }?, NO_SLOT),
        None => return None,
    };
    remember_comm(tgid);
    Some(Locker {
        pid,
        tid,
        outside_pid: tgid,
        _pad: 0,
        slot,
    })
}

/// The target whose mm `mm` is and its slot, if it has one.
#[inline(always)]
fn slot_target_of_mm(mm: u64, cfg: &Config) -> Option<(u32, usize)> {
    if cfg.target_slots == 0 {
        return None;
    }
    let targets = TARGET_SLOTS.get(0)?;
    let slot = slot_of_mm(targets, mm);
    (slot != NO_SLOT).then(|| (targets.pids[slot], slot))
}

/// `classify` for listed targets in TARGET_SLOTS: the same decisions, without a hash lookup.
#[inline(always)]
fn classify_by_slot(mm: u64, tgid: u32, tid: u32, cfg: &Config) -> Option<Locker> {
    let targets = unsafe { &mut *TARGET_SLOTS.get_ptr_mut(0)? };
    let slot = slot_of_pid(targets, tgid);
    if slot != NO_SLOT {
        if targets.mms[slot] != mm {
            // Its first lock (or the first after an exec), or a target thread locking another
            // process's mm (reading its /proc files): only its own mm is a target mm.
            if current_mm(cfg.task_mm_offset) != mm || !register(mm, tgid, false) {
                return None;
            }
        }
        return Some(Locker {
            slot,
            ..own_lock(tgid, tid)
        });
    }
    let slot = slot_of_mm(targets, mm);
    if slot == NO_SLOT {
        return None;
    }
    if owns_as_user_process(mm, cfg) {
        // The target exited and its mm_struct was reused by this process (see `classify`).
        targets.mms[slot] = 0;
        let _ = TARGET_MMS.remove(&mm);
        return None;
    }
    remember_comm(tgid);
    Some(Locker {
        pid: targets.pids[slot],
        tid,
        outside_pid: tgid,
        _pad: 0,
        slot,
    })
}

#[inline(always)]
pub fn slot_of_pid(targets: &FastTargets, tgid: u32) -> usize {
    for i in 0..FAST_TARGETS {
        if targets.pids[i] == tgid {
            return i;
        }
    }
    NO_SLOT
}

/// The slot of a target mm, or NO_SLOT.
#[inline(always)]
pub fn slot_of_mm(targets: &FastTargets, mm: u64) -> usize {
    for i in 0..FAST_TARGETS {
        if targets.mms[i] == mm {
            return i;
        }
    }
    NO_SLOT
}

/// Whether some targets are found by hash (TARGET_MMS, TARGET_TGIDS): all of them without
/// target slots; with them and `-- CMD`, the processes the command starts (the command itself
/// has the first slot, so that the process the user named costs its events no hash lookup).
#[inline(always)]
fn hashes_targets(cfg: &Config) -> bool {
    cfg.target_slots == 0 || cfg.inherit != 0
}

/// True when `mm` is a target's: through the slots first when the targets are listed in them.
#[inline(always)]
pub fn is_target_mm(mm: u64) -> bool {
    let cfg = config();
    slot_target_of_mm(mm, cfg).is_some()
        || (hashes_targets(cfg) && unsafe { TARGET_MMS.get(&mm) }.is_some())
}

/// The target whose mm `mm` is, if it is a target's.
#[inline(always)]
pub fn target_of_mm(mm: u64) -> Option<u32> {
    let cfg = config();
    if let Some((pid, _)) = slot_target_of_mm(mm, cfg) {
        return Some(pid);
    }
    hashes_targets(cfg)
        .then(|| unsafe { TARGET_MMS.get(&mm) }.copied())
        .flatten()
}

#[inline(always)]
fn own_lock(tgid: u32, tid: u32) -> Locker {
    Locker {
        pid: tgid,
        tid,
        outside_pid: 0,
        _pad: 0,
        slot: NO_SLOT,
    }
}

/// True for a target process's threads: every process but the tracer in system-wide mode (for
/// the syscall and fault families: kernel threads take neither).
#[inline(always)]
pub fn is_target_tgid(tgid: u32) -> bool {
    let cfg = config();
    if cfg.system_wide != 0 {
        return tgid != cfg.tracer_tgid;
    }
    // A few compares instead of a hash lookup, on every mm syscall and fault on the machine.
    let in_slot = cfg.target_slots != 0
        && TARGET_SLOTS
            .get(0)
            .is_some_and(|targets| slot_of_pid(targets, tgid) != NO_SLOT);
    in_slot || (hashes_targets(cfg) && is_listed_target(tgid))
}

/// True for the threads of a process given with -p (or launched).
#[inline(always)]
pub fn is_listed_target(tgid: u32) -> bool {
    unsafe { TARGET_TGIDS.get(&tgid) }.is_some()
}

/// The tracer reads /proc/PID/cmdline of an idle target, which locks that target's mm from the
/// tracer's thread: that mm is the one being discovered.
#[inline(always)]
fn discover(mm: u64, task_mm_offset: u32) {
    let Some(pid) = DISCOVER.get(0) else { return };
    let pid = *pid;
    if pid != 0 && current_mm(task_mm_offset) != mm {
        register(mm, pid, false);
    }
}

/// Records `pid` as the owner of `mm` (replacing a stale owner). With `name`, also records the
/// process's name, so that the report names a process that exited before the end of the trace
/// (overwriting: after an exec, the new mm brings the new name). An exiting task's locks of its
/// mm (exit_mm, exit_mmap: after sched_process_exit on recent kernels) register nothing: the
/// mm is about to be freed and reused, and sched_process_exit has just forgotten it. Returns
/// false for those: their locks are not traced, neither the acquire nor the release that
/// follows once exit_mm has cleared the task's `mm` (and no lookup would find the mm again),
/// which would otherwise leave a hold open for every process that exits.
#[inline(always)]
pub fn register(mm: u64, pid: u32, name: bool) -> bool {
    if current_is_exiting() {
        return false;
    }
    if TARGET_MMS.insert(&mm, &pid, 0).is_err() {
        count(Counter::TargetMapFull);
    }
    forget_left_mm(pid, mm);
    note_slot_mm(pid, mm);
    remember_cgroup(pid);
    if name {
        if let Ok(comm) = bpf_get_current_comm() {
            if LOCKER_COMMS.insert(&pid, &comm, 0).is_err() {
                count(Counter::NameMapFull);
            }
        }
    }
    true
}

/// `pid` registers `mm`: the mm it had before, if it still owns that one's entry, is gone.
#[inline(always)]
fn forget_left_mm(pid: u32, mm: u64) {
    if let Some(&left) = unsafe { MM_OF_TARGET.get(&pid) } {
        if left != mm && unsafe { TARGET_MMS.get(&left) }.is_some_and(|&owner| owner == pid) {
            let _ = TARGET_MMS.remove(&left);
        }
    }
    let _ = MM_OF_TARGET.insert(&pid, &mm, 0);
}

/// Records `mm` as target `pid`'s in its slot, if it has one (discovery of an idle target's mm
/// by the tracer, a target's first lock).
#[inline(always)]
fn note_slot_mm(pid: u32, mm: u64) {
    if config().target_slots == 0 {
        return;
    }
    let Some(targets) = TARGET_SLOTS.get_ptr_mut(0) else {
        return;
    };
    let targets = unsafe { &mut *targets };
    let slot = slot_of_pid(targets, pid);
    if slot != NO_SLOT {
        targets.mms[slot] = mm;
    }
}

/// Whether the current task is exiting (its locks from here on are exit_mm's and exit_mmap's).
#[inline(always)]
pub fn current_is_exiting() -> bool {
    current_flags() & PF_EXITING != 0
}

/// PF_KTHREAD and PF_EXITING in task_struct.flags.
const PF_KTHREAD: u32 = 0x0020_0000;
const PF_EXITING: u32 = 0x0000_0004;

#[inline(always)]
fn current_flags() -> u32 {
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let flags = task.wrapping_add(config().task_flags_offset as usize) as *const u32;
    unsafe { bpf_probe_read_kernel(flags) }.unwrap_or(0)
}

/// True when `mm` is the current task's own mm and the task is a user process (kernel threads
/// such as vhost workers borrow other processes' mms with kthread_use_mm).
#[inline(always)]
fn owns_as_user_process(mm: u64, cfg: &Config) -> bool {
    current_mm(cfg.task_mm_offset) == mm && current_flags() & PF_KTHREAD == 0
}

#[inline(always)]
pub fn current_mm(task_mm_offset: u32) -> u64 {
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let field = task.wrapping_add(task_mm_offset as usize) as *const u64;
    unsafe { bpf_probe_read_kernel(field) }.unwrap_or(0)
}

#[inline(always)]
fn remember_comm(tgid: u32) {
    if unsafe { LOCKER_COMMS.get(&tgid) }.is_some() {
        return;
    }
    remember_cgroup(tgid);
    if let Ok(comm) = bpf_get_current_comm() {
        // BPF_NOEXIST: the first thread seen names the process (EEXIST: another CPU's thread
        // did); a full map loses the name, counted.
        if let Err(err) = LOCKER_COMMS.insert(&tgid, &comm, 1) {
            if -err != EEXIST {
                count(Counter::NameMapFull);
            }
        }
    }
}

/// Records the current task's cgroup as process `tgid`'s (overwriting: a registration after
/// an exec may come from another cgroup than the fork's). A full map loses it, counted.
#[inline(always)]
fn remember_cgroup(tgid: u32) {
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    if PROCESS_CGROUPS.insert(&tgid, &cgroup, 0).is_err() {
        count(Counter::CgroupMapFull);
    }
}

/// Whether the current task may register its mm under `--cgroup`: always without it.
#[inline(always)]
fn in_filtered_cgroups(cfg: &Config) -> bool {
    cfg.cgroup_filter == 0 || {
        let cgroup = unsafe { bpf_get_current_cgroup_id() };
        unsafe { CGROUP_FILTER.get(&cgroup) }.is_some()
    }
}

/// True when the current task has SIGKILL pending: the only way a killable lock fails, so a
/// failed acquire with it is an interrupted lock, without it a trylock miss.
#[inline(always)]
pub fn fatal_signal_pending() -> bool {
    let offset = config().task_pending_signal_offset;
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let signals = task.wrapping_add(offset as usize) as *const u64;
    const SIGKILL_BIT: u64 = 1 << (9 - 1);
    unsafe { bpf_probe_read_kernel(signals) }.is_ok_and(|set| set & SIGKILL_BIT != 0)
}

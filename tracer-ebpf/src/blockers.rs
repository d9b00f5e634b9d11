//! Blocker attribution: who held a target's mmap_lock when a wait began, and charging the wait
//! to those holders when it ends. Holder stacks are taken at the holder's release, and only for
//! holds that blocked someone (see tracer_common::holders).

use aya_ebpf::maps::HashMap;
use tracer_common::{
    holder_slot, AggKey, BlockKey, BlockValue, Blockers, Counter, HoldId, HolderKey, HolderRecord,
    Holders, LockState, LAST_HOLD, MAX_BLOCKERS, MODE_WRITE,
};

use core::ptr::addr_of_mut;

use aya_ebpf::{macros::map, maps::Array};
use tracer_common::{FAST_TARGETS, KEYS_BLOCKED};

use crate::{
    filter::{Locker, NO_SLOT},
    maps::{
        atomic_add, config, count, count_key, keeps_thread, slot_of, BPF_NOEXIST, EEXIST,
        FULL_BLOCKED,
    },
};

/// Current holders of each target mm's lock (blocker attribution). Enlarged by user space in
/// system-wide mode, like TARGET_MMS.
#[map]
pub static HOLDERS: HashMap<u64, Holders> = HashMap::with_max_entries(256, 0);

/// Stacks of holds that blocked someone, kept from their release until their waiters are
/// charged (see tracer_common::HolderRecord; sized by user space, a power of two).
#[map]
pub static HOLDER_INFO: Array<HolderRecord> = Array::with_max_entries(8192, 0);

/// Waits charged to the holders they waited behind.
#[map]
pub static BLOCKED: HashMap<BlockKey, BlockValue> = HashMap::with_max_entries(10240, 0);

/// A hold that just ended, if any: whether it blocked someone, and its identity.
#[derive(Clone, Copy, Default)]
pub struct EndedHold {
    pub blocked: bool,
    pub hold_start_ns: u64,
}

/// Holders of the targets in TARGET_SLOTS, by slot: an array access, not a hash lookup, on
/// every acquire and release (inside the critical section).
#[map]
static HOLDERS_BY_SLOT: Array<Holders> = Array::with_max_entries(FAST_TARGETS as u32, 0);

/// The holder set of the target mm `mm`, locked by `locker`.
#[inline(always)]
fn holders_of(locker: &Locker, mm: u64) -> Option<&'static mut Holders> {
    if locker.slot != NO_SLOT {
        return HOLDERS_BY_SLOT
            .get_ptr_mut(locker.slot as u32)
            .map(|h| unsafe { &mut *h });
    }
    if HOLDERS.get_ptr_mut(&mm).is_none() {
        // EEXIST: another CPU inserted it first. Otherwise the map of mms is full.
        if let Err(err) = HOLDERS.insert(&mm, &Holders::ZERO, BPF_NOEXIST) {
            if -err != EEXIST {
                count(Counter::TargetMapFull);
            }
        }
    }
    HOLDERS.get_ptr_mut(&mm).map(|h| unsafe { &mut *h })
}

/// A wait begins: fills `out` with the holders it waits behind (marking them as blocking), and
/// queues a writer so that readers arriving after it are charged to it too.
#[inline(always)]
pub fn begin_wait(locker: &Locker, mm: u64, write: bool, out: &mut Blockers) {
    blockers_begin_wait(locker, mm, write as u64, out);
}

/// `begin_wait` as a global function, verified once.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn blockers_begin_wait(
    locker: *const Locker,
    mm: u64,
    write: u64,
    out: *mut Blockers,
) -> i32 {
    let (Some(locker), Some(out)) = (unsafe { (locker.as_ref(), out.as_mut()) }) else {
        return 0;
    };
    let write = write != 0;
    let Some(holders) = holders_of(locker, mm) else {
        out.count = 0;
        out.write_mask = 0;
        return 0;
    };
    holders.fill_blockers(locker.tid, write, out);
    if write {
        holders.queue_writer(locker.tid);
    }
    0
}

/// A writer's wait ended without the lock (interrupted, or a failed trylock).
#[inline(always)]
pub fn abandon_wait(locker: &Locker, mm: u64) {
    if let Some(holders) = holders_of(locker, mm) {
        holders.unqueue_writer(locker.tid);
    }
}

/// Keeps the mm's holder set in step with this thread's hold: ends the hold that was
/// (`held_since`, `held_mode`) if it changed, and records the current one.
#[inline(always)]
pub fn track_holders(
    locker: &Locker,
    mm: u64,
    held_since: u64,
    held_mode: u8,
    st: &LockState,
) -> EndedHold {
    let now_since = st.timing.hold_start_ns;
    if now_since == held_since {
        return EndedHold::default();
    }
    let modes =
        (held_mode == MODE_WRITE) as u64 | ((st.timing.hold_mode == MODE_WRITE) as u64) << 1;
    let blocking_since = blockers_track(locker, mm, held_since, now_since, modes);
    EndedHold {
        blocked: blocking_since > 0,
        hold_start_ns: blocking_since as u64,
    }
}

/// `track_holders` as a global function, verified once (its loops over the reader slots,
/// inlined, multiplied every path after them): `modes` has bit 0 set when the ended hold was
/// a write, bit 1 when the new one is. Returns when the ended hold began if it blocked
/// someone, else 0.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn blockers_track(
    locker: *const Locker,
    mm: u64,
    held_since: u64,
    now_since: u64,
    modes: u64,
) -> i64 {
    let Some(locker) = (unsafe { locker.as_ref() }) else {
        return 0;
    };
    let Some(holders) = holders_of(locker, mm) else {
        return 0;
    };
    let tid = locker.tid;
    let mut blocking_since = 0;
    if held_since != 0 {
        if let Some(hold) = holders.remove(modes & 1 != 0, tid) {
            if hold.blocked != 0 {
                blocking_since = hold.hold_start_ns as i64;
            }
        }
    }
    if now_since != 0 && !holders.add(modes & 2 != 0, tid, now_since) {
        count(Counter::ReaderOverflow);
    }
    blocking_since
}

/// Charges a finished wait, in equal shares, to the holders it found when it went to sleep.
#[inline(always)]
pub fn charge(waiter: &AggKey, blockers: &Blockers, wait_ns: u64) {
    if blockers.count != 0 {
        blockers_charge(waiter, blockers, wait_ns);
    }
}

/// `charge` as a global function, verified once: its loop of map lookups, inlined, was
/// explored once per path of every program that aggregates a wait (120 000 instructions for
/// --lean's acquire_returned, where no wait has blockers).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn blockers_charge(
    waiter: *const AggKey,
    blockers: *const Blockers,
    wait_ns: u64,
) -> i32 {
    if let (Some(waiter), Some(blockers)) = unsafe { (waiter.as_ref(), blockers.as_ref()) } {
        charge_each(waiter, blockers, wait_ns);
    }
    0
}

#[inline(always)]
fn charge_each(waiter: &AggKey, blockers: &Blockers, wait_ns: u64) {
    let n = blockers.count as usize;
    if n == 0 || n > MAX_BLOCKERS {
        return;
    }
    let share = wait_ns / n as u64;
    // One key on the stack for all the holders: flush_wait's frame, with the lock program's
    // below it, must stay within 6.1's 512 bytes (each frame rounded up to 32).
    let mut key = BlockKey {
        waiter: *waiter,
        holder: HolderKey::default(),
    };
    for i in 0..MAX_BLOCKERS {
        if i >= n {
            break;
        }
        let (hold, mode) = blockers.charged_hold(i);
        key.waiter.tid = waiter.tid;
        key.holder = holder_key(hold, mode);
        if let Some(v) = block_value(&mut key) {
            unsafe {
                atomic_add(addr_of_mut!((*v).count), 1);
                atomic_add(addr_of_mut!((*v).wait_ns), share);
            }
        }
    }
}

/// The BLOCKED value of `key`, inserted if new. Once the map is crowded a new key drops its
/// thread ids (holder's and waiter's, unless per-thread rows were asked for): a key that the
/// same stacks share from then on, whatever the thread.
#[inline(always)]
fn block_value(key: &mut BlockKey) -> Option<*mut BlockValue> {
    if let Some(value) = BLOCKED.get_ptr_mut(&*key) {
        return Some(value);
    }
    if !keeps_thread(KEYS_BLOCKED) {
        if key.holder.outside_pid == 0 {
            key.holder.tid = 0;
        }
        if key.waiter.locker_pid == 0 {
            key.waiter.tid = 0;
        }
        if let Some(value) = BLOCKED.get_ptr_mut(&*key) {
            return Some(value);
        }
    }
    let value = slot_of(
        &BLOCKED,
        key,
        &BlockValue::ZERO,
        FULL_BLOCKED,
        Counter::BlockedMapFull,
    )?;
    count_key(KEYS_BLOCKED);
    Some(value)
}

/// The holder's stacks as its release kept them; a holder still holding (or whose record was
/// lost) is charged by thread only.
#[inline(always)]
fn holder_key(hold: HoldId, mode: u8) -> HolderKey {
    let slot = holder_slot(&hold, config().holder_slots_mask);
    if let Some(record) = HOLDER_INFO.get(slot) {
        if record.id.tid == hold.tid && record.id.hold_start_ns == hold.hold_start_ns {
            return record.holder;
        }
    }
    count(Counter::HolderStackMissing);
    HolderKey::unknown(hold.tid, mode)
}

/// Keeps a blocking holder's stacks for the waiters that acquire after it (one insert inside
/// the critical section), and a write hold's also as the thread's latest blocking write hold,
/// for readers that queued behind it while it was still waiting (they could not know its
/// hold_start): overwritten in place, since the key stays the same (a lookup, not an insert).
#[inline(always)]
pub fn remember_holder(tid: u32, hold: &AggKey, hold_start_ns: u64) {
    let id = HoldId {
        tid,
        _pad: 0,
        hold_start_ns,
    };
    let holder = HolderKey {
        kernel_stack: hold.kernel_stack,
        user_stack: hold.user_stack,
        tid,
        outside_pid: hold.locker_pid,
        mode: hold.mode,
        syscall: hold.syscall,
        fault: hold.fault,
        _pad: 0,
    };
    store_holder(id, holder);
    if hold.mode != MODE_WRITE {
        return;
    }
    let latest = HoldId {
        hold_start_ns: LAST_HOLD,
        ..id
    };
    store_holder(latest, holder);
}

#[inline(always)]
fn store_holder(id: HoldId, holder: HolderKey) {
    let slot = holder_slot(&id, config().holder_slots_mask);
    if let Some(record) = HOLDER_INFO.get_ptr_mut(slot) {
        unsafe { *record = HolderRecord { id, holder } };
    }
}

//! The wakers family's part of the report: the sleeps of threads that held the lock, by who
//! ended them. Above all the per-VMA lock (Linux 6.4 on): a writer holding mmap_lock waits in
//! it until the page faults under a VMA's lock leave it, and every thread queued on mmap_lock
//! waits with it; the thread that woke it is the one whose fault it waited for.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;
use tracer_common::{WakeKey, WakeValue};

use super::Inputs;
use crate::model::json_figures::{array, expect, n};
use crate::model::place::place;
use crate::model::{Frame, Report};
use crate::units::human_ns;

/// The kernel's WAKERS map, cumulative.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Raw(pub Vec<(WakeKey, WakeValue)>);

impl Raw {
    /// Running counts per key; keys with nothing new are left out.
    pub fn since(&self, before: &Raw) -> Raw {
        let earlier: HashMap<&WakeKey, &WakeValue> = before.0.iter().map(|(k, v)| (k, v)).collect();
        Raw(self
            .0
            .iter()
            .map(|(k, v)| (*k, earlier.get(k).map_or(*v, |old| v.since(old))))
            .filter(|(_, v)| v.count > 0)
            .collect())
    }
}

/// Holder threads listed per sleep.
const MAX_TIDS: usize = 8;

/// One kind of sleep inside holds: of one process's holders, in one mode and kernel stack.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HolderSleep {
    pub pid: u32,
    pub comm: String,
    /// "read" or "write".
    pub mode: &'static str,
    /// Asleep waiting for per-VMA lock readers to leave a VMA (see `waits_for_vma_readers`).
    pub per_vma_lock: bool,
    /// Sleeps ended by a wakeup, and their time until it.
    pub count: u64,
    pub asleep_ns: u64,
    /// The holder threads (at most eight).
    pub tids: Vec<u32>,
    /// Where they slept (kernel frames, innermost first).
    pub sleep_frames: Vec<Frame>,
    /// Who woke them, most sleeping time first.
    pub woken_by: Vec<Waker>,
}

/// A task that ended such sleeps, and where it was then.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Waker {
    pub pid: u32,
    pub comm: String,
    pub tid: u32,
    /// In an interrupt (an I/O completion, a timer): `pid`, `tid` and the user frames are those
    /// of the task it interrupted.
    pub interrupt: bool,
    /// The waker was leaving a VMA's lock it held for read (a page fault; from 6.17 also
    /// madvise and /proc/PID/maps readers).
    pub vma_reader: bool,
    pub count: u64,
    pub asleep_ns: u64,
    /// User frames then kernel frames, innermost first.
    pub frames: Vec<Frame>,
}

/// The holders' sleeps by kind, most sleeping time first.
pub type Wakers = Vec<HolderSleep>;

pub fn build(raw: &Raw, inputs: &Inputs) -> Wakers {
    let mut sleeps: HashMap<(u32, u8, i32), HolderSleep> = HashMap::new();
    let mut wakers: HashMap<(u32, u8, i32), HashMap<WakeKey, Waker>> = HashMap::new();
    for (k, v) in &raw.0 {
        let group = (k.pid, k.mode, k.sleep_stack);
        let sleep = sleeps.entry(group).or_insert_with(|| HolderSleep {
            pid: k.pid,
            comm: (inputs.name)(k.pid),
            mode: mode_name(k.mode),
            per_vma_lock: false,
            count: 0,
            asleep_ns: 0,
            tids: Vec::new(),
            sleep_frames: (inputs.kernel_frames)(k.sleep_stack),
            woken_by: Vec::new(),
        });
        sleep.count += v.count;
        sleep.asleep_ns += v.asleep_ns;
        if sleep.tids.len() < MAX_TIDS && !sleep.tids.contains(&k.holder_tid) {
            sleep.tids.push(k.holder_tid);
        }
        let by = WakeKey {
            pid: 0,
            holder_tid: 0,
            sleep_stack: 0,
            mode: 0,
            ..*k
        };
        let waker = wakers
            .entry(group)
            .or_default()
            .entry(by)
            .or_insert_with(|| {
                let frames = (inputs.frames)(k.waker_kernel_stack, k.waker_user_stack, k.waker_pid);
                Waker {
                    pid: k.waker_pid,
                    comm: (inputs.name)(k.waker_pid),
                    tid: k.waker_tid,
                    interrupt: in_interrupt(&frames),
                    vma_reader: leaves_a_vma_read_lock(&frames),
                    count: 0,
                    asleep_ns: 0,
                    frames,
                }
            });
        waker.count += v.count;
        waker.asleep_ns += v.asleep_ns;
    }
    let mut out: Wakers = sleeps
        .into_iter()
        .map(|(group, mut sleep)| {
            let mut by: Vec<Waker> = wakers
                .remove(&group)
                .unwrap_or_default()
                .into_values()
                .collect();
            by.sort_by_key(|w| std::cmp::Reverse(w.asleep_ns));
            sleep.per_vma_lock = waits_for_vma_readers(&sleep.sleep_frames, &by);
            sleep.woken_by = by;
            sleep
        })
        .collect();
    out.sort_by_key(|s| std::cmp::Reverse(s.asleep_ns));
    out
}

fn mode_name(mode: u8) -> &'static str {
    if mode == tracer_common::MODE_WRITE {
        "write"
    } else {
        "read"
    }
}

fn names_any(frames: &[Frame], names: &[&str]) -> bool {
    frames
        .iter()
        .any(|f| f.kernel && f.symbol.as_deref().is_some_and(|s| names.contains(&s)))
}

/// A holder asleep in `sleep` (kernel frames) waited for per-VMA lock readers: from 6.15 in
/// `__vma_start_write` (on the mm's vma_writer_wait, until the readers leave), whoever woke it;
/// from 6.4 to 6.14 in the VMA's rwsem taken for write (`vma_start_write`, often inlined into
/// its callers, leaves only `down_write`), told from the other rwsems a writer takes there (the
/// file's i_mmap_rwsem, the anon_vma's) by who woke it: a page fault leaving the VMA's lock.
fn waits_for_vma_readers(sleep: &[Frame], wakers: &[Waker]) -> bool {
    names_any(sleep, &["__vma_start_write", "vma_start_write"])
        || (names_any(sleep, &["rwsem_down_write_slowpath"]) && wakers.iter().any(|w| w.vma_reader))
}

/// The waker left a VMA's lock it held for read: from 6.15 it wakes the writer's rcuwait
/// (`mm->vma_writer_wait`, whose only waker is the last reader of a VMA that a writer waits
/// for: a page fault, or since 6.17 a madvise or a /proc/PID/maps reader); before, it is an
/// up_read (`vma_end_read`, inlined) at the end of a page fault.
fn leaves_a_vma_read_lock(frames: &[Frame]) -> bool {
    let faults = ["do_user_addr_fault", "exc_page_fault", "handle_mm_fault"];
    names_any(frames, &["rcuwait_wake_up", "vma_end_read"])
        || (names_any(frames, &["up_read"]) && names_any(frames, &faults))
}

/// The waker's kernel stack passes through an interrupt or softirq entry.
fn in_interrupt(frames: &[Frame]) -> bool {
    frames.iter().any(|f| {
        f.kernel
            && f.symbol.as_deref().is_some_and(|s| {
                s.starts_with("asm_common_interrupt")
                    || s.starts_with("asm_sysvec_")
                    || s.starts_with("handle_softirqs")
                    || s.starts_with("__do_softirq")
                    || s.starts_with("irq_exit")
            })
    })
}

/// The frame that names where a waker was: its own code (`place::place`), else (its user stack
/// ends in the C library, as a syscall wrapper without a frame pointer leaves it) the first
/// kernel frame past the wakeup itself.
fn waker_place(frames: &[Frame]) -> String {
    const WAKEUP: [&str; 9] = [
        "try_to_wake_up",
        "wake_up",
        "__wake_up",
        "wake_q",
        "rwsem_wake",
        "up_read",
        "up_write",
        "rcuwait_wake_up",
        "vma_end_read",
    ];
    let is_wakeup = |f: &Frame| {
        f.kernel
            && f.symbol
                .as_deref()
                .is_some_and(|s| WAKEUP.iter().any(|w| s.starts_with(w)))
    };
    let past_wakeup: Vec<Frame> = frames.iter().filter(|f| !is_wakeup(f)).cloned().collect();
    place(&past_wakeup, true)
}

/// Wakers shown per sleep, and sleeps shown.
const TEXT_WAKERS: usize = 3;
const TEXT_SLEEPS: usize = 5;

/// Sleeps of one holder process and mode, of one kind (the per-VMA lock, or the kernel
/// function it slept in), as the text report sums them: the JSON keeps the stacks apart.
struct TextSleep {
    pid: u32,
    comm: String,
    mode: &'static str,
    why: String,
    count: u64,
    asleep_ns: u64,
    /// (who, where, leaving the VMA's lock) -> (count, ns).
    wakers: HashMap<(String, String, bool), (u64, u64)>,
}

fn text_sleeps(wakers: &Wakers) -> Vec<TextSleep> {
    let mut groups: HashMap<(u32, &'static str, String), TextSleep> = HashMap::new();
    for sleep in wakers {
        let why = if sleep.per_vma_lock {
            "waiting for per-VMA lock readers to leave a VMA".to_string()
        } else {
            format!("in {}", place(&sleep.sleep_frames, true))
        };
        let group = groups
            .entry((sleep.pid, sleep.mode, why.clone()))
            .or_insert_with(|| TextSleep {
                pid: sleep.pid,
                comm: sleep.comm.clone(),
                mode: sleep.mode,
                why,
                count: 0,
                asleep_ns: 0,
                wakers: HashMap::new(),
            });
        group.count += sleep.count;
        group.asleep_ns += sleep.asleep_ns;
        for w in &sleep.woken_by {
            let who = if w.interrupt {
                "an interrupt".to_string()
            } else {
                format!("pid {} tid {} ({})", w.pid, w.tid, w.comm)
            };
            let by = group
                .wakers
                .entry((who, waker_place(&w.frames), w.vma_reader))
                .or_default();
            *by = (by.0 + w.count, by.1 + w.asleep_ns);
        }
    }
    let mut out: Vec<TextSleep> = groups.into_values().collect();
    out.sort_by_key(|g| std::cmp::Reverse(g.asleep_ns));
    out
}

/// Whose sleeps inside holds were ended by whom, the per-VMA lock waits named and summed
/// against the write holds they are part of.
pub fn text(out: &mut String, wakers: &Wakers, r: &Report) {
    if !r.features.wakers {
        return;
    }
    if !r.features.per_vma_locks {
        let _ = writeln!(
            out,
            "\nPer-VMA locks: none in this kernel (before 6.4): page faults take mmap_lock"
        );
    }
    if wakers.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nHolders asleep inside the lock, and who woke them:");
    let per_vma: u64 = wakers
        .iter()
        .filter(|s| s.per_vma_lock && s.mode == "write")
        .map(|s| s.asleep_ns)
        .sum();
    if per_vma > 0 {
        let write_hold_ns = r.totals.write.hold_ns;
        let _ = writeln!(
            out,
            "  per-VMA lock: {} asleep inside write holds ({:.0}% of their {}), until the \
             readers of a VMA left it",
            human_ns(per_vma),
            100.0 * per_vma as f64 / write_hold_ns.max(1) as f64,
            human_ns(write_hold_ns)
        );
    }
    for sleep in text_sleeps(wakers).iter().take(TEXT_SLEEPS) {
        let _ = writeln!(
            out,
            "  {} holds of pid {} ({}): asleep {} ({} times), {}",
            sleep.mode,
            sleep.pid,
            sleep.comm,
            human_ns(sleep.asleep_ns),
            sleep.count,
            sleep.why
        );
        let mut by: Vec<_> = sleep.wakers.iter().collect();
        by.sort_by_key(|(_, (_, ns))| std::cmp::Reverse(*ns));
        for ((who, at, vma_reader), (count, ns)) in by.iter().take(TEXT_WAKERS) {
            let what = if *vma_reader {
                ", leaving the VMA's lock"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "    {} ({count} times) woken by {who} at {at}{what}",
                human_ns(*ns)
            );
        }
        if by.len() > TEXT_WAKERS {
            let _ = writeln!(out, "    and {} more wakers", by.len() - TEXT_WAKERS);
        }
    }
}

/// Each sleep's wakers add up to it, and it lists at most eight holder threads.
pub fn check(report: &Value, _entries: &[Value], broken: &mut Vec<String>) {
    for sleep in array(report, "wakers") {
        let by = array(sleep, "woken_by");
        let (count, ns) = by.iter().fold((0, 0), |(c, t), w| {
            (c + n(w, "count"), t + n(w, "asleep_ns"))
        });
        expect(
            broken,
            count == n(sleep, "count") && ns == n(sleep, "asleep_ns"),
            || format!("a holder sleep's wakers add up to {count} / {ns} ns, not its own: {sleep}"),
        );
        expect(broken, array(sleep, "tids").len() <= MAX_TIDS, || {
            format!("more than {MAX_TIDS} holder threads: {sleep}")
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::report::tests::attributed;
    use crate::model::{build_report, Cause};
    use tracer_common::MODE_WRITE;

    fn kernel(names: &[&str]) -> Vec<Frame> {
        names
            .iter()
            .map(|n| Frame {
                kernel: true,
                module: "kernel".into(),
                symbol: Some(n.to_string()),
                ..Frame::default()
            })
            .collect()
    }

    /// Stack 1: a 6.18 writer's sleep; 2: a 6.12 writer's rwsem sleep; 10: a fault leaving
    /// a VMA; 11: an rmap walker; 12: an interrupt.
    fn frames_of(stack: i32) -> Vec<Frame> {
        match stack {
            1 => kernel(&[
                "__schedule",
                "schedule",
                "__vma_start_write",
                "vms_gather_munmap_vmas",
            ]),
            2 => kernel(&[
                "__schedule",
                "rwsem_down_write_slowpath",
                "down_write",
                "vma_expand",
            ]),
            10 => kernel(&[
                "try_to_wake_up",
                "rwsem_wake",
                "up_read",
                "do_user_addr_fault",
            ]),
            11 => kernel(&["try_to_wake_up", "rwsem_wake", "up_read", "rmap_walk_file"]),
            12 => kernel(&[
                "try_to_wake_up",
                "blk_mq_end_request",
                "asm_common_interrupt",
            ]),
            _ => Vec::new(),
        }
    }

    fn woke(
        pid: u32,
        sleep_stack: i32,
        waker_pid: u32,
        waker_stack: i32,
        ns: u64,
    ) -> (WakeKey, WakeValue) {
        let key = WakeKey {
            pid,
            holder_tid: pid + 1,
            sleep_stack,
            waker_pid,
            waker_tid: waker_pid + 2,
            waker_kernel_stack: waker_stack,
            waker_user_stack: -1,
            mode: MODE_WRITE,
            _pad: [0; 3],
        };
        (
            key,
            WakeValue {
                count: 1,
                asleep_ns: ns,
            },
        )
    }

    fn built(raw: &Raw) -> Wakers {
        let entries = [];
        build(
            raw,
            &Inputs {
                entries: &entries,
                cause: &|_| Cause::Other,
                kernel_frames: &frames_of,
                frames: &|k, _, _| frames_of(k),
                name: &|pid| format!("p{pid}"),
            },
        )
    }

    #[test]
    fn sleeps_group_by_holder_and_stack_with_their_wakers_most_time_first() {
        let raw = Raw(vec![
            woke(7, 1, 7, 10, 3_000),
            woke(7, 1, 7, 10, 2_000),
            woke(7, 1, 9, 12, 500),
            woke(7, 2, 7, 11, 100),
            woke(7, 2, 7, 11, 100),
        ]);
        let sleeps = built(&raw);
        assert_eq!(sleeps.len(), 2);
        let vma = &sleeps[0];
        assert_eq!(
            (vma.count, vma.asleep_ns, vma.per_vma_lock),
            (3, 5_500, true)
        );
        assert_eq!(vma.tids, [8]);
        assert_eq!(vma.woken_by.len(), 2);
        let fault = &vma.woken_by[0];
        assert_eq!(
            (fault.pid, fault.tid, fault.count, fault.asleep_ns),
            (7, 9, 2, 5_000)
        );
        assert!(fault.vma_reader && !fault.interrupt);
        assert!(vma.woken_by[1].interrupt);
        // An rwsem sleep woken by an rmap walk is not the per-VMA lock...
        assert!(!sleeps[1].per_vma_lock);
        // ... but woken by a fault leaving its read lock, it is (6.4-6.14).
        let sleeps = built(&Raw(vec![woke(7, 2, 7, 10, 100)]));
        assert!(sleeps[0].per_vma_lock);
    }

    #[test]
    fn a_window_counts_only_the_new_wakeups() {
        let before = Raw(vec![woke(7, 1, 7, 10, 3_000)]);
        let mut now = before.clone();
        now.0[0].1.merge(&WakeValue {
            count: 2,
            asleep_ns: 50,
        });
        now.0.push(woke(8, 1, 8, 10, 70));
        let window = now.since(&before);
        assert_eq!(window.0.len(), 2);
        assert_eq!(
            window.0[0].1,
            WakeValue {
                count: 2,
                asleep_ns: 50
            }
        );
        assert!(Raw(vec![woke(7, 1, 7, 10, 3_000)])
            .since(&before)
            .0
            .is_empty());
    }

    #[test]
    fn the_text_names_the_vma_wait_and_its_fault_and_says_when_the_kernel_has_none() {
        let (mut harvest, symbols, meta) = attributed();
        harvest.features.wakers = true;
        let mut report = build_report(&harvest, &symbols, &meta);
        report.sections.wakers = built(&Raw(vec![woke(7, 1, 7, 10, 3_000_000)]));
        let mut text = String::new();
        super::text(&mut text, &report.sections.wakers, &report);
        assert!(
            text.contains("write holds of pid 7 (p7): asleep 3.00 ms (1 times), waiting for per-VMA lock readers to leave a VMA"),
            "{text}"
        );
        assert!(
            text.contains(
                "woken by pid 7 tid 9 (p7) at do_user_addr_fault, leaving the VMA's lock"
            ),
            "{text}"
        );
        report.features.per_vma_locks = false;
        let mut text = String::new();
        super::text(&mut text, &report.sections.wakers, &report);
        assert!(
            text.contains("Per-VMA locks: none in this kernel"),
            "{text}"
        );
    }

    #[test]
    fn wakers_that_do_not_add_up_are_named() {
        let (harvest, symbols, meta) = attributed();
        let mut report = build_report(&harvest, &symbols, &meta);
        report.sections.wakers =
            built(&Raw(vec![woke(7, 1, 7, 10, 3_000), woke(7, 1, 9, 12, 500)]));
        let mut json = serde_json::to_value(&report).unwrap();
        let mut broken = Vec::new();
        check(&json, &[], &mut broken);
        assert!(broken.is_empty(), "{broken:?}");
        json["wakers"][0]["woken_by"][0]["asleep_ns"] = 1.into();
        check(&json, &[], &mut broken);
        assert!(
            broken[0].contains("wakers add up to 2 / 501 ns"),
            "{broken:?}"
        );
    }
}

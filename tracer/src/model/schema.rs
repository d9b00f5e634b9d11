//! The report's schema: what every presenter shows. Field names here are the JSON schema
//! (docs/report.md, "JSON output"); `report` builds it from a harvest, its symbols and the trace's own
//! facts.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use tracer_common::{ModeTotals, KIND_WAIT, MODE_WRITE};

use super::sections::Sections;
use super::self_cost::SelfCost;
use super::unwound::UserStackKind;
use super::{Cause, Features, Frame, InFlight};

pub const SCHEMA_VERSION: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Wait,
    Hold,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Read,
    Write,
}

impl Kind {
    /// From the kernel's `KIND_WAIT` / `KIND_HOLD`.
    pub fn from_raw(kind: u8) -> Kind {
        if kind == KIND_WAIT {
            Kind::Wait
        } else {
            Kind::Hold
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Kind::Wait => "wait",
            Kind::Hold => "hold",
        }
    }
}

impl Mode {
    /// From the kernel's `MODE_READ` / `MODE_WRITE`.
    pub fn from_raw(mode: u8) -> Mode {
        if mode == MODE_WRITE {
            Mode::Write
        } else {
            Mode::Read
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }
}

/// Facts about the trace that the kernel maps do not hold.
#[derive(Clone, Debug, Default)]
pub struct TraceMeta {
    /// The processes given (-p, or a launched command); empty system-wide.
    pub pids: Vec<u32>,
    /// Every user process was traced (-a).
    pub system_wide: bool,
    pub comm: String,
    /// Threads that ran during the trace (the live view: alive now).
    pub threads: usize,
    pub duration_ns: u64,
    /// Sum over time of the number of target threads alive: the denominator of wait_share.
    pub thread_time_ns: u64,
    pub exited: bool,
    pub stack_threshold_ns: u64,
    /// Thread id -> name, for per-thread entries.
    pub thread_names: HashMap<u32, String>,
    /// Process id -> name (comm) from /proc; processes missing here are named by what the
    /// kernel recorded (`Harvest::locker_comms`).
    pub process_names: HashMap<u32, String>,
    /// CPUs the machine has (0: unknown), what the tracer's own cost is set against.
    pub cpus: u32,
    /// Outside lockers folded by name (`model::delta::outside_lockers_by_name`): the first pid
    /// of each name -> every pid of it.
    pub locker_groups: HashMap<u32, Vec<u32>>,
    /// Cgroup (v2) id -> its path as /proc/PID/cgroup writes it, resolved while the trace ran
    /// (`Harvest::process_cgroups` gives each process's id).
    pub cgroup_paths: HashMap<u64, String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub version: u32,
    pub target: Target,
    pub duration_ns: u64,
    pub thread_time_ns: u64,
    /// Share of the target threads' time spent waiting for the lock (0..1).
    pub wait_share: f64,
    pub stack_threshold_ns: u64,
    /// Who waited and behind whom, summed (the answer the text report leads with).
    pub answer: Answer,
    /// Every locker of the targets' mm: their threads and outside lockers.
    pub totals: Totals,
    /// The outside lockers' part of `totals`.
    pub outside_totals: Totals,
    /// Per locking process, most waiting first (from the entries: a full aggregation map
    /// leaves out what `totals` still counts).
    pub processes: Vec<ProcessRow>,
    pub causes: Vec<CauseRow>,
    pub entries: Vec<Entry>,
    /// Every drop and unpaired-event counter, zero or not.
    pub lost: BTreeMap<&'static str, u64>,
    pub in_flight: InFlight,
    /// The families' own sections (`faults`, `syscalls`), each a key of its own here.
    #[serde(flatten)]
    pub sections: Sections,
    /// Which optional attributions the kernel allowed.
    pub features: Features,
    /// What the tracer's programs cost the threads that hit their events.
    pub self_cost: SelfCost,
}

#[derive(Clone, Debug, Serialize)]
pub struct Target {
    /// Empty when `system_wide`.
    pub pids: Vec<u32>,
    pub system_wide: bool,
    pub comm: String,
    pub threads: usize,
    pub exited: bool,
}

/// Per-mode lock totals (the kernel's `ModeTotals`, summed over CPUs and slots).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub read: ModeTotals,
    pub write: ModeTotals,
}

/// One row of the by-cause table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CauseRow {
    pub cause: Cause,
    pub kind: Kind,
    pub mode: Mode,
    pub count: u64,
    pub total_ns: u64,
    pub avg_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    /// `max_ns` is an upper bound: no entry with an exact maximum reaches it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub max_is_upper_bound: bool,
}

/// One call stack's waits or holds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Entry {
    pub kind: Kind,
    pub mode: Mode,
    pub cause: Cause,
    pub count: u64,
    pub total_ns: u64,
    pub avg_ns: u64,
    pub max_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// The target whose mm was locked.
    pub pid: u32,
    /// Its name, when known.
    pub comm: Option<String>,
    /// The mm owner's cgroup (v2) path, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// Set with per-thread aggregation, and always for outside lockers.
    pub tid: Option<u32>,
    pub outside_locker: bool,
    pub locker: Option<Locker>,
    /// False when the duration was below the stack threshold (or the stack was lost).
    pub stack_collected: bool,
    /// How the user frames were obtained: unwound with CFI (`dwarf`), stopped early
    /// (`truncated`), frame pointers (`fp`), or not at all (`none`).
    pub user_stack: UserStackKind,
    /// True when part of this entry's events were not copied (the copy budget was spent) and
    /// were given to its unwound stacks in proportion to the copied ones: an estimate.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub user_stack_estimated: bool,
    /// User frames (innermost first), then kernel frames (innermost first).
    pub frames: Vec<Frame>,
    /// Non-empty log2 slots as [lower bound ns, count].
    pub histogram: Vec<[u64; 2]>,
    /// Waits: the part spent asleep in the rwsem slow path; null for holds.
    pub contended_ns: Option<u64>,
    /// Waits: the holders waited behind, largest first; empty for holds.
    pub blocked_by: Vec<Blocker>,
    /// Holds: where the time went while off CPU; null for waits.
    pub offcpu: Option<OffCpuSplit>,
    /// Holds: the kernel stack the holder slept in most; empty if it never slept.
    pub sleep_frames: Vec<Frame>,
    /// Holds: the waiting this stack caused; null for waits.
    pub blocked_others: Option<BlockedOthers>,
    /// Per-interval views only: `max_ns` bounds the interval's maximum from above (it did not
    /// beat the earlier record, so only its histogram slot is known).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub max_is_upper_bound: bool,
    /// Name (comm) of thread `tid`, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread_name: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Locker {
    pub pid: u32,
    pub comm: Option<String>,
    /// Its cgroup (v2) path, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The processes of this name folded into this locker (1 unless `--per-pid` was not given
    /// and several processes of the name locked: a /proc reader loop); `pid` is the first.
    pub processes: usize,
}

/// A holder a wait was charged to: its stacks, cause and threads, and the wait time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Blocker {
    pub mode: Mode,
    pub cause: Cause,
    pub outside_locker: bool,
    pub locker: Option<Locker>,
    /// Holder threads seen with this stack (at most MAX_TIDS).
    pub tids: Vec<u32>,
    pub frames: Vec<Frame>,
    /// The entry's wait time charged to this holder (waits behind several readers are split
    /// equally between them).
    pub wait_ns: u64,
    pub count: u64,
    /// wait_ns / the entry's total wait.
    pub share: f64,
}

/// How much waiting a hold entry caused, over every waiter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BlockedOthers {
    pub count: u64,
    pub wait_ns: u64,
}

/// Where a hold entry's time went: running + runnable + sleeping = total; uninterruptible (D)
/// sleep is part of sleeping.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OffCpuSplit {
    pub running_ns: u64,
    pub runnable_ns: u64,
    pub sleeping_ns: u64,
    pub uninterruptible_ns: u64,
}

/// One process's waits and holds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProcessRow {
    pub pid: u32,
    /// From /proc when the report was built, else as the kernel recorded it, else "?".
    pub comm: String,
    /// Its cgroup (v2) path as /proc/PID/cgroup writes it, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    pub waits: u64,
    pub wait_ns: u64,
    pub max_wait_ns: u64,
    pub holds: u64,
    pub hold_ns: u64,
    pub max_hold_ns: u64,
    /// wait_ns over every process's wait (0..1).
    pub wait_share: f64,
    /// The processes this row stands for: several for an outside locker whose processes of
    /// one name were folded (`pid` is the first), else one.
    pub processes: usize,
    /// Their pids (only when more than one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pids: Vec<u32>,
}

/// Waits of one mode and cause whose stacks a frame names.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WaitGroup {
    pub mode: Mode,
    pub cause: Cause,
    /// The frame that names the stacks (see `place`).
    pub place: String,
    pub waits: u64,
    pub wait_ns: u64,
    pub max_wait_ns: u64,
    /// wait_ns over every wait of the report (0..1).
    pub share: f64,
    /// The stacks summed here.
    pub stacks: usize,
}

/// Holders of one mode and cause whose stacks a frame names, and the waiting charged to them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HolderGroup {
    pub mode: Mode,
    pub cause: Cause,
    pub place: String,
    /// The process that held the lock from outside (a /proc reader), when it was one.
    pub outside_locker: Option<String>,
    /// The waits charged to these holders, and their time.
    pub waits_caused: u64,
    pub wait_caused_ns: u64,
    /// wait_caused_ns over every wait charged to a holder (0..1).
    pub share: f64,
    /// The holds themselves, as their entries have them (0 when the holds' entries were not
    /// kept: a full map).
    pub holds: u64,
    pub hold_ns: u64,
    pub max_hold_ns: u64,
    /// Where the holds' time went while off CPU.
    pub offcpu: OffCpuSplit,
    /// Holder threads seen.
    pub threads: Vec<u32>,
}

/// Who waited and behind whom, largest first, at most ANSWER_ROWS of each.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Answer {
    pub who_waited: Vec<WaitGroup>,
    pub behind_whom: Vec<HolderGroup>,
    /// Wait time charged to no holder (timing only, or a holder the kernel lost).
    pub wait_unattributed_ns: u64,
}

//! Struct member offsets from the running kernel's BTF: the eBPF programs get them as load-time
//! constants, because aya has no CO-RE for Rust programs.

use anyhow::{anyhow, bail, Context as _, Result};
use btf::types::{Btf, BtfComposite, BtfType};

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The offsets the programs need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelOffsets {
    pub task_mm: u32,
    pub task_pending_signal: u32,
    pub task_pid: u32,
    pub task_flags: u32,
    pub task_active_mm: u32,
    pub task_start_time: u32,
    pub task_tgid: u32,
    pub task_signal: u32,
    pub signal_live: u32,
    pub mm_mmap_lock: u32,
    /// Where a task's saved user registers are: `task_struct.stack` (its kernel stack), and
    /// `struct pt_regs` (size; ip, sp, bp, orig_ax members). None when the kernel's BTF lacks
    /// them (the copy of user stacks for unwinding and fault attribution are then unavailable).
    pub user_regs: Option<UserRegsOffsets>,
    /// Where the mmap_lock trace calls pass their arguments (start_locking, acquire_returned,
    /// released), for the BTF tracepoint programs. None when the kernel's BTF lacks the
    /// `btf_trace_mmap_lock_*` prototypes: the classic tracepoints are used then.
    pub lock_args: Option<[LockArgIndices; 3]>,
    /// Whether page faults try a per-VMA lock before mmap_lock (CONFIG_PER_VMA_LOCK, Linux
    /// 6.4): told by `lock_vma_under_rcu` among the kernel's functions. Without them every
    /// user page fault takes mmap_lock.
    pub per_vma_locks: bool,
}

/// Indices of mm, write and success among a trace call's arguments (its `TP_PROTO`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockArgIndices {
    pub mm: u32,
    pub write: u32,
    /// acquire_returned only (0 elsewhere).
    pub success: u32,
}

/// The mmap_lock events, in the order of `KernelOffsets::lock_args`.
pub const LOCK_EVENTS: [&str; 3] = [
    "mmap_lock_start_locking",
    "mmap_lock_acquire_returned",
    "mmap_lock_released",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserRegsOffsets {
    pub task_stack: u32,
    pub pt_regs_size: u32,
    pub ip: u32,
    pub sp: u32,
    pub bp: u32,
    /// The syscall number on syscall entry, -1 on exception entry (a page fault).
    pub orig_ax: u32,
}

impl UserRegsOffsets {
    fn from_btf(btf: &Btf) -> Result<Self> {
        Ok(Self {
            task_stack: byte_offset(btf, "task_struct", &["stack"])?,
            pt_regs_size: find_struct(btf, "pt_regs")?.sz,
            ip: byte_offset(btf, "pt_regs", &["ip"])?,
            sp: byte_offset(btf, "pt_regs", &["sp"])?,
            bp: byte_offset(btf, "pt_regs", &["bp"])?,
            orig_ax: byte_offset(btf, "pt_regs", &["orig_ax"])?,
        })
    }
}

impl KernelOffsets {
    pub fn from_running_kernel() -> Result<Self> {
        let data = std::fs::read(VMLINUX_BTF).with_context(|| {
            format!("cannot read {VMLINUX_BTF}: the kernel needs CONFIG_DEBUG_INFO_BTF=y")
        })?;
        Self::from_btf_bytes(&data)
    }

    pub fn from_btf_bytes(data: &[u8]) -> Result<Self> {
        let btf = Btf::load_raw(data).map_err(|e| anyhow!("cannot parse kernel BTF: {e}"))?;
        Ok(Self {
            task_mm: byte_offset(&btf, "task_struct", &["mm"])?,
            task_pending_signal: byte_offset(&btf, "task_struct", &["pending", "signal"])?,
            task_pid: byte_offset(&btf, "task_struct", &["pid"])?,
            task_flags: byte_offset(&btf, "task_struct", &["flags"])?,
            task_active_mm: byte_offset(&btf, "task_struct", &["active_mm"])?,
            task_start_time: byte_offset(&btf, "task_struct", &["start_time"])?,
            task_tgid: byte_offset(&btf, "task_struct", &["tgid"])?,
            task_signal: byte_offset(&btf, "task_struct", &["signal"])?,
            signal_live: byte_offset(&btf, "signal_struct", &["live", "counter"])?,
            mm_mmap_lock: byte_offset(&btf, "mm_struct", &["mmap_lock"])?,
            user_regs: UserRegsOffsets::from_btf(&btf)
                .map_err(|e| log::debug!("no user register offsets: {e:#}"))
                .ok(),
            lock_args: lock_arg_indices(&btf)
                .map_err(|e| log::debug!("no BTF tracepoint prototypes: {e:#}"))
                .ok(),
            per_vma_locks: has_function(&btf, "lock_vma_under_rcu"),
        })
    }
}

fn lock_arg_indices(btf: &Btf) -> Result<[LockArgIndices; 3]> {
    let args = |i: usize| trace_call_args(btf, LOCK_EVENTS[i]);
    Ok([args(0)?, args(1)?, args(2)?])
}

/// Finds mm, write and success in the prototype of `event`'s trace call, by type: the
/// `struct mm_struct *`, then the bools in order (write, then success). Kernels before 6.13
/// pass a `const char *memcg_path` between mm and write; later ones do not.
pub fn trace_call_args(btf: &Btf, event: &str) -> Result<LockArgIndices> {
    let typedef = format!("btf_trace_{event}");
    let proto = btf
        .types()
        .iter()
        .find_map(|t| match t {
            BtfType::Typedef(td) if td.name == typedef => Some(td.type_id),
            _ => None,
        })
        .and_then(|id| match btf.type_by_id(btf.skip_mods_and_typedefs(id)) {
            BtfType::Ptr(ptr) => match btf.type_by_id(ptr.type_id) {
                BtfType::FuncProto(proto) => Some(proto),
                _ => None,
            },
            _ => None,
        })
        .ok_or_else(|| anyhow!("kernel BTF has no prototype {typedef}"))?;
    // The first parameter is the probe's own data pointer, not an argument of the event.
    let params = proto.params.iter().skip(1).enumerate();
    let mut mm = None;
    let mut bools = Vec::new();
    for (index, param) in params {
        let ty = btf.type_by_id(btf.skip_mods_and_typedefs(param.type_id));
        match ty {
            BtfType::Ptr(p) if is_struct(btf, p.type_id, "mm_struct") => mm = mm.or(Some(index)),
            BtfType::Int(int) if int.name == "_Bool" => bools.push(index),
            _ => {}
        }
    }
    let mm = mm.ok_or_else(|| anyhow!("{typedef} has no struct mm_struct * argument"))?;
    let write = *bools
        .first()
        .ok_or_else(|| anyhow!("{typedef} has no bool argument"))?;
    Ok(LockArgIndices {
        mm: mm as u32,
        write: write as u32,
        success: bools.get(1).copied().unwrap_or(0) as u32,
    })
}

fn has_function(btf: &Btf, name: &str) -> bool {
    btf.types()
        .iter()
        .any(|t| matches!(t, BtfType::Func(f) if f.name == name))
}

fn is_struct(btf: &Btf, type_id: u32, name: &str) -> bool {
    matches!(btf.type_by_id(btf.skip_mods_and_typedefs(type_id)),
        BtfType::Struct(c) if c.name == name)
}

/// Byte offset of `path` (a member, then members of its type) inside `struct root`, looking
/// through anonymous struct/union members (mm_struct keeps all its fields in one).
pub fn byte_offset(btf: &Btf, root: &str, path: &[&str]) -> Result<u32> {
    let mut composite = find_struct(btf, root)?;
    let mut bits = 0u32;
    for (i, name) in path.iter().enumerate() {
        let (member_bits, type_id) = member_offset(btf, composite, name).ok_or_else(|| {
            anyhow!(
                "kernel BTF: struct {root} has no member {}",
                path[..=i].join(".")
            )
        })?;
        bits += member_bits;
        if i + 1 < path.len() {
            composite = composite_of(btf, type_id)
                .ok_or_else(|| anyhow!("kernel BTF: {root}.{name} is not a struct"))?;
        }
    }
    if !bits.is_multiple_of(8) {
        bail!("kernel BTF: {root}.{} is a bitfield", path.join("."));
    }
    Ok(bits / 8)
}

fn find_struct<'a>(btf: &'a Btf, name: &str) -> Result<&'a BtfComposite<'a>> {
    btf.types()
        .iter()
        .find_map(|t| match t {
            BtfType::Struct(c) if c.name == name && !c.members.is_empty() => Some(c),
            _ => None,
        })
        .ok_or_else(|| anyhow!("kernel BTF has no struct {name}"))
}

/// (bit offset, type id) of a named member, searching anonymous members recursively.
fn member_offset(btf: &Btf, composite: &BtfComposite, name: &str) -> Option<(u32, u32)> {
    for m in &composite.members {
        if m.name == name {
            return Some((m.bit_offset, m.type_id));
        }
        if m.name.is_empty() {
            if let Some(inner) = composite_of(btf, m.type_id) {
                if let Some((bits, ty)) = member_offset(btf, inner, name) {
                    return Some((m.bit_offset + bits, ty));
                }
            }
        }
    }
    None
}

fn composite_of<'a>(btf: &'a Btf, type_id: u32) -> Option<&'a BtfComposite<'a>> {
    match btf.type_by_id(btf.skip_mods_and_typedefs(type_id)) {
        BtfType::Struct(c) | BtfType::Union(c) => Some(c),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_kernel_offsets_are_plausible() {
        let Ok(data) = std::fs::read(VMLINUX_BTF) else {
            eprintln!("skipped: no {VMLINUX_BTF}");
            return;
        };
        let offsets = KernelOffsets::from_btf_bytes(&data).expect("offsets");
        // task_struct is several KiB; mm and pending sit well inside it, pointer-aligned.
        assert!(
            offsets.task_mm > 0 && offsets.task_mm < 16384,
            "{offsets:?}"
        );
        assert_eq!(offsets.task_mm % 8, 0);
        assert_eq!(offsets.task_pending_signal % 8, 0);
        assert_ne!(offsets.task_mm, offsets.task_pending_signal);
        assert!(offsets.mm_mmap_lock > 0 && offsets.mm_mmap_lock.is_multiple_of(8));
        // x86_64's pt_regs: 21 registers of 8 bytes, bp the 5th, orig_ax the 16th, ip the 17th,
        // sp the 20th.
        let regs = offsets.user_regs.expect("pt_regs in BTF");
        assert_eq!(
            (regs.pt_regs_size, regs.bp, regs.orig_ax, regs.ip, regs.sp),
            (168, 32, 120, 128, 152)
        );
        assert_eq!(regs.task_stack % 8, 0);
    }

    #[test]
    fn running_kernel_names_the_lock_trace_arguments() {
        let Ok(data) = std::fs::read(VMLINUX_BTF) else {
            eprintln!("skipped: no {VMLINUX_BTF}");
            return;
        };
        let offsets = KernelOffsets::from_btf_bytes(&data).expect("offsets");
        let [start, acquired, released] = offsets.lock_args.expect("btf_trace_mmap_lock_*");
        // mm always comes first; write right after it (6.13+) or after the memcg path.
        assert_eq!(start.mm, 0);
        assert!(start.write == 1 || start.write == 2, "{start:?}");
        assert_eq!(released, start);
        assert_eq!((acquired.mm, acquired.write), (0, start.write));
        assert_eq!(acquired.success, start.write + 1);
    }

    /// CONFIG_PER_VMA_LOCK is always on for x86_64 SMP kernels from 6.4 (def_bool y), absent
    /// before.
    #[test]
    fn per_vma_locks_are_told_from_the_kernel_functions() {
        let Ok(data) = std::fs::read(VMLINUX_BTF) else {
            eprintln!("skipped: no {VMLINUX_BTF}");
            return;
        };
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut parts = release.trim().split(['.', '-']);
        let major: u32 = parts.next().unwrap().parse().unwrap();
        let minor: u32 = parts.next().unwrap().parse().unwrap();
        let offsets = KernelOffsets::from_btf_bytes(&data).expect("offsets");
        assert_eq!(offsets.per_vma_locks, (major, minor) >= (6, 4), "{release}");
    }

    #[test]
    fn missing_member_is_named() {
        let Ok(data) = std::fs::read(VMLINUX_BTF) else {
            eprintln!("skipped: no {VMLINUX_BTF}");
            return;
        };
        let btf = Btf::load_raw(&data).unwrap();
        let err = byte_offset(&btf, "task_struct", &["no_such_member"]).unwrap_err();
        assert!(
            err.to_string()
                .contains("task_struct has no member no_such_member"),
            "{err}"
        );
        assert!(byte_offset(&btf, "no_such_struct_xyz", &["mm"]).is_err());
    }
}

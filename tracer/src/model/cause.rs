//! Why a lock was taken, read off its kernel stack with a priority table, as latencytop did.

use serde::Serialize;

use super::Frame;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    PageFault,
    Mmap,
    Munmap,
    Mprotect,
    Brk,
    Mremap,
    Madvise,
    ProcReader,
    /// A thread or process exiting (exit_mm, exit_mmap).
    Exit,
    /// Inside a syscall that copies into user memory (read, pread64, readv, preadv, recvfrom),
    /// known from the saved registers without a stack: a fault on its buffer, nearly always.
    InRead,
    /// Inside a syscall that copies from user memory (write, pwrite64, writev, sendto).
    InWrite,
    /// An exec setting up the new program's mm (execve, execveat).
    Exec,
    /// A fork copying the parent's mappings (clone, fork, vfork; dup_mmap), which holds the
    /// parent's lock for write for the whole copy.
    Fork,
    /// Inside any other syscall that is not an mm syscall.
    InOtherSyscall,
    Other,
    /// Shorter than the stack threshold: no stack was taken.
    NoStack,
}

impl Cause {
    /// The name in machine-read outputs (JSON, metric labels): snake_case, as serde writes it.
    pub fn id(self) -> &'static str {
        match self {
            Cause::PageFault => "page_fault",
            Cause::Mmap => "mmap",
            Cause::Munmap => "munmap",
            Cause::Mprotect => "mprotect",
            Cause::Brk => "brk",
            Cause::Mremap => "mremap",
            Cause::Madvise => "madvise",
            Cause::ProcReader => "proc_reader",
            Cause::Exit => "exit",
            Cause::InRead => "in_read",
            Cause::InWrite => "in_write",
            Cause::Exec => "exec",
            Cause::Fork => "fork",
            Cause::InOtherSyscall => "in_other_syscall",
            Cause::Other => "other",
            Cause::NoStack => "no_stack",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Cause::PageFault => "page fault",
            Cause::Mmap => "mmap",
            Cause::Munmap => "munmap",
            Cause::Mprotect => "mprotect",
            Cause::Brk => "brk",
            Cause::Mremap => "mremap",
            Cause::Madvise => "madvise",
            Cause::ProcReader => "/proc reader",
            Cause::Exit => "exit",
            Cause::InRead => "in read()",
            Cause::InWrite => "in write()",
            Cause::Exec => "exec",
            Cause::Fork => "fork",
            Cause::InOtherSyscall => "in a syscall",
            Cause::Other => "other",
            Cause::NoStack => "no stack (short)",
        }
    }
}

/// Highest priority first: an exec's mappings are the exec's, a syscall that faults pages in
/// (mmap with MAP_POPULATE) is an mmap, and a /proc read is a /proc read even though it goes
/// through access_remote_vm's fault path.
const PRIORITY: &[(Cause, &[&str])] = &[
    (
        Cause::Exec,
        &[
            "begin_new_exec",
            "exec_mmap",
            "setup_arg_pages",
            "load_elf_binary",
            "bprm_execve",
            "do_execveat_common",
        ],
    ),
    (
        Cause::Fork,
        &["dup_mmap", "dup_mm", "copy_process", "kernel_clone"],
    ),
    (
        Cause::Munmap,
        &[
            "__vm_munmap",
            "__x64_sys_munmap",
            "__do_sys_munmap",
            "__arm64_sys_munmap",
        ],
    ),
    (
        Cause::Mremap,
        &["__do_sys_mremap", "__x64_sys_mremap", "__arm64_sys_mremap"],
    ),
    (
        Cause::Mprotect,
        &[
            "do_mprotect_pkey",
            "__x64_sys_mprotect",
            "__x64_sys_pkey_mprotect",
            "__arm64_sys_mprotect",
        ],
    ),
    (
        Cause::Madvise,
        &[
            "do_madvise",
            "__x64_sys_madvise",
            "__x64_sys_process_madvise",
            "__do_sys_process_madvise",
            "vector_madvise",
            "__arm64_sys_madvise",
        ],
    ),
    (
        Cause::Brk,
        &["__do_sys_brk", "__x64_sys_brk", "__arm64_sys_brk"],
    ),
    (
        Cause::Mmap,
        &[
            "vm_mmap_pgoff",
            "ksys_mmap_pgoff",
            "__x64_sys_mmap",
            "__arm64_sys_mmap",
            "vm_mmap",
        ],
    ),
    (
        Cause::ProcReader,
        &[
            "proc_pid_cmdline_read",
            "get_mm_cmdline",
            "environ_read",
            "mem_rw",
            "m_start",
            "show_map",
            "show_smap",
            "show_smaps_rollup",
            "lock_vma_range",
            "lock_next_vma",
            "proc_get_vma",
            "do_procmap_query",
            "pagemap_read",
            "access_remote_vm",
            "process_vm_rw",
            "proc_pid_status",
        ],
    ),
    (Cause::Exit, &["exit_mm", "exit_mmap", "do_exit", "mmput"]),
    (
        Cause::PageFault,
        &[
            "do_user_addr_fault",
            "exc_page_fault",
            "lock_mm_and_find_vma",
            "do_page_fault",
            "handle_mm_fault",
        ],
    ),
];

/// The cause of a lock operation: the mm syscall in progress when one was (`syscall`: 1 +
/// index into MM_SYSCALLS, 0 for none), else its kernel stack, else a user page fault seen
/// just before, else the other syscall it was in (READ_CAUSE and the others).
pub fn cause_of(syscall: u8, fault: u8, kernel_frames: Option<&[Frame]>) -> Cause {
    const BY_SYSCALL: [Cause; 6] = [
        Cause::Mmap,
        Cause::Munmap,
        Cause::Mprotect,
        Cause::Mremap,
        Cause::Madvise,
        Cause::Brk,
    ];
    if let Some(&cause) = (syscall as usize)
        .checked_sub(1)
        .and_then(|i| BY_SYSCALL.get(i))
    {
        return cause;
    }
    match (classify(kernel_frames), fault != 0) {
        (Cause::NoStack | Cause::Other, true) => Cause::PageFault,
        (Cause::NoStack | Cause::Other, false) if syscall > 0 => match syscall {
            tracer_common::READ_CAUSE => Cause::InRead,
            tracer_common::WRITE_CAUSE => Cause::InWrite,
            tracer_common::EXEC_CAUSE => Cause::Exec,
            tracer_common::FORK_CAUSE => Cause::Fork,
            _ => Cause::InOtherSyscall,
        },
        (cause, _) => cause,
    }
}

/// Classifies a kernel stack. `None` means no stack was collected.
pub fn classify(kernel_frames: Option<&[Frame]>) -> Cause {
    let Some(frames) = kernel_frames else {
        return Cause::NoStack;
    };
    let names: Vec<&str> = frames
        .iter()
        .filter_map(|f| f.symbol.as_deref())
        .map(base_name)
        .collect();
    PRIORITY
        .iter()
        .find(|(_, symbols)| names.iter().any(|n| symbols.contains(n)))
        .map_or(Cause::Other, |(cause, _)| *cause)
}

/// Drops compiler suffixes (`.isra.0`, `.constprop.0`, `.cold`).
fn base_name(symbol: &str) -> &str {
    symbol.split('.').next().unwrap_or(symbol)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_what_json_says() {
        use Cause::*;
        for cause in [
            PageFault,
            Mmap,
            Munmap,
            Mprotect,
            Brk,
            Mremap,
            Madvise,
            ProcReader,
            Exit,
            InRead,
            InWrite,
            Exec,
            Fork,
            InOtherSyscall,
            Other,
            NoStack,
        ] {
            let json = serde_json::to_string(&cause).unwrap();
            assert_eq!(json, format!("\"{}\"", cause.id()));
        }
    }

    fn stack(symbols: &[&str]) -> Vec<Frame> {
        symbols
            .iter()
            .map(|s| Frame {
                kernel: true,
                module: "kernel".into(),
                symbol: Some(s.to_string()),
                ..Frame::default()
            })
            .collect()
    }

    #[test]
    fn classifies_by_priority() {
        let munmap = stack(&["__vm_munmap", "__x64_sys_munmap", "do_syscall_64"]);
        assert_eq!(classify(Some(&munmap)), Cause::Munmap);
        // MAP_POPULATE faults pages in under mmap: mmap wins over the fault frames.
        let populate = stack(&[
            "__mm_populate",
            "handle_mm_fault",
            "vm_mmap_pgoff",
            "ksys_mmap_pgoff",
        ]);
        assert_eq!(classify(Some(&populate)), Cause::Mmap);
        let fault = stack(&[
            "lock_mm_and_find_vma",
            "do_user_addr_fault",
            "exc_page_fault",
        ]);
        assert_eq!(classify(Some(&fault)), Cause::PageFault);
        let proc_read = stack(&[
            "access_remote_vm",
            "get_mm_cmdline.isra.0",
            "proc_pid_cmdline_read",
            "vfs_read",
        ]);
        assert_eq!(classify(Some(&proc_read)), Cause::ProcReader);
        let mprotect = stack(&[
            "mprotect_fixup",
            "do_mprotect_pkey.constprop.0",
            "__x64_sys_mprotect",
        ]);
        assert_eq!(classify(Some(&mprotect)), Cause::Mprotect);
    }

    #[test]
    fn syscall_in_progress_wins_then_stack_then_fault() {
        let fault = stack(&["lock_mm_and_find_vma", "exc_page_fault"]);
        // index 1 in MM_SYSCALLS is munmap
        assert_eq!(cause_of(2, 0, Some(&fault)), Cause::Munmap);
        assert_eq!(cause_of(0, 0, Some(&fault)), Cause::PageFault);
        assert_eq!(cause_of(0, 1, None), Cause::PageFault);
        assert_eq!(cause_of(0, 0, None), Cause::NoStack);
        assert_eq!(cause_of(6, 0, None), Cause::Brk);
        // Other syscalls, where neither a stack nor a fault says more.
        assert_eq!(cause_of(7, 0, None), Cause::InRead);
        assert_eq!(cause_of(8, 0, None), Cause::InWrite);
        assert_eq!(cause_of(9, 0, None), Cause::Exec);
        assert_eq!(cause_of(10, 0, None), Cause::Fork);
        assert_eq!(cause_of(11, 0, None), Cause::InOtherSyscall);
        let fork = stack(&["dup_mmap", "copy_process", "kernel_clone", "__do_sys_clone"]);
        assert_eq!(classify(Some(&fork)), Cause::Fork);
        let exec = stack(&[
            "vm_mmap_pgoff",
            "elf_load",
            "load_elf_binary",
            "bprm_execve",
        ]);
        assert_eq!(
            classify(Some(&exec)),
            Cause::Exec,
            "an exec's mappings are the exec's"
        );
        let exec = stack(&["setup_arg_pages", "load_elf_binary", "bprm_execve"]);
        assert_eq!(classify(Some(&exec)), Cause::Exec);
        assert_eq!(
            cause_of(7, 0, Some(&fault)),
            Cause::PageFault,
            "its stack says more"
        );
        assert_eq!(
            cause_of(7, 0, Some(&stack(&["proc_pid_status"]))),
            Cause::ProcReader
        );
        let proc_read = stack(&["show_smaps_rollup"]);
        assert_eq!(cause_of(0, 1, Some(&proc_read)), Cause::ProcReader);
        for (i, name) in tracer_common::MM_SYSCALLS.iter().enumerate() {
            assert_eq!(cause_of(i as u8 + 1, 0, None).label(), *name);
        }
    }

    #[test]
    fn unknown_and_missing_stacks() {
        assert_eq!(
            classify(Some(&stack(&["exit_mm", "do_exit", "__x64_sys_exit"]))),
            Cause::Exit
        );
        assert_eq!(
            classify(Some(&stack(&["khugepaged_scan", "kthread"]))),
            Cause::Other
        );
        assert_eq!(classify(Some(&[])), Cause::Other);
        assert_eq!(classify(None), Cause::NoStack);
    }
}

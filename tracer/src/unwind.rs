//! Unwinds the user stacks the kernel copied (`--user-stack dwarf`) with the CFI of each mapped
//! object (`.eh_frame` through `.eh_frame_hdr`, and `.debug_frame`), using framehop, which
//! falls back to frame pointers where an object has no CFI.
//!
//! Objects are opened by `procfs::open_mapped_object` (the mapped file itself, never a FIFO or
//! a file over the size cap) and mapped, not read. Their unwind sections are read once per
//! file (device, inode) and shared by every process mapping them.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::os::unix::fs::MetadataExt as _;
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder as _};
use object::{Object as _, ObjectSection as _};

use crate::model::unwound::{StackCopy, UnwoundStack};
use crate::symbolize::objects::Segments;
use crate::system::procfs::{self, Mapping, MappingHistory};

/// Deepest stack kept; deeper ones are marked truncated.
const MAX_FRAMES: usize = 256;

type Bytes = Arc<[u8]>;

/// What unwinding needs from one object file, read once.
struct ObjectInfo {
    sections: ExplicitModuleSectionInfo<Bytes>,
    /// (file offset range, vaddr) of each PT_LOAD segment, to place a mapping.
    segments: Segments,
}

/// Processes whose unwinders are kept. Under `-a` during a build thousands of processes come
/// and go, each with a framehop cache of tens of KiB; an evicted one is rebuilt from the shared
/// object info if its process copies a stack again.
const MAX_UNWINDERS: usize = 64;

/// One process's modules as added to its framehop unwinder.
struct ProcessUnwinder {
    unwinder: UnwinderX86_64<Bytes>,
    cache: CacheX86_64,
    /// Start addresses of the mappings already added (or found unusable).
    seen: HashSet<u64>,
    /// When it last unwound (`StackUnwinder::clock`), to evict the least recently used.
    last_use: u64,
}

/// Unwinds copied stacks, keeping per-object unwind info and per-process module lists, both
/// bounded: the unwinders of the `MAX_UNWINDERS` processes that unwound last, and the objects
/// those use.
#[derive(Default)]
pub struct StackUnwinder {
    /// (device, inode) -> unwind info; None for a file that is not a usable ELF object.
    objects: HashMap<(u64, u64), Option<Arc<ObjectInfo>>>,
    processes: HashMap<u32, ProcessUnwinder>,
    clock: u64,
    stats: WalkStats,
}

impl StackUnwinder {
    /// Unwinds one copied stack of process `pid`, whose executable mappings are `mappings`.
    pub fn unwind(
        &mut self,
        pid: u32,
        copy: &StackCopy,
        mappings: &MappingHistory,
    ) -> UnwoundStack {
        self.clock += 1;
        self.add_new_modules(pid, mappings);
        let process = self.processes.get_mut(&pid).expect("added above");
        process.last_use = self.clock;
        unwind_copy(&process.unwinder, &mut process.cache, copy, &mut self.stats)
    }

    pub fn stats(&self) -> WalkStats {
        self.stats
    }

    /// How many objects' unwind info and processes' unwinders are kept (for -v).
    pub fn held(&self) -> (usize, usize) {
        (self.objects.len(), self.processes.len())
    }

    /// Drops what is kept for `pid` (a process that exited).
    pub fn forget(&mut self, pid: u32) {
        if self.processes.remove(&pid).is_some() {
            self.forget_unused_objects();
        }
    }

    fn add_new_modules(&mut self, pid: u32, mappings: &MappingHistory) {
        if !self.processes.contains_key(&pid) && self.processes.len() >= MAX_UNWINDERS {
            self.evict_least_recent();
        }
        let process = self
            .processes
            .entry(pid)
            .or_insert_with(|| ProcessUnwinder {
                unwinder: UnwinderX86_64::new(),
                cache: CacheX86_64::new(),
                seen: HashSet::new(),
                last_use: 0,
            });
        for mapping in mappings.iter() {
            if !process.seen.insert(mapping.start) {
                continue;
            }
            let Some(info) = object_info(&mut self.objects, pid, mapping) else {
                continue;
            };
            if let Some(module) = module_for(mapping, &info) {
                process.unwinder.add_module(module);
            }
        }
    }
}

impl StackUnwinder {
    fn evict_least_recent(&mut self) {
        let oldest = self.processes.iter().min_by_key(|(_, p)| p.last_use);
        if let Some(&pid) = oldest.map(|(pid, _)| pid) {
            self.forget(pid);
        }
    }

    /// Drops the unwind info no kept unwinder uses (its modules share the section data).
    fn forget_unused_objects(&mut self) {
        self.objects
            .retain(|_, info| info.as_ref().is_none_or(|info| info.in_use()));
    }
}

impl ObjectInfo {
    /// Whether a process's unwinder holds this object's sections besides the cache.
    fn in_use(&self) -> bool {
        let s = &self.sections;
        [&s.text, &s.eh_frame, &s.eh_frame_hdr, &s.debug_frame]
            .into_iter()
            .flatten()
            .any(|bytes| Arc::strong_count(bytes) > 1)
    }
}

/// Walks `copy` from its saved registers; reads outside the copied window end the walk.
fn unwind_copy(
    unwinder: &UnwinderX86_64<Bytes>,
    cache: &mut CacheX86_64,
    copy: &StackCopy,
    stats: &mut WalkStats,
) -> UnwoundStack {
    let regs = &copy.header;
    let window = regs.stack_start..regs.stack_start + copy.bytes.len() as u64;
    let past_window = std::cell::Cell::new(false);
    let mut read_stack = |addr: u64| {
        let word = read_word(&copy.bytes, &window, addr);
        if word.is_err() && addr >= window.end.saturating_sub(8) {
            past_window.set(true);
        }
        word
    };
    let start = UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp);
    let mut frames = unwinder.iter_frames(regs.ip, start, cache, &mut read_stack);
    let mut addrs = Vec::new();
    let truncated = loop {
        match frames.next() {
            Ok(Some(frame)) if addrs.len() < MAX_FRAMES => addrs.push(frame.address()),
            Ok(Some(_)) | Err(_) => break true,
            Ok(None) => break false,
        }
    };
    stats.walks += 1;
    if truncated && past_window.get() {
        stats.past_window += 1;
    } else if truncated {
        stats.cut_otherwise += 1;
    }
    UnwoundStack { addrs, truncated }
}

/// How the walks of copied stacks ended: the measurement behind the default window size.
#[derive(Clone, Copy, Debug, Default)]
pub struct WalkStats {
    pub walks: u64,
    /// Walks that needed stack beyond the copied window (a larger --user-stack-bytes helps).
    pub past_window: u64,
    /// Walks cut short otherwise: no unwind info for a frame, a frame past MAX_FRAMES.
    pub cut_otherwise: u64,
}

fn read_word(bytes: &[u8], window: &Range<u64>, addr: u64) -> Result<u64, ()> {
    if addr < window.start || addr.checked_add(8).is_none_or(|end| end > window.end) {
        return Err(());
    }
    let at = (addr - window.start) as usize;
    let word: [u8; 8] = bytes[at..at + 8].try_into().map_err(|_| ())?;
    Ok(u64::from_le_bytes(word))
}

/// The unwind info of the file behind `mapping`, read once per (device, inode). The file is
/// mapped, not read: only the pages of the sections framehop needs are touched.
fn object_info(
    objects: &mut HashMap<(u64, u64), Option<Arc<ObjectInfo>>>,
    pid: u32,
    mapping: &Mapping,
) -> Option<Arc<ObjectInfo>> {
    let file = match procfs::open_mapped_object(pid, mapping) {
        Ok(file) => file,
        Err(err) => {
            log::debug!("no unwind info: {err:#}");
            return None;
        }
    };
    let meta = file.metadata().ok()?;
    let id = (meta.dev(), meta.ino());
    if let Some(known) = objects.get(&id) {
        return known.clone();
    }
    // SAFETY: the map is read-only and dropped before returning; a file truncated meanwhile
    // by the target could fault the read (SIGBUS), as for any tool that maps objects.
    let data = unsafe { memmap2::Mmap::map(&file) };
    let info = data.ok().and_then(|data| parse_object(&data)).map(Arc::new);
    if info.is_none() {
        log::debug!(
            "no unwind info from {}",
            crate::text::escaped_path(&mapping.path)
        );
    }
    objects.insert(id, info.clone());
    info
}

/// Largest `.text` copied for framehop's instruction analysis (the first frame's prologue or
/// epilogue where CFI is missing). The sections are copied so that no map of a file the target
/// may truncate outlives `object_info`; a `.text` of 100 MB (librustc_driver, libLLVM) made up
/// most of the tracer's memory under `-a` during a build, and .eh_frame covers those
/// instructions anyway.
const TEXT_COPY_MAX: u64 = 16 << 20;

/// Reads the sections framehop needs from an ELF object.
fn parse_object(data: &[u8]) -> Option<ObjectInfo> {
    let elf = object::File::parse(data).ok()?;
    let section = |name: &str| -> (Option<Range<u64>>, Option<Bytes>) {
        match elf.section_by_name(name) {
            Some(s) => (
                Some(s.address()..s.address() + s.size()),
                s.uncompressed_data().ok().map(|d| Bytes::from(&d[..])),
            ),
            None => (None, None),
        }
    };
    let text_size = elf.section_by_name(".text").map_or(0, |s| s.size());
    let (text_svma, text) = if text_size <= TEXT_COPY_MAX {
        section(".text")
    } else {
        (
            elf.section_by_name(".text")
                .map(|s| s.address()..s.address() + s.size()),
            None,
        )
    };
    let (eh_frame_svma, eh_frame) = section(".eh_frame");
    let (eh_frame_hdr_svma, eh_frame_hdr) = section(".eh_frame_hdr");
    let (got_svma, _) = section(".got");
    let (_, debug_frame) = section(".debug_frame");
    let segments = Segments::of(&elf);
    Some(ObjectInfo {
        sections: ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma,
            text,
            got_svma,
            eh_frame_svma,
            eh_frame,
            eh_frame_hdr_svma,
            eh_frame_hdr,
            debug_frame,
            ..Default::default()
        },
        segments,
    })
}

/// The framehop module of one executable mapping: its address range and where the object's
/// address 0 would be (the load bias), from the segment that contains the mapped file offset.
fn module_for(mapping: &Mapping, info: &ObjectInfo) -> Option<Module<Bytes>> {
    let svma_at_start = info.segments.vaddr_of(mapping.file_offset)?;
    let base_avma = mapping.start.checked_sub(svma_at_start)?;
    Some(Module::new(
        mapping.path.display().to_string(),
        mapping.start..mapping.end,
        base_avma,
        // Clones share the section data (Arc); framehop takes the info by value.
        info.sections.clone(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::UserStackCopyHeader;

    fn copy_of(pid: u32, ip: u64) -> StackCopy {
        StackCopy {
            header: UserStackCopyHeader {
                pid,
                ip,
                ..UserStackCopyHeader::default()
            },
            bytes: vec![0; 8],
        }
    }

    #[test]
    fn unwinders_are_bounded_and_objects_go_with_the_last_process_using_them() {
        let me = std::process::id();
        let mut mine = MappingHistory::default();
        mine.add_all(procfs::exec_mappings(me).expect("this process's maps"));
        let ip = copy_of_this_function_ip();
        assert!(mine.find(ip).is_some(), "this test's code is in a mapping");
        let mut unwinder = StackUnwinder::default();
        unwinder.unwind(me, &copy_of(me, ip), &mine);
        let (objects, processes) = unwinder.held();
        assert!(objects > 0, "the test binary's unwind info is read");
        assert_eq!(processes, 1);

        // Processes with no mappings (their maps unreadable) push this one out.
        let none = MappingHistory::default();
        for pid in 1..=MAX_UNWINDERS as u32 {
            unwinder.unwind(u32::MAX - pid, &copy_of(u32::MAX - pid, 0), &none);
            assert!(unwinder.held().1 <= MAX_UNWINDERS);
        }
        assert_eq!(unwinder.held().1, MAX_UNWINDERS);
        let still_known = unwinder.objects.values().filter(|o| o.is_some()).count();
        assert_eq!(
            still_known, 0,
            "no kept unwinder uses the evicted one's objects"
        );

        // It comes back whole when its process copies a stack again.
        unwinder.unwind(me, &copy_of(me, ip), &mine);
        assert!(unwinder.processes.contains_key(&me));
        assert!(unwinder.held().0 > 0);
        unwinder.forget(me);
        assert!(!unwinder.processes.contains_key(&me));
    }

    fn copy_of_this_function_ip() -> u64 {
        copy_of_this_function_ip as *const () as u64
    }
}

//! Turns stack addresses into frames with blazesym: kernel frames from kallsyms (and vmlinux
//! debug info when present), user frames from the ELF files of the mappings recorded during the
//! trace, so that a process that already exited is still symbolized.
//!
//! The target is hostile: its objects are opened through `objects` (the mapped file, never a
//! FIFO, a device or a huge file, never a file that replaced the mapped one), debug links are
//! followed only into the standard debug directories, and symbolization has a deadline. A frame
//! that cannot be symbolized keeps its module and file offset.

pub(crate) mod objects;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use blazesym::symbolize::{
    source::{Elf, Kernel, Source},
    CodeInfo, Input, Symbolized, Symbolizer,
};

use crate::model::{Frame, Harvest, StackRef, Symbols};
use crate::system::perf_map::{self, PerfMap};
use crate::system::procfs::{Mapping, MappingHistory};

use objects::{debug_dirs, Object, ObjectFiles};

/// How long one `add` may symbolize: stacks left when it is over keep module+offset frames
/// (a report late by minutes, on a huge or hostile object, is worse than unnamed frames).
const SYMBOLIZE_BUDGET: Duration = Duration::from_secs(20);

/// Symbolizes every stack the harvest refers to: entries, the holders they waited behind, the
/// stacks holders slept in, timeline events.
pub fn symbolize(harvest: &Harvest, mappings: &HashMap<u32, MappingHistory>) -> Symbols {
    let mut symbolizer = StackSymbolizer::new(&[]);
    symbolizer.add(harvest, mappings);
    symbolizer.into_symbols()
}

/// Symbolizes stacks once and keeps them: the live and interval views see the same stack ids
/// again every refresh, and blazesym's first look at an object is slow. Stack ids are stable
/// (the tracer never deletes from the stack map), so an id names one stack for the whole trace.
pub struct StackSymbolizer {
    symbolizer: Symbolizer,
    objects: ObjectFiles,
    /// Each process's JIT code names (`/tmp/perf-PID.map`) as last read.
    perf_maps: HashMap<u32, (perf_map::Stamp, Rc<PerfMap>)>,
    symbols: Symbols,
    /// Stacks cut short by the deadline: a later `add` retries them.
    partial: HashSet<StackRef>,
}

impl Default for StackSymbolizer {
    fn default() -> Self {
        Self::new(&[])
    }
}

impl StackSymbolizer {
    /// `given_debug_dirs`: where to look for debug files before /usr/lib/debug (`--debug-dir`).
    pub fn new(given_debug_dirs: &[PathBuf]) -> Self {
        let dirs = debug_dirs(given_debug_dirs);
        Self {
            symbolizer: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .set_debug_dirs(Some(&dirs))
                .build(),
            objects: ObjectFiles::new(dirs),
            perf_maps: HashMap::new(),
            symbols: Symbols::new(),
            partial: HashSet::new(),
        }
    }

    pub fn symbols(&self) -> &Symbols {
        &self.symbols
    }

    pub fn into_symbols(self) -> Symbols {
        self.symbols
    }

    /// Symbolizes the stacks of `harvest` not symbolized yet (or cut short by an earlier
    /// deadline), within `SYMBOLIZE_BUDGET`.
    pub fn add(&mut self, harvest: &Harvest, mappings: &HashMap<u32, MappingHistory>) {
        let deadline = Instant::now() + SYMBOLIZE_BUDGET;
        self.add_until(harvest.stack_refs(), &harvest.stacks, mappings, deadline);
    }

    /// `add` for the user stacks alone: those need their processes' mappings, which are let go
    /// of once the processes are gone; kernel stacks can wait for a report (the first names
    /// the kernel's symbols, which takes a while).
    pub fn add_user_stacks(&mut self, harvest: &Harvest, mappings: &HashMap<u32, MappingHistory>) {
        let deadline = Instant::now() + SYMBOLIZE_BUDGET;
        let mut users = harvest.stack_refs();
        users.retain(|stack| matches!(stack, StackRef::User { .. }));
        self.add_until(users, &harvest.stacks, mappings, deadline);
    }

    /// Whether `stack` is named (fully: not cut short by a deadline).
    pub fn has(&self, stack: &StackRef) -> bool {
        self.symbols.contains_key(stack) && !self.partial.contains(stack)
    }

    fn add_until(
        &mut self,
        refs: HashSet<StackRef>,
        stacks: &HashMap<i32, Vec<u64>>,
        mappings: &HashMap<u32, MappingHistory>,
        deadline: Instant,
    ) {
        let empty = MappingHistory::default();
        // Each process's perf map, looked for once per call rather than once per stack.
        let mut jit_maps: HashMap<u32, Option<Rc<PerfMap>>> = HashMap::new();
        let mut late = 0;
        for stack in refs {
            if self.symbols.contains_key(&stack) && !self.partial.contains(&stack) {
                continue;
            }
            let Some(addrs) = stacks.get(&stack.id()) else {
                continue;
            };
            let on_time = Instant::now() < deadline;
            let frames = match stack {
                StackRef::Kernel(_) if on_time => kernel_frames(&self.symbolizer, addrs),
                StackRef::Kernel(_) => unnamed_kernel_frames(addrs),
                StackRef::User { pid, .. } => {
                    let history = mappings.get(&pid).unwrap_or(&empty);
                    let jit = match jit_maps.get(&pid) {
                        Some(known) => known.clone(),
                        None => {
                            let found = self.perf_map(pid, history.owner_uid);
                            jit_maps.insert(pid, found.clone());
                            found
                        }
                    };
                    let mut objects = ObjectLookup {
                        symbolizer: &self.symbolizer,
                        objects: &mut self.objects,
                        pid,
                        deadline,
                    };
                    user_frames(&mut objects, addrs, history, jit.as_deref())
                }
            };
            if Instant::now() < deadline {
                self.partial.remove(&stack);
            } else {
                late += 1;
                self.partial.insert(stack);
            }
            self.symbols.insert(stack, frames);
        }
        if late > 0 {
            log::warn!(
                "symbolizing took over {}s: {late} stacks shown as module+offset",
                SYMBOLIZE_BUDGET.as_secs()
            );
        }
    }

    /// Process `pid`'s JIT code names, read again when its map changed; None without a map
    /// its user (`owner`) may have written.
    fn perf_map(&mut self, pid: u32, owner: Option<u32>) -> Option<Rc<PerfMap>> {
        let owner = owner?;
        let stamp = perf_map::stamp(pid, owner)?;
        if let Some((known, map)) = self.perf_maps.get(&pid) {
            if *known == stamp {
                return Some(Rc::clone(map));
            }
        }
        let map = Rc::new(perf_map::read(pid, owner)?);
        log::debug!(
            "JIT code names of pid {pid} from {}",
            perf_map::path_of(pid).display()
        );
        self.perf_maps.insert(pid, (stamp, Rc::clone(&map)));
        Some(map)
    }

    /// Drops what was named for process `pid`'s user stacks, and its JIT code names: once no
    /// window keeps what it did, they only take room (a daemon beside a shell loop sees
    /// hundreds of new processes a second), and a new process of the same pid has other stacks
    /// under the same ids.
    pub fn forget_process(&mut self, pid: u32) {
        let of_pid = |stack: &StackRef| matches!(stack, StackRef::User { pid: p, .. } if *p == pid);
        self.symbols.retain(|stack, _| !of_pid(stack));
        self.partial.retain(|stack| !of_pid(stack));
        self.perf_maps.remove(&pid);
    }

    /// Forgets user stacks with frames outside every known mapping, so that a later `add`
    /// retries them once the mappings have been re-read (a library loaded after the last look).
    pub fn forget_unresolved(&mut self) {
        self.symbols.retain(|key, frames| {
            matches!(key, StackRef::Kernel(_)) || frames.iter().all(|f| f.module != UNKNOWN_MODULE)
        });
    }
}

const UNKNOWN_MODULE: &str = "[unknown]";

/// Return addresses point after the call: look up the call instruction itself so that the
/// line is the call site's (the innermost frame is an exact ip).
fn lookup_addr(index: usize, addr: u64) -> u64 {
    if index == 0 {
        addr
    } else {
        addr.saturating_sub(1)
    }
}

fn kernel_frames(symbolizer: &Symbolizer, addrs: &[u64]) -> Vec<Frame> {
    let lookups: Vec<u64> = addrs
        .iter()
        .enumerate()
        .map(|(i, &a)| lookup_addr(i, a))
        .collect();
    let src = Source::Kernel(Kernel::default());
    let results = symbolizer
        .symbolize(&src, Input::AbsAddr(&lookups))
        .unwrap_or_default();
    let mut frames = Vec::new();
    for (i, &addr) in addrs.iter().enumerate() {
        let frame = Frame {
            kernel: true,
            module: "kernel".into(),
            addr,
            ..Frame::default()
        };
        push_symbolized(&mut frames, frame, results.get(i));
    }
    frames
}

fn unnamed_kernel_frames(addrs: &[u64]) -> Vec<Frame> {
    addrs
        .iter()
        .map(|&addr| Frame {
            kernel: true,
            module: "kernel".into(),
            addr,
            ..Frame::default()
        })
        .collect()
}

/// What symbolizing one process's user frames needs: its objects, opened safely, and the
/// time left.
struct ObjectLookup<'a> {
    symbolizer: &'a Symbolizer,
    objects: &'a mut ObjectFiles,
    pid: u32,
    deadline: Instant,
}

impl ObjectLookup<'_> {
    /// The symbol at `file_offset` of `mapping`'s object: from its installed debug file, else
    /// from the object itself (its DWARF only if it names no other file). None when out of
    /// time or when the object cannot be opened safely.
    fn symbolize(&mut self, mapping: &Mapping, file_offset: u64) -> Option<Symbolized<'_>> {
        if Instant::now() >= self.deadline {
            return None;
        }
        let object = self.objects.get(self.pid, mapping)?;
        if let Some(found) = self.symbol_in_debug_file(&object, file_offset) {
            return Some(found);
        }
        let src = Source::Elf(Elf {
            debug_syms: object.own_dwarf,
            ..Elf::new(object.path.clone())
        });
        self.symbolizer
            .symbolize(&src, Input::FileOffset(&[file_offset]))
            .ok()
            .and_then(|mut v| v.pop())
    }

    fn symbol_in_debug_file(&self, object: &Object, file_offset: u64) -> Option<Symbolized<'_>> {
        let debug = object.debug.as_ref()?;
        let vaddr = object.vaddr_of(file_offset)?;
        let src = Source::Elf(Elf::new(debug.path.clone()));
        let found = self
            .symbolizer
            .symbolize(&src, Input::VirtOffset(&[vaddr]))
            .ok()?
            .pop()?;
        matches!(found, Symbolized::Sym(_)).then_some(found)
    }
}

/// `jit`: the process's perf map, naming code outside its mapped files (JIT-compiled).
fn user_frames(
    objects: &mut ObjectLookup,
    addrs: &[u64],
    history: &MappingHistory,
    jit: Option<&PerfMap>,
) -> Vec<Frame> {
    let mut frames = Vec::new();
    for (i, &addr) in addrs.iter().enumerate() {
        let lookup = lookup_addr(i, addr);
        let named_jit = history
            .find(lookup)
            .is_none()
            .then(|| jit?.lookup(lookup))
            .flatten();
        if let Some((name, offset)) = named_jit {
            frames.push(Frame {
                module: perf_map::path_of(objects.pid).display().to_string(),
                symbol: Some(name.to_string()),
                offset: Some(offset),
                addr,
                ..Frame::default()
            });
            continue;
        }
        let Some(mapping) = history.find(lookup) else {
            frames.push(Frame {
                module: UNKNOWN_MODULE.into(),
                addr,
                ..Frame::default()
            });
            // A return address outside every executable mapping means the frame-pointer chain
            // broke (code built without frame pointers): what follows is stack data, not frames.
            break;
        };
        let file_offset = lookup - mapping.start + mapping.file_offset;
        let frame = Frame {
            module: mapping.path.display().to_string(),
            addr,
            file_offset: Some(file_offset),
            ..Frame::default()
        };
        let result = objects.symbolize(mapping, file_offset);
        push_symbolized(&mut frames, frame, result.as_ref());
    }
    frames
}

/// Appends `base` filled in from a blazesym result, preceded by the functions inlined at that
/// address (innermost first, like the rest of the stack).
fn push_symbolized(frames: &mut Vec<Frame>, base: Frame, result: Option<&Symbolized>) {
    let Some(Symbolized::Sym(sym)) = result else {
        frames.push(base);
        return;
    };
    // DWARF can name the function inlined into itself (libc's __GI___mmap64): skip such echoes.
    for inlined in sym.inlined.iter().rev().filter(|i| i.name != sym.name) {
        let (file, line) = location(inlined.code_info.as_ref());
        frames.push(Frame {
            symbol: Some(inlined.name.to_string()),
            file,
            line,
            inlined: true,
            ..base.clone()
        });
    }
    let (file, line) = location(sym.code_info.as_deref());
    let module = match (&sym.module, base.kernel) {
        (Some(m), true) => m.to_string_lossy().into_owned(),
        _ => base.module.clone(),
    };
    frames.push(Frame {
        symbol: Some(sym.name.to_string()),
        offset: Some(sym.offset as u64),
        file,
        line,
        module,
        ..base
    });
}

fn location(info: Option<&CodeInfo>) -> (Option<String>, Option<u32>) {
    match info {
        Some(ci) => (Some(ci.to_path().display().to_string()), ci.line),
        None => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::system::procfs::Mapping;

    #[test]
    fn forgetting_a_process_drops_its_user_stacks_only() {
        let mut symbolizer = StackSymbolizer::default();
        let stacks = [
            StackRef::Kernel(1),
            StackRef::User { pid: 7, id: 1 },
            StackRef::User { pid: 7, id: 2 },
            StackRef::User { pid: 8, id: 1 },
        ];
        for stack in stacks {
            symbolizer.symbols.insert(stack, Vec::new());
        }
        symbolizer.partial.insert(StackRef::User { pid: 7, id: 2 });
        symbolizer.forget_process(7);
        let mut left: Vec<StackRef> = symbolizer.symbols.keys().copied().collect();
        left.sort_by_key(|s| format!("{s:?}"));
        assert_eq!(
            left,
            [StackRef::Kernel(1), StackRef::User { pid: 8, id: 1 }]
        );
        assert!(symbolizer.partial.is_empty());
    }

    fn lookup<'a>(
        symbolizer: &'a Symbolizer,
        objects: &'a mut ObjectFiles,
        deadline: Instant,
    ) -> ObjectLookup<'a> {
        ObjectLookup {
            symbolizer,
            objects,
            pid: std::process::id(),
            deadline,
        }
    }

    /// One executable mapping, 0x1000-0x2000, of a file that does not exist.
    fn app_history() -> MappingHistory {
        let mut history = MappingHistory::default();
        history.add_all(vec![Mapping {
            start: 0x1000,
            end: 0x2000,
            file_offset: 0,
            path: "/nonexistent/app".into(),
            dev: 0,
            inode: 0,
        }]);
        history
    }

    #[test]
    fn a_return_address_outside_executable_code_ends_the_user_stack() {
        let symbolizer = Symbolizer::new();
        let mut objects = ObjectFiles::new(debug_dirs(&[]));
        let history = app_history();
        // ip in the app, a return address in the app, then stack data the broken
        // frame-pointer chain walked into, then more garbage.
        let frames = user_frames(
            &mut lookup(&symbolizer, &mut objects, Instant::now() + SYMBOLIZE_BUDGET),
            &[0x1100, 0x1201, 0x7ffd_0000_0980, 0x1300],
            &history,
            None,
        );
        let modules: Vec<&str> = frames.iter().map(|f| f.module.as_str()).collect();
        assert_eq!(
            modules,
            ["/nonexistent/app", "/nonexistent/app", UNKNOWN_MODULE]
        );
        assert_eq!(frames[2].addr, 0x7ffd_0000_0980);
    }

    #[test]
    fn code_outside_every_mapped_file_is_named_by_the_perf_map_and_the_walk_goes_on() {
        let symbolizer = Symbolizer::new();
        let mut objects = ObjectFiles::new(debug_dirs(&[]));
        let history = app_history();
        let jit = perf_map::parse("7ffd00000900 100 jitted_method\n");
        let frames = user_frames(
            &mut lookup(&symbolizer, &mut objects, Instant::now() + SYMBOLIZE_BUDGET),
            &[0x1100, 0x7ffd_0000_0981, 0x1300, 0x9999_0000],
            &history,
            Some(&jit),
        );
        let named: Vec<(&str, Option<&str>)> = frames
            .iter()
            .map(|f| (f.module.as_str(), f.symbol.as_deref()))
            .collect();
        let map = perf_map::path_of(std::process::id()).display().to_string();
        assert_eq!(
            named,
            [
                ("/nonexistent/app", None),
                (map.as_str(), Some("jitted_method")),
                ("/nonexistent/app", None),
                (UNKNOWN_MODULE, None),
            ]
        );
        // A return address: the call instruction before it is what is looked up.
        assert_eq!(frames[1].offset, Some(0x80));
    }

    /// The executable mapping of this test binary that holds `f`'s code.
    fn own_mapping(f: u64) -> Mapping {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        crate::system::procfs::parse_exec_mappings(&maps)
            .into_iter()
            .find(|m| (m.start..m.end).contains(&f))
            .expect("own code is mapped")
    }

    #[inline(never)]
    fn a_function_to_find() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn own_code_is_symbolized_through_its_mapping() {
        let addr = a_function_to_find as *const () as u64;
        let mut history = MappingHistory::default();
        history.add_all(vec![own_mapping(addr)]);
        let symbolizer = Symbolizer::new();
        let mut objects = ObjectFiles::new(debug_dirs(&[]));
        let deadline = Instant::now() + SYMBOLIZE_BUDGET;
        let frames = user_frames(
            &mut lookup(&symbolizer, &mut objects, deadline),
            &[addr],
            &history,
            None,
        );
        let symbol = frames[0].symbol.as_deref().unwrap_or_default();
        assert!(symbol.contains("a_function_to_find"), "{frames:?}");
        assert!(frames[0].file_offset.is_some());
    }

    #[test]
    fn frames_past_the_deadline_keep_their_file_offset_only() {
        let addr = a_function_to_find as *const () as u64;
        let mapping = own_mapping(addr);
        let mut history = MappingHistory::default();
        history.add_all(vec![mapping.clone()]);
        let symbolizer = Symbolizer::new();
        let mut objects = ObjectFiles::new(debug_dirs(&[]));
        let frames = user_frames(
            &mut lookup(&symbolizer, &mut objects, Instant::now()),
            &[addr],
            &history,
            None,
        );
        assert_eq!(frames[0].symbol, None);
        assert_eq!(
            frames[0].file_offset,
            Some(addr - mapping.start + mapping.file_offset)
        );
    }
}

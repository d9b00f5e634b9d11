//! Turns stack addresses into frames with blazesym: kernel frames from kallsyms (and vmlinux
//! debug info when present), user frames from the ELF files of the mappings recorded during the
//! trace, so that a process that already exited is still symbolized.

use std::collections::HashMap;
use std::path::PathBuf;

use blazesym::symbolize::{
    source::{Elf, Kernel, Source},
    CodeInfo, Input, Symbolized, Symbolizer,
};

use crate::model::{Frame, Harvest, StackRef, Symbols};
use crate::system::procfs::MappingHistory;

/// Symbolizes every stack the harvest refers to: entries, the holders they waited behind, the
/// stacks holders slept in, timeline events.
pub fn symbolize(harvest: &Harvest, mappings: &HashMap<u32, MappingHistory>) -> Symbols {
    let mut symbolizer = StackSymbolizer::new();
    symbolizer.add(harvest, mappings);
    symbolizer.into_symbols()
}

/// Symbolizes stacks once and keeps them: the live and interval views see the same stack ids
/// again every refresh, and blazesym's first look at an object is slow. Stack ids are stable
/// (the tracer never deletes from the stack map), so an id names one stack for the whole trace.
pub struct StackSymbolizer {
    symbolizer: Symbolizer,
    symbols: Symbols,
}

impl Default for StackSymbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl StackSymbolizer {
    pub fn new() -> Self {
        Self {
            symbolizer: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .build(),
            symbols: Symbols::new(),
        }
    }

    pub fn symbols(&self) -> &Symbols {
        &self.symbols
    }

    pub fn into_symbols(self) -> Symbols {
        self.symbols
    }

    /// Symbolizes the stacks of `harvest` not symbolized yet.
    pub fn add(&mut self, harvest: &Harvest, mappings: &HashMap<u32, MappingHistory>) {
        let empty = MappingHistory::default();
        for stack in harvest.stack_refs() {
            if self.symbols.contains_key(&stack) {
                continue;
            }
            let (id, history) = match stack {
                StackRef::Kernel(id) => (id, None),
                StackRef::User { pid, id } => (id, Some(mappings.get(&pid).unwrap_or(&empty))),
            };
            let Some(addrs) = harvest.stacks.get(&id) else {
                continue;
            };
            let frames = match history {
                None => kernel_frames(&self.symbolizer, addrs),
                Some(history) => user_frames(&self.symbolizer, addrs, history),
            };
            self.symbols.insert(stack, frames);
        }
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

fn user_frames(symbolizer: &Symbolizer, addrs: &[u64], history: &MappingHistory) -> Vec<Frame> {
    let mut frames = Vec::new();
    for (i, &addr) in addrs.iter().enumerate() {
        let lookup = lookup_addr(i, addr);
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
            ..Frame::default()
        };
        let src = Source::Elf(Elf::new(PathBuf::from(&mapping.path)));
        let result = symbolizer
            .symbolize(&src, Input::FileOffset(&[file_offset]))
            .ok()
            .and_then(|mut v| v.pop());
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
    fn a_return_address_outside_executable_code_ends_the_user_stack() {
        let symbolizer = Symbolizer::new();
        let mut history = MappingHistory::default();
        history.add_all(vec![Mapping {
            start: 0x1000,
            end: 0x2000,
            file_offset: 0,
            path: "/nonexistent/app".into(),
        }]);
        // ip in the app, a return address in the app, then stack data the broken
        // frame-pointer chain walked into, then more garbage.
        let frames = user_frames(
            &symbolizer,
            &[0x1100, 0x1201, 0x7ffd_0000_0980, 0x1300],
            &history,
        );
        let modules: Vec<&str> = frames.iter().map(|f| f.module.as_str()).collect();
        assert_eq!(
            modules,
            ["/nonexistent/app", "/nonexistent/app", UNKNOWN_MODULE]
        );
        assert_eq!(frames[2].addr, 0x7ffd_0000_0980);
    }
}

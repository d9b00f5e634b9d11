//! Checks the compiled eBPF object against the stack limit older verifiers enforce on chains
//! of BPF-to-BPF calls: 512 bytes for a program and every function it calls down one chain,
//! each frame counted as at least 32 bytes (round_up(max(depth, 1), 32), Linux 6.1's
//! check_max_stack_depth). Kernels from 6.14 give tracing programs private stacks and accept
//! more, so a chain over the limit loads on this machine and nowhere on Debian 12; this test
//! says so on any machine. Calls to memset and memcpy (which LLVM emits for large stack
//! copies) are frames too.

use std::collections::HashMap;

use object::{Object as _, ObjectSection as _, ObjectSymbol as _, RelocationTarget, SectionKind};

const MAX_BPF_STACK: u32 = 512;
const FRAME_POINTER: u8 = 10;
const INSN: usize = 8;

/// One function of the object: its section, byte range, own stack depth and callees.
struct Function {
    name: String,
    section: object::SectionIndex,
    start: u64,
    depth: u32,
    /// (section, byte offset) of each function it calls.
    calls: Vec<(object::SectionIndex, u64)>,
}

fn functions(data: &[u8]) -> Vec<Function> {
    let elf = object::File::parse(data).expect("the eBPF object is ELF");
    let mut out = Vec::new();
    for symbol in elf.symbols() {
        if symbol.kind() != object::SymbolKind::Text || symbol.size() == 0 {
            continue;
        }
        let Some(section_index) = symbol.section_index() else {
            continue;
        };
        let section = elf.section_by_index(section_index).unwrap();
        if section.kind() != SectionKind::Text {
            continue;
        }
        let code = section.data().unwrap();
        let relocations: HashMap<u64, RelocationTarget> = section
            .relocations()
            .map(|(offset, r)| (offset, r.target()))
            .collect();
        let (start, end) = (symbol.address(), symbol.address() + symbol.size());
        let mut function = Function {
            name: symbol.name().unwrap_or("?").to_string(),
            section: section_index,
            start,
            depth: 0,
            calls: Vec::new(),
        };
        let mut at = start;
        while at + INSN as u64 <= end {
            let insn = &code[at as usize..at as usize + INSN];
            function.depth = function.depth.max(stack_reach(insn));
            if let Some(target) = call_target(&elf, section_index, at, insn, &relocations) {
                function.calls.push(target);
            }
            at += INSN as u64;
        }
        out.push(function);
    }
    out
}

/// How far below the frame pointer an instruction reaches: a load or store through r10, or
/// r10-relative pointer arithmetic (`r1 = r10; r1 += -24`, read as the add alone: only the
/// frame pointer is offset this way by the compiler).
fn stack_reach(insn: &[u8]) -> u32 {
    let opcode = insn[0];
    let (dst, src) = (insn[1] & 0x0f, insn[1] >> 4);
    let offset = i16::from_le_bytes([insn[2], insn[3]]);
    let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
    let class = opcode & 0x07;
    let through_fp = match class {
        // LDX: src is the base; ST, STX: dst is.
        0x01 => src == FRAME_POINTER,
        0x02 | 0x03 => dst == FRAME_POINTER,
        _ => false,
    };
    if through_fp && offset < 0 {
        return u32::from(offset.unsigned_abs());
    }
    // ALU64 ADD K of a negative immediate: the address of a stack slot being formed.
    if opcode == 0x07 && imm < 0 && imm > -(MAX_BPF_STACK as i32) * 2 {
        return imm.unsigned_abs();
    }
    0
}

/// The (section, offset) a BPF-to-BPF call at `at` lands on.
fn call_target(
    elf: &object::File,
    section: object::SectionIndex,
    at: u64,
    insn: &[u8],
    relocations: &HashMap<u64, RelocationTarget>,
) -> Option<(object::SectionIndex, u64)> {
    const CALL: u8 = 0x85;
    const PSEUDO_CALL: u8 = 1;
    if insn[0] != CALL || insn[1] >> 4 != PSEUDO_CALL {
        return None;
    }
    let imm = i64::from(i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]));
    match relocations.get(&at) {
        Some(RelocationTarget::Symbol(index)) => {
            let symbol = elf.symbol_by_index(*index).ok()?;
            let target_section = symbol.section_index()?;
            // A section symbol: the immediate is the target's instruction index minus one.
            let offset = if symbol.kind() == object::SymbolKind::Section {
                ((imm + 1) * INSN as i64) as u64
            } else {
                symbol.address()
            };
            Some((target_section, offset))
        }
        _ => Some((section, (at as i64 + (imm + 1) * INSN as i64) as u64)),
    }
}

fn frame(depth: u32) -> u32 {
    depth.max(1).div_ceil(32) * 32
}

/// The deepest chain from `function`, in 6.1's accounting, with the names along it.
fn deepest_chain(
    all: &[Function],
    function: &Function,
    seen: &mut Vec<String>,
) -> (u32, Vec<String>) {
    let mut best = (0, Vec::new());
    if seen.contains(&function.name) {
        return best;
    }
    seen.push(function.name.clone());
    for &(section, offset) in &function.calls {
        if let Some(callee) = all
            .iter()
            .find(|f| f.section == section && f.start == offset)
        {
            let chain = deepest_chain(all, callee, seen);
            if chain.0 > best.0 {
                best = chain;
            }
        }
    }
    seen.pop();
    let mut names = vec![format!("{} ({})", function.name, function.depth)];
    names.extend(best.1);
    (frame(function.depth) + best.0, names)
}

#[test]
fn every_programs_call_chain_fits_the_512_byte_stack_of_older_kernels() {
    let all = functions(super::EBPF_OBJECT);
    let programs: Vec<&Function> = all
        .iter()
        .filter(|f| !f.name.starts_with('.') && !f.name.starts_with("_R"))
        .filter(|f| f.depth > 0 || !f.calls.is_empty())
        .collect();
    assert!(
        programs
            .iter()
            .any(|f| f.name == super::mmap_lock::MMAP_LOCK_BTF[0]),
        "no btf_start_locking among {:?}",
        programs.iter().map(|f| &f.name).collect::<Vec<_>>()
    );
    let mut over = Vec::new();
    for program in programs {
        let (bytes, chain) = deepest_chain(&all, program, &mut Vec::new());
        if bytes > MAX_BPF_STACK {
            over.push(format!("{bytes} bytes: {}", chain.join(" -> ")));
        }
    }
    assert!(
        over.is_empty(),
        "over {MAX_BPF_STACK} bytes:\n{}",
        over.join("\n")
    );
}

#[test]
fn frames_round_as_the_verifier_does() {
    assert_eq!(frame(0), 32);
    assert_eq!(frame(1), 32);
    assert_eq!(frame(264), 288);
    assert_eq!(frame(120), 128);
    // A store 24 bytes below r10: `*(u64 *)(r10 - 24) = r1`.
    assert_eq!(stack_reach(&[0x7b, 0x1a, 0xe8, 0xff, 0, 0, 0, 0]), 24);
    // `r1 += -72`.
    assert_eq!(stack_reach(&[0x07, 0x01, 0, 0, 0xb8, 0xff, 0xff, 0xff]), 72);
    // `r1 = *(u64 *)(r6 + 368)`: not the stack.
    assert_eq!(stack_reach(&[0x79, 0x61, 0x70, 0x01, 0, 0, 0, 0]), 0);
}

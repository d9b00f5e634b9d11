//! Row labels that tell stacks apart: each stack named by the frame that places it best, and
//! where two stacks would read the same, by the first frame where they part.

use std::collections::BTreeMap;

use crate::model::place::{self, last_path_segment};
use crate::model::report::Entry;
use crate::model::Frame;
use crate::present::short_frame;

/// The frame that names a stack best (`model::place::place`).
pub(super) fn place(e: &Entry) -> String {
    place::place(&e.frames, e.stack_collected)
}

/// What tells frames apart: where they are and what they are.
pub(super) type FrameKey<'a> = (bool, u64, Option<&'a str>);

pub(super) fn frame_key(f: &Frame) -> FrameKey<'_> {
    (f.kernel, f.addr, f.symbol.as_deref())
}

/// The labels of the table's stack rows. Each row is named by its best frame (`place`); rows
/// whose best frames coincide but whose stacks differ add, after ` ‹ `, the frame at which
/// their stacks part, at each point where they do (walking the user frames from the innermost
/// outward, then the kernel frames). So two rows with different stacks never share a label
/// when a frame tells them apart, and rows with one stack (other threads, kinds, modes) keep
/// one label.
pub(crate) fn stack_labels(entries: &[&Entry]) -> Vec<String> {
    let mut labels: Vec<String> = entries.iter().map(|e| place(e)).collect();
    let walks: Vec<Vec<&Frame>> = entries
        .iter()
        .map(|e| {
            let user = e.frames.iter().filter(|f| !f.kernel);
            user.chain(e.frames.iter().filter(|f| f.kernel)).collect()
        })
        .collect();
    let mut by_place: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, label) in labels.iter().enumerate() {
        by_place.entry(label.clone()).or_default().push(i);
    }
    for rows in by_place.into_values() {
        tell_apart(&rows, 0, &walks, &mut labels);
    }
    labels
}

/// Splits `rows` (stacks equal up to `depth`) by their frame at `depth`, naming the frame in
/// each row's label when the rows part there, until each group holds a single stack.
pub(super) fn tell_apart(
    rows: &[usize],
    depth: usize,
    walks: &[Vec<&Frame>],
    labels: &mut [String],
) {
    let first = &walks[rows[0]];
    let same = |i: &usize| {
        let w = &walks[*i];
        w.len() == first.len()
            && w.iter()
                .zip(first)
                .all(|(a, b)| frame_key(a) == frame_key(b))
    };
    if rows.iter().all(same) {
        return;
    }
    let mut parts: BTreeMap<Option<FrameKey>, Vec<usize>> = BTreeMap::new();
    for &i in rows {
        parts
            .entry(walks[i].get(depth).map(|f| frame_key(f)))
            .or_default()
            .push(i);
    }
    if parts.len() > 1 {
        let frames: Vec<&Frame> = parts
            .values()
            .filter_map(|part| walks[part[0]].get(depth).copied())
            .collect();
        for part in parts.values() {
            // A stack that ends here is told apart by having nothing more to show.
            if let Some(frame) = walks[part[0]].get(depth) {
                // Rows told apart so far share their label: the first one stands for all.
                let label = &labels[part[0]];
                let at_naming_frame = *label == short_name(frame);
                let name = parting_name(frame, &frames, at_naming_frame);
                let label = if at_naming_frame {
                    name
                } else {
                    format!("{label} ‹ {name}")
                };
                for &i in part {
                    labels[i] = label.clone();
                }
            }
        }
    }
    for part in parts.values() {
        tell_apart(part, depth + 1, walks, labels);
    }
}

pub(super) fn short_name(f: &Frame) -> String {
    match &f.symbol {
        Some(symbol) => last_path_segment(symbol).to_string(),
        None => short_frame(f),
    }
}

/// A frame's short name, with its place in the function when another frame where the stacks
/// part has the same name (two calls from one function) or when `placed` (the stacks part at
/// the frame that names the row: its name alone would not change the label).
pub(super) fn parting_name(frame: &Frame, siblings: &[&Frame], placed: bool) -> String {
    let name = short_name(frame);
    let namesakes: Vec<&&Frame> = siblings
        .iter()
        .filter(|o| frame_key(o) != frame_key(frame) && short_name(o) == name)
        .collect();
    if namesakes.is_empty() && !placed {
        return name;
    }
    match (frame.line, frame.offset) {
        (Some(line), _) if namesakes.iter().all(|o| o.line != Some(line)) => {
            format!("{name}:{line}")
        }
        (_, Some(offset)) if namesakes.iter().all(|o| o.offset != Some(offset)) => {
            format!("{name}+{offset:#x}")
        }
        _ => format!("{name}@{:#x}", frame.addr),
    }
}

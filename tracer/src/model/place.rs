//! How a stack is named in one word: by the frame that tells the most (the report's answer,
//! the live view's labels, a waker's place).

use super::Frame;

/// The frame that names a stack best: the innermost user frame outside the C library, the
/// dynamic loader and the Rust standard library (the caller that matters), named by its symbol
/// or, unnamed, by its object (so that stacks differing only by offsets in a stripped object
/// read alike); else the innermost named kernel frame.
pub fn place(frames: &[Frame], stack_collected: bool) -> String {
    let is_libc = |m: &str| m.contains("/libc.so") || m.contains("/ld-linux");
    let is_std = |symbol: &str| {
        [
            "core::", "std::", "alloc::", "<core::", "<std::", "<alloc::",
        ]
        .iter()
        .any(|prefix| symbol.starts_with(prefix))
    };
    let user = frames
        .iter()
        .filter(|f| !f.kernel && !is_libc(&f.module))
        .find(|f| f.symbol.as_deref().is_none_or(|s| !is_std(s)));
    if let Some(f) = user {
        return match f.symbol.as_deref() {
            Some(symbol) => last_path_segment(symbol).to_string(),
            None => object_name(&f.module),
        };
    }
    let kernel = frames
        .iter()
        .filter(|f| f.kernel)
        .find_map(|f| f.symbol.as_deref());
    match kernel {
        Some(symbol) => symbol.to_string(),
        None if stack_collected => "(unsymbolized)".into(),
        None => NO_STACK_PLACE.into(),
    }
}

/// The place of an operation that was not walked (under the stack threshold).
pub const NO_STACK_PLACE: &str = "(no stack: under the stack threshold)";

/// `libclamav.so.12 (unnamed)` for an unnamed frame of /usr/lib/.../libclamav.so.12.
fn object_name(module: &str) -> String {
    let base = module.rsplit('/').next().unwrap_or(module);
    format!("{base} (unnamed)")
}

/// `churn_once` of `mmapsem_workload::churn::churn_once`: the full name is in the stack below.
/// `::` inside `<...>` (a type's path) does not count.
pub fn last_path_segment(symbol: &str) -> &str {
    let mut depth = 0i32;
    let mut start = 0;
    let bytes = symbol.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'<' => depth += 1,
            b'>' => depth -= 1,
            b':' if depth == 0 && i > 0 && bytes[i - 1] == b':' && i + 1 < bytes.len() => {
                start = i + 1;
            }
            _ => {}
        }
    }
    &symbol[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(module: &str, symbol: Option<&str>, addr: u64) -> Frame {
        Frame {
            kernel: false,
            module: module.into(),
            symbol: symbol.map(String::from),
            addr,
            ..Frame::default()
        }
    }

    #[test]
    fn a_stack_is_named_by_its_first_own_user_frame_and_an_unnamed_one_by_its_object() {
        let libc = frame("/usr/lib/x86_64-linux-gnu/libc.so.6", Some("mmap"), 1);
        let named = frame("/usr/sbin/clamd", Some("cli_scangzip"), 2);
        let stripped = frame("/usr/lib/libclamav.so.12.0.3", None, 0x12b977);
        let other_offset = frame("/usr/lib/libclamav.so.12.0.3", None, 0x12c000);
        assert_eq!(place(&[libc.clone(), named], true), "cli_scangzip");
        assert_eq!(
            place(&[libc.clone(), stripped], true),
            place(&[libc, other_offset], true)
        );
        assert_eq!(
            place(&[frame("/usr/lib/libclamav.so.12.0.3", None, 1)], true),
            "libclamav.so.12.0.3 (unnamed)"
        );
        let kernel = Frame {
            kernel: true,
            symbol: Some("vm_mmap_pgoff".into()),
            ..Frame::default()
        };
        assert_eq!(place(&[kernel], true), "vm_mmap_pgoff");
        assert_eq!(place(&[], false), "(no stack: under the stack threshold)");
    }
}

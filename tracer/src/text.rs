//! Text that several layers print: names the target controls, escaped before anyone prints
//! them, and error chains on one line. A leaf: it imports nothing of the crate.

use std::borrow::Cow;
use std::fmt::Write as _;

/// A name the target controls (comm, path, symbol) made safe to print: control characters
/// (an escape sequence that would drive the terminal, a newline that would forge a report
/// line) and bidirectional overrides become `\xNN`, `\n`, `\u{NNNN}`; a backslash is doubled so
/// that an escape cannot be faked.
pub fn escaped(name: &str) -> Cow<'_, str> {
    if !name.chars().any(needs_escape) {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x100 && needs_escape(c) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A path the target controls, escaped like `escaped` (for log lines as much as reports).
pub fn escaped_path(path: &std::path::Path) -> String {
    escaped(&path.to_string_lossy()).into_owned()
}

fn needs_escape(c: char) -> bool {
    c == '\\' || c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// An error chain on one line, each cause once: some errors (aya's map errors) repeat their
/// source's message in their own, which `{:#}` would print twice.
pub fn error_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    let mut previous = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if text.is_empty() || previous.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
        previous = text;
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped() {
        assert_eq!(escaped("plain name (x).so"), "plain name (x).so");
        assert_eq!(escaped("\x1b[31mred\n"), "\\x1b[31mred\\n");
        assert_eq!(
            escaped("a\\n"),
            "a\\\\n",
            "a backslash cannot fake an escape"
        );
        assert_eq!(escaped("tab\there\r\x7f"), "tab\\there\\r\\x7f");
        assert_eq!(escaped("\u{202e}gpj.exe"), "\\u{202e}gpj.exe");
        assert_eq!(escaped("naïve µs"), "naïve µs");
    }

    #[test]
    fn error_chains_say_each_cause_once() {
        // Like aya's MapError::CreateError inside EbpfError::MapError, whose Display also
        // prints its source.
        #[derive(Debug)]
        struct Inner(std::io::Error);
        impl std::fmt::Display for Inner {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "failed to create map `AGG`")
            }
        }
        impl std::error::Error for Inner {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = || std::io::Error::from_raw_os_error(libc::EINVAL);
        #[derive(Debug)]
        struct Chain(Inner);
        impl std::fmt::Display for Chain {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "map error: {}", self.0)
            }
        }
        impl std::error::Error for Chain {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let err = anyhow::Error::new(Chain(Inner(io()))).context("loading the programs");
        assert_eq!(
            format!("{err:#}"),
            "loading the programs: map error: failed to create map `AGG`: \
             failed to create map `AGG`: Invalid argument (os error 22)",
            "the doubling this guards against"
        );
        assert_eq!(
            error_line(&err),
            "loading the programs: map error: failed to create map `AGG`: \
             Invalid argument (os error 22)"
        );
        let plain = anyhow::anyhow!("no such process: 7").context("tracing");
        assert_eq!(error_line(&plain), "tracing: no such process: 7");
    }
}

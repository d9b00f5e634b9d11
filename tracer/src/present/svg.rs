//! An SVG flamegraph of folded stacks, drawn in-process with the inferno crate.
//!
//! Readability choices: the cause frames right under the root get fixed, distinct colours (so
//! the munmap, mmap and page-fault towers stand apart at a glance), kernel frames are orange,
//! Rust frames yellow, others red (inferno's "perl" palette), and the subtitle says what the
//! widths measure.

use anyhow::{Context as _, Result};
use inferno::flamegraph::{
    self,
    color::{Color, MultiPalette, Palette, PaletteMap},
};

use crate::model::Cause;

/// What the picture is of.
pub struct SvgTitle {
    pub title: String,
    pub subtitle: String,
    /// Unit of the sample values ("µs", "acquisitions").
    pub unit: String,
}

pub fn render(folded: &str, title: &SvgTitle) -> Result<String> {
    let mut palette = cause_palette();
    let mut options = flamegraph::Options::default();
    options.title = title.title.clone();
    options.subtitle = Some(title.subtitle.clone());
    options.count_name = title.unit.clone();
    options.colors = Palette::Multi(MultiPalette::Perl);
    options.palette_map = Some(&mut palette);
    options.deterministic = true;
    options.font_size = 13;
    // A little wider than the default 1200 px: kernel frames have long names.
    options.image_width = Some(1600);
    let mut svg = Vec::new();
    let lines: Vec<&str> = folded.lines().collect();
    if lines.iter().all(|line| line.trim().is_empty()) {
        // inferno refuses empty input; an empty graph still says what was traced.
        options.notes = "no samples".into();
        flamegraph::from_lines(&mut options, ["[no samples] 1"], &mut svg)
    } else {
        flamegraph::from_lines(&mut options, lines, &mut svg)
    }
    .context("drawing the flamegraph")?;
    String::from_utf8(svg).context("flamegraph is not UTF-8")
}

/// Fixed colours for the `[cause]` frames of `present::folded` (and the mode frames).
fn cause_palette() -> PaletteMap {
    let mut map = PaletteMap::default();
    let rgb = |r, g, b| Color { r, g, b };
    let colours = [
        (Cause::Munmap, rgb(214, 39, 40)),
        (Cause::Mmap, rgb(255, 127, 14)),
        (Cause::Mprotect, rgb(148, 103, 189)),
        (Cause::Brk, rgb(140, 86, 75)),
        (Cause::Mremap, rgb(227, 119, 194)),
        (Cause::Madvise, rgb(188, 189, 34)),
        (Cause::PageFault, rgb(31, 119, 180)),
        (Cause::ProcReader, rgb(44, 160, 44)),
        (Cause::Exit, rgb(127, 127, 127)),
        (Cause::InRead, rgb(107, 174, 214)),
        (Cause::InWrite, rgb(253, 174, 107)),
        (Cause::Exec, rgb(23, 190, 207)),
        (Cause::Fork, rgb(158, 218, 229)),
        (Cause::InOtherSyscall, rgb(189, 189, 189)),
        (Cause::Other, rgb(199, 199, 199)),
        (Cause::NoStack, rgb(220, 220, 220)),
    ];
    for (cause, colour) in colours {
        map.insert(format!("[{}]", cause.label()), colour);
    }
    map.insert("[read]", rgb(158, 218, 229));
    map.insert("[write]", rgb(255, 152, 150));
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    fn title() -> SvgTitle {
        SvgTitle {
            title: "mmap_lock wait: app (pid 42)".into(),
            subtitle: "width: time waiting".into(),
            unit: "µs".into(),
        }
    }

    #[test]
    fn draws_titled_svg_with_every_frame() {
        let folded = "app;[munmap];[write];--;__vm_munmap_[k] 8000\napp;[page fault];[read];--;exc_page_fault_[k] 1000\n";
        let svg = render(folded, &title()).unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..100]);
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("mmap_lock wait: app (pid 42)"));
        assert!(svg.contains("width: time waiting"));
        assert!(svg.contains("__vm_munmap"));
        assert!(svg.contains("[page fault]"));
        // The munmap cause frame has its fixed colour.
        assert!(svg.contains("rgb(214,39,40)"), "cause colour missing");
    }

    #[test]
    fn empty_input_still_draws() {
        let svg = render("", &title()).unwrap();
        assert!(svg.contains("[no samples]"));
    }
}

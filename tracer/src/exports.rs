//! Everything written at the end of a trace, whatever ended it: the report (stdout or -o) and
//! the --folded, --svg, --pprof and --timeline files. Every file is checked before tracing starts
//! (two outputs to one file are refused) and written as output::Destination says.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::cli::{Cli, Format, View, WeightArg};
use crate::model::{report::Report, timeline::Slice};
use crate::output::{Destination, Identity};
use crate::present::{self, folded::Weight, svg::SvgTitle, trace_event::TimelineNames};
use crate::text::error_line;

/// Writes the report to `path`, or when that fails, to stdout; the error then says where the
/// report went.
fn write_or_salvage(path: &std::path::Path, text: &str) -> Result<()> {
    let Err(err) = Destination::File(path.to_path_buf()).write(text) else {
        return Ok(());
    };
    match Destination::Stdout.write(text) {
        Ok(()) => bail!(
            "{}; the report was written to stdout instead",
            error_line(&err)
        ),
        Err(stdout_err) => bail!(
            "{}; writing it to stdout failed too: {}",
            error_line(&err),
            error_line(&stdout_err)
        ),
    }
}

/// The timeline's slices and what names its tracks.
pub struct TimelineData {
    pub slices: Vec<Slice>,
    pub processes: HashMap<u32, String>,
    pub threads: HashMap<u32, String>,
    pub threshold_ns: u64,
    pub dropped: u64,
}

pub struct Outputs {
    report: Option<(Destination, Format)>,
    top: usize,
    folded: Option<Destination>,
    svg: Option<Destination>,
    pprof: Option<Destination>,
    timeline: Option<Destination>,
    weight: Weight,
}

impl Outputs {
    pub fn from_cli(cli: &Cli, view: &View) -> Self {
        let destination = cli
            .report
            .output
            .as_deref()
            .map_or(Destination::Stdout, Destination::from_arg);
        let file = |path: &Option<PathBuf>| path.as_deref().map(Destination::from_arg);
        Self {
            report: cli
                .final_report_wanted(view)
                .then(|| (destination, cli.report.format.unwrap_or(Format::Text))),
            top: cli.report.top,
            folded: file(&cli.exports.folded),
            svg: file(&cli.exports.svg),
            pprof: file(&cli.exports.pprof),
            timeline: file(&cli.exports.timeline),
            weight: match cli.exports.weight {
                WeightArg::Wait => Weight::Wait,
                WeightArg::Hold => Weight::Hold,
                WeightArg::Count => Weight::Count,
            },
        }
    }

    pub fn wants_timeline(&self) -> bool {
        self.timeline.is_some()
    }

    /// Fails now, before any tracing, if a file could not be written at the end, or if two
    /// outputs would go to one file (one would replace the other).
    pub fn check_writable(&self) -> Result<()> {
        let named = self.named();
        for (_, destination) in &named {
            destination.check_writable()?;
        }
        refuse_shared(&named)
    }

    /// Every destination with the option that asked for it.
    fn named(&self) -> Vec<(&'static str, &Destination)> {
        let report = self
            .report
            .as_ref()
            .map(|(destination, _)| match destination {
                Destination::File(_) => ("-o", destination),
                Destination::Stdout => ("the report", destination),
            });
        let files = [
            ("--folded", &self.folded),
            ("--svg", &self.svg),
            ("--pprof", &self.pprof),
            ("--timeline", &self.timeline),
        ];
        report
            .into_iter()
            .chain(
                files
                    .into_iter()
                    .filter_map(|(name, d)| d.as_ref().map(|d| (name, d))),
            )
            .collect()
    }

    /// Writes every output, trying them all even when one fails; returns what was written to
    /// files, for the closing message.
    pub fn write(&self, report: &Report, timeline: &TimelineData) -> Result<Vec<PathBuf>> {
        let mut written = Vec::new();
        let mut errors = Vec::new();
        if let Some((destination, format)) = &self.report {
            let result = self
                .render_report(report, *format)
                .and_then(|text| match destination {
                    // A full or failing disk must not cost the trace: see write_or_salvage.
                    Destination::File(path) => write_or_salvage(path, &text).map(|()| Some(path)),
                    Destination::Stdout => Destination::Stdout.write(&text).map(|()| None),
                });
            match result {
                Ok(Some(path)) => written.push(path.clone()),
                Ok(None) => {}
                Err(err) => errors.push(error_line(&err)),
            }
        }
        let mut put = |destination: Destination, contents: Result<Vec<u8>>| match contents
            .and_then(|bytes| destination.write_bytes(&bytes).map(|()| destination))
        {
            Ok(Destination::File(path)) => written.push(path),
            Ok(Destination::Stdout) => {}
            Err(err) => errors.push(error_line(&err)),
        };
        let folded = present::folded::render(report, self.weight);
        if let Some(destination) = &self.folded {
            put(destination.clone(), Ok(folded.clone().into_bytes()));
        }
        if let Some(destination) = &self.svg {
            let title = svg_title(report, self.weight);
            put(
                destination.clone(),
                present::svg::render(&folded, &title).map(String::into_bytes),
            );
        }
        if let Some(destination) = &self.pprof {
            put(destination.clone(), present::pprof::render(report));
        }
        if let Some(destination) = &self.timeline {
            let names = TimelineNames {
                processes: &timeline.processes,
                threads: &timeline.threads,
                threshold_ns: timeline.threshold_ns,
                dropped: timeline.dropped,
                lost: &report.lost,
            };
            put(
                destination.clone(),
                present::trace_event::render(&timeline.slices, &names).map(String::into_bytes),
            );
        }
        if !errors.is_empty() {
            bail!("{}", errors.join("; "));
        }
        Ok(written)
    }

    fn render_report(&self, report: &Report, format: Format) -> Result<String> {
        Ok(match format {
            Format::Text => present::text::render(report, self.top),
            Format::Json => present::json::render(report)?,
            Format::Csv => present::csv::render(report),
        })
    }
}

/// Refuses two outputs to standard output (they would interleave into one stream), or two to
/// the same file under any spelling (`X` and `./X`, a hard link, a symlink): the second would
/// replace the first.
fn refuse_shared(named: &[(&str, &Destination)]) -> Result<()> {
    let stdout: Vec<&str> = named
        .iter()
        .filter(|(_, d)| matches!(d, Destination::Stdout))
        .map(|(name, _)| *name)
        .collect();
    if let [first, second, ..] = stdout[..] {
        bail!("{first} and {second} would both go to standard output (give one of them a file)");
    }
    let files: Vec<(&str, &Destination, Identity)> = named
        .iter()
        .filter_map(|(name, d)| d.replaced_file().map(|id| (*name, *d, id)))
        .collect();
    for (i, (first, destination, id)) in files.iter().enumerate() {
        if let Some((second, ..)) = files[i + 1..].iter().find(|(_, _, other)| other == id) {
            let Destination::File(path) = destination else {
                continue;
            };
            bail!(
                "{first} and {second} name the same file ({}): give each its own",
                path.display()
            );
        }
    }
    Ok(())
}

/// The closing stderr note on what was lost, when anything was: whatever the report's
/// destination, the user running the trace sees it (the folded file has no room for it).
pub fn lost_note(report: &Report) -> Option<String> {
    let lost = present::text::nonzero_lost(report);
    (!lost.is_empty()).then(|| format!("lost events: {}", lost.join(", ")))
}

fn svg_title(report: &Report, weight: Weight) -> SvgTitle {
    let lost = present::text::nonzero_lost(report);
    let traced = if report.target.system_wide {
        report.target.comm.clone()
    } else {
        let pids: Vec<String> = report.target.pids.iter().map(u32::to_string).collect();
        format!("{} (pid {})", report.target.comm, pids.join(","))
    };
    SvgTitle {
        title: format!("mmap_lock {}: {traced}", weight.title()),
        subtitle: format!(
            "width = {} ({}), traced {}{}; towers under the root: cause, then read/write; \
             '--' marks the entry into the kernel{}",
            weight.describe(),
            weight.unit(),
            present::human_ns(report.duration_ns),
            if report.target.exited {
                ", target exited"
            } else {
                ""
            },
            if lost.is_empty() {
                String::new()
            } else {
                format!("; lost: {}", lost.join(", "))
            }
        ),
        unit: weight.unit().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{build_report, report::tests::sample};

    #[test]
    fn svg_subtitle_names_nonzero_lost_counters() {
        let (mut harvest, symbols, meta) = sample();
        harvest.counters[tracer_common::Counter::AggMapFull as usize].1 = 5;
        let report = build_report(&harvest, &symbols, &meta);
        let title = svg_title(&report, Weight::Wait);
        assert_eq!(title.title, "mmap_lock waits: app (pid 42)");
        assert!(
            title
                .subtitle
                .ends_with("; lost: aggregation_map_full=5, unpaired_release=2"),
            "{}",
            title.subtitle
        );
        harvest.counters.iter_mut().for_each(|(_, n)| *n = 0);
        let clean = svg_title(&build_report(&harvest, &symbols, &meta), Weight::Wait);
        assert!(!clean.subtitle.contains("lost"), "{}", clean.subtitle);
    }

    #[test]
    fn lost_note_names_nonzero_counters_only() {
        let (mut harvest, symbols, meta) = sample();
        harvest.counters.iter_mut().for_each(|(_, n)| *n = 0);
        assert_eq!(lost_note(&build_report(&harvest, &symbols, &meta)), None);
        harvest.counters[tracer_common::Counter::AggMapFull as usize].1 = 5;
        assert_eq!(
            lost_note(&build_report(&harvest, &symbols, &meta)).as_deref(),
            Some("lost events: aggregation_map_full=5")
        );
    }
}

//! pprof profiles (`--pprof FILE`): the gzipped protocol buffer that `go tool pprof`,
//! Pyroscope and Parca read, in the shape of Go's own mutex profile (sample types
//! `contentions/count` and `delay/nanoseconds`), with the holds beside them
//! (`holds/count`, `hold/nanoseconds`; `go tool pprof -sample_index=hold`).
//!
//! One sample per report entry: its stack as locations, leaf first (kernel frames, then the
//! user frames that entered the kernel), inlined frames as the extra lines of one location;
//! kind, mode, cause and process as labels (`-tagfocus`, `-tagroot=cause`). What the kernel
//! dropped goes in the profile's comments (`-comments`).

use std::collections::HashMap;
use std::io::Write as _;

use anyhow::{Context as _, Result};
use prost::Message as _;

use crate::model::{
    processes::UNKNOWN_COMM,
    report::{Entry, Kind, Report},
    Frame,
};
use crate::present::unnamed_frame;
use crate::text::escaped;

/// The schema of profile.proto (github.com/google/pprof/proto), the fields used here.
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
    }
}

/// The sample values, in this order.
const SAMPLE_TYPES: [(&str, &str); 4] = [
    ("contentions", "count"),
    ("delay", "nanoseconds"),
    ("holds", "count"),
    ("hold", "nanoseconds"),
];
/// Where the kernel's frames are, as perf names it.
const KERNEL_MAPPING: &str = "[kernel.kallsyms]";
/// The one frame of an entry whose stack was not taken (shorter than --stack-threshold).
const NO_STACK_FRAME: &str = "[stack not collected]";

/// The gzipped profile of `report`.
pub fn render(report: &Report) -> Result<Vec<u8>> {
    let profile = build(report);
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gzip.write_all(&profile.encode_to_vec())
        .and_then(|()| gzip.finish())
        .context("compressing the pprof profile")
}

fn build(report: &Report) -> proto::Profile {
    let mut b = Builder::default();
    b.string(""); // Index 0 is the empty string, by the format's rule.
    if let Some(main) = main_executable(report) {
        // pprof takes the first mapping for the profiled binary ("File:" in its header).
        b.mapping(main);
    }
    let sample_type = SAMPLE_TYPES
        .iter()
        .map(|(kind, unit)| b.value_type(kind, unit))
        .collect();
    let sample = report
        .entries
        .iter()
        .filter(|e| e.count > 0)
        .map(|e| b.sample(report, e))
        .collect();
    let comment = crate::present::text::nonzero_lost(report)
        .iter()
        .map(|lost| b.string(&format!("lost events: {lost}")))
        .collect();
    proto::Profile {
        sample_type,
        sample,
        duration_nanos: report.duration_ns as i64,
        period_type: Some(b.value_type("contentions", "count")),
        period: 1,
        comment,
        default_sample_type: b.string("delay"),
        mapping: b.mappings,
        location: b.locations,
        function: b.functions,
        string_table: b.strings,
    }
}

/// A frame in the traced program's own executable: the user object named like the target
/// (its comm is the executable's name cut to 15 bytes).
fn main_executable(report: &Report) -> Option<&Frame> {
    let comm = &report.target.comm;
    if comm.is_empty() {
        return None;
    }
    report
        .entries
        .iter()
        .flat_map(|e| &e.frames)
        .filter(|f| !f.kernel)
        .find(|f| {
            let name = f.module.rsplit('/').next().unwrap_or(&f.module);
            name.starts_with(comm.as_str())
        })
}

/// The profile's tables, each entry once.
#[derive(Default)]
struct Builder {
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    mappings: Vec<proto::Mapping>,
    mapping_ids: HashMap<String, u64>,
    functions: Vec<proto::Function>,
    function_ids: HashMap<(i64, i64), u64>,
    locations: Vec<proto::Location>,
    location_ids: HashMap<(u64, u64, Vec<proto::Line>), u64>,
}

impl Builder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.string_ids.insert(s.to_owned(), id);
        id
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(kind),
            unit: self.string(unit),
        }
    }

    fn sample(&mut self, report: &Report, e: &Entry) -> proto::Sample {
        let (count, ns) = (e.count as i64, e.total_ns as i64);
        let value = match e.kind {
            Kind::Wait => vec![count, ns, 0, 0],
            Kind::Hold => vec![0, 0, count, ns],
        };
        let mut location_id = self.stack(e);
        if location_id.is_empty() {
            let none = Frame {
                symbol: Some(NO_STACK_FRAME.into()),
                ..Frame::default()
            };
            location_id.push(self.location(&[&none]));
        }
        proto::Sample {
            location_id,
            value,
            label: self.labels(report, e),
        }
    }

    /// Leaf first: the kernel frames (innermost first), then the user frames that called into
    /// the kernel; a run of inlined frames and the frame they were inlined into make one
    /// location, as pprof has it.
    fn stack(&mut self, e: &Entry) -> Vec<u64> {
        let (user, kernel): (Vec<&Frame>, Vec<&Frame>) = e.frames.iter().partition(|f| !f.kernel);
        let mut ids = Vec::new();
        let mut inlined: Vec<&Frame> = Vec::new();
        for frame in kernel.into_iter().chain(user) {
            inlined.push(frame);
            if !frame.inlined {
                ids.push(self.location(&inlined));
                inlined.clear();
            }
        }
        if !inlined.is_empty() {
            ids.push(self.location(&inlined));
        }
        ids
    }

    /// One location for `frames`: the innermost inlined one first, the frame that holds the
    /// address last.
    fn location(&mut self, frames: &[&Frame]) -> u64 {
        let outer = frames[frames.len() - 1];
        let mapping_id = self.mapping(outer);
        let line: Vec<proto::Line> = frames
            .iter()
            .map(|f| proto::Line {
                function_id: self.function(f),
                line: f.line.map_or(0, i64::from),
            })
            .collect();
        let key = (mapping_id, outer.addr, line);
        if let Some(&id) = self.location_ids.get(&key) {
            return id;
        }
        let id = self.locations.len() as u64 + 1;
        self.locations.push(proto::Location {
            id,
            mapping_id,
            address: outer.addr,
            line: key.2.clone(),
        });
        self.location_ids.insert(key, id);
        id
    }

    fn mapping(&mut self, f: &Frame) -> u64 {
        let name = if f.kernel {
            KERNEL_MAPPING.to_string()
        } else {
            escaped(&f.module).into_owned()
        };
        if let Some(&id) = self.mapping_ids.get(&name) {
            return id;
        }
        let id = self.mappings.len() as u64 + 1;
        let filename = self.string(&name);
        self.mappings.push(proto::Mapping {
            id,
            filename,
            // Symbolized here: pprof must not look the addresses up again (they are runtime
            // addresses of another process).
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        });
        self.mapping_ids.insert(name, id);
        id
    }

    fn function(&mut self, f: &Frame) -> u64 {
        let name = match &f.symbol {
            Some(symbol) => escaped(symbol).into_owned(),
            None => unnamed_frame(&escaped(&f.module), f),
        };
        let name = self.string(&name);
        let filename = self.string(&f.file.as_deref().map(escaped).unwrap_or_default());
        if let Some(&id) = self.function_ids.get(&(name, filename)) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        self.functions.push(proto::Function {
            id,
            name,
            system_name: name,
            filename,
        });
        self.function_ids.insert((name, filename), id);
        id
    }

    fn labels(&mut self, report: &Report, e: &Entry) -> Vec<proto::Label> {
        let process = e
            .comm
            .as_deref()
            .unwrap_or(if report.target.pids.len() == 1 {
                &report.target.comm
            } else {
                UNKNOWN_COMM
            });
        let mut texts = vec![
            ("kind", e.kind.label().to_string()),
            ("mode", e.mode.label().to_string()),
            ("cause", e.cause.label().to_string()),
            ("process", escaped(process).into_owned()),
        ];
        if let Some(cgroup) = &e.cgroup {
            texts.push(("cgroup", escaped(cgroup).into_owned()));
        }
        if let Some(locker) = &e.locker {
            let comm = locker.comm.as_deref().unwrap_or(UNKNOWN_COMM);
            texts.push(("outside_locker", escaped(comm).into_owned()));
            if let Some(cgroup) = &locker.cgroup {
                texts.push(("outside_locker_cgroup", escaped(cgroup).into_owned()));
            }
        }
        if let Some(thread) = &e.thread_name {
            texts.push(("thread", escaped(thread).into_owned()));
        }
        let mut labels: Vec<proto::Label> = texts
            .iter()
            .map(|(key, value)| proto::Label {
                key: self.string(key),
                str: self.string(value),
                num: 0,
            })
            .collect();
        let numbers = [("pid", Some(e.pid)), ("tid", e.tid)];
        for (key, value) in numbers {
            if let Some(value) = value {
                labels.push(proto::Label {
                    key: self.string(key),
                    str: 0,
                    num: i64::from(value),
                });
            }
        }
        labels
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{build_report, report::tests::sample};

    fn decoded(bytes: &[u8]) -> proto::Profile {
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(bytes), &mut raw).unwrap();
        proto::Profile::decode(raw.as_slice()).unwrap()
    }

    fn value_index(p: &proto::Profile, kind: &str) -> usize {
        p.sample_type
            .iter()
            .position(|t| p.string_table[t.r#type as usize] == kind)
            .unwrap()
    }

    #[test]
    fn every_entry_is_a_sample_whose_values_add_up_to_the_report() {
        let (harvest, symbols, meta) = sample();
        let report = build_report(&harvest, &symbols, &meta);
        let p = decoded(&render(&report).unwrap());
        assert_eq!(p.string_table[0], "");
        assert_eq!(p.string_table[p.default_sample_type as usize], "delay");
        let sum = |kind: &str| -> i64 {
            let i = value_index(&p, kind);
            p.sample.iter().map(|s| s.value[i]).sum()
        };
        let total = |kind: Kind| -> i64 {
            let of = |e: &&Entry| e.kind == kind;
            report
                .entries
                .iter()
                .filter(of)
                .map(|e| e.total_ns as i64)
                .sum()
        };
        assert_eq!(sum("delay"), total(Kind::Wait));
        assert_eq!(sum("hold"), total(Kind::Hold));
        let waits = report.entries.iter().filter(|e| e.kind == Kind::Wait);
        assert_eq!(
            sum("contentions"),
            waits.map(|e| e.count as i64).sum::<i64>()
        );
        assert_eq!(
            p.sample.len(),
            report.entries.iter().filter(|e| e.count > 0).count()
        );
        for s in &p.sample {
            assert!(!s.location_id.is_empty());
            for id in &s.location_id {
                let location = &p.location[*id as usize - 1];
                assert_eq!(location.id, *id);
                assert!(!location.line.is_empty());
            }
            let keys: Vec<&str> = s
                .label
                .iter()
                .map(|l| p.string_table[l.key as usize].as_str())
                .collect();
            for key in ["kind", "mode", "cause", "process", "pid", "cgroup"] {
                assert!(keys.contains(&key), "{keys:?}");
            }
        }
    }

    #[test]
    fn inlined_frames_share_the_location_of_the_frame_they_were_inlined_into() {
        let frame = |symbol: &str, inlined: bool| Frame {
            module: "/usr/bin/app".into(),
            symbol: Some(symbol.into()),
            addr: 0x1000,
            inlined,
            ..Frame::default()
        };
        let (harvest, symbols, meta) = sample();
        let mut report = build_report(&harvest, &symbols, &meta);
        let entry = &mut report.entries[0];
        entry.frames = vec![
            frame("leaf_inlined", true),
            frame("caller", false),
            Frame {
                kernel: true,
                module: "kernel".into(),
                symbol: Some("down_write".into()),
                addr: 0xffff_ffff_8100_0000,
                ..Frame::default()
            },
        ];
        let p = build(&report);
        let s = &p.sample[0];
        assert_eq!(
            s.location_id.len(),
            2,
            "kernel leaf, then one user location"
        );
        let names = |id: u64| -> Vec<&str> {
            p.location[id as usize - 1]
                .line
                .iter()
                .map(|l| {
                    let f = &p.function[l.function_id as usize - 1];
                    p.string_table[f.name as usize].as_str()
                })
                .collect()
        };
        assert_eq!(names(s.location_id[0]), ["down_write"]);
        assert_eq!(names(s.location_id[1]), ["leaf_inlined", "caller"]);
    }

    #[test]
    fn names_the_target_controls_are_escaped() {
        let (harvest, symbols, meta) = sample();
        let mut report = build_report(&harvest, &symbols, &meta);
        report.entries[0].frames = vec![Frame {
            module: "/tmp/evil\x1b[2J".into(),
            symbol: Some("f\nake".into()),
            ..Frame::default()
        }];
        let p = build(&report);
        assert!(p
            .string_table
            .iter()
            .all(|s| !s.contains('\x1b') && !s.contains('\n')));
    }
}

//! The timeline as Chrome trace-event JSON (the "JSON Object Format" that Perfetto and
//! chrome://tracing open): one track per thread, named after it, one complete ("X") slice per
//! wait and per hold, named by cause and mode, with the stack in its args.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use anyhow::Result;
use serde_json::{json, Value};

use crate::model::timeline::Slice;

use super::short_frame;

/// Who the tracks belong to.
pub struct TimelineNames<'a> {
    /// Target and outside-locker process names by pid.
    pub processes: &'a HashMap<u32, String>,
    /// Thread names by tid.
    pub threads: &'a HashMap<u32, String>,
    pub threshold_ns: u64,
    pub dropped: u64,
    /// Every lost-event counter of the trace (zeros too, as in the JSON report).
    pub lost: &'a BTreeMap<&'static str, u64>,
}

pub fn render(slices: &[Slice], names: &TimelineNames) -> Result<String> {
    let mut events: Vec<Value> = track_names(slices, names);
    events.extend(slices.iter().map(slice_event));
    let trace = json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "tool": "mmapsem-trace",
            "threshold_ns": names.threshold_ns,
            "timeline_dropped": names.dropped,
            "lost": names.lost,
        },
    });
    let mut text = serde_json::to_string(&trace)?;
    text.push('\n');
    Ok(text)
}

/// Metadata events naming each process and thread track.
fn track_names(slices: &[Slice], names: &TimelineNames) -> Vec<Value> {
    let mut threads: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for s in slices {
        threads.entry(s.track_pid()).or_default().insert(s.tid);
    }
    let mut events = Vec::new();
    for (pid, tids) in threads {
        let process = names
            .processes
            .get(&pid)
            .cloned()
            .unwrap_or_else(|| format!("pid {pid}"));
        events.push(json!({
            "ph": "M", "name": "process_name", "pid": pid, "tid": 0,
            "args": {"name": process},
        }));
        for tid in tids {
            let thread = match names.threads.get(&tid) {
                Some(name) => format!("{name} ({tid})"),
                None => format!("tid {tid}"),
            };
            events.push(json!({
                "ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                "args": {"name": thread},
            }));
        }
    }
    events
}

fn slice_event(s: &Slice) -> Value {
    let mut args = json!({
        "kind": s.kind.label(),
        "mode": s.mode.label(),
        "cause": s.cause.label(),
        "duration_ms": s.duration_ns as f64 / 1e6,
        "stack": s.frames.iter().map(short_frame).collect::<Vec<_>>(),
    });
    if s.locker_pid.is_some() {
        args["locks_mm_of_pid"] = json!(s.pid);
    }
    json!({
        "ph": "X",
        "name": format!("{} {} ({})", s.kind.label(), s.mode.label(), s.cause.label()),
        "cat": s.kind.label(),
        "pid": s.track_pid(),
        "tid": s.tid,
        "ts": micros(s.start_ns),
        "dur": micros(s.duration_ns),
        "args": args,
    })
}

/// Trace-event times are microseconds; keep nanosecond precision as decimals.
fn micros(ns: u64) -> f64 {
    ns as f64 / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::timeline::{slices, tests::convoy};

    #[test]
    fn per_thread_tracks_and_slices_in_microseconds() {
        let (events, symbols) = convoy();
        let s = slices(&events, &symbols, 1_000_000_000);
        let processes = HashMap::from([(42, "app".to_string())]);
        let threads = HashMap::from([(43, "writer".to_string())]);
        let lost = BTreeMap::from([("aggregation_map_full", 3), ("state_map_full", 0)]);
        let names = TimelineNames {
            processes: &processes,
            threads: &threads,
            threshold_ns: 1_000_000,
            dropped: 0,
            lost: &lost,
        };
        let v: Value = serde_json::from_str(&render(&s, &names).unwrap()).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        let meta: Vec<&Value> = events.iter().filter(|e| e["ph"] == "M").collect();
        assert_eq!(meta.len(), 3, "one process, two threads");
        assert!(meta.iter().any(|e| e["args"]["name"] == "writer (43)"));
        assert!(meta.iter().any(|e| e["args"]["name"] == "tid 44"));
        let x: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(x.len(), 3);
        assert_eq!(x[0]["name"], "hold write (munmap)");
        assert_eq!(
            (x[0]["ts"].as_f64(), x[0]["dur"].as_f64()),
            (Some(0.0), Some(5000.0))
        );
        assert_eq!(x[1]["tid"], 44);
        assert_eq!(x[1]["ts"].as_f64(), Some(1000.0));
        assert_eq!(x[0]["args"]["stack"][0], "__vm_munmap");
        assert_eq!(v["otherData"]["threshold_ns"], 1_000_000);
        assert_eq!(v["otherData"]["lost"]["aggregation_map_full"], 3);
        assert_eq!(v["otherData"]["lost"]["state_map_full"], 0);
    }
}

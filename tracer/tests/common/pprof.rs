//! `go tool pprof`, the real consumer of the profiles.

use std::path::Path;

/// `go tool pprof ARGS PROFILE`'s output; it must succeed.
pub fn go_pprof(args: &[&str], profile: &Path) -> String {
    let out = std::process::Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(profile)
        .env("HOME", std::env::temp_dir())
        .output()
        .expect("running go tool pprof (apt-get install golang-go)");
    assert!(
        out.status.success(),
        "go tool pprof {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The four values of a `-raw` sample line (`  575 1285316703 0 0: 1 2 3`).
pub fn raw_sample_values(line: &str) -> Option<[u64; 4]> {
    let (values, _locations) = line.split_once(':')?;
    let numbers: Vec<u64> = values
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    numbers.try_into().ok()
}

/// The four sample totals (contentions, delay, holds, hold) of `go tool pprof -raw ARGS
/// PROFILE`, after checking that the profile has the four sample types in that order.
pub fn raw_totals(args: &[&str], profile: &Path) -> [u64; 4] {
    let mut all = vec!["-raw"];
    all.extend_from_slice(args);
    let raw = go_pprof(&all, profile);
    assert!(
        raw.contains("contentions/count delay/nanoseconds[dflt] holds/count hold/nanoseconds"),
        "{raw}"
    );
    let mut got = [0u64; 4];
    for values in raw.lines().filter_map(raw_sample_values) {
        for (total, value) in got.iter_mut().zip(values) {
            *total += value;
        }
    }
    got
}

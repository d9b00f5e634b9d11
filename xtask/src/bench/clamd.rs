//! The design card's own example in the bench: a real clamd (Debian's clamav-daemon) with a
//! private database of one EICAR signature (no freshclam, no system service: its own config,
//! socket and directories under the temporary directory) scanning a tree with
//! `clamdscan --multiscan`, which hands the files to clamd's worker threads: each maps, reads
//! and unmaps them, the mmap_lock traffic of the 2008 report. Timed untraced and under each
//! tool, a fresh clamd every run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::{read_proc_stat, read_report, start_tool, Tool, EXIT_TIMEOUT};
use crate::cmd::Cmd;
use crate::demo::Guarded;

/// The scenario's name in `--only` and the tables.
pub const NAME: &str = "clamd scan";

/// The trees scanned: documentation, manuals and translations, about 20 000 files of every
/// kind clamd opens (text, gzip, HTML, PDF, .mo).
pub const TREES: [&str; 3] = ["/usr/share/doc", "/usr/share/man", "/usr/share/locale"];

/// The tools the scan runs under: untraced, the floor, and the two modes the goals name.
pub const TOOLS: [Tool; 4] = [
    Tool::Untraced,
    Tool::FloorBtf,
    Tool::Mmapsem,
    Tool::MmapsemLean,
];

/// The MD5 signature of the EICAR test file: a database clamd accepts, that matches nothing
/// a system tree holds.
const EICAR_HDB: &str = "44d88612fea8a8f36de82e1278abb02f:68:Eicar-Test-Signature\n";
const CLAMD_WORKERS: u32 = 8;

/// One scan.
#[derive(Debug, Default)]
pub struct Scan {
    pub seconds: f64,
    /// The report's `self_cost.own_cost_share` (the modes that write one).
    pub reported_cost: Option<f64>,
    pub lost: BTreeMap<String, u64>,
    /// The tracer's CPU time over the scan, as a share of one core.
    pub tracer_cpu_share: Option<f64>,
}

/// clamd's private files.
pub struct Setup {
    dir: PathBuf,
}

impl Setup {
    pub fn new() -> Result<Self> {
        let dir = std::env::temp_dir().join("mmapsem-bench-clamd");
        // A fresh directory of our own: nothing another user left there is trusted.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::create_dir(dir.join("db"))?;
        std::fs::create_dir(dir.join("tmp"))?;
        std::fs::write(dir.join("db/eicar.hdb"), EICAR_HDB)?;
        std::fs::write(dir.join("clamd.conf"), config(&dir))?;
        Ok(Self { dir })
    }

    fn config_file(&self) -> PathBuf {
        self.dir.join("clamd.conf")
    }

    /// Starts clamd in the foreground and waits until it answers on its socket.
    fn start_clamd(&self) -> Result<Guarded> {
        let config = self.config_file();
        let config = config.display().to_string();
        let clamd = Cmd::new("clamd").arg(format!("--config-file={config}"));
        let clamd = Guarded::new("clamd", clamd.spawn(Stdio::null(), Stdio::null())?);
        Cmd::new("clamdscan")
            .args(&[&format!("--config-file={config}"), "--ping", "60:1"])
            .probe_ok()
            .context("clamd did not answer its ping within 60 s")?;
        Ok(clamd)
    }

    /// A fresh clamd under `tool`, one scan of TREES, then clamd stopped.
    pub fn scan_once(&self, tool: Tool) -> Result<Scan> {
        let mut clamd = self.start_clamd()?;
        let pid = clamd.child.id();
        let report = std::env::temp_dir().join(format!("mmapsem-bench-clamd-{pid}.json"));
        let (mut tracer, _) = start_tool(tool, pid, &report)?;
        let tracer_pid = tracer.as_ref().map(|t| t.child.id());
        let cpu_before = tracer_pid.and_then(read_proc_stat);
        let started = Instant::now();
        let scan = Cmd::new("clamdscan")
            .args(&[
                &format!("--config-file={}", self.config_file().display()),
                "--multiscan",
                "--no-summary",
            ])
            .args(&TREES)
            .probe()?;
        let seconds = started.elapsed().as_secs_f64();
        let cpu_after = tracer_pid.and_then(read_proc_stat);
        // 0: nothing found, 1: something matched (an EICAR file in the tree); 2 is an error.
        if scan.status.code().is_none_or(|code| code > 1) {
            bail!("clamdscan failed ({}): {}", scan.status, scan.stderr.trim());
        }
        Cmd::new("kill").args(&["-TERM", &pid.to_string()]).run()?;
        clamd.wait_for(EXIT_TIMEOUT)?;
        let mut scan = Scan {
            seconds,
            ..Scan::default()
        };
        if let Some(tracer) = tracer.as_mut() {
            // `-p` ends with its target and writes its report; the floor exits with it too.
            let status = tracer.wait_for(EXIT_TIMEOUT)?;
            if !status.success() {
                bail!("mmapsem-trace failed ({status})");
            }
        }
        if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
            scan.tracer_cpu_share = Some(after.cpu_seconds_since(&before) / seconds);
        }
        if tool.writes_report() {
            (scan.lost, scan.reported_cost) = read_report(&report)?;
            let _ = std::fs::remove_file(&report);
        }
        Ok(scan)
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config(dir: &Path) -> String {
    format!(
        "Foreground yes\nLocalSocket {dir}/clamd.sock\nDatabaseDirectory {dir}/db\n\
         TemporaryDirectory {dir}/tmp\nMaxThreads {CLAMD_WORKERS}\n",
        dir = dir.display()
    )
}

/// The scans' table: each tool's median scan time against untraced's and the floor's.
pub fn render(scans: &BTreeMap<Tool, Vec<Scan>>, reps: u32) -> String {
    let mut out = format!(
        "\nclamd scan: Debian's clamd ({CLAMD_WORKERS} worker threads, a database of one \
         EICAR signature) restarted for every run, `clamdscan --multiscan {}` timed; {reps} \
         repetitions alternating {}. `vs untraced` is the median scan time over untraced's \
         (the goals: at most 1.03x with the defaults, 1.02x with `--lean`).\n\n\
         | tracer | median scan (s) | vs untraced | vs floor (tp_btf) | reported cost | \
         tracer CPU (% of a core) | lost |\n|---|---:|---:|---:|---:|---:|---|\n",
        TREES.join(" "),
        TOOLS.map(Tool::name).join(" / ")
    );
    let median_of = |tool: Tool, value: &dyn Fn(&Scan) -> Option<f64>| {
        let mut values: Vec<f64> = scans.get(&tool)?.iter().filter_map(value).collect();
        (!values.is_empty()).then(|| super::median(&mut values))
    };
    let seconds = |tool: Tool| median_of(tool, &|s| Some(s.seconds));
    for tool in TOOLS {
        let Some(median) = seconds(tool) else {
            continue;
        };
        let ratio = |reference: Tool| {
            seconds(reference).map_or("-".into(), |r| format!("{:.3}x", median / r))
        };
        let percent =
            |v: Option<f64>| v.map_or("-".to_string(), |share| format!("{:.1}%", share * 100.0));
        let lost: BTreeMap<&str, u64> = scans[&tool]
            .iter()
            .flat_map(|s| s.lost.iter().map(|(name, n)| (name.as_str(), *n)))
            .fold(BTreeMap::new(), |mut all, (name, n)| {
                *all.entry(name).or_default() += n;
                all
            });
        let lost: Vec<String> = lost.iter().map(|(name, n)| format!("{name} {n}")).collect();
        out.push_str(&format!(
            "| {} | {median:.2} | {} | {} | {} | {} | {} |\n",
            tool.name(),
            ratio(Tool::Untraced),
            ratio(Tool::FloorBtf),
            percent(median_of(tool, &|s| s.reported_cost)),
            percent(median_of(tool, &|s| s.tracer_cpu_share)),
            if lost.is_empty() {
                "0".to_string()
            } else {
                lost.join(", ")
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_gives_each_tool_its_median_against_untraced() {
        let scan = |seconds: f64| Scan {
            seconds,
            ..Scan::default()
        };
        let mut scans = BTreeMap::new();
        scans.insert(Tool::Untraced, vec![scan(10.0), scan(12.0), scan(11.0)]);
        scans.insert(Tool::FloorBtf, vec![scan(11.0)]);
        scans.insert(
            Tool::MmapsemLean,
            vec![Scan {
                seconds: 11.55,
                reported_cost: Some(0.02),
                lost: BTreeMap::from([("reader_overflow".to_string(), 3)]),
                tracer_cpu_share: Some(0.015),
            }],
        );
        let table = render(&scans, 3);
        assert!(
            table.contains("| mmapsem-trace --lean | 11.55 | 1.050x | 1.050x | 2.0% | 1.5% | reader_overflow 3 |"),
            "{table}"
        );
        assert!(table.contains("| untraced | 11.00 | 1.000x |"), "{table}");
        assert!(!table.contains("| mmapsem-trace |"), "{table}");
    }

    #[test]
    fn clamd_gets_a_private_socket_database_and_temporary_directory() {
        let text = config(Path::new("/tmp/x"));
        for line in [
            "Foreground yes",
            "LocalSocket /tmp/x/clamd.sock",
            "DatabaseDirectory /tmp/x/db",
            "TemporaryDirectory /tmp/x/tmp",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
    }
}

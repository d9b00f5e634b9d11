//! Pure parsers for what the tools and the kernel print. Kept apart so that each can be tested
//! against real output.

use std::collections::BTreeMap;

/// Whether `rustup toolchain list` shows the toolchain that `+nightly` resolves to. A dated
/// nightly (`nightly-2026-05-19-x86_64-...`) does not count: `rustc +nightly` would not use it.
pub fn has_nightly_toolchain(toolchain_list: &str) -> bool {
    toolchain_list
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .any(|name| match name.strip_prefix("nightly") {
            Some("") => true,
            Some(rest) => rest
                .strip_prefix('-')
                .and_then(|host| host.chars().next())
                .is_some_and(|c| !c.is_ascii_digit()),
            None => false,
        })
}

/// The LLVM version line of `rustc -vV` (`LLVM version: 22.1.4`), as (major, full version).
pub fn rustc_llvm_version(rustc_vv: &str) -> Option<(u32, String)> {
    let version = rustc_vv
        .lines()
        .find_map(|line| line.trim().strip_prefix("LLVM version:"))?
        .trim();
    let major = leading_number(version)?;
    Some((major, version.to_owned()))
}

/// How a binary links libLLVM, read from `ldd` output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkedLlvm {
    /// No libLLVM among the shared libraries: LLVM is linked statically (or not at all).
    NotDynamic,
    /// Links `soname`, whose major version could be read (`libLLVM.so.22.1`, `libLLVM-22.so`).
    Dynamic {
        soname: String,
        major: Option<u32>,
        /// False when ldd says `not found`: the binary cannot run.
        resolved: bool,
    },
}

/// Reads the libLLVM dependency from `ldd` output. bpf-linker's `--version` does not name
/// LLVM (it prints `bpf-linker 0.13.0`), so the shared library it links is the evidence.
/// Upstream LLVM names it `libLLVM.so.22.1`; older Debian packages used `libLLVM-14.so.1`.
pub fn ldd_linked_llvm(ldd_output: &str) -> LinkedLlvm {
    for line in ldd_output.lines() {
        let Some(soname) = line.split_whitespace().next() else {
            continue;
        };
        if !soname.starts_with("libLLVM") {
            continue;
        }
        let major = soname
            .strip_prefix("libLLVM.so.")
            .or_else(|| soname.strip_prefix("libLLVM-"))
            .and_then(leading_number);
        return LinkedLlvm::Dynamic {
            soname: soname.to_owned(),
            major,
            resolved: !line.contains("not found"),
        };
    }
    LinkedLlvm::NotDynamic
}

/// The `llvm-N` feature cargo recorded for an installed bpf-linker in `$CARGO_HOME/.crates2.json`.
/// Used only for statically linked bpf-linkers, where ldd has nothing to say. `None` when
/// bpf-linker is not recorded or was built with default features (whose LLVM depends on the
/// bpf-linker version).
pub fn crates2_bpf_linker_llvm_major(crates2_json: &str) -> Option<u32> {
    let root: serde_json::Value = serde_json::from_str(crates2_json).ok()?;
    let (_, install) = root
        .get("installs")?
        .as_object()?
        .iter()
        .find(|(key, _)| key.starts_with("bpf-linker "))?;
    install
        .get("features")?
        .as_array()?
        .iter()
        .filter_map(|feature| feature.as_str()?.strip_prefix("llvm-"))
        .find_map(|major| major.parse().ok())
}

/// Whether `dpkg -s` output says the package is installed (not merely known, removed with
/// its configuration left behind, or half-installed).
pub fn dpkg_says_installed(dpkg_status: &str) -> bool {
    dpkg_status
        .lines()
        .any(|line| line.trim() == "Status: install ok installed")
}

/// The effective uid from `/proc/self/status` (`Uid: real effective saved fs`).
pub fn effective_uid(proc_status: &str) -> Option<u32> {
    proc_status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether `/proc/self/mounts` has a tracefs mounted at `mount_point`. Reading the mount table
/// works without root, unlike looking inside `/sys/kernel/tracing` (mode 0700).
pub fn tracefs_mounted_at(mounts: &str, mount_point: &str) -> bool {
    mounts.lines().any(|line| {
        let mut fields = line.split_whitespace();
        let _source = fields.next();
        fields.next() == Some(mount_point) && fields.next() == Some("tracefs")
    })
}

/// The pid in the workload's first line, `ready pid=<pid>`.
pub fn ready_pid(line: &str) -> Option<u32> {
    line.trim().strip_prefix("ready pid=")?.trim().parse().ok()
}

/// The instructions the verifier processed for one program, from mmapsem-trace's `-v` line
/// `NAME: the verifier processed N instructions (budget B), loaded in T ms`.
pub fn verified_instructions(line: &str) -> Option<u64> {
    let rest = line.split("the verifier processed ").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

/// Units of work per second from a workload's summary line
/// (`files_read=123 bytes=... elapsed_ns=3000000000 ...`), found by its first key.
pub fn work_rate(output: &[String], work_key: &str) -> Option<f64> {
    output.iter().find_map(|line| {
        let fields: Vec<(&str, &str)> = line
            .split_whitespace()
            .filter_map(|word| word.split_once('='))
            .collect();
        if fields.first()?.0 != work_key {
            return None;
        }
        let value =
            |key: &str| -> Option<f64> { fields.iter().find(|(k, _)| *k == key)?.1.parse().ok() };
        let elapsed_ns = value("elapsed_ns").filter(|ns| *ns > 0.0)?;
        Some(value(work_key)? / (elapsed_ns / 1e9))
    })
}

/// CPU time of a process from `/proc/PID/stat`, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub utime_ticks: u64,
    pub stime_ticks: u64,
}

/// Linux's USER_HZ, which /proc reports times in, on every architecture this runs on.
const TICKS_PER_SECOND: f64 = 100.0;

impl ProcStat {
    pub fn cpu_seconds_since(&self, earlier: &Self) -> f64 {
        let ticks = (self.utime_ticks + self.stime_ticks)
            .saturating_sub(earlier.utime_ticks + earlier.stime_ticks);
        ticks as f64 / TICKS_PER_SECOND
    }
}

/// utime and stime (fields 14 and 15) of `/proc/PID/stat`, counted after the `)` that ends
/// the command name, which may itself hold spaces and parentheses.
pub fn proc_stat(stat: &str) -> Option<ProcStat> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_comm.split_whitespace().skip(11);
    Some(ProcStat {
        utime_ticks: fields.next()?.parse().ok()?,
        stime_ticks: fields.next()?.parse().ok()?,
    })
}

/// `VmHWM:` (peak resident set) of `/proc/PID/status`, in KiB.
pub fn vm_hwm_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `VmRSS:` (resident set now) of `/proc/PID/status`, in KiB.
pub fn vm_rss_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A BPF map from the fdinfo of a file descriptor that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapFdinfo {
    pub id: u32,
    pub map_type: u32,
    pub max_entries: u64,
}

impl MapFdinfo {
    /// HASH, PERCPU_HASH, LRU_HASH, LRU_PERCPU_HASH: the map types that fill up as keys come.
    pub fn is_hash(&self) -> bool {
        matches!(self.map_type, 1 | 5 | 9 | 10)
    }
}

/// The number after `key:` in a /proc/PID/fdinfo file.
fn fdinfo_value(fdinfo: &str, key: &str) -> Option<u64> {
    fdinfo
        .lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))?
        .trim()
        .parse()
        .ok()
}

pub fn bpf_map_fdinfo(fdinfo: &str) -> Option<MapFdinfo> {
    let value = |key: &str| fdinfo_value(fdinfo, key);
    Some(MapFdinfo {
        id: u32::try_from(value("map_id")?).ok()?,
        map_type: u32::try_from(value("map_type")?).ok()?,
        max_entries: value("max_entries")?,
    })
}

/// The first `model name` of `/proc/cpuinfo`.
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find(|line| line.starts_with("model name"))?
        .split_once(':')
        .map(|(_, model)| model.trim().to_owned())
}

/// A BPF program's counters from the fdinfo of a file descriptor that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgFdinfo {
    pub id: u32,
    pub run_time_ns: u64,
    pub run_cnt: u64,
}

pub fn bpf_prog_fdinfo(fdinfo: &str) -> Option<ProgFdinfo> {
    let value = |key: &str| fdinfo_value(fdinfo, key);
    Some(ProgFdinfo {
        id: u32::try_from(value("prog_id")?).ok()?,
        // Absent while kernel.bpf_stats_enabled is 0.
        run_time_ns: value("run_time_ns").unwrap_or(0),
        run_cnt: value("run_cnt").unwrap_or(0),
    })
}

/// Program id -> name from `bpftool -j prog show`.
pub fn bpftool_program_names(json: &str) -> anyhow::Result<BTreeMap<u32, String>> {
    let programs: serde_json::Value = serde_json::from_str(json)?;
    Ok(programs
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|p| {
                    let id = u32::try_from(p["id"].as_u64()?).ok()?;
                    Some((id, p["name"].as_str().unwrap_or("?").to_owned()))
                })
                .collect()
        })
        .unwrap_or_default())
}

fn leading_number(text: &str) -> Option<u32> {
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifier_counts_are_read_from_the_tracers_info_lines() {
        let line = "[INFO  tracer::probes] btf_acquire_returned: the verifier processed 33650 \
                    instructions (budget 150000), loaded in 55 ms";
        assert_eq!(verified_instructions(line), Some(33650));
        assert_eq!(verified_instructions("mmapsem-trace: attached"), None);
        assert_eq!(verified_instructions("the verifier processed many"), None);
    }

    #[test]
    fn nightly_toolchain_is_found_in_rustup_list() {
        let list = "stable-x86_64-unknown-linux-gnu (active, default)\n\
                    nightly-x86_64-unknown-linux-gnu\n\
                    1.95.0-x86_64-unknown-linux-gnu\n";
        assert!(has_nightly_toolchain(list));
        assert!(has_nightly_toolchain("nightly\n"));
    }

    #[test]
    fn dated_nightly_or_no_nightly_does_not_count() {
        assert!(!has_nightly_toolchain(
            "stable-x86_64-unknown-linux-gnu (active, default)\n\
             nightly-2026-05-19-x86_64-unknown-linux-gnu\n"
        ));
        assert!(!has_nightly_toolchain("no installed toolchains\n"));
        assert!(!has_nightly_toolchain(""));
    }

    #[test]
    fn llvm_version_from_rustc_vv() {
        let vv = "rustc 1.97.0-nightly (e50aa6fba 2026-05-19)\n\
                  binary: rustc\n\
                  commit-hash: e50aa6fba4e63ab34c72bf9acfd2c307c1155d1a\n\
                  commit-date: 2026-05-19\n\
                  host: x86_64-unknown-linux-gnu\n\
                  release: 1.97.0-nightly\n\
                  LLVM version: 22.1.4\n";
        assert_eq!(rustc_llvm_version(vv), Some((22, "22.1.4".to_owned())));
    }

    #[test]
    fn rustc_vv_without_llvm_line_gives_none() {
        assert_eq!(
            rustc_llvm_version("rustc 1.97.0-nightly\nbinary: rustc\n"),
            None
        );
        assert_eq!(rustc_llvm_version("LLVM version: unknown\n"), None);
    }

    #[test]
    fn ldd_with_upstream_soname() {
        // Real output for bpf-linker 0.13.0 built with --features llvm-22 on Debian 12.
        let ldd = "\tlinux-vdso.so.1 (0x00007fac01aa6000)\n\
            \tlibLLVM.so.22.1 => /usr/lib/llvm-22/lib/libLLVM.so.22.1 (0x00007fabf8800000)\n\
            \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007fac01a75000)\n\
            \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007fabf861e000)\n";
        assert_eq!(
            ldd_linked_llvm(ldd),
            LinkedLlvm::Dynamic {
                soname: "libLLVM.so.22.1".to_owned(),
                major: Some(22),
                resolved: true
            }
        );
    }

    #[test]
    fn ldd_with_debian_soname_and_missing_library() {
        let ldd = "\tlibLLVM-14.so.1 => not found\n\tlibc.so.6 => /lib/libc.so.6 (0x1)\n";
        assert_eq!(
            ldd_linked_llvm(ldd),
            LinkedLlvm::Dynamic {
                soname: "libLLVM-14.so.1".to_owned(),
                major: Some(14),
                resolved: false
            }
        );
    }

    #[test]
    fn ldd_of_static_binary() {
        assert_eq!(
            ldd_linked_llvm("\tnot a dynamic executable\n"),
            LinkedLlvm::NotDynamic
        );
        assert_eq!(
            ldd_linked_llvm("\tlibc.so.6 => /lib/libc.so.6 (0x1)\n"),
            LinkedLlvm::NotDynamic
        );
    }

    #[test]
    fn crates2_records_the_llvm_feature() {
        let json = r#"{"installs":{
            "bpf-linker 0.13.0 (registry+https://github.com/rust-lang/crates.io-index)":{
              "version_req":null,"bins":["bpf-linker"],"features":["llvm-22"],
              "all_features":false,"no_default_features":true,"profile":"release"},
            "ripgrep 14.0.0 (registry+https://github.com/rust-lang/crates.io-index)":{
              "features":["llvm-99"]}}}"#;
        assert_eq!(crates2_bpf_linker_llvm_major(json), Some(22));
    }

    #[test]
    fn crates2_without_llvm_feature_or_entry() {
        let defaults = r#"{"installs":{"bpf-linker 0.13.0 (registry+x)":{"features":[]}}}"#;
        assert_eq!(crates2_bpf_linker_llvm_major(defaults), None);
        assert_eq!(crates2_bpf_linker_llvm_major(r#"{"installs":{}}"#), None);
        assert_eq!(crates2_bpf_linker_llvm_major("not json"), None);
    }

    #[test]
    fn dpkg_status_lines() {
        assert!(dpkg_says_installed(
            "Package: llvm-22-dev\nStatus: install ok installed\nPriority: optional\n"
        ));
        assert!(!dpkg_says_installed(
            "Package: llvm-22-dev\nStatus: deinstall ok config-files\n"
        ));
        assert!(!dpkg_says_installed(""));
    }

    #[test]
    fn effective_uid_is_the_second_uid_field() {
        let status = "Name:\tcat\nUmask:\t0022\nUid:\t1000\t0\t0\t0\nGid:\t0\t0\t0\t0\n";
        assert_eq!(effective_uid(status), Some(0));
        assert_eq!(effective_uid("Name:\tcat\n"), None);
    }

    #[test]
    fn tracefs_mount_is_found_by_mount_point_and_type() {
        let mounts = "sysfs /sys sysfs rw,nosuid 0 0\n\
                      nodev /sys/kernel/tracing tracefs rw,relatime 0 0\n";
        assert!(tracefs_mounted_at(mounts, "/sys/kernel/tracing"));
        assert!(!tracefs_mounted_at(mounts, "/sys/kernel/debug/tracing"));
        assert!(!tracefs_mounted_at(
            "none /sys/kernel/tracing debugfs rw 0 0\n",
            "/sys/kernel/tracing"
        ));
    }

    #[test]
    fn workload_ready_line() {
        assert_eq!(ready_pid("ready pid=4242\n"), Some(4242));
        assert_eq!(ready_pid("started"), None);
        assert_eq!(ready_pid("ready pid=abc"), None);
    }

    #[test]
    fn work_rate_divides_the_count_by_elapsed_time() {
        let out = vec![
            "ready pid=1".to_owned(),
            "files_read=300 bytes=9 elapsed_ns=3000000000 method=mmap".to_owned(),
        ];
        assert_eq!(work_rate(&out, "files_read"), Some(100.0));
        assert_eq!(work_rate(&out, "iterations"), None);
        assert_eq!(
            work_rate(&["iterations=5 elapsed_ns=0".to_owned()], "iterations"),
            None
        );
    }

    #[test]
    fn proc_stat_survives_spaces_and_parentheses_in_comm() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 1 0";
        let parsed = proc_stat(stat).unwrap();
        assert_eq!((parsed.utime_ticks, parsed.stime_ticks), (250, 30));
        let before = ProcStat {
            utime_ticks: 100,
            stime_ticks: 30,
        };
        assert_eq!(parsed.cpu_seconds_since(&before), 1.5);
    }

    #[test]
    fn status_and_cpuinfo_fields() {
        assert_eq!(vm_hwm_kib("Name:\tx\nVmHWM:\t   12345 kB\n"), Some(12345));
        assert_eq!(vm_hwm_kib("Name:\tx\n"), None);
        assert_eq!(
            cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n").as_deref(),
            Some("AMD EPYC 7B13")
        );
    }

    #[test]
    fn prog_fdinfo_with_and_without_stats() {
        let info = "pos:\t0\nprog_type:\t5\nprog_id:\t1683\nrun_time_ns:\t5000\nrun_cnt:\t10\n";
        assert_eq!(
            bpf_prog_fdinfo(info),
            Some(ProgFdinfo {
                id: 1683,
                run_time_ns: 5000,
                run_cnt: 10
            })
        );
        assert_eq!(bpf_prog_fdinfo("prog_id:\t7\n").unwrap().run_cnt, 0);
        assert_eq!(bpf_prog_fdinfo("pos:\t0\n"), None);
    }

    #[test]
    fn bpftool_names_by_id() {
        let names =
            bpftool_program_names(r#"[{"id":3,"name":"mmap_lock_start"},{"id":4}]"#).unwrap();
        assert_eq!(names[&3], "mmap_lock_start");
        assert_eq!(names[&4], "?");
    }

    #[test]
    fn map_fdinfo_and_rss() {
        let info = "pos:\t0\nmap_type:\t9\nkey_size:\t16\nmax_entries:\t16384\nmap_id:\t42\n";
        let map = bpf_map_fdinfo(info).unwrap();
        assert_eq!((map.id, map.max_entries, map.is_hash()), (42, 16384, true));
        let array = "map_type:\t2\nmax_entries:\t1\nmap_id:\t7\n";
        assert!(!bpf_map_fdinfo(array).unwrap().is_hash());
        assert_eq!(bpf_map_fdinfo("pos:\t0\n"), None);
        assert_eq!(vm_rss_kib("VmHWM:\t 9 kB\nVmRSS:\t 7 kB\n"), Some(7));
    }
}

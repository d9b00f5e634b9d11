//! The command line: the options in groups, one per concern (`target`, `report` with the
//! exports, `collect` with the map sizes), `serve`'s own, the value parsers, and the policy that
//! turns them into a view.

mod collect;
mod parse;
mod report;
mod serve;
mod target;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand, ValueEnum};

pub use collect::{CollectArgs, MapArgs, SelfCostArg, TestingArgs, UserStackArg};
pub use parse::parse_duration_ns;
pub use report::{ExportArgs, Format, ReportArgs, View, WeightArg};
pub use serve::{ServeArgs, DEFAULT_LISTEN};
pub use target::TargetArgs;

/// Who waits on a process's mmap_lock, for how long, and doing what: wait and hold time per call
/// stack, from the kernel's mmap_lock tracepoints.
#[derive(Debug, Parser)]
#[command(name = "mmapsem-trace", version)]
#[command(group = clap::ArgGroup::new("target").args(["pid", "all", "command"]).required(true))]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Cli {
    #[command(subcommand)]
    pub action: Option<Action>,

    #[command(flatten)]
    pub target: TargetArgs,

    #[command(flatten)]
    pub report: ReportArgs,

    #[command(flatten)]
    pub exports: ExportArgs,

    #[command(flatten)]
    pub collect: CollectArgs,

    #[command(flatten)]
    pub maps: MapArgs,

    #[command(flatten)]
    pub testing: TestingArgs,

    /// More logging on stderr, the BPF maps' memory among it (repeat for more).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Debug, Subcommand)]
pub enum Action {
    /// Trace continuously (every process, unless -p or --comm narrows it) and serve it over
    /// HTTP: /metrics (OpenMetrics or Prometheus text) and /debug/pprof/mmap_lock?seconds=N
    /// (a pprof profile of the next N seconds). Timing only unless --stacks. Runs until
    /// SIGTERM, SIGINT or SIGHUP (with -p: until those processes have exited).
    Serve(ServeArgs),
    /// Print the man page or a shell's completions on stdout (`cargo xtask package` uses it).
    #[command(hide = true)]
    Generate {
        #[arg(value_enum)]
        what: Generated,
    },
}

/// What `generate` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Generated {
    Man,
    /// The page of `serve` (mmapsem-trace-serve(1)).
    ManServe,
    Bash,
    Zsh,
    Fish,
}

/// The man page (roff) or completions of the whole command line, serve included.
pub fn generate(what: Generated, out: &mut dyn std::io::Write) -> Result<()> {
    use clap::CommandFactory as _;
    let mut command = Cli::command();
    let name = command.get_name().to_string();
    let shell = match what {
        Generated::Man => {
            clap_mangen::Man::new(command).render(out)?;
            return Ok(());
        }
        Generated::ManServe => {
            command.build();
            let serve = command
                .find_subcommand("serve")
                .context("no serve subcommand")?
                .clone()
                .name("mmapsem-trace-serve")
                .version(env!("CARGO_PKG_VERSION"));
            clap_mangen::Man::new(serve).render(out)?;
            return Ok(());
        }
        Generated::Bash => clap_complete::Shell::Bash,
        Generated::Zsh => clap_complete::Shell::Zsh,
        Generated::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut command, name, out);
    Ok(())
}

/// `-o -`: the report goes to standard output.
pub const STDOUT_NAME: &str = "-";

/// Default refresh of the live view.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// The longest -d or -i: far beyond any trace, and far from where Instant + Duration
/// arithmetic could overflow.
pub const MAX_SECONDS: f64 = 10.0 * 365.0 * 86_400.0;

/// `pids` without repetitions, in the order first given (`-p W,W` traces W once, and counts its
/// threads' time once).
pub fn unique_pids(pids: &[u32]) -> Vec<u32> {
    let mut seen = std::collections::HashSet::new();
    pids.iter().copied().filter(|p| seen.insert(*p)).collect()
}

impl Cli {
    /// `serve`'s arguments, when that is what was asked for.
    pub fn serve(&self) -> Option<&ServeArgs> {
        match &self.action {
            Some(Action::Serve(args)) => Some(args),
            _ => None,
        }
    }

    /// `serve` as a trace: system-wide unless -p, timing only unless --stacks (then frame
    /// pointers: no stack copies), nothing on the terminal.
    pub fn with_serve_settings(mut self) -> Self {
        let Some(serve) = self.serve().cloned() else {
            return self;
        };
        self.target.all = serve.pid.is_empty();
        self.target.pid = serve.pid;
        self.target.cgroups = serve.cgroups;
        self.collect.lean = !serve.stacks;
        self.collect.user_stack = UserStackArg::Fp;
        self.report.no_live = true;
        self.verbose = serve.verbose;
        self
    }

    /// The file of `-o`, unless it is `-` (standard output).
    pub fn output_file(&self) -> Option<&Path> {
        self.report
            .output
            .as_deref()
            .filter(|path| *path != Path::new(STDOUT_NAME))
    }

    /// `--stack-threshold`, or never with --lean.
    pub fn stack_threshold(&self) -> u64 {
        if self.collect.lean {
            u64::MAX
        } else {
            self.collect.stack_threshold
        }
    }

    /// `--user-stack`, with the older `--no-user-stacks` meaning `none`.
    pub fn user_stack(&self) -> UserStackArg {
        if self.collect.no_user_stacks || self.collect.lean {
            UserStackArg::None
        } else {
            self.collect.user_stack
        }
    }
}

/// A clap usage error on one line: its message and tips without the usage block, then a
/// pointer to --help (once: clap's own "For more information, try '--help'." is dropped).
pub fn one_line(err: &clap::Error) -> String {
    let text = err.to_string();
    let message = text.split("\nUsage:").next().unwrap_or(&text);
    let parts: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("For more information, try"))
        .collect();
    let joined = parts.join(" ");
    let joined = joined.strip_prefix("error: ").unwrap_or(&joined);
    format!("{joined} (see --help)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("0").unwrap(), 0);
        assert_eq!(parse_duration_ns("750ns").unwrap(), 750);
        assert_eq!(parse_duration_ns("10us").unwrap(), 10_000);
        assert_eq!(parse_duration_ns("10µs").unwrap(), 10_000);
        assert_eq!(parse_duration_ns("1.5ms").unwrap(), 1_500_000);
        assert_eq!(parse_duration_ns("2s").unwrap(), 2_000_000_000);
        assert!(parse_duration_ns("fast").is_err());
        assert!(parse_duration_ns("3 weeks").is_err());
    }

    fn usage_error(args: &[&str]) -> String {
        let err = Cli::try_parse_from(["mmapsem-trace"].iter().chain(args)).unwrap_err();
        one_line(&err)
    }

    #[test]
    fn map_sizes_and_stack_bytes_are_range_checked() {
        for (flag, bad) in [
            ("--max-entries", "0"),
            ("--max-entries", "4294967295"),
            ("--max-stacks", "0"),
            ("--max-stacks", "2000000"),
            ("--user-stack-bytes", "0"),
            ("--user-stack-bytes", "1000000"),
        ] {
            let line = usage_error(&["-p", "1", flag, bad]);
            assert!(line.contains(flag), "names the flag: {line}");
            assert!(line.contains(" is not in 1..="), "gives the range: {line}");
        }
        assert_eq!(cli(&["--max-entries", "1048576"]).maps.max_entries, 1 << 20);
        assert_eq!(
            cli(&["--user-stack-bytes", "65536"])
                .collect
                .user_stack_bytes,
            65536
        );
    }

    #[test]
    fn absurd_durations_and_intervals_are_usage_errors() {
        for bad in ["NaN", "-1", "0", "inf", "1e20", "soon"] {
            let line = usage_error(&["-p", "1", "-d", bad]);
            assert!(line.contains("'--duration <SECS>'"), "{line}");
            assert!(line.contains("10 years"), "gives the range: {line}");
        }
        let line = usage_error(&["-p", "1", "-d=-1"]);
        assert!(line.contains("--duration"), "{line}");
        for bad in ["1e30", "inf", "NaN", "0.01"] {
            let line = usage_error(&["-p", "1", "-i", bad]);
            assert!(line.contains("'--interval <SECS>'"), "{line}");
        }
        assert_eq!(cli(&["-d", "0.5"]).target.duration, Some(0.5));
        assert_eq!(cli(&["-d", "315360000"]).target.duration, Some(MAX_SECONDS));
        assert_eq!(
            cli(&["-i", "315360000"]).report.interval,
            Some(Duration::from_secs(315_360_000))
        );
    }

    #[test]
    fn negative_or_zero_pids_are_named_not_taken_for_commands() {
        for bad in ["-1", "0", "1,-5"] {
            let line = usage_error(&["-p", bad]);
            assert!(line.contains("invalid value '"), "{line}");
            assert!(line.contains("for '--pid "), "{line}");
            assert!(line.contains("not a process id"), "{line}");
            assert!(!line.contains("'-- "), "no tip to run a command: {line}");
        }
    }

    #[test]
    fn usage_errors_point_to_help_once() {
        let line = usage_error(&["-p", "x"]);
        assert_eq!(line.matches("--help").count(), 1, "{line}");
        assert!(line.ends_with("(see --help)"), "{line}");
    }

    #[test]
    fn missing_target_names_every_kind() {
        let line = usage_error(&[]);
        for kind in ["--pid", "--all", "CMD"] {
            assert!(line.contains(kind), "{kind} missing from: {line}");
        }
    }

    #[test]
    fn dash_output_is_stdout() {
        assert_eq!(cli(&["-o", "-"]).output_file(), None);
        assert_eq!(
            cli(&["-o", "r.txt"]).output_file(),
            Some(Path::new("r.txt"))
        );
        // Interval reports already go to stdout: no second, whole-trace report there.
        let intervals = View::Intervals {
            interval: DEFAULT_INTERVAL,
        };
        assert!(!cli(&["-i", "1", "-o", "-"]).final_report_wanted(&intervals));
        assert!(cli(&["-i", "1", "--format", "json", "-o", "-"])
            .view(false)
            .is_err());
    }

    #[test]
    fn repeated_pids_count_once() {
        assert_eq!(unique_pids(&[5, 3, 5, 3, 9]), vec![5, 3, 9]);
        assert!(unique_pids(&[]).is_empty());
    }

    #[test]
    fn parses_pid_lists() {
        let cli =
            Cli::try_parse_from(["mmapsem-trace", "-p", "1,2", "-d", "3", "--format", "json"])
                .unwrap();
        assert_eq!(cli.target.pid, vec![1, 2]);
        assert_eq!(cli.target.duration, Some(3.0));
        assert_eq!(cli.report.format, Some(Format::Json));
        assert!(
            Cli::try_parse_from(["mmapsem-trace"]).is_err(),
            "-p is required"
        );
        assert!(Cli::try_parse_from(["mmapsem-trace", "-p", "x"]).is_err());
    }

    #[test]
    fn all_replaces_pids_and_commands() {
        let cli = Cli::try_parse_from(["mmapsem-trace", "-a", "-d", "3"]).unwrap();
        assert!(cli.target.all && cli.target.pid.is_empty() && cli.target.command.is_empty());
        assert!(
            Cli::try_parse_from(["mmapsem-trace", "--all"])
                .unwrap()
                .target
                .all
        );
        assert!(Cli::try_parse_from(["mmapsem-trace", "-a", "-p", "1"]).is_err());
        assert!(Cli::try_parse_from(["mmapsem-trace", "-a", "--", "true"]).is_err());
    }

    #[test]
    fn cgroups_narrow_system_wide_tracing_only() {
        let cli = Cli::try_parse_from(["mmapsem-trace", "-a", "--cgroup", "/a", "--cgroup", "b"])
            .unwrap();
        assert_eq!(cli.target.cgroups, ["/a", "b"]);
        for args in [
            &["mmapsem-trace", "-p", "1", "--cgroup", "/a"][..],
            &["mmapsem-trace", "--cgroup", "/a", "--", "true"],
            &["mmapsem-trace", "serve", "-p", "1", "--cgroup", "/a"],
        ] {
            assert!(Cli::try_parse_from(args).is_err(), "{args:?}");
        }
        let serve = Cli::try_parse_from(["mmapsem-trace", "serve", "--cgroup", "/a"])
            .unwrap()
            .with_serve_settings();
        assert!(serve.target.all);
        assert_eq!(serve.target.cgroups, ["/a"]);
    }

    #[test]
    fn usage_errors_fit_on_one_line() {
        let err = Cli::try_parse_from(["mmapsem-trace", "-a", "-p", "1"]).unwrap_err();
        let line = one_line(&err);
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("'--all' cannot be used with"), "{line}");
        let err = Cli::try_parse_from(["mmapsem-trace"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("--pid"), "names the missing argument: {line}");
        assert!(!line.contains("Usage"), "{line}");
    }

    #[test]
    fn a_command_after_double_dash_replaces_pids() {
        let cli =
            Cli::try_parse_from(["mmapsem-trace", "-d", "1", "--", "make", "-j", "8"]).unwrap();
        assert_eq!(cli.target.command, ["make", "-j", "8"]);
        assert!(cli.target.pid.is_empty());
        assert!(Cli::try_parse_from(["mmapsem-trace", "-p", "1", "--", "true"]).is_err());
    }

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(["mmapsem-trace", "-p", "1"].iter().chain(args)).unwrap()
    }

    #[test]
    fn debug_dirs_must_be_directories() {
        let dir = std::env::temp_dir();
        let given = cli(&["--debug-dir", dir.to_str().unwrap(), "--debug-dir", "/"]);
        assert_eq!(given.report.debug_dir, [dir, std::path::PathBuf::from("/")]);
        let parse = |arg: &str| {
            Cli::try_parse_from(["mmapsem-trace", "-p", "1", "--debug-dir", arg])
                .map(|_| ())
                .map_err(|e| one_line(&e))
        };
        let missing = parse("/no/such/dir").unwrap_err();
        assert!(missing.contains("No such file"), "{missing}");
        assert!(parse("/etc/hostname")
            .unwrap_err()
            .contains("not a directory"));
    }

    #[test]
    fn outside_lockers_fold_by_name_unless_per_pid() {
        assert!(!cli(&[]).report.per_pid);
        assert!(cli(&["--per-pid"]).report.per_pid);
    }

    #[test]
    fn live_is_the_default_on_a_terminal_only() {
        let second = Duration::from_secs(1);
        assert_eq!(
            cli(&[]).view(true).unwrap(),
            View::Live { interval: second }
        );
        assert_eq!(cli(&[]).view(false).unwrap(), View::Final);
        assert_eq!(cli(&["--format", "json"]).view(true).unwrap(), View::Final);
        assert_eq!(cli(&["-o", "r.txt"]).view(true).unwrap(), View::Final);
        assert_eq!(cli(&["--no-live"]).view(true).unwrap(), View::Final);
        assert_eq!(
            cli(&["--live", "--format", "csv", "-i", "2"])
                .view(true)
                .unwrap(),
            View::Live {
                interval: Duration::from_secs(2)
            }
        );
        assert!(cli(&["--live"]).view(false).is_err(), "no terminal");
        assert!(Cli::try_parse_from(["mmapsem-trace", "-p", "1", "--live", "--no-live"]).is_err());
        // Exports alone keep the live view.
        assert!(matches!(
            cli(&["--svg", "x.svg"]).view(true).unwrap(),
            View::Live { .. }
        ));
    }

    #[test]
    fn intervals_without_a_terminal() {
        let view = cli(&["-i", "0.5"]).view(false).unwrap();
        assert_eq!(
            view,
            View::Intervals {
                interval: Duration::from_millis(500)
            }
        );
        assert_eq!(
            cli(&["-i", "2", "--no-live"]).view(true).unwrap(),
            View::Intervals {
                interval: Duration::from_secs(2)
            }
        );
        assert!(cli(&["-i", "1", "--format", "json"]).view(false).is_err());
        assert!(cli(&["-i", "1", "--format", "json", "-o", "r.json"])
            .view(false)
            .is_ok());
        assert!(Cli::try_parse_from(["mmapsem-trace", "-p", "1", "-i", "0"]).is_err());
    }

    #[test]
    fn final_report_after_live_only_when_asked() {
        let live = View::Live {
            interval: DEFAULT_INTERVAL,
        };
        assert!(!cli(&[]).final_report_wanted(&live));
        assert!(cli(&["-o", "r.txt", "--live"]).final_report_wanted(&live));
        assert!(cli(&[]).final_report_wanted(&View::Final));
        let intervals = View::Intervals {
            interval: DEFAULT_INTERVAL,
        };
        assert!(!cli(&["-i", "1"]).final_report_wanted(&intervals));
        assert!(cli(&["-i", "1", "-o", "r.txt"]).final_report_wanted(&intervals));
    }

    #[test]
    fn export_flags() {
        let c = cli(&[
            "--folded",
            "f.txt",
            "--svg",
            "f.svg",
            "--weight",
            "hold",
            "--timeline",
            "t.json",
            "--threshold",
            "500us",
        ]);
        assert_eq!(c.exports.weight, WeightArg::Hold);
        assert_eq!(c.exports.threshold, 500_000);
        assert_eq!(
            c.exports.timeline.as_deref(),
            Some(std::path::Path::new("t.json"))
        );
        assert_eq!(cli(&[]).exports.threshold, 1_000_000);
        assert_eq!(cli(&[]).collect.user_stack, UserStackArg::Dwarf);
        assert_eq!(
            cli(&["--user-stack", "fp"]).collect.user_stack,
            UserStackArg::Fp
        );
        assert_eq!(cli(&["--no-user-stacks"]).user_stack(), UserStackArg::None);
    }
}

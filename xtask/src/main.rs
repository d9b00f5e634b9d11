//! `cargo xtask`: sets up, builds, demonstrates and checks mmapsem-trace.

mod bench;
mod check;
mod cmd;
mod demo;
mod package;
mod parse;
mod paths;
mod setup;
mod soak;
mod vm;
mod workspace;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use setup::Tracefs;
use workspace::Profile;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Set up, build, demo and test mmapsem-trace"
)]
struct Cli {
    /// Also print the read-only probes (`rustup toolchain list`, `ldd ...`) setup runs.
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Make this machine ready to build and run: nightly rust-src, bpf-linker for nightly's
    /// LLVM, tracefs. Checks first; acts only when something is missing.
    Setup {
        /// Check, and print what would be installed or mounted without doing it.
        #[arg(long)]
        dry_run: bool,
    },
    /// Build a Debian package (target/package/*.deb): the binary, man pages, bash/zsh/fish
    /// completions and a systemd unit for `serve`.
    Package {
        /// Use the release binary already built instead of running `cargo build --release`.
        #[arg(long)]
        no_build: bool,
    },
    /// Set up, then build the workspace (release unless --debug).
    Build {
        #[arg(long)]
        debug: bool,
    },
    /// Set up, build, and trace the contention workload (needs root).
    Demo {
        /// How long the workload churns once the tracer is attached.
        #[arg(long, default_value_t = 8)]
        seconds: u32,
        /// Use the release binaries already built instead of running `cargo build --release`.
        #[arg(long)]
        no_build: bool,
    },
    /// Measure what tracing costs: each workload untraced, under empty-program floors, under
    /// mmapsem-trace and under the equivalent bpftrace script, alternating; records the table
    /// in BENCHMARKS.md (root).
    Bench {
        /// Repetitions of each (workload, tracer) pair.
        #[arg(long, default_value_t = 5)]
        reps: u32,
        /// How long each workload run lasts.
        #[arg(long, default_value_t = 5)]
        seconds: u32,
        /// Use the release binaries already built instead of running `cargo build --release`.
        #[arg(long)]
        no_build: bool,
        /// Print the table only; leave BENCHMARKS.md alone.
        #[arg(long)]
        no_record: bool,
        /// Run only the workloads whose name contains SCENARIO (`small` for small-files);
        /// needs --no-record.
        #[arg(long, value_name = "SCENARIO")]
        only: Option<String>,
        /// Run only the tracers whose name contains one of these (comma-separated: `lean,perf`),
        /// beside the untraced run and the tp_btf floor; needs --no-record.
        #[arg(long, value_name = "NAMES")]
        tools: Option<String>,
    },
    /// Trace the churn workload for a long time, sampling the tracer's RSS, map occupancy and
    /// lost counters every 10 s; records the curve in BENCHMARKS.md (root).
    Soak {
        #[arg(long, default_value_t = 30)]
        minutes: u32,
        /// Use the release binaries already built instead of running `cargo build --release`.
        #[arg(long)]
        no_build: bool,
        /// Print the table only; leave BENCHMARKS.md alone.
        #[arg(long)]
        no_record: bool,
        /// Soak the daemon (`mmapsem-trace serve`) beside processes that start and exit all
        /// along, instead of a one-shot trace of one workload.
        #[arg(long)]
        serve: bool,
    },
    /// Run CMD as root on a Debian distribution kernel booted under QEMU, this machine's root
    /// file system as the guest's (read-only, under a throwaway overlay); exits with CMD's
    /// status. The kernel and its initramfs are cached under target/vm.
    Vm {
        #[arg(long, value_enum)]
        kernel: vm::Kernel,
        /// Seconds after which the guest is killed.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Set up, build, then cargo test, cargo fmt --check and cargo clippy -D warnings.
    Test {
        /// Passed to the test harness (`-- --nocapture`); if they contain their own `--`,
        /// to `cargo test` itself (`-- -p tracer -- --nocapture`).
        #[arg(last = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cmd::set_verbose(cli.verbose);
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Setup { dry_run } => setup::run(setup::Options {
            dry_run,
            tracefs: Tracefs::Require,
        }),
        Command::Build { debug } => {
            setup::run(setup::Options {
                dry_run: false,
                // Building needs no tracefs.
                tracefs: Tracefs::Skip,
            })?;
            workspace::build(if debug {
                Profile::Debug
            } else {
                Profile::Release
            })
        }
        Command::Demo { seconds, no_build } => demo::run(seconds, !no_build),
        Command::Bench {
            reps,
            seconds,
            no_build,
            no_record,
            only,
            tools,
        } => bench::run(&bench::Options {
            reps,
            seconds,
            build: !no_build,
            record: !no_record,
            only,
            tools,
        }),
        Command::Package { no_build } => package::run(!no_build).map(|_| ()),
        Command::Soak {
            minutes,
            no_build,
            no_record,
            serve,
        } => soak::run(minutes, !no_build, !no_record, serve),
        Command::Test { args } => check::run(&args),
        Command::Vm {
            kernel,
            timeout,
            command,
        } => {
            let timeout = std::time::Duration::from_secs(timeout);
            let status =
                vm::prepare(kernel)?.run(&command, &[], timeout, &mut |line| println!("{line}"))?;
            // The command's own status, as `ssh host CMD` passes it out.
            std::process::exit(status)
        }
    }
}

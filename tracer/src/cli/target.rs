//! What is traced, and for how long.

use clap::Args;

use super::parse::{parse_duration_secs, parse_pid};

/// What is traced, and for how long.
#[derive(Debug, Args)]
#[command(next_help_heading = "Target")]
pub struct TargetArgs {
    /// Process id(s) to trace, comma-separated.
    #[arg(
        short,
        long,
        value_delimiter = ',',
        // `-p -1` reaches parse_pid, which says what is wrong, instead of clap suggesting
        // `-- -1` (which would run a command named -1).
        allow_negative_numbers = true,
        value_parser = parse_pid,
        conflicts_with = "command",
        value_name = "PID[,PID...]"
    )]
    pub pid: Vec<u32>,

    /// Instead of -p: trace every user process's mmap_lock, with a per-process split (until
    /// -d, Ctrl-C, SIGTERM or SIGHUP).
    #[arg(short = 'a', long = "all", conflicts_with_all = ["pid", "command"])]
    pub all: bool,

    /// With -a: only the processes of this cgroup (v2) and of the cgroups below it, as
    /// /proc/PID/cgroup writes it (`/system.slice/redis.service`) or its directory; repeat for
    /// more. A process's own locks are traced when it is in one of them (outside lockers of
    /// its lock, whatever their cgroup, with it).
    #[arg(long = "cgroup", value_name = "PATH", conflicts_with_all = ["pid", "command"])]
    pub cgroups: Vec<String>,

    /// Instead of -p: run this command, traced from its first instruction with every process it
    /// starts (forked and exec'd children, theirs too), and exit with its status
    /// (`mmapsem-trace -- make -j8`).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,

    /// With `-- CMD`: trace the command's own process only, not the processes it starts.
    #[arg(long, requires = "command")]
    pub no_inherit: bool,

    /// With `-- CMD` as root: run the command as this user (name or uid), with its groups,
    /// HOME, USER and LOGNAME, as `sudo -u USER CMD` would (sudo's own fork is not followed).
    #[arg(long, requires = "command", value_name = "USER")]
    pub user: Option<String>,

    /// Stop after this many seconds, more than 0 and at most 10 years (default: until Ctrl-C,
    /// SIGTERM or the targets exit).
    #[arg(
        short,
        long,
        value_name = "SECS",
        allow_negative_numbers = true,
        value_parser = parse_duration_secs
    )]
    pub duration: Option<f64>,
}

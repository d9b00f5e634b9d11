//! `serve`'s own options.

use clap::Args;

use super::parse::parse_pid;

#[derive(Clone, Debug, Args)]
pub struct ServeArgs {
    /// Address and port to listen on. Loopback unless another address is given here: whoever
    /// reaches the endpoint reads process names and call stacks.
    #[arg(long, default_value = DEFAULT_LISTEN, value_name = "ADDR:PORT")]
    pub listen: std::net::SocketAddr,

    /// Trace only these processes (comma-separated).
    #[arg(
        short,
        long,
        value_delimiter = ',',
        allow_negative_numbers = true,
        value_parser = parse_pid,
        value_name = "PID[,PID...]"
    )]
    pub pid: Vec<u32>,

    /// Export only the processes of this name (repeat for more names). Every process's lock
    /// is still timed in the kernel; the names choose what /metrics and the profiles show.
    #[arg(long = "comm", value_name = "NAME")]
    pub comms: Vec<String>,

    /// Also walk kernel and frame-pointer user stacks, of waits and holds past 10 us and of
    /// one in 64 others: causes for the series, stacks for the profiles. Costs more per lock
    /// event than timing alone.
    #[arg(long)]
    pub stacks: bool,

    /// Label the series with the pid as well as the process name (pids are many over a
    /// daemon's life: --max-series bounds them).
    #[arg(long)]
    pub label_pid: bool,

    /// Trace only the processes of this cgroup (v2) and of the cgroups below it (repeat for
    /// more), as `mmapsem-trace -a --cgroup` does.
    #[arg(long = "cgroup", value_name = "PATH", conflicts_with = "pid")]
    pub cgroups: Vec<String>,

    /// Label the series with the locking process's cgroup (v2) path as well.
    #[arg(long)]
    pub label_cgroup: bool,

    /// The most series exported; the operations of series beyond it are counted in
    /// mmapsem_trace_lost_events_total{counter="series_cap"}.
    #[arg(
        long,
        default_value_t = 2000,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=1_000_000)
    )]
    pub max_series: u32,

    /// More logging on stderr (repeat for more).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// Where `serve` listens unless told otherwise: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9723";

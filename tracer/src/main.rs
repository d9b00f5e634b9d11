use clap::Parser as _;

fn main() {
    let cli = tracer::cli::Cli::parse();
    if let Err(err) = tracer::run::run(cli) {
        // One line: the chain of causes joined, as users of perf and bpftrace expect.
        eprintln!("mmapsem-trace: {err:#}");
        std::process::exit(1);
    }
}

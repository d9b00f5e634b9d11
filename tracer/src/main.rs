use clap::Parser as _;

fn main() {
    let cli = tracer::cli::Cli::parse();
    match tracer::run::run(cli) {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            // One line: the chain of causes joined, as users of perf and bpftrace expect.
            eprintln!("mmapsem-trace: {err:#}");
            std::process::exit(1);
        }
    }
}

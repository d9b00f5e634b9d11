use clap::Parser as _;

fn main() {
    let cli = match tracer::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if err.use_stderr() => {
            // Usage errors are one line too, like every other error of the tool.
            eprintln!("mmapsem-trace: {}", tracer::cli::one_line(&err));
            std::process::exit(err.exit_code());
        }
        // --help and --version.
        Err(err) => err.exit(),
    };
    match tracer::run::run(cli) {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            // One line: the chain of causes joined, as users of perf and bpftrace expect.
            eprintln!("mmapsem-trace: {}", tracer::cli::error_line(&err));
            std::process::exit(1);
        }
    }
}

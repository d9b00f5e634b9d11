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
            eprintln!("mmapsem-trace: {}", tracer::text::error_line(&err));
            // A command that could not run exits as a shell would have it (127, 126).
            let code = err
                .downcast_ref::<tracer::launch::ExecFailed>()
                .map_or(1, tracer::launch::ExecFailed::exit_code);
            std::process::exit(code);
        }
    }
}

//! The `sessionlog` command line.

mod cli;
mod demo;
mod failure;
mod transfer;

fn main() -> std::process::ExitCode {
    // The demo runs this binary again as the process it crashes.
    if let Some(dir) = std::env::var_os(demo::CHILD_ENV) {
        demo::crash_child_main(std::path::Path::new(&dir));
    }
    cli::main()
}

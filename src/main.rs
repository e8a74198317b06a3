//! The `sessionlog` command line.

// The command line lives in src/cli/, over the library's public API.
#[path = "cli/args.rs"]
mod args;
#[path = "cli/commands.rs"]
mod cli;
#[path = "cli/demo.rs"]
mod demo;
#[path = "cli/failure.rs"]
mod failure;
#[path = "cli/progress.rs"]
mod progress;
#[path = "cli/space.rs"]
mod space;
#[path = "cli/transfer.rs"]
mod transfer;

fn main() -> std::process::ExitCode {
    // The demo runs this binary again as the process it crashes.
    if let Some(dir) = std::env::var_os(demo::CHILD_ENV) {
        demo::crash_child_main(std::path::Path::new(&dir));
    }
    cli::main()
}

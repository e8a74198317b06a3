//! The `sessionlog` command line: file mode (harness JSONL files).
//!
//! Exit codes: 0 success, 1 invalid input (the message names the file, the
//! line or seq, and the rule broken), 2 usage, 3 I/O error.

use clap::{Parser, Subcommand};
use sessionlog::adapters::jsonl::{self, JsonlSession};
use sessionlog::derive;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Inspect harness session logs: validate, print the logical log, the
/// surface, the derived messages, or the closers a crash would need.
#[derive(Debug, Parser)]
#[command(name = "sessionlog", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a session file; print `OK` or the first violation.
    Check {
        /// Also check the relational invariants, known types and message
        /// shapes (many real logs fail these: a diagnostic, not the default).
        #[arg(long)]
        strict: bool,
        /// A harness session file (JSONL, plain or with packed rows).
        file: PathBuf,
    },
    /// Print the logical log as plain JSONL: the header, then one event per
    /// line (packed rows expanded).
    Cat {
        /// A harness session file.
        file: PathBuf,
    },
    /// Print the surface: nodes, replacement history and replaceGeneration.
    Surface {
        /// A harness session file.
        file: PathBuf,
    },
    /// Print the derived message history, one JSON message per line.
    Derive {
        /// A harness session file.
        file: PathBuf,
    },
    /// Print the closers crash recovery would append, one per line.
    Repair {
        /// Only print the closers (file mode never changes the file).
        #[arg(long)]
        dry_run: bool,
        /// A harness session file.
        file: PathBuf,
    },
}

/// How a command failed, and so which exit code it gets.
enum Failure {
    /// Invalid input: exit 1.
    Invalid(String),
    /// Usage: exit 2.
    Usage(String),
    /// I/O: exit 3.
    Io(String),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = run(cli.command, &mut out).and_then(|()| {
        out.flush()
            .map_err(|e| Failure::Io(format!("writing output: {e}")))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Invalid(m)) => {
            let _ = out.flush();
            eprintln!("error: {m}");
            ExitCode::from(1)
        }
        Err(Failure::Usage(m)) => {
            eprintln!("error: {m}");
            ExitCode::from(2)
        }
        Err(Failure::Io(m)) => {
            eprintln!("error: {m}");
            ExitCode::from(3)
        }
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| Failure::Io(format!("{}: {e}", path.display())))
}

/// Reads and folds a file, reporting an ignored torn tail on stderr.
fn load<'a>(path: &Path, bytes: &'a [u8], strict: bool) -> Result<JsonlSession<'a>, Failure> {
    let session = jsonl::read_session(bytes, strict)
        .map_err(|v| Failure::Invalid(format!("{}: {v}", path.display())))?;
    if let Some(t) = &session.torn {
        eprintln!(
            "note: {}: torn tail ignored from line {}: {}",
            path.display(),
            t.line,
            t.reason
        );
    }
    Ok(session)
}

fn io_err(e: io::Error) -> Failure {
    Failure::Io(format!("writing output: {e}"))
}

fn run(command: Command, out: &mut impl Write) -> Result<(), Failure> {
    match command {
        Command::Check { strict, file } => {
            let bytes = read_file(&file)?;
            match jsonl::read_session(&bytes, strict) {
                Ok(s) => {
                    if let Some(t) = &s.torn {
                        eprintln!(
                            "note: {}: torn tail ignored from line {}: {}",
                            file.display(),
                            t.line,
                            t.reason
                        );
                    }
                    writeln!(out, "OK").map_err(io_err)
                }
                Err(v) => {
                    writeln!(out, "FAIL {v}").map_err(io_err)?;
                    Err(Failure::Invalid(format!("{}: {v}", file.display())))
                }
            }
        }
        Command::Cat { file } => {
            let bytes = read_file(&file)?;
            let s = load(&file, &bytes, false)?;
            jsonl::write_session(out, &s.header.header, &s.events).map_err(io_err)
        }
        Command::Surface { file } => {
            let bytes = read_file(&file)?;
            let s = load(&file, &bytes, false)?;
            writeln!(out, "{}", s.state.surface().to_json()).map_err(io_err)
        }
        Command::Derive { file } => {
            let bytes = read_file(&file)?;
            let s = load(&file, &bytes, false)?;
            let messages = derive::derive(s.state.surface(), &s.events)
                .map_err(|e| Failure::Invalid(format!("{}: {e}", file.display())))?;
            let mut buf = Vec::new();
            for m in messages {
                buf.clear();
                m.write_json(&mut buf);
                buf.push(b'\n');
                out.write_all(&buf).map_err(io_err)?;
            }
            Ok(())
        }
        Command::Repair { dry_run, file } => {
            if !dry_run {
                return Err(Failure::Usage(
                    "file mode only inspects: use `repair --dry-run FILE` (repairing in place needs --store)".into(),
                ));
            }
            let bytes = read_file(&file)?;
            let s = load(&file, &bytes, false)?;
            for c in s.state.closers() {
                writeln!(out, "{}", c.to_json()).map_err(io_err)?;
            }
            Ok(())
        }
    }
}

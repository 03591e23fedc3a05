//! The `oomdoc` command line: parse arguments, run the command, map errors to exit codes. The arguments are in
//! `cli/args.rs`, the commands in `cli/commands.rs`; the work is the library's (`oomdoc::job` and below).

mod cli {
    pub mod args;
    pub mod commands;
}

use std::process::ExitCode;

use oomdoc::Error;

fn main() -> ExitCode {
    install_panic_hook();
    // How the tests see the hook at work (tests/it/bad_input.rs).
    if std::env::var_os("OOMDOC_TEST_PANIC").is_some() {
        panic!("OOMDOC_TEST_PANIC is set");
    }
    let cli = match cli::args::parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli::commands::run(cli) {
        Ok(code) => code,
        Err(e) => {
            if let Error::Io { source, .. } = &e {
                if source.kind() == std::io::ErrorKind::BrokenPipe {
                    return ExitCode::SUCCESS;
                }
            }
            eprintln!("oomdoc: error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The last line of defence: a panic is a bug, and the user gets one line saying so and where (exit 3), not a
/// backtrace, unless they asked for one with RUST_BACKTRACE.
fn install_panic_hook() {
    if std::env::var_os("RUST_BACKTRACE").is_some_and(|v| !v.is_empty() && v != "0") {
        return;
    }
    std::panic::set_hook(Box::new(|info| {
        let at =
            info.location().map_or_else(|| "an unknown place".to_string(), |l| format!("{}:{}", l.file(), l.line()));
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        eprintln!("oomdoc: internal error at {at}: {what}: this is a bug; please report it with the file it read");
        std::process::exit(3);
    }));
}

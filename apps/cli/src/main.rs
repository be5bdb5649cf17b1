//! The `whyslow` binary (see the library's docs for the exit codes).

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(whyslow::run(std::env::args_os()))
}

//! The `idemgate` binary; all the work is in the library, see [`idemgate::cli`].

fn main() -> std::process::ExitCode {
    idemgate::cli::main()
}

//! The `idemgate` binary; all the work is in the library, see [`idemgate::cli`].

/// Request and response buffers are allocated on one worker thread and freed on
/// another; glibc's malloc serialises that on arena locks, mimalloc does not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    idemgate::cli::main()
}

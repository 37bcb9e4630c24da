//! The `idemgate` binary; all the work is in the library, see [`idemgate::cli`].

/// mimalloc: buffers freed on another thread than the one that allocated them (a
/// detached exchange, the file store's writer) do not contend on arena locks as in
/// glibc's malloc. Built with `no_thp`: with transparent huge pages, memory mimalloc
/// returned to the system came back as a fresh 2 MiB page to clear, 9 % of idemgate's
/// CPU in a `miss` run (`clear_page_erms` under `do_huge_pmd_anonymous_page`).
///
/// With the benchmark's feature `alloc-stats`, the library counts every allocation and
/// sets the allocator itself (src/alloc_stats.rs).
#[cfg(not(feature = "alloc-stats"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    idemgate::cli::main()
}

/// With the `mimalloc` feature, the broker allocates through mimalloc
/// (BENCHMARKS.md, "A global allocator").
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    loopx::cli::main()
}

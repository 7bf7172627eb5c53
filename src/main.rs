/// The broker allocates through mimalloc: the writer spends a fifth less CPU
/// per cycle than on glibc's allocator (BENCHMARKS.md, "A global
/// allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    loopx::cli::main()
}

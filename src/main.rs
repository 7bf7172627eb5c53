fn main() -> std::process::ExitCode {
    loopx::cli::main()
}

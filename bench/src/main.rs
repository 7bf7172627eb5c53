fn main() {
    println!("loopx-bench: coming");
}

//! The migrations are embedded by `sqlx::migrate!`, which cannot see a new
//! file by itself: rebuild when the folder changes (sqlx's own advice).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}

//! `mesh-host`: not built yet.

fn main() {
    eprintln!("mesh-host: not built yet");
    std::process::exit(1);
}

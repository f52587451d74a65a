//! `meshd`: not built yet.

fn main() {
    eprintln!("meshd: not built yet");
    std::process::exit(1);
}

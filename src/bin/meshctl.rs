//! `meshctl`: the operator command line.

fn main() {
    eprintln!("meshctl: not built yet");
    std::process::exit(1);
}

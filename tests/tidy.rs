//! Tidy checks that keep the tree honest: every Rust file says what it is for, and nothing that
//! belongs only in tests (`unwrap()`, `dbg!`) leaks into the code that ships, and no test is
//! skipped with an ignore attribute anywhere.

use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = fs::read_dir(&dir).expect("read dir");
        for entry in entries {
            let path = entry.expect("dir entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    stack.push(path);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A file is test code when it lives under a `tests/`, `benches/`, `beds/` or `chaos/` tree or is
/// a `tests.rs`; inside other files, everything after the first `#[cfg(test)]` is test code.
fn shipped_part(path: &Path, text: &str) -> Option<String> {
    let rel = path.strip_prefix(workspace_root()).unwrap_or(path);
    let first = rel
        .components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .unwrap_or("");
    let test_tree = rel
        .components()
        .any(|c| matches!(c.as_os_str().to_str(), Some("tests" | "benches")))
        || matches!(first, "beds" | "chaos")
        || rel.file_name().and_then(|n| n.to_str()) == Some("tests.rs")
        || rel
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with("_tests.rs"));
    if test_tree {
        return None;
    }
    let shipped = match text.find("#[cfg(test)]") {
        Some(at) => &text[..at],
        None => text,
    };
    Some(shipped.to_string())
}

#[test]
fn every_rust_file_starts_with_a_doc_line() {
    let mut missing = Vec::new();
    for path in rust_files(&workspace_root()) {
        let text = fs::read_to_string(&path).expect("read file");
        if !text.starts_with("//!") {
            missing.push(path.display().to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "files without a leading `//!` line saying what they are for:\n{}",
        missing.join("\n")
    );
}

#[test]
fn no_unwrap_dbg_or_ignore_outside_tests() {
    let unwrap = [".", "unwrap()"].concat();
    let dbg = ["dbg", "!("].concat();
    let ignore = ["#[", "ignore"].concat();
    let mut found = Vec::new();
    for path in rust_files(&workspace_root()) {
        let text = fs::read_to_string(&path).expect("read file");
        if text.contains(&ignore) {
            found.push(format!("{}: {ignore}", path.display()));
        }
        let Some(shipped) = shipped_part(&path, &text) else {
            continue;
        };
        for (n, line) in shipped.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for bad in [&unwrap, &dbg] {
                if code.contains(bad.as_str()) {
                    found.push(format!("{}:{}: {bad}", path.display(), n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "outside tests, use errors that say what to do:\n{}",
        found.join("\n")
    );
}

/// The shipped part of every Rust file under `src/<dir>`, with its path.
fn shipped_under(dir: &str) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for path in rust_files(&workspace_root().join("src").join(dir)) {
        let text = fs::read_to_string(&path).expect("read");
        if let Some(shipped) = shipped_part(&path, &text) {
            out.push((path, shipped));
        }
    }
    out
}

#[test]
fn the_controller_never_imports_the_host_agent() {
    // Layers (design "Shape"): `controller` never imports `host`; what both need lives beside
    // them (`crate::durable`, `crate::hex`).
    let host = ["crate::", "host"].concat();
    let mut found = Vec::new();
    for (path, text) in shipped_under("controller") {
        for (n, line) in text.lines().enumerate() {
            if line.contains(&host) {
                found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "controller imports host:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_core_does_no_io_reads_no_clock_and_draws_no_randomness() {
    // Invariant: `src/core` is pure — everything it needs is an argument.
    let banned = [
        "tokio",
        "std::fs",
        "std::net",
        "std::thread",
        "std::process",
        "getrandom",
        "SystemTime",
        "Instant::now",
    ];
    let mut found = Vec::new();
    for (path, text) in shipped_under("core") {
        for (n, line) in text.lines().enumerate() {
            for word in banned {
                if line.contains(word) {
                    found.push(format!("{}:{}: {word}", path.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "impure core:\n{}", found.join("\n"));
}

//! Tidy checks that keep the tree honest: every Rust file says what it is for, nothing that belongs
//! only in tests (`unwrap()`, `dbg!`) leaks into the code that ships, no test is skipped with an
//! ignore attribute, no error becomes an empty result, and the layers hold: the controller never
//! imports the host, and mesh-core depends only on pure crates and names no I/O, clock or
//! randomness.

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

/// What mesh-core may depend on, each with why it is pure: it computes on what it is given and
/// touches no file, socket, clock, thread or random source.
const core_dependencies_allowed: [(&str, &str); 6] = [
    (
        "mesh-codec",
        "bincode over serde, into and out of bytes in memory",
    ),
    ("serde", "derives"),
    ("toml", "parses the text of a mesh file it is given"),
    ("blake3", "hashes bytes it is given"),
    ("ed25519-dalek", "signs and verifies with keys it is given"),
    ("thiserror", "derives error types"),
];

/// Why a crate that is not on the allowlist does not belong in mesh-core.
fn why_not_in_core(name: &str) -> &'static str {
    match name {
        "tokio" | "futures" | "quinn" | "hyper" | "hyper-util" | "async-trait" => {
            "it is async I/O and timers; the shells (controller, host, store) drive the core"
        }
        "getrandom" | "rand" | "rand_core" => {
            "it draws randomness; secrets are generated by the caller and passed in"
        }
        "nix" | "libc" => "it calls the kernel",
        "redb" | "tempfile" => "it uses the filesystem",
        "time" | "chrono" => "it can read the clock; `now` is an argument",
        "mesh" | "mesh-raft" | "mesh-transport" | "mesh-migrations" | "mesh-beds" => {
            "it is a crate that does I/O, and the layers point the other way (it may use the core)"
        }
        _ => {
            "it is not on the allowlist of pure crates in tests/tidy.rs; if it does no I/O, reads no clock and draws no randomness, add it there with the reason"
        }
    }
}

#[test]
fn the_core_crate_depends_only_on_pure_crates() {
    // Invariant: mesh-core does no I/O, reads no clock and draws no randomness; its manifest is
    // where that is decided once (decision 0130).
    let path = workspace_root().join("core").join("Cargo.toml");
    let text = fs::read_to_string(&path).expect("read core/Cargo.toml");
    let manifest: toml::Table = text.parse().expect("core/Cargo.toml is TOML");
    let mut tables: Vec<(String, &toml::Table)> = Vec::new();
    for section in ["dependencies", "build-dependencies"] {
        if let Some(table) = manifest.get(section).and_then(|v| v.as_table()) {
            tables.push((format!("[{section}]"), table));
        }
    }
    let targets = manifest.get("target").and_then(|v| v.as_table());
    for (cfg, target) in targets.into_iter().flatten() {
        for section in ["dependencies", "build-dependencies"] {
            if let Some(table) = target.get(section).and_then(|v| v.as_table()) {
                tables.push((format!("[target.{cfg}.{section}]"), table));
            }
        }
    }
    let mut found = Vec::new();
    for (section, table) in tables {
        for name in table.keys() {
            let allowed = section == "[dependencies]"
                && core_dependencies_allowed.iter().any(|(ok, _)| ok == name);
            if !allowed {
                found.push(format!(
                    "core/Cargo.toml {section}: `{name}` is not allowed in mesh-core: {}",
                    why_not_in_core(name)
                ));
            }
        }
    }
    if workspace_root().join("core").join("build.rs").exists() {
        found.push("core/build.rs: mesh-core has no build script".to_string());
    }
    assert!(found.is_empty(), "impure core:\n{}", found.join("\n"));
}

/// Whether `word` occurs in `line` as a whole name (not inside a longer identifier).
fn names(line: &str, word: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices(word).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + word.len()..].chars().next();
        !before.is_some_and(ident) && (word.ends_with(':') || !after.is_some_and(ident))
    })
}

#[test]
fn the_core_does_no_io_reads_no_clock_and_draws_no_randomness() {
    // Invariant: mesh-core is pure — everything it needs is an argument. Its tests too: a core
    // test needs no file, socket or clock.
    let banned = [
        "tokio",
        "std::fs",
        "std::net",
        "std::thread",
        "std::process",
        "std::env",
        "getrandom",
        "rand::",
        "SystemTime",
        "Instant",
    ];
    let mut found = Vec::new();
    for path in rust_files(&workspace_root().join("core").join("src")) {
        let text = fs::read_to_string(&path).expect("read");
        for (n, line) in text.lines().enumerate() {
            for word in banned {
                if names(line, word) {
                    found.push(format!("{}:{}: {word}", path.display(), n + 1));
                }
            }
        }
    }
    // The core moved from src/core to core/ (decision 0130); a file written back there would
    // compile into nothing.
    let old = workspace_root().join("src").join("core");
    if old.exists() {
        found.push(format!(
            "{}: the core is the mesh-core crate at core/src now; move these files there",
            old.display()
        ));
    }
    assert!(found.is_empty(), "impure core:\n{}", found.join("\n"));
}

/// The mark that lets one line turn an error into an empty result; a reason follows the colon.
const empty_on_error_allow: &str = "// allow(empty-on-error):";

/// Whether `line`, or the line before it, says why it may turn an error into an empty result.
fn allows_empty_on_error(line: &str, before: Option<&str>) -> bool {
    [Some(line), before].into_iter().flatten().any(|l| {
        l.split_once(empty_on_error_allow)
            .is_some_and(|(_, reason)| !reason.trim().is_empty())
    })
}

/// Whether an expression is an empty or default value: `vec![]`, `Vec::new()`, `""`,
/// `Default::default()`, `T::default()`, an empty map or set — also inside `Ok(..)`, `Some(..)`,
/// `{ .. }` or after `return`.
fn is_empty_value(expression: &str) -> bool {
    let mut e = expression.trim().trim_end_matches([',', ';']).trim();
    loop {
        if let Some(rest) = e.strip_prefix("return ") {
            e = rest.trim().trim_end_matches(';').trim();
        } else if let Some(inner) = ["Ok(", "Some("]
            .into_iter()
            .find_map(|open| e.strip_prefix(open).and_then(|r| r.strip_suffix(')')))
        {
            e = inner.trim();
        } else if let Some(inner) = e.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
            e = inner.trim().trim_end_matches(';').trim();
        } else {
            break;
        }
    }
    let path =
        |p: &str| !p.is_empty() && p.chars().all(|c| c.is_alphanumeric() || "_:<>".contains(c));
    let empty_new = [
        "Vec", "String", "BTreeMap", "BTreeSet", "HashMap", "HashSet", "VecDeque", "PathBuf",
    ];
    matches!(
        e,
        "vec![]" | "\"\"" | "\"\".into()" | "\"\".to_string()" | "String::from(\"\")"
    ) || e.strip_suffix("::default()").is_some_and(path)
        || e.strip_suffix("::new()")
            .is_some_and(|t| empty_new.contains(&t))
}

/// The argument of the call that opens just before `at` in `code`, up to its closing paren.
fn call_argument(code: &str, at: usize) -> &str {
    let mut depth = 1;
    for (i, c) in code[at..].char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    return &code[at..at + i];
                }
            }
            _ => {}
        }
    }
    &code[at..]
}

/// What on one line of code turns an error into an empty or default result, if anything. `next`
/// and `after` are the two lines that follow, for an arm or `else` whose body is a block.
fn empty_on_error(code: &str, next: &str, after: &str) -> Option<String> {
    for shape in [
        ".unwrap_or_default()",
        ".ok().into_iter()",
        ".ok().unwrap_or(",
        ".ok().unwrap_or_else(",
        "filter_map(Result::ok)",
        "flat_map(Result::ok)",
    ] {
        if code.contains(shape) {
            return Some(shape.to_string());
        }
    }
    if code.contains("filter_map(|") && code.contains(".ok())") {
        return Some("filter_map(|..| ...ok())".to_string());
    }
    // `unwrap_or_else(|_| ..)`: a closure that takes the error, so on a Result.
    for (at, _) in code.match_indices(".unwrap_or_else(|") {
        let argument = call_argument(code, at + ".unwrap_or_else(".len());
        let body = argument.splitn(3, '|').nth(2).unwrap_or("");
        if is_empty_value(body) {
            return Some(format!(".unwrap_or_else({})", argument.trim()));
        }
    }
    // A block body on the next line alone: `=> {` / `else {`, then the value, then `}`.
    let closes = matches!(after.trim(), "}" | "}," | "};");
    let block_body = |rest| {
        if closes && str::trim(rest) == "{" {
            next
        } else {
            rest
        }
    };
    // `Err(..) => <empty>`
    if let Some((pattern, body)) = code.split_once("=>")
        && pattern
            .trim()
            .trim_start_matches('|')
            .trim()
            .starts_with("Err(")
        && is_empty_value(block_body(body))
    {
        return Some(format!("{} => {}", pattern.trim(), block_body(body).trim()));
    }
    // `let Ok(..) = .. else { return <empty> }`
    if let Some((pattern, body)) = code.split_once(" else ")
        && pattern.trim().starts_with("let Ok(")
        && is_empty_value(block_body(body))
    {
        return Some(format!("let Ok(..) = .. else {}", block_body(body).trim()));
    }
    None
}

#[test]
fn no_error_is_turned_into_an_empty_result_outside_tests() {
    // Style ("errors that say what to do"): a failed read that answers an empty list or a default
    // lies to the caller. Propagate it; where empty truly is the answer (an Option that is
    // legitimately absent), say why on the line or the line before with
    // `// allow(empty-on-error): <reason>`. Text cannot tell a Result from an Option, so every
    // `unwrap_or_default()` is flagged. beds/ and chaos/ are test harnesses (shipped_part).
    let mut found = Vec::new();
    for path in rust_files(&workspace_root()) {
        let text = fs::read_to_string(&path).expect("read file");
        let Some(shipped) = shipped_part(&path, &text) else {
            continue;
        };
        let lines: Vec<&str> = shipped.lines().collect();
        let code = |i: usize| {
            lines
                .get(i)
                .map_or("", |l| l.split("//").next().unwrap_or(""))
        };
        for (n, line) in lines.iter().enumerate() {
            let Some(shape) = empty_on_error(code(n), code(n + 1), code(n + 2)) else {
                continue;
            };
            let before = n.checked_sub(1).and_then(|b| lines.get(b).copied());
            if !allows_empty_on_error(line, before) {
                found.push(format!("{}:{}: {shape}", path.display(), n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "outside tests, an error turned into an empty or default result (propagate it, or say why \
         with `{empty_on_error_allow} <reason>` on the line or the line before):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_empty_on_error_lint_sees_each_shape_and_passes_what_is_not_one() {
    // A check that cannot fail is worse than none: each shape it names is caught, one line at a
    // time, and the look-alikes that keep the error are not.
    let caught = [
        ("let v = read().unwrap_or_default();", "", ""),
        ("let v = read().ok().into_iter().flatten();", "", ""),
        ("let v = read().ok().unwrap_or_else(Vec::new);", "", ""),
        ("let v = read().ok().unwrap_or(0);", "", ""),
        (
            "let v: Vec<_> = it.filter_map(Result::ok).collect();",
            "",
            "",
        ),
        (
            "let v: Vec<_> = it.filter_map(|r| r.ok()).collect();",
            "",
            "",
        ),
        ("let v = read().unwrap_or_else(|_| Vec::new());", "", ""),
        ("let v = read().unwrap_or_else(|_e| vec![]);", "", ""),
        ("let v = read().unwrap_or_else(|_| String::new());", "", ""),
        ("        Err(_) => vec![],", "", ""),
        ("        Err(_) => Vec::new(),", "", ""),
        ("        Err(_) => Default::default(),", "", ""),
        ("        Err(_) => BTreeMap::new(),", "", ""),
        ("        Err(_) => String::new(),", "", ""),
        ("        Err(e) => return Ok(Vec::new()),", "", ""),
        ("        Err(_) => Settings::default(),", "", ""),
        ("        Err(_) => {", "            vec![]", "        }"),
        (
            "    let Ok(text) = read() else { return Vec::new() };",
            "",
            "",
        ),
        (
            "    let Ok(text) = read() else {",
            "        return Ok(vec![]);",
            "    };",
        ),
    ];
    for (line, next, after) in caught {
        assert!(
            empty_on_error(line, next, after).is_some(),
            "not caught: {line}"
        );
    }
    let passed = [
        ("let v = read()?;", "", ""),
        ("let v = read().map_err(Error::Read)?;", "", ""),
        ("let v = read().unwrap_or_else(|e| fail(e));", "", ""),
        (
            "let v = names.get(k).cloned().unwrap_or_else(Vec::new);",
            "",
            "",
        ),
        ("        Err(_) => return Err(Timeout { ms }),", "", ""),
        (
            "        Err(_) => {",
            "            tracing::warn!(\"x\");",
            "            break;",
        ),
        ("        Err(_) => return,", "", ""),
        (
            "    let Ok(permit) = gate.acquire() else { break };",
            "",
            "",
        ),
    ];
    for (line, next, after) in passed {
        assert!(
            empty_on_error(line, next, after).is_none(),
            "caught: {line}"
        );
    }
    let allowed = "// allow(empty-on-error): no layer yet is an empty one";
    assert!(allows_empty_on_error(
        "let v = x.unwrap_or_default();",
        Some(allowed)
    ));
    assert!(allows_empty_on_error(
        &format!("let v = x.unwrap_or_default(); {allowed}"),
        None
    ));
    assert!(!allows_empty_on_error(
        "let v = x.unwrap_or_default();",
        Some("// allow(empty-on-error):")
    ));
    assert!(!allows_empty_on_error(
        "let v = x.unwrap_or_default();",
        None
    ));
}

/// Test files that define a function with a testkit helper's name on purpose, and why.
const testkit_names_allowed: [(&str, &str, &str); 1] = [(
    "tests/core_compose_plan.rs",
    "machine",
    "its machines get distinct addresses, which compose's provisions show",
)];

/// The names of testkit's top-level public functions, structs, traits and types.
fn testkit_helper_names() -> Vec<String> {
    let mut names = Vec::new();
    for path in rust_files(&workspace_root().join("testkit/src")) {
        let text = fs::read_to_string(&path).expect("read testkit source");
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("pub ") else {
                continue;
            };
            let rest = rest.strip_prefix("async ").unwrap_or(rest);
            for item in ["fn ", "struct ", "trait ", "type "] {
                if let Some(after) = rest.strip_prefix(item) {
                    let name: String = after
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    names.push(name);
                }
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

/// The item a top-level line of a test file defines, if it is a function, struct, trait or type.
fn defined_item(line: &str) -> Option<String> {
    let mut rest = line;
    for prefix in ["pub(crate) ", "pub ", "async "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let after = ["fn ", "struct ", "trait ", "type "]
        .iter()
        .find_map(|item| rest.strip_prefix(item))?;
    Some(
        after
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect(),
    )
}

#[test]
fn test_setup_has_one_copy_in_testkit() {
    // Issue 10 item 9, decision 0140: the PKI, waits, Raft settings, fixtures and process guards
    // live once in mesh-testkit; a test file defining one of its helpers again is a new copy.
    let names = testkit_helper_names();
    for expected in ["Pki", "wait_until", "fast_raft", "GroupGuard"] {
        assert!(
            names.iter().any(|n| n == expected),
            "testkit no longer has {expected}: update this check with what replaced it"
        );
    }
    let root = workspace_root();
    let mut copies = Vec::new();
    for dir in [
        "tests",
        "transport/tests",
        "raft/tests",
        "beds/src",
        "chaos/src",
    ] {
        for path in rust_files(&root.join(dir)) {
            let rel = path
                .strip_prefix(&root)
                .unwrap_or(&path)
                .display()
                .to_string();
            let text = fs::read_to_string(&path).expect("read test file");
            for (n, line) in text.lines().enumerate() {
                let Some(name) = defined_item(line) else {
                    continue;
                };
                let allowed = testkit_names_allowed
                    .iter()
                    .any(|(file, item, _)| *file == rel && *item == name);
                if names.contains(&name) && !allowed {
                    copies.push(format!("{rel}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        copies.is_empty(),
        "test setup defined again instead of taken from mesh-testkit (use mesh_testkit::…, or \
         name it for what it does differently):\n{}",
        copies.join("\n")
    );
}

#[test]
fn every_limit_in_shipped_code_is_listed_in_the_operator_guide() {
    // Issue 23: every limit is a named constant with its unit, and the operator guide's "Limits"
    // section says what happens at it. A `pub const …_max` (or `…_max_limit`, `…_reserved_min`)
    // in shipped code that the section does not name is a limit an operator cannot look up.
    let root = workspace_root();
    let guide = fs::read_to_string(root.join("docs/operator-guide.md")).expect("read the guide");
    let start = guide
        .find("\n## Limits\n")
        .expect("the guide has a ## Limits section");
    let section = &guide[start + 1..];
    let section = match section[3..].find("\n## ") {
        Some(end) => &section[..end + 3],
        None => section,
    };
    let mut missing = Vec::new();
    for dir in [
        "src",
        "core/src",
        "raft/src",
        "transport/src",
        "codec/src",
        "migrations/src",
    ] {
        for path in rust_files(&root.join(dir)) {
            let text = fs::read_to_string(&path).expect("read");
            let Some(shipped) = shipped_part(&path, &text) else {
                continue;
            };
            for line in shipped.lines() {
                let Some(rest) = line.strip_prefix("pub const ") else {
                    continue;
                };
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let is_limit = name.ends_with("_max")
                    || name.ends_with("_max_limit")
                    || name.ends_with("_reserved_min");
                if is_limit && !section.contains(&format!("`{name}`")) {
                    let rel = path
                        .strip_prefix(&root)
                        .unwrap_or(&path)
                        .display()
                        .to_string();
                    missing.push(format!("{rel}: {name}"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "limits not listed in docs/operator-guide.md's Limits section (add a row saying what happens at each):\n{}",
        missing.join("\n")
    );
}

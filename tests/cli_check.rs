//! `meshctl check` run as the real binary: the merge gate composes every machine, `--against`
//! shows which declarations change, and a bad file fails with positions and exit code 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mesh.toml")
}

fn meshctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_meshctl"))
        .args(args)
        .output()
        .expect("run meshctl")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn write(dir: &tempfile::TempDir, name: &str, content: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, content).expect("write mesh file");
    path.display().to_string()
}

#[test]
fn check_composes_every_machine_of_the_example_one_line_each() {
    // Merge gate: every machine composes; the line names digest, modules, mints and grants.
    let out = meshctl(&["check", "-f", &example().display().to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    for (line, machine) in lines.iter().zip(["ace", "g14", "novox", "shanks"]) {
        assert!(line.starts_with(machine), "{line}");
        assert!(
            line.contains("modules: ") && line.contains("mints: ") && line.contains("grants: ")
        );
    }
    assert!(lines[1].contains("sql broker@g14<-db@ace"), "{stdout}");
}

#[test]
fn check_against_lists_only_the_machines_whose_declaration_changes_with_their_diff() {
    // G7: diff before effect, offline: a settings change on g14 and a mount move on ace.
    let dir = tempfile::tempdir().expect("temp dir");
    let original = std::fs::read_to_string(example()).expect("read example");
    let changed = original
        .replace("max_connections = 128", "max_connections = 256")
        .replace("/tmp/mesh-dev/ace/db/data", "/tmp/mesh-dev/ace/db/moved");
    let new = write(&dir, "new.toml", &changed);
    let out = meshctl(&[
        "check",
        "-f",
        &new,
        "--against",
        &example().display().to_string(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("ace: 1 change\n"), "{stdout}");
    assert!(stdout.contains("~ db: mount data: /tmp/mesh-dev/ace/db/data -> data => /tmp/mesh-dev/ace/db/moved -> data"), "{stdout}");
    assert!(
        stdout.contains("g14: 1 change\n  ~ broker: setting max_connections:"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("novox:") && !stdout.contains("shanks:"),
        "{stdout}"
    );
    assert!(stdout.contains("2 changed, 2 unchanged"), "{stdout}");
    assert!(
        !stdout.contains("128") && !stdout.contains("256"),
        "values never shown: {stdout}"
    );
}

#[test]
fn check_of_a_bad_file_prints_positions_to_stderr_and_exits_2() {
    // A bad file: every error with line and column, exit code 2, nothing on stdout.
    let dir = tempfile::tempdir().expect("temp dir");
    let bad = write(
        &dir,
        "bad.toml",
        "[machines.ace]\naddress = 1\n[modules.x]\nmachine = \"zz\"\ncommand = \"sh\"\n",
    );
    let out = meshctl(&["check", "-f", &bad]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("bad.toml:2:11: machines.ace.address:"),
        "{stderr}"
    );
    assert!(
        stderr.contains("bad.toml:4:11: modules.x.machine: machine `zz` is not declared"),
        "{stderr}"
    );
    let syntax = write(&dir, "syntax.toml", "[machines.ace\n");
    let out = meshctl(&["check", "-f", &syntax]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(
        text(&out.stderr).contains("syntax.toml:1:"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn check_of_a_missing_file_exits_2_naming_the_path() {
    let out = meshctl(&["check", "-f", "/nonexistent/mesh.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(text(&out.stderr).contains("/nonexistent/mesh.toml"));
}

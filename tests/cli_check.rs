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

/// Runs `check` and `apply` on one file and returns both runs' stderr; `apply` is given a context
/// that does not exist, so it can only refuse the file locally (it parses before it connects).
fn check_and_apply(dir: &tempfile::TempDir, content: &str) -> (String, String) {
    let file = write(dir, "mesh.toml", content);
    let check = meshctl(&["check", "-f", &file]);
    let context = dir.path().join("no-context.toml").display().to_string();
    let apply = meshctl(&[
        "--context",
        &context,
        "apply",
        "-f",
        &file,
        "--why",
        "issue 9",
    ]);
    for (name, out) in [("check", &check), ("apply", &apply)] {
        assert_eq!(out.status.code(), Some(2), "{name}: {}", text(&out.stderr));
        assert!(out.stdout.is_empty(), "{name}: {}", text(&out.stdout));
    }
    (text(&check.stderr), text(&apply.stderr))
}

/// The example with `extra` appended.
fn example_with(extra: &str) -> String {
    let original = std::fs::read_to_string(example()).expect("read example");
    format!("{original}\n{extra}")
}

#[test]
fn check_and_apply_refuse_two_modules_on_one_port() {
    // Issue 9: a second module on ace listening on db's port is refused by the same validation at
    // check and at apply, in one line naming both modules, with exit code 2.
    let dir = tempfile::tempdir().expect("temp dir");
    let (check, apply) = check_and_apply(
        &dir,
        &example_with(
            "[modules.rogue]\nmachine = \"ace\"\ncommand = \"sh\"\nprovides = [{ kind = \"pg\", port = 47101 }]\n",
        ),
    );
    assert_eq!(check, apply);
    assert_eq!(check.lines().count(), 1, "{check}");
    assert!(
        check.contains("modules.rogue.provides[0].port: module `rogue` would listen on 127.0.0.1:47101 on machine ace, where module `db` listens too"),
        "{check}"
    );
}

#[test]
fn check_and_apply_refuse_a_placement_scope_on_a_machine_the_module_does_not_run_on() {
    // Issue 9: `module/broker@ace` when broker runs on g14 would apply to nothing.
    let dir = tempfile::tempdir().expect("temp dir");
    let (check, apply) = check_and_apply(
        &dir,
        &example_with("[settings.\"module/broker@ace\"]\nk = \"v\"\n"),
    );
    assert_eq!(check, apply);
    assert_eq!(check.lines().count(), 1, "{check}");
    assert!(
        check.contains("settings.\"module/broker@ace\": module `broker` runs on g14, not on ace"),
        "{check}"
    );
}

#[test]
fn check_and_apply_refuse_control_characters_and_oversized_values_in_settings() {
    // Issue 9: one line per problem, control characters shown escaped, the size limit named.
    let dir = tempfile::tempdir().expect("temp dir");
    let big = "x".repeat(mesh::core::settings::setting_value_bytes_max + 1);
    let (check, apply) = check_and_apply(
        &dir,
        &example_with(&format!(
            "[settings.\"machine/g14\"]\nbanner = \"\\u001b[31mred\"\nmotd = \"two\\nlines\"\nblob = \"{big}\"\n"
        )),
    );
    assert_eq!(check, apply);
    assert_eq!(check.lines().count(), 3, "{check}");
    for want in [
        "settings.\"machine/g14\".banner: setting `banner` has a control character (U+001B) in its value",
        "settings.\"machine/g14\".motd: setting `motd` has a control character (U+000A) in its value",
        "settings.\"machine/g14\".blob: setting `blob` has a value of 65537 bytes, over the limit of 65536 bytes (setting_value_bytes_max)",
    ] {
        assert!(check.contains(want), "missing {want:?} in {check}");
    }
}

#[test]
fn check_and_apply_refuse_a_model_over_model_bytes_max() {
    // Issue 9: the encoded model is over model_bytes_max: the error says the size, the limit and
    // the way out, before anything is sent.
    // The content is spread over machines, each declaration within declaration_bytes_max
    // (issue 23), so the model's size is the one rule broken.
    let dir = tempfile::tempdir().expect("temp dir");
    let part = mesh::core::validate::declaration_bytes_max / 2;
    let mut file = String::new();
    for i in 0..mesh::core::validate::model_bytes_max.div_ceil(part) {
        let blob = "x".repeat(part);
        file.push_str(&format!(
            "[machines.m{i}]\naddress = \"127.0.0.1\"\n[modules.a{i}]\nmachine = \"m{i}\"\ncommand = \"sh\"\nfiles = {{ \"blob\" = \"{blob}\" }}\n"
        ));
    }
    let (check, apply) = check_and_apply(&dir, &file);
    assert_eq!(check, apply);
    assert_eq!(check.lines().count(), 1, "{check}");
    let limit = mesh::core::validate::model_bytes_max;
    assert!(
        check.contains("model: the model encodes to ") && check.contains(&format!("bytes, over the limit of {limit} bytes a model may have (model_bytes_max); make it smaller")),
        "{check}"
    );
}

#[test]
fn check_and_apply_refuse_a_module_file_over_declaration_bytes_max_naming_machine_module_size_and_limit()
 {
    // Issue 23: a module file that makes g14's declaration larger than any envelope may carry
    // is refused by check and apply alike, in one line at the module, naming the machine, the
    // module, the declaration's size and the limit, before anything is sent or stored.
    let dir = tempfile::tempdir().expect("temp dir");
    let limit = mesh::core::validate::declaration_bytes_max;
    let blob = "x".repeat(limit);
    let (check, apply) = check_and_apply(
        &dir,
        &example_with(&format!(
            "[modules.big]\nmachine = \"g14\"\ncommand = \"sh\"\nfiles = {{ \"blob\" = \"{blob}\" }}\n"
        )),
    );
    assert_eq!(check, apply);
    assert_eq!(check.lines().count(), 1, "{check}");
    let want = format!(
        "modules.big: the declaration of machine g14 would encode to {} bytes, over the limit of {limit} bytes one machine's declaration may have (declaration_bytes_max), so its envelope could not be delivered; module `big` is its largest part (",
        size_of_g14(&check)
    );
    assert!(check.contains(&want), "{want}\nin\n{check}");
}

/// The size the refusal names, checked to be over the limit by the caller's `want`.
fn size_of_g14(line: &str) -> usize {
    let after = line
        .split("would encode to ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<usize>().ok());
    let size = after.unwrap_or_else(|| panic!("no size in {line}"));
    assert!(size > mesh::core::validate::declaration_bytes_max, "{line}");
    size
}

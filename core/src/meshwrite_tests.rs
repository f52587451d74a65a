//! The writer's one promise, checked as a property: text written from a model parses back to the
//! same model, so to the same bytes and digest `apply` names (decision 0302).

use super::*;
use crate::flat::FlatMap;
use crate::meshfile::parse_mesh;
use crate::model::{Machine, Mount, Need, Provide};
use crate::settings::{Layer, Scope};
use proptest::prelude::*;

const example: &str = include_str!("../../examples/mesh.toml");

/// The digest `apply` names for a model: blake3 over its encoded bytes.
fn digest(mesh: &Mesh) -> [u8; 32] {
    *blake3::hash(&mesh_codec::encode("model", mesh).expect("encodes")).as_bytes()
}

fn round_trip(mesh: &Mesh) {
    let text = write_mesh(mesh);
    let back = parse_mesh("written.toml", &text)
        .unwrap_or_else(|e| panic!("the written text does not parse: {e}\n---\n{text}"));
    assert_eq!(&back, mesh, "round trip changed the model\n---\n{text}");
    assert_eq!(digest(&back), digest(mesh), "digest moved\n---\n{text}");
}

#[test]
fn the_example_mesh_written_back_parses_to_the_same_model_and_digest() {
    // Issue 25 item 1: `model show` prints the stored model as a file that applies back to the
    // same digest; the example is what every bed and `meshctl dev` apply.
    let mesh = parse_mesh("examples/mesh.toml", example).expect("example parses");
    round_trip(&mesh);
    // The perl scripts stay readable: written as multi-line literals, as the example has them.
    let text = write_mesh(&mesh);
    assert!(text.contains("'''\nmy $s = IO::Socket::INET"), "{text}");
}

fn module(name: &str, machine: &str) -> Module {
    Module {
        name: name.into(),
        machine: machine.into(),
        command: "sh".into(),
        args: Vec::new(),
        env: FlatMap::new(),
        files: FlatMap::new(),
        mounts: Vec::new(),
        ready: None,
        after: Vec::new(),
        provides: Vec::new(),
        consumes: Vec::new(),
    }
}

fn machine(name: &str, address: &str) -> (String, Machine) {
    let m = Machine {
        name: name.into(),
        address: address.into(),
    };
    (name.into(), m)
}

#[test]
fn awkward_values_round_trip() {
    // Quotes, backslashes, `'''` inside a multi-line value, a trailing quote, CR LF, tabs,
    // other control characters, unicode, empty strings, an empty settings layer, dotted and
    // slashed keys.
    let mut a = module("a", "m1");
    a.command = "/bin/ünïcødé \"quoted\" \\ back".into();
    a.args = vec![
        String::new(),
        "line one\nline two\n".into(),
        "has ''' inside\nand more".into(),
        "ends with a quote\n'".into(),
        "crlf\r\nline".into(),
        "tab\there\nnext".into(),
        "bell\u{7}\nescape\u{1b}[0m".into(),
        "\nstarts with a newline".into(),
        "日本語 🚀 \u{85} next-line".into(),
    ];
    a.env = [
        ("EMPTY".to_string(), String::new()),
        ("Q".into(), "\"'\\".into()),
    ]
    .into_iter()
    .collect();
    a.files = [
        ("conf/a b.conf".to_string(), "x = \"1\"\n\ty\n".to_string()),
        ("dir/é.txt".into(), String::new()),
    ]
    .into_iter()
    .collect();
    a.mounts = vec![Mount {
        name: "data".into(),
        host_dir: "/srv/with space/ü".into(),
        target: "data dir".into(),
    }];
    a.ready = Some(Box::new(Probe::Command {
        command: "test".into(),
        args: vec!["-e".into(), "multi\nline".into()],
        timeout_ms: 1,
    }));
    a.provides = vec![
        Provide {
            kind: "sql".into(),
            port: Some(65535),
        },
        Provide {
            kind: "raw".into(),
            port: None,
        },
    ];
    let mut b = module("b", "m1");
    b.ready = Some(Box::new(Probe::File {
        path: "ready file".into(),
        timeout_ms: 600_000,
    }));
    b.after = vec!["a".into()];
    b.consumes = vec![Need {
        kind: "sql".into(),
        from: "a".into(),
    }];
    let mut c = module("c", "m2");
    c.ready = Some(Box::new(Probe::Tcp {
        addr: "[::1]:80".into(),
        timeout_ms: 5,
    }));
    let mut mesh = Mesh {
        machines: [machine("m1", "10.0.0.1"), machine("m2", "host \"two\"")]
            .into_iter()
            .collect(),
        modules: [("a".into(), a), ("b".into(), b), ("c".into(), c)].into(),
        settings: Default::default(),
    };
    let mut layer = Layer::new();
    layer.insert("log.level".into(), "dé\"bug\\".into());
    layer.insert("n".into(), "128".into());
    mesh.settings.layers.insert(Scope::Mesh, layer);
    mesh.settings
        .layers
        .insert(Scope::Machine("m2".into()), Layer::new());
    mesh.settings.layers.insert(
        Scope::Placement {
            module: "a".into(),
            machine: "m1".into(),
        },
        [("true".to_string(), "true".to_string())]
            .into_iter()
            .collect(),
    );
    round_trip(&mesh);
}

#[test]
fn an_empty_mesh_round_trips() {
    round_trip(&Mesh::default());
}

/// Any text the parser keeps as it is: no NUL (the file refuses it), anything else allowed.
fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            any::<char>().prop_filter("no NUL", |c| *c != '\0'),
            Just('\n'),
            Just('\''),
            Just('"'),
            Just('\\'),
            Just('\r'),
        ],
        0..24,
    )
    .prop_map(|cs| cs.into_iter().collect())
}

/// A settings value: one line, not empty (`validate`'s rule).
fn setting_value() -> impl Strategy<Value = String> {
    "[^\\p{Cc}]{1,16}"
}

fn arbitrary_mesh() -> impl Strategy<Value = Mesh> {
    (
        text(),
        proptest::collection::vec(text(), 0..4),
        proptest::collection::btree_map("[A-Za-z_][A-Za-z0-9_]{0,6}", text(), 0..3),
        proptest::collection::btree_map("[a-z]{1,4}(/[a-z.]{1,4}){0,2}", text(), 0..3),
        proptest::collection::btree_map("[a-z0-9][a-z0-9_.-]{0,6}", setting_value(), 0..3),
        "[^\\p{Cc}]{1,12}",
    )
        .prop_map(|(command, args, env, files, layer, address)| {
            let mut a = module("a", "m1");
            // A command must not be blank (the parser refuses it).
            a.command = format!("x{command}");
            a.args = args;
            a.env = env.into_iter().collect();
            a.files = files
                .into_iter()
                .filter(|(k, _)| crate::meshfile::is_safe_relative(k))
                .collect();
            let mut mesh = Mesh {
                machines: [machine("m1", &address)].into_iter().collect(),
                modules: [("a".into(), a)].into(),
                settings: Default::default(),
            };
            mesh.settings
                .layers
                .insert(Scope::Module("a".into()), layer);
            mesh
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn any_model_written_back_parses_to_the_same_model(mesh in arbitrary_mesh()) {
        round_trip(&mesh);
    }
}

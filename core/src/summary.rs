//! Send summaries and their diff (G7): what a send record keeps of a declaration — every field a host
//! receives, with values of settings, env, files and secrets as digests — so `plan --diff` can show
//! what changes without the store ever holding file contents or secrets. The summary is derived by
//! destructuring every declaration type whole (no `..`), so a field added to a declaration does not
//! compile until the summary carries it.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

use super::declaration::{Declaration, DeclaredModule, Grant, ProvisionRef};
use super::flat::FlatMap;
use super::model::{Mount, Placement, Probe};

/// Hex characters kept of a value's blake3: enough to see a change, too few to be a copy.
pub const value_digest_hex_chars: usize = 16;

/// One machine's declaration as a send record keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub machine: String,
    /// By module name; a sorted vector rather than a tree, whose first node has room for eleven
    /// modules whatever the count (decision 0337).
    pub modules: FlatMap<String, ModuleSummary>,
    /// The deny list sent (entry → why; no secret in it).
    pub revoked: BTreeMap<String, String>,
    /// The added replicas' envelope keys sent (replica id → public key hex; decision 0230).
    pub signers: BTreeMap<u64, String>,
}

/// One module of a summary. Values of settings, env, files and secrets appear only as digests.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleSummary {
    pub command: String,
    pub args: Vec<String>,
    /// mount name → (host_dir, target)
    pub mounts: FlatMap<String, (String, String)>,
    /// key → digest of the value
    pub settings: FlatMap<String, String>,
    /// key → digest of the value
    pub env: FlatMap<String, String>,
    /// path → digest of the content
    pub files: FlatMap<String, String>,
    /// Boxed: most modules have none, and inline it would be 56 of each summary's module's
    /// bytes (decision 0337).
    pub ready: Option<Box<Probe>>,
    pub after: Vec<String>,
    /// Provisions this module consumes, by id: everything but the secret, which is a digest.
    pub provisions: FlatMap<String, ProvisionSummary>,
    /// Provisions granted from this module, by id.
    pub grants: FlatMap<String, GrantSummary>,
}

/// What a summary keeps of a consumed provision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvisionSummary {
    pub kind: String,
    pub provider: Placement,
    pub name: String,
    /// Digest of the secret.
    pub secret: String,
    pub endpoint: Option<String>,
}

/// What a summary keeps of a grant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantSummary {
    pub kind: String,
    pub consumer: Placement,
    pub name: String,
    /// Digest of the secret's hash the provider checks against.
    pub secret: String,
}

/// The module name a deny-list change is shown under in a diff: it is the mesh's, not a module's.
pub const deny_list_module: &str = "(mesh)";

/// A short blake3 of a value, for summaries.
pub fn value_digest(value: &str) -> String {
    let hex = blake3::hash(value.as_bytes()).to_hex();
    hex.as_str()[..value_digest_hex_chars].to_string()
}

/// What a send record keeps of `declaration`.
pub fn summarize(declaration: &Declaration) -> Summary {
    let Declaration {
        machine,
        modules,
        revoked,
        signers,
    } = declaration;
    Summary {
        machine: machine.clone(),
        modules: modules
            .iter()
            .map(|m| (m.name.clone(), summarize_module(m)))
            .collect(),
        revoked: revoked.clone(),
        signers: signers
            .iter()
            .map(|(id, key)| (*id, key_hex(key)))
            .collect(),
    }
}

/// A public key as 64 lowercase hex digits.
fn key_hex(key: &[u8; 32]) -> String {
    use std::fmt::Write;
    key.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn digests<'a>(map: impl IntoIterator<Item = (&'a String, &'a String)>) -> FlatMap<String, String> {
    map.into_iter()
        .map(|(k, v)| (k.clone(), value_digest(v)))
        .collect()
}

fn summarize_module(m: &DeclaredModule) -> ModuleSummary {
    // Whole destructuring: a new field of DeclaredModule is a compile error here until summarised.
    let DeclaredModule {
        name: _,
        command,
        args,
        env,
        settings,
        files,
        mounts,
        ready,
        after,
        provisions,
        grants,
    } = m;
    ModuleSummary {
        command: command.clone(),
        args: args.clone(),
        mounts: mounts.iter().map(summarize_mount).collect(),
        settings: digests(settings),
        env: digests(env),
        files: digests(files),
        ready: ready.clone().map(Box::new),
        after: after.clone(),
        provisions: provisions.iter().map(summarize_provision).collect(),
        grants: grants.iter().map(summarize_grant).collect(),
    }
}

fn summarize_mount(m: &Mount) -> (String, (String, String)) {
    let Mount {
        name,
        host_dir,
        target,
    } = m;
    (name.clone(), (host_dir.clone(), target.clone()))
}

fn summarize_provision(p: &ProvisionRef) -> (String, ProvisionSummary) {
    let ProvisionRef {
        id,
        kind,
        provider,
        name,
        secret,
        endpoint,
    } = p;
    let summary = ProvisionSummary {
        kind: kind.clone(),
        provider: provider.clone(),
        name: name.clone(),
        secret: value_digest(secret),
        endpoint: endpoint.clone(),
    };
    (id.clone(), summary)
}

fn summarize_grant(g: &Grant) -> (String, GrantSummary) {
    let Grant {
        id,
        kind,
        consumer,
        name,
        secret_blake3,
    } = g;
    let summary = GrantSummary {
        kind: kind.clone(),
        consumer: consumer.clone(),
        name: name.clone(),
        secret: value_digest(secret_blake3),
    };
    (id.clone(), summary)
}

impl ProvisionSummary {
    /// One line: `sql from db@ace as web-novox at 127.0.0.1:47101, secret 1a2b…`.
    pub fn line(&self) -> String {
        let at = match &self.endpoint {
            Some(e) => format!(" at {e}"),
            None => String::new(),
        };
        format!(
            "{} from {} as {}{at}, secret {}",
            self.kind, self.provider, self.name, self.secret
        )
    }
}

impl GrantSummary {
    /// One line: `sql to web@novox as web-novox, secret 1a2b…`.
    pub fn line(&self) -> String {
        format!(
            "{} to {} as {}, secret {}",
            self.kind, self.consumer, self.name, self.secret
        )
    }
}

impl Summary {
    /// The machines this one is linked to by a provision it consumes or a grant it gives.
    pub fn linked_machines(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for m in self.modules.values() {
            out.extend(m.provisions.values().map(|p| p.provider.machine.clone()));
            out.extend(m.grants.values().map(|g| g.consumer.machine.clone()));
        }
        out.remove(&self.machine);
        out
    }

    /// What this machine's declaration takes from another machine's part of the model: the
    /// provisions it consumes from `providers` (modules placed there now or at its last send),
    /// keyed by consumer, kind and provider module so that a moved provider or endpoint shows as
    /// a changed value; and the grants it gives to consumers placed on `machine`.
    pub fn links(&self, providers: &BTreeSet<String>, machine: &str) -> Links {
        let mut links = Links::default();
        for (module, m) in &self.modules {
            for p in m.provisions.values() {
                if providers.contains(&p.provider.module) {
                    let key = format!("{module} consumes {} from {}", p.kind, p.provider.module);
                    links.consumed.insert(key, p.line());
                }
            }
            for (id, g) in &m.grants {
                if g.consumer.machine == machine {
                    links
                        .granted
                        .insert(format!("{module} grant {id}"), g.line());
                }
            }
        }
        links
    }
}

/// See [`Summary::links`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Links {
    pub consumed: BTreeMap<String, String>,
    pub granted: BTreeMap<String, String>,
}

impl Links {
    /// Whether `now` differs from `self` (the last send) because of the other machine's part of
    /// the model: a consumed provision whose provider, endpoint or secret changed, or any grant
    /// added, re-minted or revoked. A consumption added or dropped is the consumer's own change.
    pub fn moved_by_other(&self, now: &Links) -> bool {
        let changed = self
            .consumed
            .iter()
            .any(|(k, was)| now.consumed.get(k).is_some_and(|v| v != was));
        changed || self.granted != now.granted
    }
}

/// How one item changed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Change {
    Added { now: String },
    Removed { was: String },
    Changed { was: String, now: String },
}

/// One changed item of one module. `item` is `module` for the module as a whole, else e.g.
/// `command`, `mount data`, `setting log_level`, `env LOG`, `file conf/x`, `provision p-…`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ItemChange {
    pub module: String,
    pub item: String,
    pub change: Change,
}

/// Every difference between two summaries of one machine, sorted by module then item.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SummaryDiff {
    pub machine: String,
    pub changes: Vec<ItemChange>,
}

impl SummaryDiff {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

/// Compares what was last sent (`None`: never sent) with what would be sent.
pub fn diff(old: Option<&Summary>, new: &Summary) -> SummaryDiff {
    let empty = Summary::default();
    let old = old.unwrap_or(&empty);
    let mut changes = Vec::new();
    let names: BTreeSet<&String> = old.modules.keys().chain(new.modules.keys()).collect();
    for name in names {
        match (old.modules.get(name), new.modules.get(name)) {
            (None, Some(m)) => changes.push(item(name, "module", added(&m.command))),
            (Some(m), None) => changes.push(item(name, "module", removed(&m.command))),
            (Some(a), Some(b)) => diff_module(name, a, b, &mut changes),
            (None, None) => {}
        }
    }
    let keys: BTreeSet<&String> = old.revoked.keys().chain(new.revoked.keys()).collect();
    for key in keys {
        let what = format!("revoked {key}");
        match (old.revoked.get(key), new.revoked.get(key)) {
            (None, Some(why)) => changes.push(item(deny_list_module, &what, added(why))),
            (Some(why), None) => changes.push(item(deny_list_module, &what, removed(why))),
            _ => {}
        }
    }
    let ids: BTreeSet<&u64> = old.signers.keys().chain(new.signers.keys()).collect();
    for id in ids {
        let what = format!("replica {id} signing key");
        match (old.signers.get(id), new.signers.get(id)) {
            (None, Some(key)) => changes.push(item(deny_list_module, &what, added(key))),
            (Some(key), None) => changes.push(item(deny_list_module, &what, removed(key))),
            (Some(a), Some(b)) if a != b => {
                changes.push(item(deny_list_module, &what, removed(a)));
                changes.push(item(deny_list_module, &what, added(b)));
            }
            _ => {}
        }
    }
    changes.sort();
    SummaryDiff {
        machine: new.machine.clone(),
        changes,
    }
}

fn item(module: &str, item: &str, change: Change) -> ItemChange {
    ItemChange {
        module: module.to_string(),
        item: item.to_string(),
        change,
    }
}

fn added(now: &str) -> Change {
    Change::Added {
        now: now.to_string(),
    }
}

fn removed(was: &str) -> Change {
    Change::Removed {
        was: was.to_string(),
    }
}

fn diff_module(name: &str, a: &ModuleSummary, b: &ModuleSummary, out: &mut Vec<ItemChange>) {
    let mut scalar = |label: &str, was: String, now: String| {
        if was != now {
            out.push(item(name, label, Change::Changed { was, now }));
        }
    };
    scalar("command", a.command.clone(), b.command.clone());
    scalar("args", quoted(&a.args), quoted(&b.args));
    scalar(
        "ready",
        probe_text(a.ready.as_deref()),
        probe_text(b.ready.as_deref()),
    );
    scalar("after", a.after.join(" "), b.after.join(" "));
    let mounts = |m: &FlatMap<String, (String, String)>| -> FlatMap<String, String> {
        m.iter()
            .map(|(k, (dir, target))| (k.clone(), format!("{dir} -> {target}")))
            .collect()
    };
    diff_map(name, "mount", &mounts(&a.mounts), &mounts(&b.mounts), out);
    diff_map(name, "setting", &a.settings, &b.settings, out);
    diff_map(name, "env", &a.env, &b.env, out);
    diff_map(name, "file", &a.files, &b.files, out);
    let provisions = |m: &FlatMap<String, ProvisionSummary>| -> FlatMap<String, String> {
        m.iter().map(|(id, p)| (id.clone(), p.line())).collect()
    };
    let grants = |m: &FlatMap<String, GrantSummary>| -> FlatMap<String, String> {
        m.iter().map(|(id, g)| (id.clone(), g.line())).collect()
    };
    diff_map(
        name,
        "provision",
        &provisions(&a.provisions),
        &provisions(&b.provisions),
        out,
    );
    diff_map(name, "grant", &grants(&a.grants), &grants(&b.grants), out);
}

fn diff_map(
    module: &str,
    kind: &str,
    a: &FlatMap<String, String>,
    b: &FlatMap<String, String>,
    out: &mut Vec<ItemChange>,
) {
    for (k, was) in a {
        let label = format!("{kind} {k}");
        match b.get(k) {
            None => out.push(item(module, &label, removed(was))),
            Some(now) if now != was => out.push(item(
                module,
                &label,
                Change::Changed {
                    was: was.clone(),
                    now: now.clone(),
                },
            )),
            Some(_) => {}
        }
    }
    for (k, now) in b {
        if !a.contains_key(k) {
            out.push(item(module, &format!("{kind} {k}"), added(now)));
        }
    }
}

fn quoted(args: &[String]) -> String {
    let parts: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    parts.join(" ")
}

fn probe_text(p: Option<&Probe>) -> String {
    match p {
        None => "none".into(),
        Some(Probe::Tcp { addr, timeout_ms }) => format!("tcp {addr} ({timeout_ms} ms)"),
        Some(Probe::File { path, timeout_ms }) => format!("file {path} ({timeout_ms} ms)"),
        Some(Probe::Command {
            command,
            args,
            timeout_ms,
        }) => format!("command {command} {} ({timeout_ms} ms)", quoted(args)),
    }
}

impl std::fmt::Display for ItemChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (m, i) = (&self.module, &self.item);
        let show = |v: &str| {
            if v.is_empty() {
                String::new()
            } else {
                format!(": {v}")
            }
        };
        match &self.change {
            Change::Added { now } if i == "module" => write!(f, "+ module {m}{}", show(now)),
            Change::Removed { was } if i == "module" => write!(f, "- module {m}{}", show(was)),
            Change::Added { now } => write!(f, "+ {m}: {i}{}", show(now)),
            Change::Removed { was } => write!(f, "- {m}: {i}{}", show(was)),
            Change::Changed { was, now } => write!(f, "~ {m}: {i}: {was} => {now}"),
        }
    }
}

/// One line per change, sorted; the same inputs always render the same lines.
impl std::fmt::Display for SummaryDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (n, c) in self.changes.iter().enumerate() {
            if n > 0 {
                writeln!(f)?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::declaration::{Grant, ProvisionRef};
    use crate::model::{Mount, Placement};

    fn declared(name: &str) -> DeclaredModule {
        DeclaredModule {
            name: name.into(),
            command: "perl".into(),
            args: vec!["-e".into(), "1".into()],
            env: FlatMap::from([("TOKEN".into(), "env-secret-value".into())]),
            settings: BTreeMap::from([("password".into(), "setting-secret-value".into())]),
            files: FlatMap::from([("conf/x".into(), "file-secret-content".into())]),
            mounts: vec![Mount {
                name: "data".into(),
                host_dir: "/srv/a".into(),
                target: "data".into(),
            }],
            ready: None,
            after: vec![],
            provisions: vec![ProvisionRef {
                id: "p-1".into(),
                kind: "amqp".into(),
                provider: Placement {
                    module: "b".into(),
                    machine: "g14".into(),
                },
                name: "a-ace".into(),
                secret: "provision-secret".into(),
                endpoint: None,
            }],
            grants: vec![Grant {
                id: "p-2".into(),
                kind: "sql".into(),
                consumer: Placement {
                    module: "c".into(),
                    machine: "novox".into(),
                },
                name: "c-novox".into(),
                secret_blake3: "hash".into(),
            }],
        }
    }

    fn declaration(modules: Vec<DeclaredModule>) -> Declaration {
        Declaration {
            machine: "ace".into(),
            modules,
            revoked: Default::default(),
            signers: Default::default(),
        }
    }

    #[test]
    fn a_leaders_summary_of_ten_modules_fits_in_two_kib_of_module_slots() {
        // Issue 24 item 4 (decision 0337): the leader keeps one summary per machine, 10,000 of
        // them; their modules are one allocation of exactly as many slots as modules, each slot
        // a name and a `ModuleSummary` whose empty maps and absent probe cost no more than a
        // pointer or two. Ten modules: 2,000 bytes, in a 2 KiB allocation (a tree of eleven
        // slots of the old layout took 3.5 KiB).
        let slot = std::mem::size_of::<(String, ModuleSummary)>();
        assert!(slot <= 200, "a module's slot in a summary is {slot} bytes");
        let s = summarize(&declaration(vec![declared("a"), declared("b")]));
        assert_eq!(s.modules.len(), 2);
        let back: Summary = mesh_codec::decode(
            "summary",
            &mesh_codec::encode("summary", &s).expect("encode"),
        )
        .expect("decode");
        assert_eq!(back, s);
    }

    #[test]
    fn g7_a_summary_never_holds_file_contents_secrets_or_setting_values() {
        // G7: send records keep digests, never the values.
        let s = summarize(&declaration(vec![declared("a")]));
        let bytes = mesh_codec::encode("summary", &s).expect("encode");
        let text = format!("{s:?}");
        for secret in [
            "env-secret-value",
            "setting-secret-value",
            "file-secret-content",
            "provision-secret",
        ] {
            assert!(!text.contains(secret), "{secret} leaked");
            assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()));
        }
        let m = &s.modules["a"];
        assert_eq!(m.provisions["p-1"].secret, value_digest("provision-secret"));
        assert_eq!(m.provisions["p-1"].provider.to_string(), "b@g14");
        assert_eq!(m.grants["p-2"].consumer.to_string(), "c@novox");
        assert_eq!(m.settings["password"], value_digest("setting-secret-value"));
    }

    #[test]
    fn g7_diff_names_every_added_removed_and_changed_item_in_a_stable_order() {
        // G7: diff before effect; same inputs render the same sorted lines.
        let old = summarize(&declaration(vec![declared("a"), declared("gone")]));
        let mut a = declared("a");
        a.command = "sh".into();
        a.mounts[0].host_dir = "/srv/b".into();
        a.env.insert("NEW".into(), "1".into());
        a.settings.remove("password");
        a.files.insert("conf/x".into(), "other".into());
        a.provisions.clear();
        let new = summarize(&declaration(vec![a, declared("fresh")]));
        let d = diff(Some(&old), &new);
        let lines: Vec<String> = d.changes.iter().map(|c| c.to_string()).collect();
        let want = [
            "~ a: command: perl => sh".to_string(),
            "+ a: env NEW: ".to_string() + &value_digest("1"),
            format!(
                "~ a: file conf/x: {} => {}",
                value_digest("file-secret-content"),
                value_digest("other")
            ),
            "~ a: mount data: /srv/a -> data => /srv/b -> data".to_string(),
            format!(
                "- a: provision p-1: amqp from b@g14 as a-ace, secret {}",
                value_digest("provision-secret")
            ),
            "- a: setting password: ".to_string() + &value_digest("setting-secret-value"),
            "+ module fresh: perl".to_string(),
            "- module gone: perl".to_string(),
        ];
        assert_eq!(lines, want);
        assert_eq!(d.to_string(), want.join("\n"));
        assert!(diff(Some(&new), &new).is_empty());
        let first = diff(None, &new);
        assert_eq!(first.changes.len(), 2);
    }

    /// Every field a host receives, changed one at a time: `(what, change)`.
    fn field_changes() -> Vec<(&'static str, fn(&mut DeclaredModule))> {
        vec![
            ("command", |m| m.command.push('x')),
            ("args", |m| m.args.push("x".into())),
            ("env key", |m| {
                m.env.insert("NEW".into(), "v".into());
            }),
            ("env value", |m| {
                m.env.insert("TOKEN".into(), "other".into());
            }),
            ("setting value", |m| {
                m.settings.insert("password".into(), "other".into());
            }),
            ("file content", |m| {
                m.files.insert("conf/x".into(), "other".into());
            }),
            ("file path", |m| {
                m.files.insert("conf/y".into(), "c".into());
            }),
            ("mount name", |m| m.mounts[0].name.push('x')),
            ("mount host_dir", |m| m.mounts[0].host_dir.push('x')),
            ("mount target", |m| m.mounts[0].target.push('x')),
            ("ready", |m| {
                m.ready = Some(Probe::File {
                    path: "up".into(),
                    timeout_ms: 1,
                })
            }),
            ("after", |m| m.after.push("b".into())),
            ("provision id", |m| m.provisions[0].id.push('x')),
            ("provision kind", |m| m.provisions[0].kind.push('x')),
            ("provision provider module", |m| {
                m.provisions[0].provider.module.push('x')
            }),
            ("provision provider machine", |m| {
                m.provisions[0].provider.machine.push('x')
            }),
            ("provision name", |m| m.provisions[0].name.push('x')),
            ("provision secret", |m| m.provisions[0].secret.push('x')),
            ("provision endpoint", |m| {
                m.provisions[0].endpoint = Some("10.0.0.1:1".into())
            }),
            ("grant id", |m| m.grants[0].id.push('x')),
            ("grant kind", |m| m.grants[0].kind.push('x')),
            ("grant consumer module", |m| {
                m.grants[0].consumer.module.push('x')
            }),
            ("grant consumer machine", |m| {
                m.grants[0].consumer.machine.push('x')
            }),
            ("grant name", |m| m.grants[0].name.push('x')),
            ("grant secret hash", |m| m.grants[0].secret_blake3.push('x')),
        ]
    }

    proptest::proptest! {
        #[test]
        fn g7_changing_any_field_of_a_declaration_changes_its_summary_and_shows_in_the_diff(
            value in "[a-z0-9]{1,12}",
            port in 1u16..,
        ) {
            // G7 (issue 9): a summary cannot miss a field; each change is one diff line at least.
            let mut base = declared("a");
            base.env.insert("V".into(), value.clone());
            base.provisions[0].endpoint = Some(format!("10.0.0.9:{port}"));
            base.grants[0].name = value;
            let old = summarize(&declaration(vec![base.clone()]));
            for (what, change) in field_changes() {
                let mut m = base.clone();
                change(&mut m);
                proptest::prop_assert_ne!(&m, &base, "{} changed nothing", what);
                let new = summarize(&declaration(vec![m]));
                proptest::prop_assert_ne!(&new, &old, "{} is not in the summary", what);
                proptest::prop_assert!(!diff(Some(&old), &new).is_empty(), "{} shows no diff", what);
            }
        }
    }
}

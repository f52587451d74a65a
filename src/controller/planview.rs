//! What `meshctl plan` shows of a push plan (G7): every machine the push would send or hold, named
//! and cascaded, each with its own diff against its last send; settings and env values in the clear
//! where the store holds them, files and secrets as digests; the mints; and a token over all of it
//! that `push --plan` checks, so a reviewed plan is sent only while it is still what would happen.

use std::collections::{BTreeMap, BTreeSet};

use super::api::{PlanView, PlannedChange, PlannedMachine, PlannedMint, PushTarget, drift_item};
use crate::core::plan::{PlannedSend, PushPlan};
use crate::core::summary::{Change, Summary, diff, summarize, value_digest};
use crate::store::command::{HeldMount, SettingsEntry};
use crate::store::state::DomainState;

/// What a plan shows instead of the secret of a provision it has not minted yet.
pub const unminted_secret: &str = "minted at push";

/// Values the store holds in the clear, by their summary digest: settings (current layers and their
/// history) and module env (the model in force and the kept models of earlier revisions, decision
/// 0302, so a value a change replaced shows in the clear too). Files and secrets are never in it.
pub(crate) struct Reveal {
    values: BTreeMap<String, String>,
}

impl Reveal {
    /// Reveals nothing: every value stays a digest (what a plan's token is computed over).
    pub(crate) fn none() -> Reveal {
        Reveal {
            values: BTreeMap::new(),
        }
    }

    /// From the state, the settings history and `earlier` models (kept models of earlier
    /// revisions, newest first, as many as the caller read).
    pub(crate) fn new(
        state: &DomainState,
        history: &[SettingsEntry],
        earlier: &[crate::core::model::Mesh],
    ) -> Reveal {
        let mut values = BTreeMap::new();
        let mut add = |v: &String| {
            values.insert(value_digest(v), v.clone());
        };
        for layer in state.mesh.settings.layers.values() {
            layer.values().for_each(&mut add);
        }
        // Every value a layer ever held was written by some entry (a created layer's entry
        // holds every key), so the entries' keys hold them all (decision 0317).
        for entry in history {
            for change in entry.delta.keys.values() {
                [&change.before, &change.after]
                    .into_iter()
                    .flatten()
                    .for_each(&mut add);
            }
        }
        for mesh in std::iter::once(&state.mesh).chain(earlier) {
            for module in mesh.modules.values() {
                module.env.values().for_each(&mut add);
            }
        }
        Reveal { values }
    }

    /// The value behind `digest` for a setting or env item; the digest itself otherwise.
    fn show(&self, item: &str, digest: String) -> String {
        let clear = item.starts_with("setting ") || item.starts_with("env ");
        match self.values.get(&digest) {
            Some(v) if clear => format!("{v:?}"),
            _ => digest,
        }
    }
}

/// The view of `planned`, diffing each machine against its last send.
pub(crate) fn plan_view(
    state: &DomainState,
    target: PushTarget,
    moves: Vec<String>,
    planned: &PushPlan,
    reveal: &Reveal,
) -> PlanView {
    let minted: BTreeSet<&str> = planned.mints.iter().map(|p| p.id.as_str()).collect();
    let mut holds: BTreeMap<&str, Vec<HeldMount>> = BTreeMap::new();
    for h in &planned.holds {
        holds
            .entry(h.machine.as_str())
            .or_default()
            .push(HeldMount {
                module: h.module.clone(),
                mount: h.mount.clone(),
                old_dir: h.old_dir.clone(),
                new_dir: h.new_dir.clone(),
            });
    }
    let mut machines = Vec::new();
    for send in planned.sends.iter().chain(&planned.held) {
        let last = state.last_sends.get(&send.machine).map(|s| &*s.summary);
        machines.push(PlannedMachine {
            machine: send.machine.clone(),
            reason: send.reason.to_string(),
            changes: changes_of(last, send, &minted, reveal)
                .into_iter()
                .chain(drift_restored(state, &send.machine))
                .collect(),
            // allow(empty-on-error): a send with no hold has no holds
            holds: holds.remove(send.machine.as_str()).unwrap_or_default(),
        });
    }
    let mints = planned
        .mints
        .iter()
        .map(|p| PlannedMint {
            id: p.id.clone(),
            kind: p.kind.clone(),
            consumer: p.consumer.to_string(),
            provider: p.provider.to_string(),
        })
        .collect();
    let mut view = PlanView {
        target,
        moves,
        revision: state.revision,
        machines,
        mints,
        token: String::new(),
    };
    view.token = if reveal.values.is_empty() {
        token_of(&view)
    } else {
        plan_view(
            state,
            view.target.clone(),
            view.moves.clone(),
            planned,
            &Reveal::none(),
        )
        .token
    };
    view
}

/// Why a saved plan no longer holds: what the leader would now do differently, in one line.
pub(crate) fn what_moved(saved: &PlanView, now: &PlanView) -> String {
    let mut out = Vec::new();
    if saved.revision != now.revision {
        out.push(format!(
            "the model moved from revision {} to {}",
            saved.revision, now.revision
        ));
    }
    for m in &saved.machines {
        match now.machines.iter().find(|n| n.machine == m.machine) {
            None => out.push(format!("{} is no longer in the push", m.machine)),
            Some(n) if n.changes != m.changes || n.holds != m.holds => {
                out.push(format!("{}'s changes differ", m.machine))
            }
            Some(n) if n.reason != m.reason => {
                out.push(format!("{} is now in it as {}", m.machine, n.reason))
            }
            Some(_) => {}
        }
    }
    for n in &now.machines {
        if !saved.machines.iter().any(|m| m.machine == n.machine) {
            out.push(format!(
                "{} would now be sent too ({})",
                n.machine, n.reason
            ));
        }
    }
    if saved.mints != now.mints {
        out.push("the mints differ".to_string());
    }
    if out.is_empty() {
        out.push("the plan file's token does not match its contents".to_string());
    }
    out.join("; ")
}

/// blake3 over the plan's target, moves, machines (with their diffs and holds) and mints. New
/// mints' secrets are already left out of the diffs, so planning twice gives the same token.
pub(crate) fn token_of(view: &PlanView) -> String {
    let subject = (&view.target, &view.moves, &view.machines, &view.mints);
    let bytes = mesh_codec::encode("plan token", &subject)
        .expect("plain strings and vectors always encode: no size limit on encode");
    let hex = blake3::hash(&bytes).to_hex();
    hex.as_str()[..32].to_string()
}

/// What the host's last report says differs from its declaration (decision 0305), as the
/// changes a push makes on the host though the declaration is the same: `~ broker: drift:
/// conf/broker.conf changed => as sent`.
fn drift_restored(state: &DomainState, machine: &str) -> Vec<PlannedChange> {
    let mut out = Vec::new();
    let report = state.accounts.get(machine).and_then(|a| a.report.as_ref());
    for m in report.iter().flat_map(|r| &r.modules) {
        for what in &m.drift {
            out.push(PlannedChange {
                module: m.name.clone(),
                item: drift_item.to_string(),
                was: Some(what.clone()),
                now: Some(drift_restored_word.to_string()),
            });
        }
    }
    out
}

/// A restored drift's value after the push, in `plan`'s changes.
const drift_restored_word: &str = "as sent";

fn changes_of(
    last: Option<&Summary>,
    send: &PlannedSend,
    minted: &BTreeSet<&str>,
    reveal: &Reveal,
) -> Vec<PlannedChange> {
    let mut now = summarize(&send.declaration);
    for module in now.modules.values_mut() {
        for (id, p) in module.provisions.iter_mut() {
            if minted.contains(id.as_str()) {
                p.secret = unminted_secret.to_string();
            }
        }
        for (id, g) in module.grants.iter_mut() {
            if minted.contains(id.as_str()) {
                g.secret = unminted_secret.to_string();
            }
        }
    }
    let mut out = Vec::new();
    for c in diff(last, &now).changes {
        let item = c.item.clone();
        let show = |v: String| Some(reveal.show(&item, v)).filter(|v| !v.is_empty());
        let (was, now) = match c.change {
            Change::Added { now } => (None, show(now)),
            Change::Removed { was } => (show(was), None),
            Change::Changed { was, now } => (show(was), show(now)),
        };
        out.push(PlannedChange {
            module: c.module,
            item: c.item,
            was,
            now,
        });
    }
    out
}

//! What the hosts applied and refused and what the store recorded as sends: the evidence a fault
//! bed compares after the fault. A host's applies come from its own log (`applying declaration`,
//! written after its mark is on disk and before anything is applied), so a bed sees every envelope
//! a host took, in the order it took them, not only the last one its state files keep.

use anyhow::{Context as _, anyhow};
use std::path::Path;

use crate::Bed;
use mesh::host::state::{RefusalCounts, StateFiles};

/// One envelope a host applied: its position and the declaration's short digest (12 hex).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Applied {
    pub epoch: u64,
    pub sequence: u64,
    pub digest: String,
}

impl std::fmt::Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{} digest {}", self.epoch, self.sequence, self.digest)
    }
}

/// Every `applying declaration` line of a mesh-host log, in order. A field named twice on a line
/// (a span's and the event's) is read from its last occurrence, the event's own.
pub fn applied_in_log(log: &str) -> Vec<Applied> {
    log.lines()
        .filter(|l| l.contains("applying declaration"))
        .filter_map(|line| {
            let field = |name: &str| -> Option<String> {
                let key = format!("{name}=");
                line.split_whitespace()
                    .rev()
                    .find_map(|t| t.strip_prefix(key.as_str()))
                    .map(str::to_string)
            };
            Some(Applied {
                epoch: field("epoch")?.parse().ok()?,
                sequence: field("sequence")?.parse().ok()?,
                digest: field("digest")?,
            })
        })
        .collect()
}

/// Everything machine `name`'s mesh-host applied so far, in order.
pub fn applied(bed: &Bed, name: &str) -> Vec<Applied> {
    applied_in_log(&bed.host_log(name))
}

/// G2 on what a host took: every apply strictly above the one before it in `(epoch, sequence)`,
/// so in particular no epoch after a newer one. The error names the machine and both positions.
pub fn strictly_increasing(name: &str, applies: &[Applied]) -> anyhow::Result<()> {
    for pair in applies.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        if (after.epoch, after.sequence) <= (before.epoch, before.sequence) {
            let what = if after.epoch < before.epoch {
                "an older epoch after a newer one"
            } else {
                "not above the one before"
            };
            anyhow::bail!("{name} applied {after} after {before}: {what}");
        }
    }
    Ok(())
}

/// The refusals machine `name`'s mesh-host counted so far (its `refusals` state file).
pub fn refusals(bed: &Bed, name: &str) -> anyhow::Result<RefusalCounts> {
    StateFiles::new(&bed.host_root(name))
        .load_refusals()
        .with_context(|| format!("{name}'s refusal counts"))
}

/// One send record of the store, as `history --json` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    pub machine: String,
    pub epoch: u64,
    pub sequence: u64,
    /// The full digest; a host logs its first 12 hex.
    pub digest: String,
    pub why: String,
}

impl Sent {
    /// Whether `applied` is this record's envelope (same position, same digest).
    pub fn is(&self, applied: &Applied) -> bool {
        self.epoch == applied.epoch
            && self.sequence == applied.sequence
            && !applied.digest.is_empty()
            && self.digest.starts_with(&applied.digest)
    }
}

/// Every send the store recorded, oldest first (`meshctl history --json` through `context`).
pub fn sends(bed: &Bed, context: &Path) -> anyhow::Result<Vec<Sent>> {
    let run = bed.meshctl_in(context, &["history", "--json"])?;
    if run.code != Some(0) {
        anyhow::bail!(
            "meshctl history --json exited {:?}: {}{}",
            run.code,
            run.stdout,
            run.stderr
        );
    }
    let doc = run.json()?;
    let items = doc["answer"]["items"]
        .as_array()
        .ok_or_else(|| anyhow!("history --json without answer.items: {doc}"))?;
    items
        .iter()
        .filter(|i| i["kind"] == "send")
        .map(|i| {
            let text = |k: &str| {
                i[k].as_str()
                    .map(str::to_string)
                    .ok_or_else(|| anyhow!("send without {k}: {i}"))
            };
            let number = |k: &str| {
                i[k].as_u64()
                    .ok_or_else(|| anyhow!("send without {k}: {i}"))
            };
            Ok(Sent {
                machine: text("machine")?,
                epoch: number("epoch")?,
                sequence: number("sequence")?,
                digest: text("digest")?,
                why: text("why")?,
            })
        })
        .collect()
}

/// G4 on what hosts took: every apply of `machines` is a send record of the same machine,
/// position and digest. The error names the first apply without one.
pub fn every_apply_recorded(bed: &Bed, machines: &[&str], sent: &[Sent]) -> anyhow::Result<()> {
    for machine in machines {
        for applied in applied(bed, machine) {
            let recorded = sent.iter().any(|s| s.machine == *machine && s.is(&applied));
            if !recorded {
                anyhow::bail!(
                    "{machine} applied {applied}, which no send record of the store matches"
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applies_are_read_from_the_event_fields_and_other_lines_are_skipped() {
        let log = "\
2026-12-01T15:00:00Z  INFO mesh::host::agent: applying declaration machine=ace epoch=2 sequence=3 digest=2194f0fa833d
2026-12-01T15:00:01Z  WARN mesh::host::agent: envelope refused machine=ace reason=older
2026-12-01T15:00:02Z  INFO report{epoch=1}: mesh::host::agent: applying declaration machine=ace epoch=4 sequence=5 digest=abcdefabcdef
";
        let applies = applied_in_log(log);
        assert_eq!(
            applies,
            vec![
                Applied {
                    epoch: 2,
                    sequence: 3,
                    digest: "2194f0fa833d".into()
                },
                Applied {
                    epoch: 4,
                    sequence: 5,
                    digest: "abcdefabcdef".into()
                },
            ]
        );
        assert!(strictly_increasing("ace", &applies).is_ok());
        let back: Vec<Applied> = applies.into_iter().rev().collect();
        let error = strictly_increasing("ace", &back)
            .err()
            .map(|e| e.to_string());
        assert!(
            error
                .as_deref()
                .is_some_and(|e| e.contains("an older epoch after a newer one")),
            "{error:?}"
        );
    }
}

//! A report's bounds (issue 23 part 2, decision 0299): how many modules and how long each text a
//! host may report. The host cuts its texts to them before reporting ([`Report::clip_texts`]);
//! the leader decodes a report without building more than [`report_modules_max`] module entries
//! ([`decode_bounded`]) and refuses one over any bound ([`Report::check_bounds`]). The largest
//! report within them fits the transport's `report_frame_bytes_max` (checked in
//! `tests/controller_reports.rs`).

use serde::Deserialize;
use serde::de::{Deserializer, SeqAccess, Visitor};

use super::{ModuleState, ModuleStatus, Report};
use crate::declaration::Digest;
use crate::envelope::EpochProof;

/// Most modules one report may list: as many as one declaration may hold (the host's
/// `modules_max`).
pub const report_modules_max: usize = 1024;
/// Longest machine or module name a report may carry, in bytes (the host's `name_bytes_max`).
pub const report_name_bytes_max: usize = 128;
/// Longest text of one module's state (what it waits on, why it failed), in bytes; the host cuts
/// a longer one at a character boundary and marks it with `…`.
pub const report_text_bytes_max: usize = 512;
/// Longest `last_refusal` (why the host refused its last envelope), in bytes; cut like a module's
/// text.
pub const report_refusal_bytes_max: usize = 2048;
/// Most drift texts one module's status may carry (decision 0305); a host with more lists the
/// first ones and `and N more`.
pub const report_drift_items_max: usize = 4;
/// Longest drift text (`conf/broker.conf changed`), in bytes; the host cuts a longer one like a
/// module's text. With [`report_drift_items_max`], 1,024 drifted modules add about 270 KiB, so
/// the largest report still fits `report_frame_bytes_max`.
pub const report_drift_text_bytes_max: usize = 64;
/// Longest signature in a report's epoch proof, in bytes (an ed25519 signature is 64).
pub const report_signature_bytes_max: usize = 64;

/// Why a report is over its bounds: never filed, counted, and the host named in `status`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OverBound {
    #[error(
        "the report lists {count} modules, more than the {max} its machine may run ({limit}); a host reports only the modules it runs: it is broken or forging, fix or upgrade it"
    )]
    TooManyModules {
        count: usize,
        max: usize,
        /// Which bound: the declaration the report says it applied, or `report_modules_max`.
        limit: &'static str,
    },
    #[error(
        "{what} is {bytes} bytes, over {limit} ({max} bytes); a host cuts longer texts before reporting: it is broken or forging, or older than decision 0299: upgrade it"
    )]
    TooLong {
        what: String,
        bytes: usize,
        max: usize,
        limit: &'static str,
    },
}

impl OverBound {
    fn check(
        what: impl FnOnce() -> String,
        bytes: usize,
        max: usize,
        limit: &'static str,
    ) -> Result<(), OverBound> {
        if bytes <= max {
            return Ok(());
        }
        Err(OverBound::TooLong {
            what: what(),
            bytes,
            max,
            limit,
        })
    }
}

impl Report {
    /// Whether the report is within its bounds, listing at most `modules_max` modules (the
    /// declaration it says it applied, when the leader knows it; else [`report_modules_max`]).
    pub fn check_bounds(&self, modules_max: usize, limit: &'static str) -> Result<(), OverBound> {
        let count = self.modules.len();
        let max = modules_max.min(report_modules_max);
        if count > max {
            let limit = if max < modules_max {
                "report_modules_max"
            } else {
                limit
            };
            return Err(OverBound::TooManyModules { count, max, limit });
        }
        let name = "report_name_bytes_max";
        OverBound::check(
            || "the machine name".into(),
            self.machine.len(),
            report_name_bytes_max,
            name,
        )?;
        for (i, m) in self.modules.iter().enumerate() {
            OverBound::check(
                || format!("module #{i}'s name"),
                m.name.len(),
                report_name_bytes_max,
                name,
            )?;
            let text = match &m.state {
                ModuleState::Waiting { on } => Some(("what it waits on", on)),
                ModuleState::Failed { error } => Some(("why it failed", error)),
                ModuleState::Starting
                | ModuleState::Ready
                | ModuleState::Running
                | ModuleState::Stopped => None,
            };
            if let Some((what, text)) = text {
                OverBound::check(
                    || format!("module {}'s {what}", m.name),
                    text.len(),
                    report_text_bytes_max,
                    "report_text_bytes_max",
                )?;
            }
            check_drift(m)?;
        }
        if let Some(refusal) = &self.last_refusal {
            OverBound::check(
                || "the last refusal".into(),
                refusal.len(),
                report_refusal_bytes_max,
                "report_refusal_bytes_max",
            )?;
        }
        if let Some(proof) = &self.proof {
            OverBound::check(
                || "the proof's machine name".into(),
                proof.header.machine.len(),
                report_name_bytes_max,
                name,
            )?;
            OverBound::check(
                || "the proof's signature".into(),
                proof.signature.len(),
                report_signature_bytes_max,
                "report_signature_bytes_max",
            )?;
        }
        Ok(())
    }

    /// Cuts every text over its bound at a character boundary, marked with `…`: what a host does
    /// before reporting, so a long failure or refusal (a path too long, say) never makes the
    /// whole report refused. Names are not cut: a declaration's names are within the bound.
    pub fn clip_texts(&mut self) {
        for m in &mut self.modules {
            match &mut m.state {
                ModuleState::Waiting { on: text } | ModuleState::Failed { error: text } => {
                    clip(text, report_text_bytes_max)
                }
                ModuleState::Starting
                | ModuleState::Ready
                | ModuleState::Running
                | ModuleState::Stopped => {}
            }
            clip_drift(&mut m.drift);
        }
        if let Some(refusal) = &mut self.last_refusal {
            clip(refusal, report_refusal_bytes_max);
        }
    }
}

/// A module's drift within [`report_drift_items_max`] texts of [`report_drift_text_bytes_max`].
fn check_drift(m: &ModuleStatus) -> Result<(), OverBound> {
    OverBound::check(
        || format!("module {}'s drift list (items)", m.name),
        m.drift.len(),
        report_drift_items_max,
        "report_drift_items_max",
    )?;
    for text in &m.drift {
        OverBound::check(
            || format!("module {}'s drift text", m.name),
            text.len(),
            report_drift_text_bytes_max,
            "report_drift_text_bytes_max",
        )?;
    }
    Ok(())
}

/// Keeps the first texts and says how many more there were; cuts each long text.
fn clip_drift(drift: &mut Vec<String>) {
    if drift.len() > report_drift_items_max {
        let kept = report_drift_items_max - 1;
        let more = drift.len() - kept;
        drift.truncate(kept);
        drift.push(format!("and {more} more"));
    }
    for text in drift.iter_mut() {
        clip(text, report_drift_text_bytes_max);
    }
}

/// Cuts `text` to at most `max` bytes, the mark included.
fn clip(text: &mut String, max: usize) {
    const mark: &str = "…";
    if text.len() <= max {
        return;
    }
    let mut cut = max.saturating_sub(mark.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.push_str(mark);
}

/// A report body decoded without building more than [`report_modules_max`] module entries:
/// `Ok(Err(..))` when it lists more (counted, each entry decoded and dropped in turn, so memory
/// stays bounded whatever the count); `Err` when it is not a report at all.
pub fn decode_bounded(bytes: &[u8]) -> Result<Result<Report, OverBound>, mesh_codec::CodecError> {
    let ReportIn {
        machine,
        epoch,
        sequence,
        report_sequence,
        applied,
        modules,
        refused_older,
        last_refusal,
        proof,
    } = mesh_codec::decode(crate::wire::report_what, bytes)?;
    let modules = match modules {
        Modules::Within(modules) => modules,
        Modules::Over { count } => {
            return Ok(Err(OverBound::TooManyModules {
                count,
                max: report_modules_max,
                limit: "report_modules_max",
            }));
        }
    };
    Ok(Ok(Report {
        machine,
        epoch,
        sequence,
        report_sequence,
        applied,
        modules,
        refused_older,
        last_refusal,
        proof,
    }))
}

/// [`Report`]'s layout field for field (its fixture in `tests/wire_contract.rs` and the round
/// trip below pin it), its modules read by [`Modules`]. [`decode_bounded`] builds a `Report` by
/// naming every field, so a field added to `Report` does not compile until it is added here.
#[derive(Deserialize)]
struct ReportIn {
    machine: String,
    epoch: u64,
    sequence: u64,
    report_sequence: u64,
    applied: Option<Digest>,
    modules: Modules,
    refused_older: u64,
    last_refusal: Option<String>,
    proof: Option<EpochProof>,
}

/// A report's modules as a sequence read one entry at a time: kept up to
/// [`report_modules_max`], only counted past it.
enum Modules {
    Within(Vec<ModuleStatus>),
    Over { count: usize },
}

impl<'de> Deserialize<'de> for Modules {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Modules, D::Error> {
        d.deserialize_seq(ModulesVisitor)
    }
}

struct ModulesVisitor;

impl<'de> Visitor<'de> for ModulesVisitor {
    type Value = Modules;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a sequence of module states")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Modules, A::Error> {
        let hint = seq.size_hint().unwrap_or(0);
        let mut kept = Vec::with_capacity(hint.min(report_modules_max));
        while kept.len() < report_modules_max {
            match seq.next_element::<ModuleStatus>()? {
                Some(m) => kept.push(m),
                None => return Ok(Modules::Within(kept)),
            }
        }
        if seq.next_element::<ModuleStatus>()?.is_none() {
            return Ok(Modules::Within(kept));
        }
        let mut count = kept.len() + 1;
        drop(kept);
        while seq.next_element::<ModuleStatus>()?.is_some() {
            count += 1;
        }
        Ok(Modules::Over { count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(name: &str, state: ModuleState) -> ModuleStatus {
        ModuleStatus {
            name: name.into(),
            state,
            restarts: 0,
            pid: None,
            last_exit: None,
            drift: Vec::new(),
        }
    }

    fn report(modules: Vec<ModuleStatus>) -> Report {
        Report {
            machine: "ace".into(),
            epoch: 1,
            sequence: 2,
            report_sequence: 3,
            applied: Some(Digest([7; 32])),
            modules,
            refused_older: 0,
            last_refusal: Some("older".into()),
            proof: None,
        }
    }

    fn encoded(report: &Report) -> Vec<u8> {
        mesh_codec::encode(crate::wire::report_what, report).expect("encode")
    }

    #[test]
    fn a_report_decoded_within_its_bounds_is_the_report_sent() {
        // The bounded decode reads Report's own layout: the same bytes, the same value.
        let within = report(vec![
            module(
                "web",
                ModuleState::Failed {
                    error: "exit 1".into(),
                },
            ),
            module(
                "db",
                ModuleState::Waiting {
                    on: "module web".into(),
                },
            ),
        ]);
        assert_eq!(
            decode_bounded(&encoded(&within)).expect("decode"),
            Ok(within)
        );
        let full = report(
            (0..report_modules_max)
                .map(|i| module(&format!("m{i}"), ModuleState::Ready))
                .collect(),
        );
        assert_eq!(decode_bounded(&encoded(&full)).expect("decode"), Ok(full));
    }

    #[test]
    fn a_report_of_more_modules_than_the_bound_is_counted_not_built() {
        // Issue 23 part 2: millions of empty entries must not become millions of structs.
        let count = report_modules_max + 5;
        let over = report((0..count).map(|_| module("", ModuleState::Ready)).collect());
        let decoded = decode_bounded(&encoded(&over)).expect("decode");
        assert_eq!(
            decoded,
            Err(OverBound::TooManyModules {
                count,
                max: report_modules_max,
                limit: "report_modules_max"
            })
        );
        assert!(decode_bounded(&[0xff; 8]).is_err(), "not a report");
    }

    #[test]
    fn a_report_is_refused_over_any_bound_and_names_it() {
        // Issue 23 part 2: bounded count (the declaration's, or report_modules_max) and texts.
        let two = report(vec![
            module("a", ModuleState::Ready),
            module("b", ModuleState::Ready),
        ]);
        assert_eq!(two.check_bounds(2, "the declaration applied"), Ok(()));
        let err = two
            .check_bounds(1, "the declaration applied")
            .expect_err("over");
        assert!(
            err.to_string().contains("2 modules, more than the 1"),
            "{err}"
        );
        assert!(err.to_string().contains("the declaration applied"), "{err}");
        let err = two.check_bounds(usize::MAX, "x").err();
        assert_eq!(
            err, None,
            "the declaration's count is capped by report_modules_max only"
        );
        let long = "x".repeat(report_text_bytes_max + 1);
        let failed = report(vec![module(
            "web",
            ModuleState::Failed {
                error: long.clone(),
            },
        )]);
        let err = failed.check_bounds(1, "x").expect_err("long");
        assert!(
            err.to_string().contains("module web's why it failed"),
            "{err}"
        );
        assert!(err.to_string().contains("report_text_bytes_max"), "{err}");
        let name = report(vec![module(&long, ModuleState::Ready)]);
        assert!(matches!(
            name.check_bounds(1, "x"),
            Err(OverBound::TooLong {
                limit: "report_name_bytes_max",
                ..
            })
        ));
        let mut refusal = report(vec![]);
        refusal.last_refusal = Some("r".repeat(report_refusal_bytes_max + 1));
        assert!(matches!(
            refusal.check_bounds(0, "x"),
            Err(OverBound::TooLong {
                limit: "report_refusal_bytes_max",
                ..
            })
        ));
    }

    #[test]
    fn a_hosts_clipped_report_is_within_its_bounds() {
        // The host cuts texts, so a long failure never makes its report refused.
        let mut r = report(vec![
            module(
                "web",
                ModuleState::Failed {
                    error: "é".repeat(report_text_bytes_max),
                },
            ),
            module(
                "db",
                ModuleState::Waiting {
                    on: "w".repeat(10 * report_text_bytes_max),
                },
            ),
            module(
                "ok",
                ModuleState::Failed {
                    error: "short".into(),
                },
            ),
        ]);
        r.last_refusal = Some("r".repeat(report_refusal_bytes_max * 3));
        r.clip_texts();
        assert_eq!(r.check_bounds(3, "x"), Ok(()));
        let ModuleState::Failed { error } = &r.modules[0].state else {
            panic!("failed")
        };
        assert!(
            error.ends_with('…') && error.len() <= report_text_bytes_max,
            "{error}"
        );
        assert_eq!(
            r.modules[2].state,
            ModuleState::Failed {
                error: "short".into()
            }
        );
    }

    #[test]
    fn drift_is_bounded_in_texts_and_length_and_a_hosts_clip_keeps_it_within() {
        // Decision 0305: drift adds at most report_drift_items_max short texts per module, so
        // the largest report still fits a host's frame; the host says how many it left out.
        let mut m = module("broker", ModuleState::Ready);
        m.drift = (0..report_drift_items_max + 2)
            .map(|i| format!("conf/{i}.conf changed"))
            .collect();
        let mut r = report(vec![m]);
        let err = r.check_bounds(1, "x").expect_err("too many");
        assert!(err.to_string().contains("report_drift_items_max"), "{err}");
        r.modules[0].drift[0] = "p".repeat(10 * report_drift_text_bytes_max);
        r.clip_texts();
        assert_eq!(r.check_bounds(1, "x"), Ok(()));
        let drift = &r.modules[0].drift;
        assert_eq!(drift.len(), report_drift_items_max);
        assert_eq!(drift.last().map(String::as_str), Some("and 3 more"));
        assert!(drift[0].ends_with('…') && drift[0].len() <= report_drift_text_bytes_max);
        let mut long = report(vec![module("broker", ModuleState::Ready)]);
        long.modules[0].drift = vec!["q".repeat(report_drift_text_bytes_max + 1)];
        let err = long.check_bounds(1, "x").expect_err("long");
        assert!(
            err.to_string().contains("report_drift_text_bytes_max"),
            "{err}"
        );
        // The bounded decode keeps drift as sent.
        assert_eq!(decode_bounded(&encoded(&r)).expect("decode"), Ok(r));
    }
}

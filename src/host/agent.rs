//! The agent: receives envelopes (G2), applies what they declare, and reports (G5). The transport
//! calls [`Agent::receive`] with the exact bytes it got from a replica; everything else is here.

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;
use tracing::Instrument;

use super::board::Board;
use super::config::HostConfig;
use super::durable;
use super::layout::Layout;
use super::leftovers;
use super::metrics::{EnvelopeCounters, ReportCounters};
use super::reporter::{ReportError, ReportSink, Reporter};
use super::runtime::{ApplyOutcome, Runtime};
use super::state::{AppliedRecord, RefusalCounts, StateError, StateFiles};
use super::validate::{DeclarationRefusal, check_declaration, check_mount_moves};
use crate::core::compose::digest;
use crate::core::declaration::{Declaration, Digest};
use crate::core::envelope::{Envelope, Position, Refusal, check_sender, open_with_proof};
use crate::core::report::{Exit, ModuleState, ModuleStatus, Report};

/// After a module changes state, the board must be quiet this long before the change is
/// reported: a start, an exit and a restart often follow each other within milliseconds.
pub const change_settle_ms: u64 = 200;
/// Longest a change waits for the board to be quiet before it is reported anyway.
pub const change_settle_ms_max: u64 = 1_000;

/// The genesis file under the state directory: the first envelope of a machine that joined a
/// running mesh (`meshctl machines add`, G11).
pub const genesis_file_name: &str = "genesis.envelope";
/// Largest genesis file read, in bytes (an envelope's frame limit is far below it).
pub const genesis_bytes_max: u64 = 256 * 1024 * 1024;

/// What a change of module states must alter to be reported before the next reconcile: restart
/// counts and pids alone wait for it.
type Shape = Vec<(String, ModuleState, Option<Exit>)>;

fn shape_of(modules: &[ModuleStatus]) -> Shape {
    modules
        .iter()
        .map(|m| (m.name.clone(), m.state.clone(), m.last_exit))
        .collect()
}

/// Why the agent did not apply an envelope, or could not keep its state. [`HostError::is_fatal`]
/// separates a refused envelope (the host carries on) from storage trouble (the host must stop).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("envelope refused: {0}")]
    Refused(Refusal),
    #[error("declaration at {position} refused, nothing applied: {refusal}")]
    Declaration {
        position: Position,
        refusal: DeclarationRefusal,
    },
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error(
        "mesh-host is stopping its modules and applies nothing more; send again once it is back"
    )]
    ShuttingDown,
    #[error("cannot read the genesis {path}: {reason}; write it again with `meshctl machines add`")]
    Genesis { path: String, reason: String },
}

impl HostError {
    /// True when the host can no longer keep its promises and must stop.
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            HostError::Refused(_)
                | HostError::Declaration { .. }
                | HostError::ShuttingDown
                | HostError::Genesis { .. }
        )
    }
}

/// What an accepted envelope did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub position: Position,
    pub digest: Digest,
    pub outcome: ApplyOutcome,
}

struct Inner {
    high_water: Option<Position>,
    applied: Option<AppliedRecord>,
    refusals: RefusalCounts,
    runtime: Runtime,
    /// Set by [`Agent::shutdown`]: nothing may start a module after the runtime stopped them all.
    closing: bool,
}

/// One machine's agent over its state directory.
pub struct Agent {
    config: HostConfig,
    files: StateFiles,
    reporter: Arc<Reporter>,
    inner: Mutex<Inner>,
    /// The runtime's board, watched without the state lock for module state changes.
    board: Board,
    /// The module states of the last report queued, so a change is reported once.
    reported: std::sync::Mutex<Shape>,
    /// What became of envelopes, for `/metrics`.
    envelopes: EnvelopeCounters,
}

impl Agent {
    /// Opens the state under the config's root: the high-water mark, the last applied declaration, the
    /// refusal counts and the report counter. Runs nothing until [`Agent::start`].
    pub fn open(config: HostConfig, sink: Arc<dyn ReportSink>) -> Result<Agent, HostError> {
        // The root holds the mark, the declaration (with its secrets) and the genesis envelope.
        if let Some(loose) = durable::private_dir(config.root()).map_err(StateError::from)? {
            tracing::warn!(dir = %loose.dir.display(), "{loose}");
        }
        let files = StateFiles::new(config.root());
        let high_water = files.load_high_water()?;
        let applied = files.load_applied()?;
        if let Some(record) = &applied
            && Some(record.position) > high_water
        {
            // The mark is written before the record, so the record can never be ahead of it.
            return Err(StateError::Corrupt {
                path: files.high_water_path(),
                reason: format!(
                    "the applied record is at {} but the mark is at {:?}",
                    record.position, high_water
                ),
            }
            .into());
        }
        let refusals = files.load_refusals()?;
        let reporter = Arc::new(Reporter::open(config.root(), sink)?);
        let layout = Layout::new(config.root(), config.mounts_root());
        let runtime = Runtime::new(layout, config.name());
        Ok(Agent {
            files,
            reporter,
            board: runtime.board(),
            reported: std::sync::Mutex::new(Vec::new()),
            envelopes: EnvelopeCounters::new(),
            inner: Mutex::new(Inner {
                high_water,
                applied,
                refusals,
                runtime,
                closing: false,
            }),
            config,
        })
    }

    /// Stops modules an earlier mesh-host left running, runs the last applied declaration again
    /// (after a restart) and reports.
    #[tracing::instrument(skip_all, fields(machine = %self.config.name()))]
    pub async fn start(&self) -> Result<Option<ApplyOutcome>, HostError> {
        let mut inner = self.inner.lock().await;
        leftovers::reap(&leftovers::run_dir(self.config.root())).await;
        let Some(record) = inner.applied.clone() else {
            self.enqueue_report(&inner).await?;
            drop(inner);
            self.flush_in_background();
            return Ok(None);
        };
        check_declaration(&record.declaration, self.config.name()).map_err(|refusal| {
            HostError::Declaration {
                position: record.position,
                refusal,
            }
        })?;
        tracing::info!(machine = %self.config.name(), epoch = record.position.epoch,
            sequence = record.position.sequence, "resuming the last applied declaration");
        let outcome = inner.runtime.apply(&record.declaration).await;
        self.enqueue_report(&inner).await?;
        drop(inner);
        // The listener starts after this returns; it must not wait on the controllers.
        self.flush_in_background();
        Ok(Some(outcome))
    }

    /// Applies the genesis in the state directory through the same fencing as any envelope, if
    /// this machine has accepted nothing yet (G11). `None` when there is no genesis or the machine
    /// is past it; a refused genesis is counted and reported like any refused envelope.
    pub async fn genesis(&self) -> Result<Option<Applied>, HostError> {
        if self.high_water().await.is_some() {
            return Ok(None);
        }
        let path = self.config.root().join(genesis_file_name);
        let fail = |reason: String| HostError::Genesis {
            path: path.display().to_string(),
            reason,
        };
        let size = match std::fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(fail(e.to_string())),
        };
        if size > genesis_bytes_max {
            return Err(fail(format!(
                "{size} bytes, over the {genesis_bytes_max}-byte limit"
            )));
        }
        let bytes = std::fs::read(&path).map_err(|e| fail(e.to_string()))?;
        tracing::info!(machine = %self.config.name(), "applying the genesis envelope");
        self.receive(&bytes).await.map(Some)
    }

    /// Verifies `wire` (the exact envelope bytes), raises the high-water mark on disk, applies the
    /// declaration and queues a report. A refusal is counted, logged and kept for the report.
    #[tracing::instrument(skip_all, fields(machine = %self.config.name(), bytes = wire.len()))]
    pub async fn receive(&self, wire: &[u8]) -> Result<Applied, HostError> {
        self.receive_from(None, wire).await
    }

    /// [`Agent::receive`] of an envelope that came over a connection with replica `sender`'s
    /// certificate: one signed by another replica is refused before it touches the mark
    /// ([`check_sender`], issue 27). `None` for an envelope read from a file (genesis).
    pub async fn receive_from(
        &self,
        sender: Option<u64>,
        wire: &[u8],
    ) -> Result<Applied, HostError> {
        let mut inner = self.inner.lock().await;
        if inner.closing {
            return Err(HostError::ShuttingDown);
        }
        let result = self.accept(&mut inner, sender, wire).await;
        self.envelopes.count(&result);
        if let Err(e) = &result
            && e.is_fatal()
        {
            // The disk failed part-way: apply nothing more; the process stops, and a restart
            // reads back whatever state did reach the disk.
            inner.closing = true;
        }
        drop(inner);
        if result.is_ok() {
            self.flush_in_background();
        }
        result
    }

    async fn accept(
        &self,
        inner: &mut Inner,
        sender: Option<u64>,
        wire: &[u8],
    ) -> Result<Applied, HostError> {
        let trusted = trusted_now(self.config.trusted(), inner.applied.as_ref());
        let opened = open_with_proof(wire, &trusted, self.config.name(), inner.high_water)
            .and_then(|(envelope, proof)| match sender {
                Some(sender) => check_sender(&envelope, sender).map(|()| (envelope, proof)),
                None => Ok((envelope, proof)),
            });
        let (envelope, proof) = match opened {
            Ok(opened) => opened,
            Err(refusal) => {
                let older = matches!(refusal, Refusal::Older { .. });
                self.count_refusal(inner, older, refusal.to_string())?;
                return Err(HostError::Refused(refusal));
            }
        };
        let position = envelope.position();
        if let Err(refusal) = self.check(inner, &envelope) {
            self.count_refusal(inner, false, refusal.to_string())?;
            return Err(HostError::Declaration { position, refusal });
        }
        let digest = digest(&envelope.declaration);
        // G2: the mark is durable before anything of the declaration touches the machine.
        self.files.store_high_water(position)?;
        inner.high_water = Some(position);
        let record = AppliedRecord {
            position,
            declaration: envelope.declaration,
            proof: Some(proof),
        };
        self.files.store_applied(&record)?;
        tracing::info!(machine = %self.config.name(), epoch = position.epoch,
            sequence = position.sequence, digest = %digest.short(), "applying declaration");
        let outcome = inner.runtime.apply(&record.declaration).await;
        inner.applied = Some(record);
        self.enqueue_report(inner).await?;
        Ok(Applied {
            position,
            digest,
            outcome,
        })
    }

    /// Builds a report of the current state, numbers and queues it, and delivers what the sink
    /// takes. Returns the report as numbered.
    #[tracing::instrument(skip_all, fields(machine = %self.config.name()))]
    pub async fn report_now(&self) -> Result<Report, HostError> {
        let report = {
            let inner = self.inner.lock().await;
            self.enqueue_report(&inner).await?
        };
        self.reporter.flush().await?;
        Ok(report)
    }

    /// Delivers queued reports now; returns how many went out.
    pub async fn flush_reports(&self) -> Result<usize, HostError> {
        Ok(self.reporter.flush().await?)
    }

    /// Reports every `reconcile_interval`, and soon after a module's state changes (it fails,
    /// becomes ready, starts waiting), until `stop` turns true; returns early only on an error
    /// that must stop the host.
    pub async fn reconcile(&self, mut stop: watch::Receiver<bool>) -> Result<(), HostError> {
        let interval = self.config.reconcile_interval();
        let mut board = self.board.subscribe();
        let mut next = Instant::now() + interval;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {
                    next = Instant::now() + interval;
                    self.check_drift().await;
                    self.report_now().await?;
                }
                changed = board.changed() => {
                    if changed.is_err() {
                        // The runtime is gone; only the periodic reports are left.
                        board = watch::channel(Default::default()).1;
                        continue;
                    }
                    if !settle(&mut board, &mut stop).await {
                        return Ok(());
                    }
                    if shape_of(&self.board.snapshot()) != *self.last_reported() {
                        self.report_now().await?;
                    }
                }
                _ = super::supervise::stopped(&mut stop) => return Ok(()),
            }
        }
    }

    /// Compares what every module runs with the declaration applied (decision 0305); what
    /// differs goes on the board and into the report that follows. The host repairs nothing on
    /// its own: a push does.
    pub async fn check_drift(&self) {
        let inner = self.inner.lock().await;
        if inner.closing {
            return;
        }
        inner.runtime.check_drift();
    }

    fn last_reported(&self) -> std::sync::MutexGuard<'_, Shape> {
        // A panic while holding this lock leaves a shape that is at worst stale: one report more.
        self.reported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stops every module and refuses every later envelope. The state on disk stays, so the next
    /// start resumes the same declaration.
    pub async fn shutdown(&self) {
        let mut inner = self.inner.lock().await;
        inner.closing = true;
        inner.runtime.shutdown().await;
    }

    pub async fn status(&self) -> Vec<ModuleStatus> {
        self.inner.lock().await.runtime.status()
    }

    pub async fn high_water(&self) -> Option<Position> {
        self.inner.lock().await.high_water
    }

    pub async fn refusals(&self) -> RefusalCounts {
        self.inner.lock().await.refusals.clone()
    }

    /// The declaration applied last, if any.
    pub async fn applied(&self) -> Option<(Position, Declaration)> {
        let inner = self.inner.lock().await;
        inner
            .applied
            .as_ref()
            .map(|r| (r.position, r.declaration.clone()))
    }

    /// Reports dropped from the full queue or refused by a controller since this agent opened.
    pub fn reports_dropped(&self) -> u64 {
        self.reporter.dropped()
    }

    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// The envelope counters `/metrics` reports.
    pub fn envelope_counters(&self) -> &EnvelopeCounters {
        &self.envelopes
    }

    /// The report counters `/metrics` reports.
    pub fn report_counters(&self) -> &ReportCounters {
        self.reporter.counters()
    }

    /// Every module's status as of now, from the board (no state lock: a scrape never waits for
    /// an apply).
    pub fn modules_now(&self) -> Vec<ModuleStatus> {
        self.board.snapshot()
    }

    /// Restarts of every module since this host started, for `/metrics` (decision 0313).
    pub fn module_restarts_total(&self) -> prometheus_client::metrics::counter::Counter {
        self.board.restarts_total()
    }

    /// Reports in the on-disk queue.
    pub fn reports_queued(&self) -> Result<usize, ReportError> {
        self.reporter.queued()
    }

    fn check(&self, inner: &Inner, envelope: &Envelope) -> Result<(), DeclarationRefusal> {
        check_declaration(&envelope.declaration, self.config.name())?;
        if let Some(current) = &inner.applied {
            check_mount_moves(&current.declaration, &envelope.declaration, &envelope.moves)?;
        }
        Ok(())
    }

    fn count_refusal(
        &self,
        inner: &mut Inner,
        older: bool,
        reason: String,
    ) -> Result<(), HostError> {
        tracing::warn!(machine = %self.config.name(), reason = %reason, "envelope refused");
        inner.refusals.total += 1;
        if older {
            inner.refusals.older += 1;
        }
        inner.refusals.last = Some(reason);
        self.files.store_refusals(&inner.refusals)?;
        Ok(())
    }

    /// Builds and numbers a report while the caller holds the state: a report numbered later
    /// always describes a state at least as new (G5 on the host's side).
    async fn enqueue_report(&self, inner: &Inner) -> Result<Report, HostError> {
        let report = self.build_report(inner)?;
        let report = self.reporter.enqueue(report).await?;
        *self.last_reported() = shape_of(&report.modules);
        Ok(report)
    }

    fn build_report(&self, inner: &Inner) -> Result<Report, HostError> {
        let (position, applied, proof) = match &inner.applied {
            Some(r) => (r.position, Some(digest(&r.declaration)), r.proof.clone()),
            None => (Position::default(), None, None),
        };
        let mut report = Report {
            machine: self.config.name().to_string(),
            epoch: position.epoch,
            sequence: position.sequence,
            report_sequence: 0,
            applied,
            modules: inner.runtime.status(),
            refused_older: inner.refusals.older,
            last_refusal: inner.refusals.last.clone(),
            proof,
        };
        // The leader refuses a report over its bounds (decision 0299): a long failure or
        // refusal is cut here, whole in this host's log.
        report.clip_texts();
        Ok(report)
    }

    /// The transport should not wait on the controllers' answer to a report: deliver it aside.
    fn flush_in_background(&self) {
        let reporter = Arc::clone(&self.reporter);
        let span = tracing::info_span!("flush", machine = %self.config.name());
        let flush = async move {
            if let Err(e) = reporter.flush().await {
                tracing::error!(error = %e, "cannot deliver queued reports");
            }
        };
        tokio::spawn(flush.instrument(span));
    }
}

/// Waits until `board` has been quiet for [`change_settle_ms`], or [`change_settle_ms_max`] has
/// passed; false if told to stop first.
async fn settle(
    board: &mut watch::Receiver<std::collections::BTreeMap<String, super::board::Entry>>,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let deadline = Instant::now() + Duration::from_millis(change_settle_ms_max);
    loop {
        let quiet = Instant::now() + Duration::from_millis(change_settle_ms);
        tokio::select! {
            _ = tokio::time::sleep_until(quiet.min(deadline)) => return true,
            changed = board.changed() => if changed.is_err() { return true; },
            _ = super::supervise::stopped(stop) => return false,
        }
        if Instant::now() >= deadline {
            return true;
        }
    }
}

/// The replica keys an envelope may be signed with now: `host.toml`'s `trusted_keys`, and the
/// added replicas' keys of the declaration last applied (decision 0230). That declaration was
/// itself signed by a trusted key, so a replica added to the cluster is trusted from the first
/// push after its key was committed, before it can lead; `host.toml` keys stay trusted whatever a
/// declaration says. A key in `host.toml` wins over a declaration's for the same id.
fn trusted_now(
    configured: &std::collections::BTreeMap<u64, ed25519_dalek::VerifyingKey>,
    applied: Option<&AppliedRecord>,
) -> std::collections::BTreeMap<u64, ed25519_dalek::VerifyingKey> {
    let mut trusted = configured.clone();
    if let Some(record) = applied {
        for (id, bytes) in &record.declaration.signers {
            // A key that is not an ed25519 point was refused by the state machine; skip it here too.
            if let Ok(key) = ed25519_dalek::VerifyingKey::from_bytes(bytes) {
                trusted.entry(*id).or_insert(key);
            }
        }
        // The declaration in force retires replicas (decision 0294): their keys sign nothing
        // this host applies, whatever the epoch, host.toml's keys included.
        for retired in crate::core::declaration::retired_replicas(&record.declaration.revoked) {
            trusted.remove(&retired);
        }
    }
    trusted
}

#[cfg(test)]
mod trust_tests {
    use super::*;

    #[test]
    fn g2_a_key_in_the_applied_declaration_is_trusted_beside_host_toml() {
        let founding = ed25519_dalek::SigningKey::from_bytes(&[1; 32]).verifying_key();
        let added = ed25519_dalek::SigningKey::from_bytes(&[4; 32]).verifying_key();
        let configured = std::collections::BTreeMap::from([(1, founding)]);
        assert_eq!(trusted_now(&configured, None), configured);
        let record = AppliedRecord {
            position: Position {
                epoch: 2,
                sequence: 1,
            },
            declaration: Declaration {
                machine: "ace".into(),
                modules: vec![],
                revoked: Default::default(),
                signers: std::collections::BTreeMap::from([
                    (4, added.to_bytes()),
                    (1, added.to_bytes()),
                ]),
            },
            proof: None,
        };
        let trusted = trusted_now(&configured, Some(&record));
        assert_eq!(
            trusted.get(&4),
            Some(&added),
            "the added replica is not trusted"
        );
        assert_eq!(
            trusted.get(&1),
            Some(&founding),
            "host.toml's key was replaced"
        );
    }

    #[test]
    fn g2_a_replica_the_declaration_in_force_retires_is_trusted_by_no_key_host_toml_included() {
        // Decision 0294: once the host applied a declaration that retires replicas 2 (founding,
        // in host.toml) and 4 (added), neither key signs anything it applies, whatever the epoch.
        let key = |b: u8| ed25519_dalek::SigningKey::from_bytes(&[b; 32]).verifying_key();
        let configured = std::collections::BTreeMap::from([(1, key(1)), (2, key(2))]);
        let record = AppliedRecord {
            position: Position {
                epoch: 6,
                sequence: 1,
            },
            declaration: Declaration {
                machine: "ace".into(),
                modules: vec![],
                revoked: std::collections::BTreeMap::from([
                    (
                        "principal:replica:2".into(),
                        "left out by a recovery".into(),
                    ),
                    ("principal:replica:4".into(), "removed".into()),
                    ("principal:operator:bob".into(), "left".into()),
                ]),
                signers: std::collections::BTreeMap::from([(4, key(4).to_bytes())]),
            },
            proof: None,
        };
        let trusted = trusted_now(&configured, Some(&record));
        assert_eq!(
            trusted.keys().copied().collect::<Vec<_>>(),
            vec![1],
            "{trusted:?}"
        );
    }
}

//! A machine joins a running mesh at its genesis (G11): the leader composes it exactly as a push
//! would — under its lease, its provisions minted and committed, its send recorded, its providers
//! cascaded and sent — and hands back the sealed envelope instead of sending it, because the
//! machine's agent is not running yet. `mesh-host` applies it at its first start through the same
//! fencing as any envelope.

use std::time::Instant;

use super::api::{ApiError, Body, GenesisError, PushTarget, RequestId};
use super::engine::PushJob;
use super::service::Service;
use crate::core::envelope::{Envelope, seal};

impl Service {
    /// `Request::Genesis`: refused for a machine not in the model or already sent to.
    pub(crate) async fn genesis(
        &self,
        actor: &str,
        id: RequestId,
        machine: String,
        why: String,
    ) -> Result<Body, ApiError> {
        let state = self.state()?;
        if !state.mesh.machines.contains_key(&machine) {
            return Err(GenesisError::UnknownMachine { machine }.into());
        }
        if let Some(send) = state.last_sends.get(&machine) {
            return Err(GenesisError::AlreadySent {
                machine,
                sequence: send.sequence,
                epoch: send.epoch,
            }
            .into());
        }
        drop(state);
        let job = PushJob {
            target: PushTarget::Machine(machine.clone()),
            why,
            moves: Vec::new(),
            saved: None,
            keep: Some(machine.clone()),
            request: Some(id),
        };
        let (body, sealed) = self.run_push(actor, job).await?;
        let Body::Push(cascade) = body else {
            return Err(ApiError::internal(format!(
                "the push for {machine}'s genesis answered {body:?}"
            )));
        };
        match sealed {
            Some(envelope) => Ok(Body::Genesis { envelope, cascade }),
            None => Err(GenesisError::NotSealed {
                lines: cascade
                    .lines
                    .iter()
                    .map(|l| format!("{}: {:?}", l.machine, l.outcome))
                    .collect::<Vec<_>>()
                    .join("; "),
                machine,
            }
            .into()),
        }
    }

    /// Seals the kept envelope, only while this replica leads in its epoch and before `deadline`,
    /// the lease's end (G3).
    pub(crate) fn seal_kept(
        &self,
        envelope: &Envelope,
        deadline: Instant,
    ) -> Result<Vec<u8>, String> {
        // Sealing is an act under the lease (decision 0225): refused once acting stopped.
        self.fence
            .act(|| self.seal_checked(envelope, deadline))
            .map_err(|e| e.to_string())?
    }

    fn seal_checked(&self, envelope: &Envelope, deadline: Instant) -> Result<Vec<u8>, String> {
        self.leads_in(envelope.epoch)?;
        let now = self.clock.now();
        if now >= deadline {
            return Err(format!(
                "lease closed: the lease of term {} ended {} ms before the genesis was sealed",
                envelope.epoch,
                now.duration_since(deadline).as_millis()
            ));
        }
        seal(envelope, &self.key).map_err(|e| format!("could not seal the genesis: {e}"))
    }
}

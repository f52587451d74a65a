//! `meshctl logs` on a replica: operators never dial hosts, so the replica asked relays the
//! request to the machine's mesh-host over QUIC (`MessageKind::Logs`, which only replicas may
//! send, G10) at the address its config's `[hosts]` gives, and hands back the host's bounded
//! answer. Any replica answers, leader or not: reading a log changes nothing and needs no lease.

use std::time::Duration;

use mesh_transport::{MessageKind, Peer, Principal, TransportError};

use super::api::{ApiError, Body};
use super::service::Service;
use crate::core::wire::{
    LogsAnswer, LogsAsk, log_cursors_max, log_lines_max, logs_answer_what, logs_ask_what,
};

impl Service {
    /// Asks `machine`'s host for `ask` and checks the answer is about that machine.
    pub(crate) async fn logs(&self, machine: String, ask: LogsAsk) -> Result<Body, ApiError> {
        if ask.lines == 0 || ask.lines > log_lines_max {
            return Err(ApiError::Invalid(format!(
                "--lines {} is out of range; give 1 to {log_lines_max}",
                ask.lines
            )));
        }
        if ask.from.len() > log_cursors_max {
            return Err(ApiError::Invalid(format!(
                "{} cursors in one logs request, at most {log_cursors_max}",
                ask.from.len()
            )));
        }
        let Some(addr) = self.config().hosts().get(&machine).copied() else {
            let known: Vec<&str> = self.config().hosts().keys().map(String::as_str).collect();
            return Err(ApiError::Invalid(format!(
                "no machine `{machine}` in [hosts] of replica {}'s config; known machines: {}",
                self.id(),
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        };
        let body = mesh_codec::encode(logs_ask_what, &ask)
            .map_err(|e| ApiError::Failed(format!("cannot encode the logs request: {e}")))?;
        let peer = Peer::expecting(addr, Principal::Host(machine.clone()));
        let timeout: Duration = self.endpoint.config().request_timeout();
        let bytes = match self
            .endpoint
            .request(peer, MessageKind::Logs, body, timeout)
            .await
        {
            Ok(bytes) => bytes,
            // The host read the request and said, naming itself, what is wrong with it (no such
            // module).
            Err(TransportError::Refused { reason, .. }) => return Err(ApiError::Invalid(reason)),
            Err(e) => {
                return Err(ApiError::Unavailable(format!(
                    "cannot read machine {machine}'s logs: {e}; is its mesh-host running?"
                )));
            }
        };
        let answer: LogsAnswer = mesh_codec::decode(logs_answer_what, &bytes).map_err(|e| {
            ApiError::Failed(format!("machine {machine}'s answer is unreadable: {e}"))
        })?;
        if answer.machine != machine {
            return Err(ApiError::Failed(format!(
                "asked machine {machine} for logs and {} answered; check [hosts] in the replica config",
                answer.machine
            )));
        }
        Ok(Body::Logs(answer))
    }
}

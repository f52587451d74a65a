//! `meshctl logs` on a replica: operators never dial hosts, so the replica asked relays the
//! request to the machine's mesh-host over QUIC (`MessageKind::Logs`, which only replicas may
//! send, G10) at the address its config's `[hosts]` gives, and hands back the host's bounded
//! answer. Any replica answers, leader or not: reading a log changes nothing and needs no lease.

use std::time::Duration;

use mesh_transport::{MessageKind, Peer, Principal, TransportError};

use super::api::{ApiError, Body, LogsError};
use super::service::Service;
use crate::core::wire::{
    LogsAnswer, LogsAsk, log_cursors_max, log_lines_max, logs_answer_what, logs_ask_what,
};

impl Service {
    /// Asks `machine`'s host for `ask` and checks the answer is about that machine.
    pub(crate) async fn logs(&self, machine: String, ask: LogsAsk) -> Result<Body, ApiError> {
        if ask.lines == 0 || ask.lines > log_lines_max {
            return Err(LogsError::LinesOutOfRange {
                lines: u64::from(ask.lines),
                max: u64::from(log_lines_max),
            }
            .into());
        }
        if ask.from.len() > log_cursors_max {
            return Err(LogsError::TooManyCursors {
                count: ask.from.len() as u64,
                max: log_cursors_max as u64,
            }
            .into());
        }
        let Some(addr) = self.config().hosts().get(&machine).copied() else {
            return Err(LogsError::UnknownMachine {
                machine,
                replica: self.id(),
                known: self.config().hosts().keys().cloned().collect(),
            }
            .into());
        };
        let body = mesh_codec::encode(logs_ask_what, &ask)
            .map_err(|e| ApiError::internal(format!("cannot encode the logs request: {e}")))?;
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
            Err(TransportError::Refused { reason, .. }) => {
                return Err(LogsError::HostRefused { machine, reason }.into());
            }
            Err(e) => {
                return Err(LogsError::HostUnreachable {
                    machine,
                    reason: e.to_string(),
                }
                .into());
            }
        };
        let answer: LogsAnswer = mesh_codec::decode(logs_answer_what, &bytes).map_err(|e| {
            LogsError::AnswerUnreadable {
                machine: machine.clone(),
                reason: e.to_string(),
            }
        })?;
        if answer.machine != machine {
            return Err(LogsError::WrongMachine {
                asked: machine,
                answered: answer.machine,
            }
            .into());
        }
        Ok(Body::Logs(answer))
    }
}

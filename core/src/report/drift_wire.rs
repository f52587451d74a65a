//! How a [`ModuleStatus`] crosses the wire and sits in the store with its drift (decision 0305):
//! a module that runs as declared is encoded exactly as before drift existed (its state's own
//! variant), a drifted one as `Drifted`, a variant added last to the state that wraps the real
//! state and the drift texts. So every report, account, Raft entry and fixture written before
//! drift decodes unchanged, and only a report that does carry drift is new to an older reader.

use serde::{Deserialize, Serialize};

use super::{Exit, ModuleState, ModuleStatus};

/// [`ModuleStatus`]'s encoded layout: its fields in their order, the state as [`StateWire`].
#[derive(Clone, Serialize, Deserialize)]
pub(super) struct StatusWire {
    name: String,
    state: StateWire,
    restarts: u32,
    pid: Option<u32>,
    last_exit: Option<Exit>,
}

/// [`ModuleState`]'s variants in their order (the index is the encoding), then `Drifted`.
#[derive(Clone, Serialize, Deserialize)]
enum StateWire {
    Starting,
    Waiting {
        on: String,
    },
    Ready,
    Running,
    Failed {
        error: String,
    },
    Stopped,
    /// Added last: the module's state, and what differs from its declaration (never empty).
    Drifted {
        state: ModuleState,
        drift: Vec<String>,
    },
}

impl From<ModuleState> for StateWire {
    fn from(state: ModuleState) -> StateWire {
        match state {
            ModuleState::Starting => StateWire::Starting,
            ModuleState::Waiting { on } => StateWire::Waiting { on },
            ModuleState::Ready => StateWire::Ready,
            ModuleState::Running => StateWire::Running,
            ModuleState::Failed { error } => StateWire::Failed { error },
            ModuleState::Stopped => StateWire::Stopped,
        }
    }
}

impl From<ModuleStatus> for StatusWire {
    fn from(m: ModuleStatus) -> StatusWire {
        let ModuleStatus {
            name,
            state,
            restarts,
            pid,
            last_exit,
            drift,
        } = m;
        let state = match drift.is_empty() {
            true => StateWire::from(state),
            false => StateWire::Drifted { state, drift },
        };
        StatusWire {
            name,
            state,
            restarts,
            pid,
            last_exit,
        }
    }
}

impl From<StatusWire> for ModuleStatus {
    fn from(w: StatusWire) -> ModuleStatus {
        let StatusWire {
            name,
            state,
            restarts,
            pid,
            last_exit,
        } = w;
        let (state, drift) = match state {
            StateWire::Starting => (ModuleState::Starting, Vec::new()),
            StateWire::Waiting { on } => (ModuleState::Waiting { on }, Vec::new()),
            StateWire::Ready => (ModuleState::Ready, Vec::new()),
            StateWire::Running => (ModuleState::Running, Vec::new()),
            StateWire::Failed { error } => (ModuleState::Failed { error }, Vec::new()),
            StateWire::Stopped => (ModuleState::Stopped, Vec::new()),
            StateWire::Drifted { state, drift } => (state, drift),
        };
        ModuleStatus {
            name,
            state,
            restarts,
            pid,
            last_exit,
            drift,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ModuleStatus` as it was derived before drift (issue 25): the layout every stored report,
    /// Raft entry and v1 fixture has.
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Before {
        name: String,
        state: ModuleState,
        restarts: u32,
        pid: Option<u32>,
        last_exit: Option<Exit>,
    }

    fn status(state: ModuleState, drift: Vec<String>) -> ModuleStatus {
        ModuleStatus {
            name: "broker".into(),
            state,
            restarts: 3,
            pid: Some(77),
            last_exit: Some(Exit::Signal(9)),
            drift,
        }
    }

    fn encode<T: Serialize>(v: &T) -> Vec<u8> {
        mesh_codec::encode("a module status", v).expect("encode")
    }

    #[test]
    fn a_module_without_drift_encodes_as_before_drift_existed_and_old_bytes_decode() {
        // Decision 0305: stored accounts, Raft entries and the report v1 fixture keep decoding.
        let states = [
            ModuleState::Starting,
            ModuleState::Waiting { on: "db".into() },
            ModuleState::Ready,
            ModuleState::Running,
            ModuleState::Failed {
                error: "exit 3".into(),
            },
            ModuleState::Stopped,
        ];
        for state in states {
            let before = Before {
                name: "broker".into(),
                state: state.clone(),
                restarts: 3,
                pid: Some(77),
                last_exit: Some(Exit::Signal(9)),
            };
            let now = status(state, Vec::new());
            assert_eq!(encode(&now), encode(&before), "{now:?}");
            let back: ModuleStatus =
                mesh_codec::decode("a module status", &encode(&before)).expect("decode");
            assert_eq!(back, now);
        }
    }

    #[test]
    fn a_drifted_module_round_trips_with_its_state_and_texts() {
        let drifted = status(
            ModuleState::Ready,
            vec![
                "conf/broker.conf changed".into(),
                "mount data missing".into(),
            ],
        );
        let bytes = encode(&drifted);
        let back: ModuleStatus = mesh_codec::decode("a module status", &bytes).expect("decode");
        assert_eq!(back, drifted);
        // An older reader cannot take it for a module without drift.
        assert!(mesh_codec::decode::<Before>("a module status", &bytes).is_err());
    }
}

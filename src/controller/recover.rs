//! `meshd recover --force-new-cluster`: one surviving replica made a one-member cluster with its
//! data after the others are lost (quorum loss, decision 0235), its first term above every epoch
//! floor it knows — the store's, the floor file beside it (G9), the epochs hosts proved in their
//! reports, the epochs of the sends it recorded, and its own Raft vote and log.
//!
//! Without `--force-new-cluster` it changes nothing and says what it would do, so an operator can
//! compare survivors (the one with the highest last index keeps the most) before choosing.

use std::path::PathBuf;

use mesh_raft::BasicNode;

use super::config::ReplicaConfig;
use super::floor::{FloorError, read_floor};
use crate::store::app::MeshApp;

/// Why a recovery did not happen; nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error(transparent)]
    Raft(#[from] mesh_raft::RecoverError),
    #[error("cannot read the domain state of the store in {dir}: {reason}")]
    State { dir: PathBuf, reason: String },
    #[error(transparent)]
    Floor(#[from] FloorError),
    #[error(
        "replica {id} has no address for itself in [peers] of its replica.toml; add `{id} = \"ip:port\"` (the address the others dial) and run recover again"
    )]
    NoOwnAddress { id: u64 },
}

/// Every epoch floor a replica knows, by where it comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Floors {
    /// The store's epoch floor: the highest term of an applied entry or a raised floor.
    pub store: u64,
    /// The epoch-floor file beside the store.
    pub file: u64,
    /// The highest epoch a host proved in a report filed into its account, and that host.
    pub proven: u64,
    pub proven_by: Option<String>,
    /// The highest epoch of a send recorded in the store.
    pub sent: u64,
    /// The Raft vote's term.
    pub vote: u64,
    /// The term of the last log entry (applied or not).
    pub last_log: u64,
}

impl Floors {
    /// The term the recovered store's vote is set to: the highest of every floor. The replica's
    /// first election is one above it, so its first epoch is above every epoch it knows was used.
    pub fn vote_term(&self) -> u64 {
        [
            self.store,
            self.file,
            self.proven,
            self.sent,
            self.vote,
            self.last_log,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }
}

impl std::fmt::Display for Floors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "store floor {}, floor file {}, hosts' proven epoch {}{}, sends' epoch {}, raft vote {}, last log term {}",
            self.store,
            self.file,
            self.proven,
            self.proven_by
                .as_ref()
                .map_or(String::new(), |m| format!(" ({m})")),
            self.sent,
            self.vote,
            self.last_log
        )
    }
}

/// What a recovery did, or would do without `--force-new-cluster`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovery {
    pub replica: u64,
    pub data_dir: PathBuf,
    /// The voters the store had before.
    pub voters_before: Vec<u64>,
    /// The last log index before (the new membership entry is the next one).
    pub last_index: Option<u64>,
    /// The last index known committed and the last applied one before.
    pub committed: Option<u64>,
    pub applied: Option<u64>,
    pub floors: Floors,
    /// The vote term written; the first term of the new cluster is `vote_term + 1`.
    pub vote_term: u64,
    /// Whether the store was rewritten (`--force-new-cluster`) or only read.
    pub done: bool,
}

impl Recovery {
    /// The first term (epoch) the recovered replica leads in.
    pub fn first_term(&self) -> u64 {
        self.vote_term + 1
    }

    /// The one line naming every floor and the chosen term.
    pub fn line(&self) -> String {
        let what = if self.done {
            "CLUSTER RECOVERED"
        } else {
            "RECOVER (dry run, nothing changed)"
        };
        let verb = if self.done { "is now" } else { "would be" };
        format!(
            "{what}: replica {} {verb} a one-member cluster {{{}}} with its data (voters before {:?}; last index {}, committed {}, applied {}); floors: {}; vote term {}, first term {}",
            self.replica,
            self.replica,
            self.voters_before,
            show(self.last_index),
            show(self.committed),
            show(self.applied),
            self.floors,
            self.vote_term,
            self.first_term()
        )
    }
}

fn show(index: Option<u64>) -> String {
    index.map_or("none".into(), |i| i.to_string())
}

/// Reads every floor of `config`'s store and, with `force`, rewrites the store into a one-member
/// cluster whose vote is at the highest of them. meshd must be stopped
/// on this store. Logs the result loudly (an ERROR line: the other replicas are gone for good).
pub async fn recover(config: &ReplicaConfig, force: bool) -> Result<Recovery, RecoverError> {
    let id = config.id();
    let dir = config.data_dir();
    let node = config
        .peers()
        .get(&id)
        .map(|addr| BasicNode::new(addr.to_string()))
        .ok_or(RecoverError::NoOwnAddress { id })?;
    // Refuses a directory with no store before anything else opens (and would create) one.
    let raft = mesh_raft::inspect(dir).await?;
    let mut floors = domain_floors(dir).await?;
    floors.file = read_floor(dir)?;
    floors.vote = raft.vote_term;
    floors.last_log = raft.last_log.map_or(0, |l| l.leader_id.term);
    let vote_term = floors.vote_term();
    let mut recovery = Recovery {
        replica: id,
        data_dir: dir.to_path_buf(),
        voters_before: raft.voters(),
        last_index: raft.last_log.map(|l| l.index),
        committed: raft.committed.map(|l| l.index),
        applied: raft.applied.map(|l| l.index),
        floors,
        vote_term,
        done: false,
    };
    if !force {
        return Ok(recovery);
    }
    // The floor file stays as it is: it holds the highest floor the store reached (a raised one
    // would read as a reset store at start), and the vote at `vote_term`, at or above it, carries
    // the choice. The first term's blank entry raises the store's floor, and the file follows.
    let recovered = mesh_raft::force_new_cluster(id, dir, node, vote_term).await?;
    recovery.vote_term = recovered.term;
    recovery.done = true;
    tracing::error!(
        replica = id,
        data_dir = %dir.display(),
        store_floor = recovery.floors.store,
        file_floor = recovery.floors.file,
        proven_epoch = recovery.floors.proven,
        sent_epoch = recovery.floors.sent,
        vote_term_before = recovery.floors.vote,
        last_log_term = recovery.floors.last_log,
        first_term = recovery.first_term(),
        "{}; the other replicas' stores are of the old cluster: never start them again as they are (move them aside, then add the replicas back)",
        recovery.line()
    );
    Ok(recovery)
}

/// The floors held in the domain state: the store's floor, the highest proven epoch of an
/// account, the highest epoch of a recorded send.
async fn domain_floors(dir: &std::path::Path) -> Result<Floors, RecoverError> {
    let owned = dir.to_path_buf();
    let state_err = |reason: String| RecoverError::State {
        dir: dir.to_path_buf(),
        reason,
    };
    let app = tokio::task::spawn_blocking(move || MeshApp::open(&owned))
        .await
        .map_err(|e| state_err(e.to_string()))?
        .map_err(|e| state_err(e.to_string()))?;
    let state = app.state().map_err(|e| state_err(e.to_string()))?;
    let mut floors = Floors {
        store: state.epoch_floor,
        ..Floors::default()
    };
    for (machine, account) in &state.accounts {
        let epochs = [
            account.last.map(|p| p.epoch),
            account.report.as_ref().map(|r| r.epoch),
        ];
        if let Some(epoch) = epochs.into_iter().flatten().max()
            && epoch > floors.proven
        {
            floors.proven = epoch;
            floors.proven_by = Some(machine.clone());
        }
    }
    floors.sent = state
        .last_sends
        .values()
        .map(|s| s.epoch)
        .max()
        .unwrap_or(0);
    Ok(floors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g9_the_recovered_vote_is_at_the_highest_of_every_floor() {
        // G9 (decision 0235): whichever floor is the highest, the recovered replica's first term
        // is above it.
        let base = Floors {
            store: 3,
            file: 3,
            proven: 3,
            proven_by: None,
            sent: 3,
            vote: 3,
            last_log: 3,
        };
        let raised: [fn(&mut Floors); 6] = [
            |f| f.store = 9,
            |f| f.file = 9,
            |f| f.proven = 9,
            |f| f.sent = 9,
            |f| f.vote = 9,
            |f| f.last_log = 9,
        ];
        for (which, raise) in raised.iter().enumerate() {
            let mut floors = base.clone();
            raise(&mut floors);
            assert_eq!(floors.vote_term(), 9, "floor #{which} is ignored: {floors}");
        }
        assert_eq!(base.vote_term(), 3);
    }
}

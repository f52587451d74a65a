//! Models larger than one proposal (issue 10 item 2, decision 0185): `meshctl` uploads the encoded
//! model in chunks, each its own proposal (`Command::StageChunk`) into a staging record every
//! replica keeps, and one small proposal (`Command::ApplyUpload`) checks the digest, decodes the
//! staged model, applies it as `ApplyModel` would and drops the staging rows, all in one commit.
//! Until then the current model is untouched: a refused, abandoned or dropped upload changes
//! nothing but the staging record.
//!
//! Pure like the rest of the state machine: time is the proposal's `time_ms`. Bounded by
//! [`staging_bytes_max`] (every staged upload together), [`uploads_max`] (uploads at once),
//! [`upload_chunk_bytes_max`], [`upload_chunks_max`] and [`upload_idle_ms`] (an upload no chunk
//! touched for that long is dropped); a new upload by an actor supersedes (drops) that actor's
//! unfinished ones.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

use super::command::{Applied, Proposal, Refusal};
use super::state::{Changed, DomainState};
use crate::core::model::{Machine, Mesh};
use crate::core::validate::model_bytes_max;

/// Most bytes staged at once, every upload together (each is at most [`model_bytes_max`]): two
/// whole models, so two operators can upload at once while every replica holds at most this.
pub const staging_bytes_max: u64 = 2 * model_bytes_max as u64;
/// Most uploads staged at once; a new one past it is refused (finished, dropped or expired
/// uploads free their place).
pub const uploads_max: usize = 4;
/// Largest chunk, in bytes: with the rest of its proposal well under raft's default
/// `batch_bytes_max` (4 MiB) and the transport's `frame_bytes_max` (16 MiB).
pub const upload_chunk_bytes_max: usize = 2 * 1024 * 1024;
/// The chunk size `meshctl` sends. Small, because openraft gives an AppendEntries only
/// `heartbeat_ms` (100 ms by default, 50 ms in the test beds) to reach a follower, be stored
/// there and be answered, and retries it whole when it does not: 256 KiB chunks timed out again
/// and again in the debug-build test bed on a loaded 2-core machine, 64 KiB ones did not.
pub const upload_chunk_bytes: usize = 64 * 1024;
/// Most chunks of one upload.
pub const upload_chunks_max: u32 = 4_096;
/// An upload no chunk reached for this long is dropped (at the next staging command) and can no
/// longer be applied.
pub const upload_idle_ms: u64 = 10 * 60 * 1_000;

/// An upload's id: 16 random bytes `meshctl` picks once per `apply`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct UploadId(pub [u8; 16]);

impl std::fmt::Display for UploadId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::hex::encode_hex(&self.0))
    }
}

/// Bytes of one chunk, shared: cloning the state while a reader holds a snapshot copies a pointer,
/// not the chunk. Encoded as a plain byte string; shown (`Debug`, in logs and errors) by its size.
#[derive(Clone, PartialEq, Eq)]
pub struct Chunk(pub Arc<Vec<u8>>);

impl std::fmt::Debug for Chunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Chunk({} bytes)", self.0.len())
    }
}

impl Chunk {
    pub fn new(bytes: Vec<u8>) -> Chunk {
        Chunk(Arc::new(bytes))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl Serialize for Chunk {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Chunk {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Chunk, D::Error> {
        struct Bytes;
        impl<'de> serde::de::Visitor<'de> for Bytes {
            type Value = Chunk;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Chunk, E> {
                Ok(Chunk::new(v))
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Chunk, E> {
                Ok(Chunk::new(v.to_vec()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Chunk, A::Error> {
                let mut out = Vec::new();
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(Chunk::new(out))
            }
        }
        d.deserialize_byte_buf(Bytes)
    }
}

/// What an upload is, besides its chunks: its row in table `uploads`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadHead {
    /// Who started it; only they may add to it or apply it.
    pub actor: String,
    pub chunks_total: u32,
    pub bytes_total: u64,
    /// `time_ms` of the proposal of the last chunk staged.
    pub touched_ms: u64,
}

/// One staged upload: its head and the chunks received so far (rows of `upload_chunks`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upload {
    pub head: UploadHead,
    pub chunks: BTreeMap<u32, Chunk>,
}

impl Upload {
    pub fn staged_bytes(&self) -> u64 {
        self.chunks.values().map(|c| c.len() as u64).sum()
    }

    fn idle(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.head.touched_ms) > upload_idle_ms
    }

    /// The staged model's bytes, when every chunk is there and they add up to the announced size.
    pub fn assembled(&self, id: &UploadId) -> Result<Vec<u8>, String> {
        let missing = self.head.chunks_total as usize - self.chunks.len();
        if missing > 0 {
            return Err(format!(
                "upload {id} has {} of its {} chunks; send the rest (meshctl does), then apply",
                self.chunks.len(),
                self.head.chunks_total
            ));
        }
        let staged = self.staged_bytes();
        if staged != self.head.bytes_total {
            return Err(format!(
                "upload {id} holds {staged} bytes but announced {}; upload it again",
                self.head.bytes_total
            ));
        }
        let mut out = Vec::with_capacity(staged as usize);
        for chunk in self.chunks.values() {
            out.extend_from_slice(chunk.bytes());
        }
        Ok(out)
    }
}

/// The blake3 digest `ApplyUpload` names: over the concatenated chunks (the encoded model).
pub fn upload_digest(bytes: &[u8]) -> [u8; 32] {
    *blake3::hash(bytes).as_bytes()
}

/// Decodes a staged model.
pub fn decode_model(id: &UploadId, bytes: &[u8]) -> Result<Mesh, String> {
    mesh_codec::decode::<Mesh>("staged model", bytes)
        .map_err(|e| format!("upload {id} is not an encoded model: {e}; upload it again"))
}

/// What a chunk says of its upload, as `Command::StageChunk` carries it.
#[derive(Clone, Copy, Debug)]
pub struct ChunkAt<'a> {
    pub upload: &'a UploadId,
    pub index: u32,
    pub chunks_total: u32,
    pub bytes_total: u64,
    pub bytes: &'a Chunk,
}

/// `Command::StageChunk`: every check before any change, so a refusal changes nothing. On
/// success: idle uploads and this actor's other unfinished uploads are dropped, and the chunk is
/// kept. The same chunk again (a retry) is answered as staged and changes nothing.
pub fn stage_chunk(
    state: &mut DomainState,
    p: &Proposal,
    at: ChunkAt<'_>,
    changed: &mut Vec<Changed>,
) -> Result<Applied, Refusal> {
    let ChunkAt {
        upload,
        index,
        chunks_total,
        bytes_total,
        bytes,
    } = at;
    let invalid = |why: String| {
        Err(Refusal::Invalid(format!(
            "upload {upload}: {why}; nothing was staged"
        )))
    };
    if chunks_total == 0 || chunks_total > upload_chunks_max {
        return invalid(format!(
            "{chunks_total} chunks announced, an upload has 1 to {upload_chunks_max} (upload_chunks_max)"
        ));
    }
    if index >= chunks_total {
        return invalid(format!(
            "chunk {index} of {chunks_total} does not exist (chunks count from 0)"
        ));
    }
    if bytes_total > model_bytes_max as u64 {
        return invalid(format!(
            "the model is {bytes_total} bytes, over the limit of {model_bytes_max} bytes a model may have (model_bytes_max); make it smaller: move large `files` contents onto a mount the module reads, or split the mesh"
        ));
    }
    if bytes.is_empty() || bytes.len() > upload_chunk_bytes_max {
        return invalid(format!(
            "chunk {index} is {} bytes, a chunk has 1 to {upload_chunk_bytes_max} (upload_chunk_bytes_max)",
            bytes.len()
        ));
    }
    let now = p.time_ms;
    let dropped: Vec<UploadId> = state
        .uploads
        .iter()
        .filter(|(id, u)| {
            *id != upload
                && (u.idle(now) || (u.head.actor == p.actor && !state.uploads.contains_key(upload)))
        })
        .map(|(id, _)| *id)
        .collect();
    match state.uploads.get(upload) {
        Some(u) => {
            if u.head.actor != p.actor {
                return invalid(format!(
                    "it was started by {}, not {}",
                    u.head.actor, p.actor
                ));
            }
            if u.head.chunks_total != chunks_total || u.head.bytes_total != bytes_total {
                return invalid(format!(
                    "it was announced as {} chunks of {} bytes in all, this chunk says {chunks_total} of {bytes_total}",
                    u.head.chunks_total, u.head.bytes_total
                ));
            }
            if let Some(have) = u.chunks.get(&index) {
                if have == bytes {
                    return Ok(staged_answer(upload, u));
                }
                return invalid(format!("chunk {index} was already staged with other bytes"));
            }
            if u.staged_bytes() + bytes.len() as u64 > bytes_total {
                return invalid(format!(
                    "chunk {index} brings it over the {bytes_total} bytes announced"
                ));
            }
        }
        None => {
            let others = state.uploads.iter().filter(|(id, _)| !dropped.contains(id));
            let (count, staged) = others.fold((0usize, 0u64), |(n, b), (_, u)| {
                (n + 1, b + u.head.bytes_total)
            });
            if count >= uploads_max {
                return invalid(format!(
                    "{count} uploads are staged already, the most at once (uploads_max); wait until they are applied or {} s pass",
                    upload_idle_ms / 1_000
                ));
            }
            if staged + bytes_total > staging_bytes_max {
                return invalid(format!(
                    "{bytes_total} bytes more would stage {} bytes, over the limit of {staging_bytes_max} (staging_bytes_max); wait until the other uploads are applied or {} s pass",
                    staged + bytes_total,
                    upload_idle_ms / 1_000
                ));
            }
            if bytes.len() as u64 > bytes_total {
                return invalid(format!(
                    "chunk {index} is larger than the {bytes_total} bytes announced"
                ));
            }
        }
    }
    for id in dropped {
        state.uploads.remove(&id);
        changed.push(Changed::Upload(id));
    }
    let u = state.uploads.entry(*upload).or_insert_with(|| Upload {
        head: UploadHead {
            actor: p.actor.clone(),
            chunks_total,
            bytes_total,
            touched_ms: now,
        },
        chunks: BTreeMap::new(),
    });
    u.head.touched_ms = now;
    u.chunks.insert(index, bytes.clone());
    changed.push(Changed::Upload(*upload));
    changed.push(Changed::UploadChunk {
        upload: *upload,
        index,
    });
    Ok(staged_answer(upload, u))
}

fn staged_answer(upload: &UploadId, u: &Upload) -> Applied {
    Applied::Staged {
        upload: *upload,
        received: u.chunks.len() as u32,
        chunks_total: u.head.chunks_total,
    }
}

/// The staged model of `upload` for `actor` at `now_ms`, checked against `digest`: every refusal
/// an `ApplyUpload` can meet before the model rules.
pub fn staged_model(
    state: &DomainState,
    actor: &str,
    now_ms: u64,
    upload: &UploadId,
    digest: &[u8; 32],
) -> Result<Mesh, String> {
    let Some(u) = state.uploads.get(upload) else {
        return Err(format!(
            "upload {upload} is not staged (never started, already applied, superseded by a newer upload, or dropped after {} s idle); run `meshctl apply` again",
            upload_idle_ms / 1_000
        ));
    };
    if u.head.actor != actor {
        return Err(format!(
            "upload {upload} was started by {}, not {actor}",
            u.head.actor
        ));
    }
    if u.idle(now_ms) {
        return Err(format!(
            "upload {upload} got no chunk for over {} s and is dropped (upload_idle_ms); run `meshctl apply` again",
            upload_idle_ms / 1_000
        ));
    }
    let bytes = u.assembled(upload)?;
    let got = upload_digest(&bytes);
    if &got != digest {
        return Err(format!(
            "upload {upload}: the staged bytes have blake3 {} but the apply names {}; a chunk was lost or changed on the way, run `meshctl apply` again",
            crate::hex::encode_hex(&got),
            crate::hex::encode_hex(digest)
        ));
    }
    decode_model(upload, &bytes)
}

/// `Command::ApplyUpload`: the staged model (digest checked), with the machines `keep` names put
/// back (a drain: the leader decided them on the state it checked, and the revision CAS holds
/// it to that state), applied as `ApplyModel`; the upload's rows go in the same commit.
pub fn apply_upload(
    state: &mut DomainState,
    p: &Proposal,
    upload: &UploadId,
    digest: &[u8; 32],
    keep: &[Machine],
) -> Result<Mesh, Refusal> {
    let mut mesh = staged_model(state, &p.actor, p.time_ms, upload, digest)
        .map_err(|e| Refusal::Invalid(format!("{e}; nothing was stored")))?;
    for machine in keep {
        mesh.machines
            .entry(machine.name.clone())
            .or_insert_with(|| machine.clone());
    }
    Ok(mesh)
}

/// Drops `upload`'s staging rows (after its model was applied).
pub fn drop_upload(state: &mut DomainState, upload: &UploadId, changed: &mut Vec<Changed>) {
    if state.uploads.remove(upload).is_some() {
        changed.push(Changed::Upload(*upload));
    }
}

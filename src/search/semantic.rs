//! Optional semantic ranking: a sentence-embedding model ([`Embedder`]) places queries and
//! capabilities in one vector space, so a query finds a capability that shares none of its words.
//!
//! Capability embeddings are computed off the request path ([`Semantic::plan`] and [`Semantic::apply`], run by a node task
//! as the view changes) and cached on disk by content hash (model id + text), so a restart re-embeds
//! nothing it has seen. Query embeddings are kept in a small LRU. A search reads only what is ready: a
//! capability whose embedding is not computed yet is ranked by its words alone.
//!
//! Fusion keeps one scale across queries (no per-query rescaling, which turned a weak one-word match
//! into a full vote for a confuser): the cosine is mapped to 0..=1 by the model's fixed floor and
//! ceiling, then mixed with the lexical relevance by a fixed share.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use sha2::{Digest, Sha256};

use super::embed::{EmbedError, Embedder};
use super::index::{Doc, Index};
use crate::card::held::CapRef;

/// Cosine at or below which a capability is unrelated to the query (MiniLM's scale: unrelated
/// sentences score about 0 to 0.1).
pub const COS_FLOOR: f32 = 0.10;
/// Cosine at which a capability fully matches (a close paraphrase scores 0.5 to 0.7).
pub const COS_FULL: f32 = 0.55;
/// Share of the fused relevance that is semantic; the rest is lexical. Chosen on the labelled set's
/// totals per query type (0.6 to 0.9 tried): the model already ranks word-for-word queries first, and
/// a larger lexical share let weak one-word matches outrank paraphrases.
pub const SEMANTIC_SHARE: f32 = 0.85;
/// Query embeddings kept.
pub const QUERY_CACHE: usize = 1024;
/// Texts embedded in one call of the model.
pub const BATCH: usize = 32;
/// Capability embeddings held in memory; past it the table is rebuilt from the live view.
pub const MAX_VECTORS: usize = 250_000;
/// Capability embeddings kept on disk; past it new ones are not written (they are recomputed).
pub const MAX_DISK_VECTORS: usize = 500_000;
/// Longest embedding text, in bytes (the model reads at most 256 word pieces anyway).
const MAX_TEXT: usize = 2048;

/// Row marker for a slot with no embedding yet.
const NONE: u32 = u32::MAX;

/// Errors of the semantic ranker.
#[derive(Debug, thiserror::Error)]
pub enum SemanticError {
    #[error(transparent)]
    Model(#[from] EmbedError),
    #[error("embedding cache {path}: {source}")]
    Cache { path: String, source: sled::Error },
    #[error("embedding stopped: {0}")]
    Background(String),
}

/// What a capability is embedded as: its name (or its id in words) and its description. Measured on
/// the labelled set in `benches/search/`, adding the category, tags, parameters or requirements made
/// paraphrase and intent queries no better, and lexical search already reads those fields.
pub fn embedding_text(cap: &CapRef<'_>) -> String {
    let mut text = String::new();
    text.push_str(cap.name.as_deref().unwrap_or(&cap.id.replace(['_', '-', '.'], " ")));
    if let Some(d) = cap.description.as_deref().map(str::trim).filter(|d| !d.is_empty()) {
        text.push_str(". ");
        text.push_str(d);
    }
    if text.len() > MAX_TEXT {
        let cut = (0..=MAX_TEXT).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        text.truncate(cut);
    }
    text
}

fn text_of(doc: &Doc) -> Option<String> {
    let card_text = doc.entry.card.text();
    let card = card_text.view();
    let list = if doc.reasoner { &card.reasoners } else { &card.skills };
    list.get(doc.cap as usize).map(embedding_text)
}

fn hash_text(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// Capability embeddings by text hash, as rows of one flat table.
#[derive(Debug, Default)]
struct Vectors {
    rows: HashMap<u64, u32>,
    data: Vec<f32>,
}

/// Which row each index slot uses, for one index generation.
#[derive(Debug, Default)]
struct Slots {
    generation: u64,
    rows: Vec<u32>,
    /// Slots with an embedding.
    ready: usize,
}

/// A small LRU of query embeddings.
#[derive(Debug, Default)]
struct Queries {
    map: HashMap<String, (Arc<[f32]>, u64)>,
    tick: u64,
}

impl Queries {
    fn get(&mut self, q: &str) -> Option<Arc<[f32]>> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(q).map(|(v, used)| {
            *used = tick;
            v.clone()
        })
    }

    fn put(&mut self, q: String, v: Arc<[f32]>) {
        if self.map.len() >= QUERY_CACHE {
            if let Some(oldest) = self.map.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone()) {
                self.map.remove(&oldest);
            }
        }
        self.tick += 1;
        self.map.insert(q, (v, self.tick));
    }
}

/// The semantic side of one node's search.
pub struct Semantic {
    embedder: Embedder,
    disk: Option<sled::Db>,
    vectors: RwLock<Vectors>,
    slots: RwLock<Slots>,
    queries: Mutex<Queries>,
}

impl std::fmt::Debug for Semantic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semantic").field("model", &self.embedder.model_id()).finish_non_exhaustive()
    }
}

/// What one index generation needs embedded ([`Semantic::plan`]).
#[derive(Debug)]
pub struct Plan {
    pub generation: u64,
    hashes: Vec<Option<u64>>,
    missing: Vec<(u64, String)>,
}

impl Plan {
    /// Capabilities with no embedding in memory.
    pub fn missing(&self) -> usize {
        self.missing.len()
    }
}

/// A query's embedding and the slot table it is compared through.
pub struct Ready<'a> {
    pub query: Arc<[f32]>,
    slots: std::sync::RwLockReadGuard<'a, Slots>,
    vectors: std::sync::RwLockReadGuard<'a, Vectors>,
    dim: usize,
}

impl Ready<'_> {
    /// The query's semantic relevance to the capability in `slot` (0..=1), if it is embedded.
    pub fn relevance(&self, slot: u32) -> Option<f32> {
        let row = *self.slots.rows.get(slot as usize)?;
        if row == NONE {
            return None;
        }
        let start = row as usize * self.dim;
        let v = self.vectors.data.get(start..start + self.dim)?;
        let cos: f32 = v.iter().zip(self.query.iter()).map(|(a, b)| a * b).sum();
        Some(((cos - COS_FLOOR) / (COS_FULL - COS_FLOOR)).clamp(0.0, 1.0))
    }

    /// Index slots the table covers.
    pub fn slots(&self) -> u32 {
        self.slots.rows.len() as u32
    }
}

impl Semantic {
    /// Loads the model in `model_dir`; `cache_dir` (if any) holds the embedding cache.
    pub fn load(model_dir: &Path, cache_dir: Option<&Path>) -> Result<Self, SemanticError> {
        let embedder = Embedder::load(model_dir)?;
        let disk = cache_dir
            .map(|dir| {
                sled::Config::new()
                    .path(dir)
                    .cache_capacity(16 << 20)
                    .open()
                    .map_err(|source| SemanticError::Cache { path: dir.display().to_string(), source })
            })
            .transpose()?;
        Ok(Self {
            embedder,
            disk,
            vectors: RwLock::default(),
            slots: RwLock::default(),
            queries: Mutex::default(),
        })
    }

    pub fn model_id(&self) -> &str {
        self.embedder.model_id()
    }

    /// Capability embeddings held.
    pub fn len(&self) -> usize {
        self.vectors.read().map(|v| v.rows.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn disk_key(&self, text: &str) -> [u8; 16] {
        let mut h = Sha256::new();
        h.update(self.embedder.model_id().as_bytes());
        h.update([0]);
        h.update(text.as_bytes());
        let digest = h.finalize();
        let mut key = [0u8; 16];
        key.copy_from_slice(&digest[..16]);
        key
    }

    /// The embedding of query `q`, from the LRU or the model.
    pub fn query(&self, q: &str) -> Result<Arc<[f32]>, EmbedError> {
        if let Some(v) = self.queries.lock().unwrap_or_else(|e| e.into_inner()).get(q) {
            return Ok(v);
        }
        let v: Arc<[f32]> = self.embedder.embed(&[q])?.pop().unwrap_or_default().into();
        self.queries.lock().unwrap_or_else(|e| e.into_inner()).put(q.to_owned(), v.clone());
        Ok(v)
    }

    /// The query's embedding and the slot table, when the table is for `generation` of the index.
    pub fn ready(&self, q: &str, generation: u64) -> Option<Ready<'_>> {
        let usable = |s: &Slots| s.generation == generation && s.ready > 0;
        if !usable(&self.slots.read().unwrap_or_else(|e| e.into_inner())) {
            return None;
        }
        let query = match self.query(q) {
            Ok(v) => v,
            Err(error) => {
                tracing::warn!(target: "agentmesh::search", %error, "query embedding failed; lexical ranking only");
                return None;
            }
        };
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        if !usable(&slots) {
            return None;
        }
        let vectors = self.vectors.read().unwrap_or_else(|e| e.into_inner());
        Some(Ready { query, slots, vectors, dim: self.embedder.dim() })
    }

    /// What `index` needs: the text hash of every slot, and the texts with no embedding in memory.
    /// Takes a while at 40,000 capabilities (a text per capability), so run it as the view changes,
    /// not per query.
    pub fn plan(&self, index: &Index) -> Plan {
        let mut hashes = vec![None; index.slots() as usize];
        let mut missing: Vec<(u64, String)> = Vec::new();
        let vectors = self.vectors.read().unwrap_or_else(|e| e.into_inner());
        let mut wanted = std::collections::HashSet::new();
        for slot in 0..index.slots() {
            let Some(text) = index.doc(slot).and_then(text_of) else { continue };
            let h = hash_text(&text);
            hashes[slot as usize] = Some(h);
            if !vectors.rows.contains_key(&h) && wanted.insert(h) {
                missing.push((h, text));
            }
        }
        Plan { generation: index.generation(), hashes, missing }
    }

    /// Carries out `plan`: embeddings from the disk cache, else from the model in batches; after
    /// each batch the slot table is pointed at the plan's index generation, so searches use what is
    /// ready. Stops early when `stop` says so (the view moved on). Returns how many the model computed.
    pub fn apply(&self, plan: Plan, mut stop: impl FnMut() -> bool) -> Result<usize, EmbedError> {
        let dim = self.embedder.dim();
        if self.len() + plan.missing.len() > MAX_VECTORS {
            // Start over from what the view holds now (the disk cache makes it cheap).
            *self.vectors.write().unwrap_or_else(|e| e.into_inner()) = Vectors::default();
            self.slots.write().unwrap_or_else(|e| e.into_inner()).generation = u64::MAX;
        }
        let mut computed = 0;
        let mut found: Vec<(u64, Vec<f32>)> = Vec::new();
        let mut to_embed: Vec<&(u64, String)> = Vec::new();
        for item in &plan.missing {
            let cached = self.disk.as_ref().and_then(|d| d.get(self.disk_key(&item.1)).ok().flatten());
            match cached.filter(|bytes| bytes.len() == dim * 4) {
                Some(bytes) => found.push((
                    item.0,
                    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
                )),
                None => to_embed.push(item),
            }
        }
        self.publish(&plan, std::mem::take(&mut found));
        for batch in to_embed.chunks(BATCH) {
            if stop() {
                break;
            }
            let texts: Vec<&str> = batch.iter().map(|(_, t)| t.as_str()).collect();
            let vecs = self.embedder.embed_background(&texts)?;
            for ((h, text), v) in batch.iter().zip(vecs) {
                if let Some(disk) = &self.disk {
                    if disk.len() < MAX_DISK_VECTORS {
                        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                        if let Err(error) = disk.insert(self.disk_key(text), bytes) {
                            tracing::warn!(target: "agentmesh::search", %error, "embedding cache write failed");
                        }
                    }
                }
                found.push((*h, v));
                computed += 1;
            }
            self.publish(&plan, std::mem::take(&mut found));
        }
        Ok(computed)
    }

    /// Adds `found` and points the slot table at the plan's generation.
    fn publish(&self, plan: &Plan, found: Vec<(u64, Vec<f32>)>) {
        let dim = self.embedder.dim();
        // Rows are only appended, so a reader holding the old slot table stays right; the two locks
        // are never held together here (a search takes the slots, then the vectors).
        let rows = {
            let mut vectors = self.vectors.write().unwrap_or_else(|e| e.into_inner());
            for (h, v) in found {
                if v.len() != dim || vectors.rows.contains_key(&h) {
                    continue;
                }
                let row = (vectors.data.len() / dim) as u32;
                vectors.data.extend_from_slice(&v);
                vectors.rows.insert(h, row);
            }
            plan.hashes
                .iter()
                .map(|h| h.and_then(|h| vectors.rows.get(&h).copied()).unwrap_or(NONE))
                .collect()
        };
        let rows: Vec<u32> = rows;
        let ready = rows.iter().filter(|r| **r != NONE).count();
        *self.slots.write().unwrap_or_else(|e| e.into_inner()) =
            Slots { generation: plan.generation, rows, ready };
    }
}

#[cfg(test)]
mod tests;

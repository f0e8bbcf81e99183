//! Sentence embeddings for semantic ranking: a local sentence-transformers model of the BERT family
//! (such as all-MiniLM-L6-v2) run on the CPU in pure Rust, mean-pooled over the attention mask and
//! L2-normalised, so the dot product of two embeddings is their cosine similarity.
//!
//! [`Embedder::load`] reads a model directory holding `config.json`, `model.safetensors` and
//! `tokenizer.json` (the layout sentence-transformers saves); nothing is fetched at run time.
//!
//! # Threads
//!
//! Candle's CPU backend parallelises in two places, both through rayon:
//!
//! - matrix products go to the `gemm` crate with `Parallelism::Rayon(n)`, where `n` is
//!   `RAYON_NUM_THREADS` or else the number of physical cores, read on every product
//!   (`Parallelism::None` when `n` is 1); `gemm` runs a product on one thread below its own size
//!   threshold and otherwise splits it into `n` tasks on the *current* rayon pool;
//! - softmax and layer norm (`candle_nn::ops`) split rows with `par_chunks` on the current pool.
//!
//! Called from outside any pool, both land on rayon's global pool (one thread per logical core),
//! shared with the rest of the process. An [`Embedder`] instead runs every forward pass inside its
//! own rayon pool of one thread by default ([`Embedder::load_with_threads`] sets another number), so
//! all of that work stays on one core whatever the environment says, and a query does not wait
//! behind, or for, unrelated work on the global pool. With one thread the split `gemm` tasks run one
//! after the other and the row loops run in order; no other thread is woken.
//!
//! A query of about ten word pieces costs roughly 0.2 GFLOP (six layers of products with 1.8 M
//! weights each), mostly matrix products. With so few rows `gemm` does not pack the weights,
//! but it still splits every product above 48 x 48 x 256 multiply-adds into `n` tasks; in the
//! one-thread pool those run one after the other. Against `RAYON_NUM_THREADS=1` (no split at all)
//! the difference was within the noise of a shared two-core machine.
//!
//! Tokenisation runs on the calling thread, one text at a time (`encode_fast`, no offsets).

use std::fmt;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use sha2::Digest as _;
use tokenizers::{Tokenizer, TruncationParams};

#[cfg(test)]
pub(crate) mod tests;

/// Longest input, in word pieces counting the `[CLS]` and `[SEP]` markers (sentence-transformers'
/// `max_seq_length`; all-MiniLM-L6-v2 was trained at 256). Longer texts are cut at the end.
pub const MAX_TOKENS: usize = 256;
/// Texts run through the model together. Texts are sorted by length first, so a batch is padded
/// only to the longest of similar lengths.
const BATCH: usize = 32;

/// The files a model directory must hold.
const CONFIG: &str = "config.json";
const WEIGHTS: &str = "model.safetensors";
const TOKENIZER: &str = "tokenizer.json";
/// sentence-transformers' pooling settings, checked when present.
const POOLING: &str = "1_Pooling/config.json";

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// A file of the model directory could not be read.
    #[error("{}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// A JSON file is not valid JSON.
    #[error("{}: not valid JSON: {source}", path.display())]
    Json { path: PathBuf, source: serde_json::Error },
    /// `config.json` is not the configuration of a BERT model, or not one this embedder runs.
    #[error("{}: not a BERT model configuration: {reason}", path.display())]
    NotBert { path: PathBuf, reason: String },
    /// The pooling settings ask for something other than mean pooling.
    #[error("{}: {reason}", path.display())]
    Pooling { path: PathBuf, reason: String },
    /// `tokenizer.json` could not be loaded or does not fit the model.
    #[error("{}: {reason}", path.display())]
    Tokenizer { path: PathBuf, reason: String },
    /// `model.safetensors` could not be read as the weights `config.json` describes.
    #[error("{}: {source}", path.display())]
    Weights { path: PathBuf, source: candle_core::Error },
    /// The thread pool for the model could not be started.
    #[error("cannot start the embedding thread pool: {0}")]
    Threads(#[from] rayon::ThreadPoolBuildError),
    /// A text could not be tokenised.
    #[error("tokenising a text: {0}")]
    Tokenize(String),
    /// The forward pass failed.
    #[error("running the model: {0}")]
    Model(#[from] candle_core::Error),
}

/// A loaded sentence embedder. It is `Send + Sync`: one instance can serve every thread, and each
/// call to [`Embedder::embed`] runs on the embedder's own thread pool (see the module docs).
pub struct Embedder {
    model: BertModel,
    tokenizer: Tokenizer,
    pool: rayon::ThreadPool,
    /// One thread at the lowest CPU priority, for embedding capabilities in the background.
    background: rayon::ThreadPool,
    dim: usize,
    pad_id: u32,
    model_id: String,
}

impl fmt::Debug for Embedder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Embedder")
            .field("dim", &self.dim)
            .field("model_id", &self.model_id)
            .field("threads", &self.pool.current_num_threads())
            .finish_non_exhaustive()
    }
}

fn read(dir: &Path, name: &str) -> Result<(PathBuf, Vec<u8>), EmbedError> {
    let path = dir.join(name);
    match std::fs::read(&path) {
        Ok(bytes) => Ok((path, bytes)),
        Err(source) => Err(EmbedError::Read { path, source }),
    }
}

fn json(path: &Path, bytes: &[u8]) -> Result<serde_json::Value, EmbedError> {
    serde_json::from_slice(bytes).map_err(|source| EmbedError::Json { path: path.to_owned(), source })
}

/// Checks `config.json` and reads it as a BERT configuration.
fn bert_config(path: &Path, bytes: &[u8]) -> Result<Config, EmbedError> {
    let not_bert = |reason: String| EmbedError::NotBert { path: path.to_owned(), reason };
    let value = json(path, bytes)?;
    match value.get("model_type").and_then(|t| t.as_str()) {
        Some("bert") => {}
        Some(other) => return Err(not_bert(format!("model_type is {other:?}, expected \"bert\""))),
        None => return Err(not_bert("no model_type".into())),
    }
    let config: Config = serde_json::from_value(value).map_err(|e| not_bert(e.to_string()))?;
    if config.hidden_size == 0
        || config.num_attention_heads == 0
        || !config.hidden_size.is_multiple_of(config.num_attention_heads)
    {
        return Err(not_bert(format!(
            "hidden_size {} is not a positive multiple of num_attention_heads {}",
            config.hidden_size, config.num_attention_heads
        )));
    }
    if config.max_position_embeddings < 2 || config.type_vocab_size == 0 || config.vocab_size == 0 {
        return Err(not_bert(
            "max_position_embeddings, type_vocab_size and vocab_size must be positive".into(),
        ));
    }
    Ok(config)
}

/// Refuses a sentence-transformers pooling configuration that is not plain mean pooling.
fn check_pooling(dir: &Path) -> Result<(), EmbedError> {
    let path = dir.join(POOLING);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(EmbedError::Read { path, source }),
    };
    let value = json(&path, &bytes)?;
    let on = |key: &str| value.get(key).and_then(|v| v.as_bool()).unwrap_or(false);
    let others = ["pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens"];
    if !on("pooling_mode_mean_tokens") || others.iter().any(|k| on(k)) {
        return Err(EmbedError::Pooling {
            path,
            reason: "only mean pooling (pooling_mode_mean_tokens alone) is supported".into(),
        });
    }
    Ok(())
}

impl Embedder {
    /// Loads the model in `dir` to run on one thread. Errors name the file at fault.
    pub fn load(dir: &Path) -> Result<Self, EmbedError> {
        Self::load_with_threads(dir, 1)
    }

    /// Loads the model in `dir` to run on a pool of `threads` threads (at least one).
    pub fn load_with_threads(dir: &Path, threads: usize) -> Result<Self, EmbedError> {
        let (config_path, config_bytes) = read(dir, CONFIG)?;
        let config = bert_config(&config_path, &config_bytes)?;
        check_pooling(dir)?;

        let (tokenizer_path, tokenizer_bytes) = read(dir, TOKENIZER)?;
        let tokenizer_err = |reason: String| EmbedError::Tokenizer { path: tokenizer_path.clone(), reason };
        let mut tokenizer =
            Tokenizer::from_bytes(&tokenizer_bytes).map_err(|e| tokenizer_err(e.to_string()))?;
        let vocab = tokenizer.get_vocab_size(true);
        if vocab > config.vocab_size {
            return Err(tokenizer_err(format!(
                "{vocab} tokens, more than the model's vocab_size {}",
                config.vocab_size
            )));
        }
        // The saved tokenizer may pad every text to a fixed length and cut at another length than the
        // model's (all-MiniLM-L6-v2's pads and cuts at 128); padding is done here per batch.
        let max_length = MAX_TOKENS.min(config.max_position_embeddings);
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams { max_length, ..Default::default() }))
            .map_err(|e| tokenizer_err(e.to_string()))?;
        let pad_id = tokenizer.token_to_id("[PAD]").unwrap_or(config.pad_token_id as u32);

        let (weights_path, weights) = read(dir, WEIGHTS)?;
        let mut hash = sha2::Sha256::new();
        for (name, bytes) in [(CONFIG, &config_bytes), (TOKENIZER, &tokenizer_bytes), (WEIGHTS, &weights)] {
            hash.update(name.as_bytes());
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        }
        let model_id = hash.finalize().iter().map(|b| format!("{b:02x}")).collect::<String>();
        let weights_err = |source| EmbedError::Weights { path: weights_path.clone(), source };
        let model = VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu)
            .and_then(|vb| BertModel::load(vb, &config))
            .map_err(weights_err)?;

        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("embed-{i}"))
            .build()?;
        let background = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .thread_name(|_| "embed-background".to_owned())
            .start_handler(|_| lowest_priority())
            .build()?;
        Ok(Self { model, tokenizer, pool, background, dim: config.hidden_size, pad_id, model_id })
    }

    /// Length of every embedding (384 for all-MiniLM-L6-v2).
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// A stable hex id of the model: SHA-256 over the bytes of `config.json`, `tokenizer.json` and
    /// `model.safetensors`. The same files give the same id, so it can key an on-disk cache of
    /// embeddings.
    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// Threads of the pool the model runs on.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Unit-length embeddings, one per text in the same order, each [`Embedder::dim`] long. Any
    /// number of texts; texts longer than [`MAX_TOKENS`] word pieces are cut.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_on(&self.pool, texts)
    }

    /// [`Embedder::embed`] on a thread of the lowest CPU priority (nice 19), tokenising included: for
    /// work nobody waits on, so that it takes what the cores leave and requests keep their latency.
    pub fn embed_background(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.background.install(|| self.embed_on(&self.background, texts))
    }

    fn embed_on(&self, pool: &rayon::ThreadPool, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut encoded = Vec::with_capacity(texts.len());
        for text in texts {
            let encoding =
                self.tokenizer.encode_fast(*text, true).map_err(|e| EmbedError::Tokenize(e.to_string()))?;
            encoded.push(encoding.get_ids().to_vec());
        }
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| encoded[i].len());
        let mut out = vec![Vec::new(); texts.len()];
        for batch in order.chunks(BATCH) {
            let ids: Vec<&[u32]> = batch.iter().map(|&i| encoded[i].as_slice()).collect();
            let vectors = pool.install(|| self.forward(&ids))?;
            for (&i, v) in batch.iter().zip(vectors) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    /// One padded batch through the model, mean-pooled and normalised.
    fn forward(&self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let rows = batch.len();
        let len = batch.iter().map(|ids| ids.len()).max().unwrap_or(0).max(1);
        let mut ids = Vec::with_capacity(rows * len);
        let mut mask = Vec::with_capacity(rows * len);
        for seq in batch {
            ids.extend_from_slice(seq);
            ids.resize(ids.len() + len - seq.len(), self.pad_id);
            mask.extend(std::iter::repeat_n(1u32, seq.len()));
            mask.resize(mask.len() + len - seq.len(), 0);
        }
        let ids = Tensor::from_vec(ids, (rows, len), &Device::Cpu)?;
        let types = ids.zeros_like()?;
        let mask_t = Tensor::from_vec(mask, (rows, len), &Device::Cpu)?;
        let hidden = self.model.forward(&ids, &types, Some(&mask_t))?;
        let hidden = hidden.flatten_all()?.to_vec1::<f32>()?;
        let dim = self.dim;
        let mut out = Vec::with_capacity(rows);
        for (r, seq) in batch.iter().enumerate() {
            let mut sum = vec![0f32; dim];
            for t in 0..seq.len() {
                let at = (r * len + t) * dim;
                for (s, h) in sum.iter_mut().zip(&hidden[at..at + dim]) {
                    *s += h;
                }
            }
            let count = seq.len().max(1) as f32;
            let mean: Vec<f32> = sum.into_iter().map(|x| x / count).collect();
            // The same floor as sentence-transformers' normalisation.
            let norm = mean.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            out.push(mean.into_iter().map(|x| x / norm).collect());
        }
        Ok(out)
    }
}

/// Niceness of the background embedding thread: the lowest priority.
const BACKGROUND_NICE: libc::c_int = 19;

/// Lowers the calling thread to [`BACKGROUND_NICE`] (Linux schedules threads one by one; elsewhere
/// nothing changes).
fn lowest_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take and return plain integers; the call only changes the
        // scheduling priority of the calling thread.
        let failed =
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, BACKGROUND_NICE) };
        if failed != 0 {
            tracing::debug!("could not lower the background embedding thread's priority");
        }
    }
}

/// Cosine similarity of two unit-length embeddings (their dot product).
pub fn similarity(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

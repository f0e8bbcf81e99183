//! Two kinds of tests: on a tiny BERT written here (loading errors, padding, truncation, the model
//! id; always run), and on the real model when `AGENTMESH_TEST_MODEL_DIR` names its directory
//! (agreement with `reference.json`, made by `benches/search/reference_embeddings.py`, an
//! independent numpy implementation; and whether meaning is captured).

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::{json, Value};

use super::*;

const ENV: &str = "AGENTMESH_TEST_MODEL_DIR";

/// The real model, loaded once for the whole test binary; `None` (and a printed line) without it.
fn model(test: &str) -> Option<&'static Embedder> {
    static MODEL: OnceLock<Option<Embedder>> = OnceLock::new();
    let model = MODEL
        .get_or_init(|| {
            let dir = std::env::var_os(ENV)?;
            Some(Embedder::load(Path::new(&dir)).expect("load the model in AGENTMESH_TEST_MODEL_DIR"))
        })
        .as_ref();
    if model.is_none() {
        println!("{test} skipped: set {ENV} to a sentence-transformers all-MiniLM-L6-v2 directory to run it");
    }
    model
}

fn norm(v: &[f32]) -> f32 {
    similarity(v, v).sqrt()
}

// ---------------------------------------------------------------------------------------------------
// A tiny BERT: 2 layers, hidden size 8, a vocabulary of a dozen words, 16 positions.

const TINY_WORDS: [&str; 12] =
    ["the", "cat", "dog", "sat", "on", "mat", "rain", "sun", "##s", "a", "big", "red"];
const TINY_POSITIONS: usize = 16;

fn tiny_config(hidden: usize) -> Value {
    json!({
        "model_type": "bert", "architectures": ["BertModel"], "vocab_size": 4 + TINY_WORDS.len(),
        "hidden_size": hidden, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 2 * hidden, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "max_position_embeddings": TINY_POSITIONS,
        "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0
    })
}

fn tiny_tokenizer() -> Value {
    let special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"];
    let mut vocab = serde_json::Map::new();
    for (i, w) in special.iter().chain(TINY_WORDS.iter()).enumerate() {
        vocab.insert((*w).to_owned(), json!(i));
    }
    let added: Vec<Value> = special
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    let tok = |t: &str| json!({"SpecialToken": {"id": t, "type_id": 0}});
    json!({
        "version": "1.0", "truncation": null,
        "padding": {"strategy": {"Fixed": 12}, "direction": "Right", "pad_to_multiple_of": null,
                    "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"},
        "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                       "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "TemplateProcessing",
            "single": [tok("[CLS]"), {"Sequence": {"id": "A", "type_id": 0}}, tok("[SEP]")],
            "pair": [tok("[CLS]"), {"Sequence": {"id": "A", "type_id": 0}}, tok("[SEP]"),
                     {"Sequence": {"id": "B", "type_id": 1}}, tok("[SEP]")],
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                               "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
        "decoder": null,
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab}
    })
}

/// Deterministic weights in -0.5..0.5 (layer norms at weight 1, bias 0), named as BERT's are.
fn tiny_weights(hidden: usize) -> HashMap<String, Tensor> {
    let mut seed = 0x2545_f491_u64;
    let mut random = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu).expect("tensor")
    };
    let inter = 2 * hidden;
    let mut w = HashMap::new();
    let norm = |w: &mut HashMap<String, Tensor>, prefix: &str| {
        w.insert(format!("{prefix}.weight"), Tensor::ones(hidden, DType::F32, &Device::Cpu).expect("ones"));
        w.insert(format!("{prefix}.bias"), Tensor::zeros(hidden, DType::F32, &Device::Cpu).expect("zeros"));
    };
    w.insert("embeddings.word_embeddings.weight".into(), random(&[4 + TINY_WORDS.len(), hidden]));
    w.insert("embeddings.position_embeddings.weight".into(), random(&[TINY_POSITIONS, hidden]));
    w.insert("embeddings.token_type_embeddings.weight".into(), random(&[2, hidden]));
    norm(&mut w, "embeddings.LayerNorm");
    for layer in 0..2 {
        let p = format!("encoder.layer.{layer}");
        for (name, out, inp) in [
            ("attention.self.query", hidden, hidden),
            ("attention.self.key", hidden, hidden),
            ("attention.self.value", hidden, hidden),
            ("attention.output.dense", hidden, hidden),
            ("intermediate.dense", inter, hidden),
            ("output.dense", hidden, inter),
        ] {
            w.insert(format!("{p}.{name}.weight"), random(&[out, inp]));
            w.insert(format!("{p}.{name}.bias"), random(&[out]));
        }
        norm(&mut w, &format!("{p}.attention.output.LayerNorm"));
        norm(&mut w, &format!("{p}.output.LayerNorm"));
    }
    w
}

/// Writes the tiny model into `dir`.
pub(crate) fn tiny(dir: &Path) {
    let write = |name: &str, v: &Value| std::fs::write(dir.join(name), v.to_string()).expect("write");
    write(CONFIG, &tiny_config(8));
    write(TOKENIZER, &tiny_tokenizer());
    candle_core::safetensors::save(&tiny_weights(8), dir.join(WEIGHTS)).expect("save weights");
}

fn tiny_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    tiny(dir.path());
    dir
}

fn load_err(dir: &Path) -> EmbedError {
    Embedder::load(dir).expect_err("a bad model directory must not load")
}

#[test]
fn embedder_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Embedder>();
}

#[test]
fn tiny_model_embeds_unit_vectors_one_per_text() {
    let dir = tiny_dir();
    let e = Embedder::load(dir.path()).expect("load");
    assert_eq!(e.dim(), 8);
    assert_eq!(e.threads(), 1);
    assert!(e.embed(&[]).expect("no texts").is_empty());
    let texts = ["the cat sat on the mat", "", "rain", "a big red dog", "unknownword"];
    let vs = e.embed(&texts).expect("embed");
    assert_eq!(vs.len(), texts.len());
    for v in &vs {
        assert_eq!(v.len(), 8);
        assert!((norm(v) - 1.0).abs() < 1e-5, "norm {}", norm(v));
    }
    assert!(similarity(&vs[0], &vs[2]) < 0.9999, "different texts, different embeddings");
}

#[test]
fn padding_does_not_change_an_embedding() {
    // More texts than one batch, of varied lengths: each is padded to the longest in its batch.
    let dir = tiny_dir();
    let e = Embedder::load(dir.path()).expect("load");
    let words = TINY_WORDS.iter().filter(|w| !w.starts_with('#')).copied().collect::<Vec<_>>();
    let texts: Vec<String> = (0..70)
        .map(|i| (0..1 + i % 13).map(|j| words[(i + j) % words.len()]).collect::<Vec<_>>().join(" "))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let together = e.embed(&refs).expect("batch");
    for (i, text) in refs.iter().enumerate() {
        let alone = e.embed(&[text]).expect("alone");
        let s = similarity(&alone[0], &together[i]);
        assert!(s > 0.99999, "text {i} {text:?}: alone vs in a batch {s}");
    }
}

#[test]
fn texts_are_cut_at_the_models_positions() {
    // The tiny model has 16 positions: a 14-word text plus [CLS] and [SEP] fills them; more words are
    // cut (and do not fail on a position past the table). Below the limit a word does change it.
    let dir = tiny_dir();
    let e = Embedder::load(dir.path()).expect("load");
    let base = ["the cat sat on the mat"; 3].join(" ");
    let filled = base.split(' ').take(14).collect::<Vec<_>>().join(" ");
    let vs = e
        .embed(&[&filled, &format!("{filled} dog dog dog"), &base, "the cat", "the cat dog"])
        .expect("embed");
    assert!(similarity(&vs[0], &vs[1]) > 0.99999);
    assert!(similarity(&vs[0], &vs[2]) > 0.99999);
    assert!(similarity(&vs[3], &vs[4]) < 0.9999);
}

#[test]
fn model_id_follows_the_files() {
    let a = tiny_dir();
    let b = tiny_dir();
    let id_a = Embedder::load(a.path()).expect("load").model_id().to_owned();
    assert_eq!(id_a.len(), 64);
    assert!(id_a.bytes().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(id_a, Embedder::load(b.path()).expect("load").model_id(), "same bytes, same id");
    let mut config = tiny_config(8);
    config["initializer_range"] = json!(0.03);
    std::fs::write(b.path().join(CONFIG), config.to_string()).expect("write");
    assert_ne!(id_a, Embedder::load(b.path()).expect("load").model_id(), "another config, another id");
}

#[test]
fn a_missing_file_is_named() {
    for missing in [CONFIG, TOKENIZER, WEIGHTS] {
        let dir = tiny_dir();
        std::fs::remove_file(dir.path().join(missing)).expect("remove");
        match load_err(dir.path()) {
            EmbedError::Read { path, .. } => assert!(path.ends_with(missing), "{missing}: {path:?}"),
            other => panic!("{missing}: {other}"),
        }
    }
    match load_err(Path::new("/nonexistent/agentmesh-model")) {
        EmbedError::Read { path, .. } => assert!(path.ends_with(CONFIG)),
        other => panic!("{other}"),
    }
}

#[test]
fn a_config_of_another_model_is_refused() {
    let dir = tiny_dir();
    let mut config = tiny_config(8);
    config["model_type"] = json!("gpt2");
    std::fs::write(dir.path().join(CONFIG), config.to_string()).expect("write");
    let err = load_err(dir.path());
    assert!(matches!(&err, EmbedError::NotBert { path, .. } if path.ends_with(CONFIG)), "{err}");
    assert!(err.to_string().contains("config.json") && err.to_string().contains("gpt2"), "{err}");

    // BERT in name only: a field the model needs is missing.
    let mut config = tiny_config(8);
    config.as_object_mut().expect("object").remove("hidden_size");
    std::fs::write(dir.path().join(CONFIG), config.to_string()).expect("write");
    assert!(matches!(load_err(dir.path()), EmbedError::NotBert { .. }));

    std::fs::write(dir.path().join(CONFIG), "{\"model_type\": \"bert\",").expect("write");
    assert!(matches!(load_err(dir.path()), EmbedError::Json { path, .. } if path.ends_with(CONFIG)));
}

#[test]
fn weights_that_do_not_fit_the_config_are_an_error() {
    let dir = tiny_dir();
    // The config says hidden size 16; the weights are for 8.
    std::fs::write(dir.path().join(CONFIG), tiny_config(16).to_string()).expect("write");
    let err = load_err(dir.path());
    assert!(matches!(&err, EmbedError::Weights { path, .. } if path.ends_with(WEIGHTS)), "{err}");
    std::fs::write(dir.path().join(CONFIG), tiny_config(8).to_string()).expect("write");
    std::fs::write(dir.path().join(WEIGHTS), b"not safetensors").expect("write");
    assert!(matches!(load_err(dir.path()), EmbedError::Weights { .. }));
}

#[test]
fn a_bad_tokenizer_or_pooling_is_an_error() {
    let dir = tiny_dir();
    std::fs::write(dir.path().join(TOKENIZER), "{\"model\": 1}").expect("write");
    let err = load_err(dir.path());
    assert!(matches!(&err, EmbedError::Tokenizer { path, .. } if path.ends_with(TOKENIZER)), "{err}");

    let dir = tiny_dir();
    std::fs::create_dir(dir.path().join("1_Pooling")).expect("mkdir");
    let pooling = dir.path().join(POOLING);
    std::fs::write(&pooling, r#"{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}"#)
        .expect("write");
    assert!(matches!(load_err(dir.path()), EmbedError::Pooling { .. }));
    std::fs::write(&pooling, r#"{"pooling_mode_mean_tokens": true}"#).expect("write");
    Embedder::load(dir.path()).expect("mean pooling loads");
}

// ---------------------------------------------------------------------------------------------------
// The real model.

#[test]
fn real_model_matches_the_reference() {
    let Some(e) = model("real_model_matches_the_reference") else { return };
    let reference: Value = serde_json::from_str(include_str!("reference.json")).expect("reference.json");
    let items = reference["items"].as_array().expect("items");
    assert!(items.len() >= 6);
    let texts: Vec<&str> = items.iter().map(|i| i["text"].as_str().expect("text")).collect();
    assert!(items.iter().any(|i| i["tokens"] == json!(MAX_TOKENS)), "one reference text is cut");
    // All together (padded to the longest in one batch) and each alone.
    let together = e.embed(&texts).expect("embed");
    assert_eq!(e.dim(), 384);
    for (i, item) in items.iter().enumerate() {
        let want: Vec<f32> = item["embedding"]
            .as_array()
            .expect("embedding")
            .iter()
            .map(|x| x.as_f64().expect("number") as f32)
            .collect();
        assert_eq!(want.len(), e.dim());
        let alone = e.embed(&[texts[i]]).expect("embed");
        for (how, got) in [("in a batch", &together[i]), ("alone", &alone[0])] {
            assert!((norm(got) - 1.0).abs() < 1e-4, "{:?}: norm {}", texts[i], norm(got));
            let cos = similarity(got, &want) / norm(&want);
            assert!(cos >= 0.999, "{:?} {how}: cosine {cos} with the reference", texts[i]);
        }
    }
}

#[test]
fn real_model_cuts_at_max_tokens() {
    let Some(e) = model("real_model_cuts_at_max_tokens") else { return };
    let long = "the quick brown fox jumps over the lazy dog and keeps running through the field ".repeat(20);
    let vs = e.embed(&[&long, &format!("{long} then it starts to rain heavily on everyone")]).expect("embed");
    assert!(similarity(&vs[0], &vs[1]) > 0.99999, "words past {MAX_TOKENS} tokens change nothing");
}

#[test]
fn real_model_ranks_a_paraphrase_above_an_unrelated_text() {
    let Some(e) = model("real_model_ranks_a_paraphrase_above_an_unrelated_text") else { return };
    let cases = [
        (
            "how many yen would I get for 100 dollars",
            "convert an amount between currencies",
            "book a table at a restaurant",
        ),
        (
            "will I need an umbrella in Lisbon tomorrow",
            "weather forecast for a location",
            "translate text into another language",
        ),
        ("let my team know the deploy is done", "post a message to a chat channel", "resize an image"),
        ("what does this contract say, briefly", "summarize a document", "check the uptime of a website"),
    ];
    for (query, near, far) in cases {
        let v = e.embed(&[query, near, far]).expect("embed");
        let (s_near, s_far) = (similarity(&v[0], &v[1]), similarity(&v[0], &v[2]));
        assert!(s_near > s_far + 0.05, "{query:?}: {near:?} {s_near} vs {far:?} {s_far}");
    }
}

#[test]
fn real_model_dir_without_weights_or_of_another_type_is_refused() {
    let Some(_) = model("real_model_dir_without_weights_or_of_another_type_is_refused") else { return };
    let real = PathBuf::from(std::env::var_os(ENV).expect("set"));
    let dir = tempfile::tempdir().expect("tempdir");
    for name in [CONFIG, TOKENIZER] {
        std::fs::copy(real.join(name), dir.path().join(name)).expect("copy");
    }
    match load_err(dir.path()) {
        EmbedError::Read { path, .. } => assert!(path.ends_with(WEIGHTS)),
        other => panic!("{other}"),
    }
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(real.join(CONFIG)).expect("read")).expect("config");
    config["model_type"] = json!("roberta");
    std::fs::write(dir.path().join(CONFIG), config.to_string()).expect("write");
    assert!(matches!(load_err(dir.path()), EmbedError::NotBert { path, .. } if path.ends_with(CONFIG)));
}

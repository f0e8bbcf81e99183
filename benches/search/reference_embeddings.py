#!/usr/bin/env python3
"""Reference sentence embeddings for the Rust embedder's test (src/search/embed/tests.rs).

An independent implementation of what sentence-transformers does with all-MiniLM-L6-v2: the BERT
encoder forward pass written out in numpy (float64), mean pooling over the attention mask and L2
normalisation. It needs only numpy, safetensors and tokenizers (no torch):

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install numpy safetensors tokenizers
    /tmp/venv/bin/python benches/search/reference_embeddings.py /path/to/model src/search/embed/reference.json

The model directory holds config.json, model.safetensors and tokenizer.json. Each text is encoded
on its own (no padding), truncated to MAX_TOKENS word pieces counting [CLS] and [SEP], the
sentence-transformers max_seq_length of the model.
"""

import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

MAX_TOKENS = 256

LONG = " ".join(
    f"Step {i}: the scheduler reads the calendar of every participant, finds free slots that fit "
    f"the requested duration, respects working hours and time zones, and proposes the earliest "
    f"three options; if nobody is free it widens the window by one day and tries again."
    for i in range(1, 9)
)

TEXTS = [
    "Will it rain in Lisbon tomorrow?",
    "How many yen would I get for 100 dollars?",
    "send-email: Send an email to one or more recipients. Parameters: to, subject, body.",
    "Café «déjà vu» — naïve façade; 東京タワー 🚀!? 50% off… (résumé) ops@example.org #42",
    "x",
    LONG,
]

erf = np.vectorize(math.erf)


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def gelu(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def embed(ids, w, cfg):
    n = len(ids)
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    d = h // heads
    eps = cfg["layer_norm_eps"]
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:n]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)

    def lin(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q = lin(x, p + "attention.self.query").reshape(n, heads, d).transpose(1, 0, 2)
        k = lin(x, p + "attention.self.key").reshape(n, heads, d).transpose(1, 0, 2)
        v = lin(x, p + "attention.self.value").reshape(n, heads, d).transpose(1, 0, 2)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(1, 0, 2).reshape(n, h)
        a = lin(ctx, p + "attention.output.dense")
        x = layer_norm(x + a, w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"], eps)
        inter = gelu(lin(x, p + "intermediate.dense"))
        o = lin(inter, p + "output.dense")
        x = layer_norm(x + o, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
    pooled = x.mean(0)  # one unpadded sequence: every position is in the mask
    return pooled / max(np.linalg.norm(pooled), 1e-12)


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("AGENTMESH_TEST_MODEL_DIR")
    out = sys.argv[2] if len(sys.argv) > 2 else None
    if not model:
        sys.exit("usage: reference_embeddings.py MODEL_DIR [OUT.json]")
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    assert cfg.get("model_type") == "bert", "not a BERT config"
    w = {k: v.astype(np.float64) for k, v in load_file(os.path.join(model, "model.safetensors")).items()}
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(MAX_TOKENS)
    items = []
    for text in TEXTS:
        enc = tok.encode(text)
        if text is LONG:
            assert enc.overflowing, "the long text must be cut at MAX_TOKENS"
        vec = embed(np.array(enc.ids), w, cfg)
        items.append({"text": text, "tokens": len(enc.ids), "embedding": [round(float(v), 6) for v in vec]})
    doc = {
        "model": "all-MiniLM-L6-v2",
        "max_tokens": MAX_TOKENS,
        "made_by": "benches/search/reference_embeddings.py",
        "items": items,
    }
    # One item a line: the file stays small and diffs stay readable.
    head = {k: v for k, v in doc.items() if k != "items"}
    text = json.dumps(head, ensure_ascii=False)[:-1] + ', "items": [\n'
    text += ",\n".join(json.dumps(it, ensure_ascii=False) for it in items) + "\n]}\n"
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    for it in items:
        print(f"{it['tokens']:4} tokens  {it['text'][:60]!r}", file=sys.stderr)


if __name__ == "__main__":
    main()

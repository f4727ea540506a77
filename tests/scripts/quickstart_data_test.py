#!/usr/bin/env python3
"""Checks the bundled quickstart datasets: valid JSONL in the expected formats, disjoint train/valid prompts, and
that scripts/make_instruct_dataset.py and scripts/make_corpus.py reproduce the committed files byte for byte.
Usage: python3 tests/scripts/quickstart_data_test.py [REPO_ROOT]"""
import filecmp
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(ROOT, "datasets")
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def read_jsonl(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                check(False, f"{path}:{n}: invalid JSON: {e}")
                continue
            check(isinstance(obj, dict), f"{path}:{n}: not an object")
            rows.append(obj)
    check(rows, f"{path}: empty")
    return rows


def is_str(x):
    return isinstance(x, str) and x != ""


# Corpus: {"text": str}.
for n, r in enumerate(read_jsonl(os.path.join(DATA, "corpus", "train.jsonl")), 1):
    check(set(r) == {"text"} and is_str(r["text"]), f"corpus line {n}: expected only a non-empty \"text\"")

# Instruction data: {"prompt", "completion"} and the chat variant.
labels = {"positive", "negative", "sports", "food", "weather", "music"}
prompts = {}
for split in ("train", "valid"):
    rows = read_jsonl(os.path.join(DATA, "instruct", f"{split}.jsonl"))
    chat = read_jsonl(os.path.join(DATA, "instruct", "chat", f"{split}.jsonl"))
    check(len(rows) == len(chat), f"{split}: completion and chat files differ in length")
    for n, r in enumerate(rows, 1):
        where = f"instruct/{split}.jsonl:{n}"
        if not check(set(r) == {"prompt", "completion"} and is_str(r["prompt"]) and is_str(r["completion"]),
                     f"{where}: expected string \"prompt\" and \"completion\""):
            continue
        check(r["prompt"].endswith("\nAnswer:"), f"{where}: prompt does not end with the Answer: cue")
        check(r["completion"][0] == " " and r["completion"][1:] in labels, f"{where}: bad completion")
    for n, (r, c) in enumerate(zip(rows, chat), 1):
        where = f"instruct/chat/{split}.jsonl:{n}"
        m = c.get("messages")
        if not check(set(c) == {"messages"} and isinstance(m, list) and len(m) == 2, f"{where}: expected 2 messages"):
            continue
        check([x.get("role") for x in m] == ["user", "assistant"] and all(is_str(x.get("content")) for x in m),
              f"{where}: expected a user and an assistant message with string content")
        check(m[0]["content"] + "\nAnswer:" == r.get("prompt") and " " + m[1]["content"] == r.get("completion"),
              f"{where}: does not match instruct/{split}.jsonl:{n}")
    prompts[split] = {r.get("prompt") for r in rows}
check(not (prompts["train"] & prompts["valid"]), "a valid prompt is also in train")

# Determinism: the generators reproduce the committed files exactly.
with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_instruct_dataset.py"), "--out",
                    os.path.join(tmp, "instruct")], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_corpus.py"), "--out",
                    os.path.join(tmp, "corpus", "train.jsonl")], check=True, env=env, stdout=subprocess.DEVNULL)
    for rel in ("instruct/train.jsonl", "instruct/valid.jsonl", "instruct/chat/train.jsonl",
                "instruct/chat/valid.jsonl", "corpus/train.jsonl"):
        check(filecmp.cmp(os.path.join(tmp, rel), os.path.join(DATA, rel), shallow=False),
              f"datasets/{rel} differs from what the generator writes (re-run it and commit the result)")

for f in failures[:20]:
    print("FAIL:", f)
print("quickstart data: " + ("OK" if not failures else f"{len(failures)} failure(s)"))
sys.exit(1 if failures else 0)

#!/usr/bin/env python3
"""Preference pairs for the DPO / ORPO / SimPO recipes (datasets/preference/), from the instruction data.

Each pair keeps an instruction prompt of datasets/instruct/, its label as the chosen answer and a wrong label of
the same task as the rejected one (the other sentiment; for topics the next topic in a fixed order). The same
pairs are also written as chat records (the question as the user's turn, the labels as assistant replies) under
datasets/preference/chat/. Deterministic: the committed files are exactly what it writes.

    python3 scripts/make_preference_dataset.py [--train 48] [--valid 16]
"""
import argparse
import json
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOPICS = [" sports", " food", " weather", " music"]


def wrong(label):
    if label in (" positive", " negative"):
        return " negative" if label == " positive" else " positive"
    return TOPICS[(TOPICS.index(label) + 1) % len(TOPICS)]


def write(rows, out_dir, name):
    text = os.path.join(out_dir, name)
    chat = os.path.join(out_dir, "chat", name)
    os.makedirs(os.path.dirname(chat), exist_ok=True)
    with open(text, "w") as ft, open(chat, "w") as fc:
        for r in rows:
            chosen, rejected = r["completion"], wrong(r["completion"])
            ft.write(json.dumps({"prompt": r["prompt"], "chosen": chosen, "rejected": rejected}) + "\n")
            question = r["prompt"].rsplit("\nAnswer:", 1)[0]
            fc.write(json.dumps({"prompt": [{"role": "user", "content": question}],
                                 "chosen": {"role": "assistant", "content": chosen.strip()},
                                 "rejected": {"role": "assistant", "content": rejected.strip()}}) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", type=int, default=48)
    ap.add_argument("--valid", type=int, default=16)
    a = ap.parse_args()
    src = os.path.join(ROOT, "datasets", "instruct")
    out = os.path.join(ROOT, "datasets", "preference")
    for split, n in (("train", a.train), ("valid", a.valid)):
        with open(os.path.join(src, f"{split}.jsonl")) as f:
            rows = [json.loads(line) for line in f][:n]
        write(rows, out, f"{split}.jsonl")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Independent float64 reference for log-likelihood scoring (`lmtune score`, eval's multiple choice, serve's
logprobs): tests/infer/fixtures/logprobs/.

Run with Debian's PyTorch:  /usr/bin/python3 scripts/reference_logprobs.py

Takes the Llama fixture model of scripts/reference_models.py (tests/models/fixtures/llama) and gives it a
character-level tokenizer written here (tokenizer.json: a BPE model without merges, one token per character
(printable ASCII and 30 Latin-1 letters), <s> prepended by the post-processor), so that the reference tokenizes
text by a dictionary lookup.
For each prompt/completion pair of records.jsonl it computes, with the reference model of reference_models.py
(float64), the log-softmax log-probability of every completion token given <s> + prompt + the completion tokens
before it, and the top 5 alternatives of each; the same with the LoRA adapter of tests/train/fixtures/sgd_step
(q_proj, v_proj; scale alpha / r). choices.jsonl is a multiple-choice set whose answers are set here to the
choice the reference scores highest (by sum; a second answer key by sum per character for acc_norm).
Writes tokenizer.json, tokenizer_config.json (with a chat template for the server's tests), records.jsonl,
choices.jsonl and expected.json.
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reference_models as rm  # noqa: E402
from reference_sgd_step import read_safetensors  # noqa: E402

torch.set_default_dtype(torch.float64)
# ids 3.. (0 <unk>, 1 <s>, 2 </s>): printable ASCII, then Latin-1 letters up to the model's vocabulary of 128, so
# that every id the model can rank has a text of its own (two-byte UTF-8 characters).
CHARS = [chr(c) for c in range(32, 127)] + [chr(0xA1 + i) for i in range(rm.V - 98)]
VOCAB = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: 3 + i for i, c in enumerate(CHARS)}}
TOP = 5
# A chat template in the vocabulary's characters (no newline), for the server's chat log-probs.
CHAT = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + ' | ' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}")

PAIRS = [
    ("The cat sat on the", " mat."),
    ("Q: 2+2=? A:", " 4"),
    ("hello", " world, again and again"),
    ("x", "y"),
]
CHOICES = [
    ("The sky is", [" blue", " green", " a very long answer"]),
    ("Paris is in", [" France", " Spain"]),
    ("1, 2, 3,", [" 4", " 5", " 6", " 7"]),
    ("ab", ["c", "cd", "xyz"]),
]


def tokenizer_json():
    specials = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True} for t, i in list(VOCAB.items())[:3]]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": specials, "normalizer": None,
            "pre_tokenizer": None,
            "post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}},
                                        {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
            "decoder": {"type": "Fuse"},
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": VOCAB, "merges": []}}


def encode(text, bos):
    return ([1] if bos else []) + [VOCAB[c] for c in text]


def score(arch, p, prompt, completion):
    """Log-probs of the completion's tokens given <s> + prompt, and the top alternatives (id, logprob)."""
    ctx, cont = encode(prompt, True), encode(completion, False)
    ids = torch.tensor([ctx + cont])
    T = ids.shape[1]
    logits = rm.forward({"arch": arch}, p, ids, torch.arange(T)[None], torch.zeros(1, T, dtype=torch.int32))
    lp = torch.log_softmax(logits[0], -1)
    out = []
    for j, tok in enumerate(cont):
        row = lp[len(ctx) + j - 1]
        vals, idx = torch.sort(row, descending=True, stable=True)
        out.append({"id": tok, "logprob": row[tok].item(),
                    "top": [[int(i), v.item()] for v, i in zip(vals[:TOP], idx[:TOP])]})
    return out


def with_lora(adapter_dir, scale):
    """Patches reference_models.linear with the PEFT adapter's (x A^T) B^T * scale."""
    t = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    lora = {}
    for name, v in t.items():
        module = name[len("base_model.model."):].rsplit(".lora_", 1)[0]
        lora.setdefault(module, {})["A" if ".lora_A." in name else "B"] = v.double()
    base = rm.linear

    def linear(params, name, x, bias):
        y = base(params, name, x, bias)
        if name in lora:
            y = y + scale * ((x @ lora[name]["A"].T) @ lora[name]["B"].T)
        return y
    return base, linear


def main():
    root = os.path.join(HERE, "..")
    fixture = os.path.join(root, "tests", "models", "fixtures", "llama")
    adapter = os.path.join(root, "tests", "train", "fixtures", "sgd_step", "adapter")
    out = os.path.join(root, "tests", "infer", "fixtures", "logprobs")
    os.makedirs(out, exist_ok=True)
    arch = next(f for f in rm.fixtures() if f[0] == "llama")[2]
    p = {k: v.double() for k, v in read_safetensors(os.path.join(fixture, "model.safetensors")).items()}
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        cfg = json.load(f)
    lora_scale = cfg["lora_alpha"] / cfg["r"]

    expected = {"generator": "scripts/reference_logprobs.py", "top": TOP, "base": [], "lora": [], "choices": []}
    for prompt, completion in PAIRS:
        expected["base"].append(score(arch, p, prompt, completion))
    base, patched = with_lora(adapter, lora_scale)
    rm.linear = patched
    for prompt, completion in PAIRS:
        expected["lora"].append(score(arch, p, prompt, completion))
    rm.linear = base

    choice_lines = []
    for prompt, choices in CHOICES:
        sums = [sum(t["logprob"] for t in score(arch, p, prompt, c)) for c in choices]
        per_char = [s / len(c) for s, c in zip(sums, choices)]
        answer = max(range(len(choices)), key=lambda i: sums[i])
        answer_norm = max(range(len(choices)), key=lambda i: per_char[i])
        expected["choices"].append({"logprobs": sums, "answer": answer, "answer_norm": answer_norm})
        choice_lines.append(json.dumps({"prompt": prompt, "choices": choices, "answer": answer}))

    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f, indent=1)
        f.write("\n")
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "chat_template": CHAT}
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "records.jsonl"), "w") as f:
        for prompt, completion in PAIRS:
            f.write(json.dumps({"prompt": prompt, "completion": completion}) + "\n")
    with open(os.path.join(out, "choices.jsonl"), "w") as f:
        f.write("\n".join(choice_lines) + "\n")
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    for name in ("base", "lora"):
        print(name, [round(sum(t["logprob"] for t in r), 6) for r in expected[name]])
    print("choices", [(c["answer"], c["answer_norm"]) for c in expected["choices"]])


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Load generator for `lmtune serve`: aggregate generated tokens/s at several concurrency levels.

Each client thread sends greedy /v1/completions requests back to back; the figure is the completion tokens of all
requests (from their usage) divided by the wall time of the level. Only the standard library is used.

  scripts/serve_bench.py --url http://127.0.0.1:8080 --models base,alpha,beta,gamma --concurrency 1,8,32

--max-tokens LO-HI draws each request's length from that range (seeded by --seed and the client), so that
requests finish and join at different steps, as real traffic does.

For a benchmark without trained adapters, random PEFT adapters (LoRA on q_proj and v_proj) can be written first:

  scripts/serve_bench.py --make-adapter MODEL_DIR OUT_DIR --rank 8 --seed 1
"""
import argparse
import http.client
import json
import os
import random
import struct
import threading
import time
import urllib.parse


def one_request(url, model, prompt, max_tokens, api_key):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    conn.request("POST", "/v1/completions", body, headers)
    resp = conn.getresponse()
    data = json.loads(resp.read())
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {data}")
    return data["usage"]["completion_tokens"]


def level(url, models, concurrency, requests_per_client, max_tokens, api_key, seed):
    total = [0] * concurrency
    errors = []
    lo, hi = max_tokens

    def client(i):
        rng = random.Random(seed * 1000 + i)
        try:
            for r in range(requests_per_client):
                model = models[(i + r) % len(models)]
                n = rng.randint(lo, hi)
                total[i] += one_request(url, model, f"Request {i}.{r}: once upon a time", n, api_key)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return sum(total), seconds


def make_adapter(model_dir, out_dir, rank, seed):
    """A PEFT LoRA adapter with random A and B on every q_proj and v_proj (standard library only)."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    outs = {"q_proj": cfg["num_attention_heads"] * head_dim, "v_proj": cfg["num_key_value_heads"] * head_dim}
    rng = random.Random(seed)
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for layer in range(layers):
        for proj, out in outs.items():
            for which, shape in (("A", [rank, hidden]), ("B", [out, rank])):
                n = shape[0] * shape[1]
                data = struct.pack(f"<{n}f", *(rng.gauss(0, 0.3) for _ in range(n)))
                name = f"base_model.model.model.layers.{layer}.self_attn.{proj}.lora_{which}.weight"
                header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
                blobs.append(data)
                offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(outs),
               "bias": "none", "base_model_name_or_path": model_dir},
              open(os.path.join(out_dir, "adapter_config.json"), "w"), indent=2)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--make-adapter", nargs=2, metavar=("MODEL_DIR", "OUT_DIR"))
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--models", help="comma-separated model names, used round-robin")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--requests", type=int, default=2, help="requests per client per level")
    p.add_argument("--max-tokens", default="32", help="tokens per request: N, or LO-HI drawn per request")
    p.add_argument("--api-key", default="")
    a = p.parse_args()
    if a.make_adapter:
        make_adapter(*a.make_adapter, a.rank, a.seed)
        return
    if not a.models:
        p.error("--models is required")
    models = a.models.split(",")
    try:
        bounds = [int(x) for x in a.max_tokens.split("-")]
    except ValueError:
        p.error(f"--max-tokens: expected N or LO-HI, got {a.max_tokens!r}")
    if len(bounds) == 1:
        bounds *= 2
    if len(bounds) != 2 or not 1 <= bounds[0] <= bounds[1]:
        p.error(f"--max-tokens: expected N or LO-HI with 1 <= LO <= HI, got {a.max_tokens!r}")
    one_request(a.url, models[0], "warm up", 4, a.api_key)
    for c in [int(x) for x in a.concurrency.split(",")]:
        tokens, seconds = level(a.url, models, c, a.requests, bounds, a.api_key, a.seed)
        print(json.dumps({"concurrency": c, "models": models, "tokens": tokens, "seconds": round(seconds, 2),
                          "tokens_per_s": round(tokens / seconds, 1)}), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Load generator for `lmtune serve`: aggregate generated tokens/s at several concurrency levels.

Each client thread sends greedy /v1/completions requests back to back; the figure is the completion tokens of all
requests (from their usage) divided by the wall time of the level. Only the standard library is used.

  scripts/serve_bench.py --url http://127.0.0.1:8080 --models base,alpha,beta,gamma --concurrency 1,8,32
"""
import argparse
import http.client
import json
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


def level(url, models, concurrency, requests_per_client, max_tokens, api_key):
    total = [0] * concurrency
    errors = []

    def client(i):
        try:
            for r in range(requests_per_client):
                model = models[(i + r) % len(models)]
                total[i] += one_request(url, model, f"Request {i}.{r}: once upon a time", max_tokens, api_key)
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


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--models", required=True, help="comma-separated model names, used round-robin")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--requests", type=int, default=2, help="requests per client per level")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--api-key", default="")
    a = p.parse_args()
    models = a.models.split(",")
    one_request(a.url, models[0], "warm up", 4, a.api_key)
    for c in [int(x) for x in a.concurrency.split(",")]:
        tokens, seconds = level(a.url, models, c, a.requests, a.max_tokens, a.api_key)
        print(json.dumps({"concurrency": c, "models": models, "tokens": tokens, "seconds": round(seconds, 2),
                          "tokens_per_s": round(tokens / seconds, 1)}), flush=True)


if __name__ == "__main__":
    main()

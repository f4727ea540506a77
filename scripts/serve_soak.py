#!/usr/bin/env python3
"""Memory soak of `lmtune serve`: rounds of mixed requests, the server's resident memory after each round.

Starts `LMTUNE serve` on MODEL (with the given adapters) on a free loopback port, sends ROUNDS rounds of REQUESTS
requests from CONCURRENCY client threads, and reads the server's VmRSS (/proc/PID/status) after each round. The mix
covers every kind of request the server takes: completions and chat completions, streamed and not, over the base
model and each adapter, greedy and seeded sampling, log-probs, echo, stop strings, clients that hang up in the middle
of a stream, and refused requests (bad JSON, unknown model, out-of-range numbers, a wrong content type, an unknown
route). The first rounds warm caches and the allocator up, and its arenas may grow in steps while they do; a leak
instead grows the RSS every round. Exits 1 if the last round's RSS is more than --tolerance above every earlier
round's, or more than --total-tolerance above the higher of the first two rounds', or if any request got an
unexpected status. Standard library only.

  scripts/serve_soak.py --lmtune build/lmtune --model M --adapter alpha=A1 --adapter beta=A2 --rounds 4 \\
      --requests 1000 --json
"""
import argparse
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

PROMPTS = ["Hello there", "The capital of France is", "1, 2, 3,", "Once upon a time", "def f(x):", "a b c d e f"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS for the server")


def request(port, method, path, body=None, content_type="application/json", read_bytes=None):
    """One request; returns the status. read_bytes: hang up after that many bytes of the response body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        headers = {"Content-Type": content_type} if body is not None else {}
        conn.request(method, path, body, headers)
        resp = conn.getresponse()
        if read_bytes is None:
            resp.read()
        else:
            resp.read(read_bytes)
        return resp.status
    finally:
        conn.close()


def one(port, models, rng):
    """A random request of the mix; returns (kind, status, expected statuses)."""
    model = rng.choice(models)
    prompt = rng.choice(PROMPTS)
    sampling = {"temperature": 0} if rng.random() < 0.5 else {"temperature": 0.8, "top_p": 0.9,
                                                                 "seed": rng.randrange(1 << 30)}
    kind = rng.choices(["completion", "chat", "stream", "chat_stream", "logprobs", "echo", "hangup", "bad"],
                       [20, 20, 15, 10, 10, 5, 5, 15])[0]
    if kind == "completion":
        body = {"model": model, "prompt": prompt, "max_tokens": rng.randint(1, 16), "stop": ["\n\n"], **sampling}
        return kind, request(port, "POST", "/v1/completions", json.dumps(body)), (200,)
    if kind in ("chat", "chat_stream"):
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": rng.randint(1, 16),
                "stream": kind == "chat_stream", **sampling}
        return kind, request(port, "POST", "/v1/chat/completions", json.dumps(body)), (200,)
    if kind == "stream":
        body = {"model": model, "prompt": prompt, "max_tokens": rng.randint(1, 16), "stream": True, **sampling}
        return kind, request(port, "POST", "/v1/completions", json.dumps(body)), (200,)
    if kind == "logprobs":
        body = {"model": model, "prompt": prompt, "max_tokens": rng.randint(1, 8), "logprobs": 3, "temperature": 0}
        return kind, request(port, "POST", "/v1/completions", json.dumps(body)), (200,)
    if kind == "echo":
        body = {"model": model, "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1}
        return kind, request(port, "POST", "/v1/completions", json.dumps(body)), (200,)
    if kind == "hangup":
        body = {"model": model, "prompt": prompt, "max_tokens": 64, "stream": True, "temperature": 0}
        return kind, request(port, "POST", "/v1/completions", json.dumps(body), read_bytes=16), (200,)
    bad = rng.randrange(6)
    if bad == 0:
        return "bad_json", request(port, "POST", "/v1/completions", '{"model": "x", "prompt": '), (400,)
    if bad == 1:
        body = {"model": "no-such-adapter", "prompt": prompt, "max_tokens": 4}
        return "unknown_model", request(port, "POST", "/v1/completions", json.dumps(body)), (404,)
    if bad == 2:
        body = '{"model": "%s", "prompt": "x", "max_tokens": 1e400}' % model
        return "bad_number", request(port, "POST", "/v1/completions", body), (400,)
    if bad == 3:
        return "text_plain", request(port, "POST", "/v1/completions", "hello", content_type="text/plain"), (415,)
    if bad == 4:
        return "unknown_route", request(port, "GET", "/v1/nothing"), (404,)
    return "health", request(port, "GET", "/health"), (200,)


def run_round(port, models, requests, concurrency, seed):
    failures = []
    counts = {}
    slowest = {}
    lock = threading.Lock()

    def client(c):
        rng = random.Random(seed * 1000 + c)
        for _ in range(requests // concurrency + (c < requests % concurrency)):
            t0 = time.time()
            try:
                kind, status, expected = one(port, models, rng)
            except (OSError, http.client.HTTPException) as e:
                kind, status, expected = "error", str(e), ()
            seconds = time.time() - t0
            with lock:
                counts[kind] = counts.get(kind, 0) + 1
                slowest[kind] = max(slowest.get(kind, 0.0), round(seconds, 3))
                if status not in expected:
                    failures.append(f"{kind}: status {status}, expected {expected}")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts, slowest, failures


def wait_ready(proc, port, seconds=120):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        try:
            if request(port, "GET", "/health") == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the server did not become ready")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lmtune", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--adapter", action="append", default=[], help="NAME=DIR, repeatable")
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--tolerance", type=float, default=0.10,
                   help="allowed RSS growth of the last round over the highest earlier round")
    p.add_argument("--total-tolerance", type=float, default=0.25,
                   help="allowed RSS growth of the last round over the higher of the first two")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.rounds < 2:
        p.error("--rounds must be at least 2")

    port = free_port()
    cmd = [a.lmtune, "--device", a.device, "--log-level", "warn", "serve", "--model", a.model, "--port", str(port)]
    for ad in a.adapter:
        cmd += ["--adapter", ad]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rounds = []
    failures = []
    try:
        wait_ready(proc, port)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/v1/models")
        models = [m["id"] for m in json.loads(conn.getresponse().read())["data"]]
        conn.close()
        for r in range(a.rounds):
            t0 = time.time()
            counts, slowest, fails = run_round(port, models, a.requests, a.concurrency, seed=r + 1)
            seconds = time.time() - t0
            time.sleep(0.5)
            rounds.append({"round": r + 1, "requests": sum(counts.values()), "seconds": round(seconds, 2),
                           "rss_mib": round(rss_kib(proc.pid) / 1024, 1), "kinds": counts,
                           "slowest_s": slowest})
            failures += [f"round {r + 1}: {f}" for f in fails]
            if not a.json:
                print(f"round {r + 1}: {rounds[-1]['requests']} requests in {seconds:.1f} s, "
                      f"RSS {rounds[-1]['rss_mib']} MiB", flush=True)
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    # SIGTERM is a clean stop (exit 0), whatever thread of the server the signal reaches.
    if proc.returncode != 0:
        failures.append(f"the server exited with {proc.returncode} on SIGTERM, not 0 (a clean stop)")
    # A step in an earlier round is the allocator settling (a new arena when a round's requests contend more);
    # a leak shows as growth in the last round too, and as growth over the whole soak.
    last = rounds[-1]["rss_mib"]
    growth = last / max(r["rss_mib"] for r in rounds[:-1]) - 1
    total = last / max(r["rss_mib"] for r in rounds[:2]) - 1
    ok = not failures and growth <= a.tolerance and total <= a.total_tolerance
    if a.json:
        print(json.dumps({"rounds": rounds, "growth": round(growth, 4), "total_growth": round(total, 4),
                          "failures": failures[:20], "ok": ok}, indent=1))
    else:
        print(f"RSS growth of round {len(rounds)} over the earlier rounds: {100 * growth:+.1f}% "
              f"(tolerance {100 * a.tolerance:.0f}%); over rounds 1-2: {100 * total:+.1f}% "
              f"(tolerance {100 * a.total_tolerance:.0f}%)")
        for f in failures[:20]:
            print("unexpected:", f)
    if proc.returncode not in (0, -15) and err:
        print(err[-2000:], file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

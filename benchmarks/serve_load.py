"""Load test of `autoplan serve`: mixed requests from concurrent clients against the real server.

    python benchmarks/serve_load.py [--requests 1000] [--clients 8] [--workers 2] [--url URL]

Starts a server on a free port (unless --url), fires a deterministic mix (search, estimate, scale, NDJSON batch,
bad requests, infeasible jobs, catalog GETs) and prints a table: errors (transport failures, 5xx, or an answer
other than the one expected for that request), batch lines lost or out of order, p50/p99 latency, requests/s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.serve_util import running_server  # noqa: E402

MODELS = [("llama3-8b", 8), ("llama3-8b", 64), ("llama3-70b", 64), ("llama3-70b", 512), ("mixtral-8x7b", 64),
          ("llama3-70b", 1024), ("llama2-13b", 128), ("llama3-8b", 256)]


def _search(rng: random.Random) -> tuple[str, str, dict, int, str]:
    model, n = rng.choice(MODELS)
    return ("POST", "/v1/search", {"id": f"s-{model}-{n}", "model": model, "cluster": {"num_gpus": n},
                                   "top": rng.choice([1, 3])}, 200, "ok")


def _estimate(rng: random.Random) -> tuple[str, str, dict, int, str]:
    model, n = rng.choice(MODELS[:4])
    return ("POST", "/v1/estimate", {"model": model, "cluster": {"num_gpus": n},
                                     "parallel": {"tp": rng.choice([1, 2, 4, 8]), "pp": 1}}, 200, "any")


def _batch(rng: random.Random) -> tuple[str, str, list, int, str]:
    lines = []
    for i in range(rng.randint(3, 12)):
        if rng.random() < 0.15:
            lines.append({"id": f"b{i}", "model": "no-such-model", "cluster": {"num_gpus": 8}})
        else:
            _, _, body, _, _ = _search(rng) if rng.random() < 0.6 else _estimate(rng)
            lines.append({**body, "id": f"b{i}", "kind": "search" if "top" in body else "estimate"})
    return ("POST", "/v1/batch", lines, 200, "batch")


def make_mix(n: int, seed: int = 0) -> list[tuple[str, str, object, int, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.35:
            out.append(_search(rng))
        elif r < 0.55:
            out.append(_estimate(rng))
        elif r < 0.70:
            out.append(_batch(rng))
        elif r < 0.75:
            out.append(("POST", "/v1/scale", {"model": "llama3-8b", "gpus": [8, 16, 32, 64]}, 200, "ok"))
        elif r < 0.82:
            out.append(("POST", "/v1/search", {"model": "llama3-7b", "cluster": {"num_gpus": 8}}, 422, "invalid"))
        elif r < 0.87:
            out.append(("POST", "/v1/search", {"model": "llama3-405b", "cluster": {"num_gpus": 8}}, 200,
                        "infeasible"))
        else:
            out.append(("GET", rng.choice(["/v1/models", "/v1/hardware", "/healthz"]), None, 200, "get"))
    return out


def one(client: httpx.Client, req: tuple[str, str, object, int, str]) -> tuple[float, str | None, int, int]:
    """(latency s, error or None, batch lines lost, batch lines out of order)."""
    method, path, body, code, expect = req
    t0 = time.perf_counter()
    try:
        if path == "/v1/batch":
            text = "".join(json.dumps(x) + "\n" for x in body)  # type: ignore[union-attr]
            r = client.post(path, content=text, headers={"content-type": "application/x-ndjson"})
        elif method == "POST":
            r = client.post(path, json=body)
        else:
            r = client.get(path)
    except httpx.HTTPError as err:
        return time.perf_counter() - t0, f"{path}: {type(err).__name__}", 0, 0
    dt = time.perf_counter() - t0
    if r.status_code != code:
        return dt, f"{path}: HTTP {r.status_code} (want {code}): {r.text[:120]}", 0, 0
    if expect == "batch":
        out = [json.loads(x) for x in r.text.splitlines() if x.strip()]
        sent = body  # type: ignore[assignment]
        lost = max(0, len(sent) - len(out))
        order = sum(1 for i, o in enumerate(out) if o.get("line") != i + 1 or o.get("id") != sent[i]["id"])
        bad = [o for o in out if o["status"] == "error"]
        return dt, (f"batch line error: {bad[0]['message']}" if bad else None), lost, order
    if expect in ("ok", "infeasible", "invalid") and r.json().get("status") != expect:
        return dt, f"{path}: status {r.json().get('status')} (want {expect})", 0, 0
    return dt, None, 0, 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--url", default=None, help="a running server (default: start one)")
    args = ap.parse_args()
    mix = make_mix(args.requests)
    shares = [mix[i::args.clients] for i in range(args.clients)]

    def client_run(url: str, reqs: list) -> list:
        with httpx.Client(base_url=url, timeout=300) as c:
            return [one(c, r) for r in reqs]

    def run(url: str) -> None:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as ex:
            results = [x for part in ex.map(lambda s: client_run(url, s), shares) for x in part]
        wall = time.perf_counter() - t0
        lat = sorted(r[0] for r in results)
        errors = [r[1] for r in results if r[1]]
        kinds: dict[str, int] = {}
        for m in mix:
            kinds[m[1]] = kinds.get(m[1], 0) + 1
        batch_lines = sum(len(m[2]) for m in mix if m[1] == "/v1/batch")  # type: ignore[arg-type]
        print(f"autoplan serve load: {len(mix)} requests from {args.clients} clients, server workers "
              f"{args.workers}, load average {os.getloadavg()[0]:.2f}")
        print("  mix: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + f" ({batch_lines} batch lines)")
        print(f"  errors                  {len(errors)}")
        print(f"  batch lines lost        {sum(r[2] for r in results)}")
        print(f"  batch lines reordered   {sum(r[3] for r in results)}")
        print(f"  latency p50 / p99 / max {statistics.median(lat) * 1e3:.1f} / "
              f"{lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3:.1f} / {lat[-1] * 1e3:.1f} ms")
        print(f"  throughput              {len(mix) / wall:.1f} requests/s ({wall:.1f} s wall)")
        for e in errors[:5]:
            print("  error:", e)

    if args.url:
        run(args.url)
    else:
        with running_server("--workers", str(args.workers), "--log-level", "error") as url:
            run(url)


if __name__ == "__main__":
    main()

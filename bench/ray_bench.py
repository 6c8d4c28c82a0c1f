#!/usr/bin/env python3
"""Ray's costs and gains, measured in one run (docs/scale_out.md).

    bench/ray_bench.py serve [--n 40]   per-request latency: Ray Serve vs edgellm serve
    bench/ray_bench.py sweep            2 deployments x 2 prompt sets: serial vs Ray (2 CPUs)

serve: both servers up at once (SmolLM2, 2 threads, one replica), the same 16-token completion
(greedy, ignore_eos) sent to each in turn over a kept-alive connection, after a warm-up; the
median and p95 of each and of their difference. sweep: the four gate runs one after another as
`make verify` runs them, then the same four jobs as one Ray sweep; their reports compared.
Run it under the CPU lock (`flock /tmp/edgellm-cpu.lock ...`): the numbers are wall times.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "llms"), str(REPO)]

from conftest import PYTHON, SMOLLM2_DIR, VERIFY_RUNNER, verify_env  # noqa: E402
from test_server import NAME, Server  # noqa: E402


def body(tokens: int) -> str:
    return json.dumps(
        {"model": NAME, "prompt": "Once upon a time", "max_tokens": tokens, "temperature": 0,
         "ignore_eos": True}
    )  # fmt: skip


def p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20)[-1]


def timed_request(conn: http.client.HTTPConnection, tokens: int) -> float:
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body(tokens), {"Content-Type": "application/json"})
    r = conn.getresponse()
    reply = json.loads(r.read())
    elapsed = time.perf_counter() - start
    assert r.status == 200 and reply["usage"]["completion_tokens"] == tokens, reply
    return elapsed * 1000


def serve(n: int) -> None:
    servers = {
        "cpp": Server(SMOLLM2_DIR, "--parallel", "8", kind="cpp"),
        "ray": Server(SMOLLM2_DIR, "--parallel", "8", kind="ray"),
    }
    try:
        conns = {k: http.client.HTTPConnection("127.0.0.1", s.port) for k, s in servers.items()}
        # 1 token: little engine time, so its noise hides the fixed overhead least.
        for tokens in (16, 1):
            ms: dict[str, list[float]] = {k: [] for k in servers}
            for i in range(n + 5):
                for k, conn in conns.items():
                    t = timed_request(conn, tokens)
                    if i >= 5:  # warm-up
                        ms[k].append(t)
            diff = [r - c for r, c in zip(ms["ray"], ms["cpp"], strict=True)]
            print(f"{tokens}-token completion, {n} requests each, interleaved (ms):")
            for k, xs in (*ms.items(), ("ray - cpp", diff)):
                print(f"  {k:<9} median {statistics.median(xs):7.2f}  p95 {p95(xs):7.2f}")
            med = statistics.median(ms["ray"]) - statistics.median(ms["cpp"])
            print(f"  overhead (median ray - median cpp) {med:.2f} ms, "
                  f"p95 ray - p95 cpp {p95(ms['ray']) - p95(ms['cpp']):.2f} ms")  # fmt: skip
    finally:
        for s in servers.values():
            s.stop()


JOBS = [
    "smollm2_135m:instruct:instruct",
    "smollm2_135m:instruct:heldout_instruct",
    "gemma3_270m:base:base",
    "gemma3_270m:base:heldout_base",
]


def verdicts(folder: Path) -> dict[str, object]:
    out = {}
    for path in folder.glob("*.json"):
        r = json.loads(path.read_text())
        meta = r["meta"]
        out[(meta["deployment"], meta["prompt_source"])] = (r["verdict"], r["prompts"])
    return out


def sweep() -> None:
    common = ["--max-prompts", "2", "--threads", "2"]
    env = verify_env()
    with tempfile.TemporaryDirectory() as tmp:
        serial_dir, ray_dir = Path(tmp) / "serial", Path(tmp) / "ray"
        start = time.monotonic()
        for job in JOBS:
            d, m, s = job.split(":")
            prompts = REPO / "llms" / "verify" / "prompts" / f"{s}.txt"
            cmd = [PYTHON, str(VERIFY_RUNNER), "--runner", f"{d}.verify_adapter", "--model", m]
            cmd += ["--prompts-file", str(prompts), *common, "--report-dir", str(serial_dir)]
            subprocess.run(cmd, env=env, check=True, capture_output=True)
        serial = time.monotonic() - start
        start = time.monotonic()
        cmd = [PYTHON, str(VERIFY_RUNNER), "--ray", *[a for j in JOBS for a in ("--job", j)],
               *common, "--ray-cpus", "2", "--report-dir", str(ray_dir)]  # fmt: skip
        p = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True)
        swept = time.monotonic() - start
        print(p.stdout)
        same = verdicts(serial_dir) == verdicts(ray_dir)
        print(f"4 jobs x 2 prompts: serial {serial:.1f} s, Ray sweep on 2 CPUs {swept:.1f} s "
              f"({serial / swept:.2f}x); reports identical: {same}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("serve", "sweep"))
    ap.add_argument("--n", type=int, default=40)
    args = ap.parse_args()
    serve(args.n) if args.what == "serve" else sweep()
    return 0


if __name__ == "__main__":
    sys.exit(main())

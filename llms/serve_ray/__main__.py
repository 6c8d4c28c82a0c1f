"""`make serve-ray`: edgellm's OpenAI-compatible API on Ray Serve.

    python -m serve_ray --model smollm2-135m-instruct --replicas 2 [--threads T]
                        [--address ray://head:10001] [--min-replicas 1 --max-replicas 4]

Without --address it starts a local single-node Ray cluster (dashboard off); with one it
deploys onto that cluster, whose nodes must hold the model at the same path (docs/scale_out.md).
Two deployments: OpenAIIngress (HTTP, validation, no CPU reserved) and EdgeLLMReplica (one
Model and its continuous-batching Scheduler each, --threads engine threads and as many CPUs
reserved). SIGTERM / Ctrl-C take the application down and exit 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

_LLMS = Path(__file__).resolve().parents[1]
_REPO = _LLMS.parent
for _p in (str(_LLMS), str(_REPO), str(_REPO / "build" / "python")):
    if _p not in sys.path:
        sys.path.append(_p)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def _at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = _Parser(prog="serve_ray", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="checkpoint directory (or .gguf), or its name in the model store",
    )
    p.add_argument(
        "--name", help="model id clients send (default: the checkpoint's name, as edgellm_server)"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_at_least(1), default=8080)
    p.add_argument("--address", help="an existing Ray cluster (default: start a local one)")
    p.add_argument("--num-cpus", type=_at_least(1), help="CPUs of the local cluster (all cores)")
    p.add_argument("--replicas", type=_at_least(1), default=1, help="model replicas")
    p.add_argument(
        "--threads",
        type=_at_least(0),
        default=0,
        help="engine threads per replica, CPUs it reserves (0: cores / replicas)",
    )
    p.add_argument("--min-replicas", type=_at_least(0), help="autoscaling lower bound")
    p.add_argument("--max-replicas", type=_at_least(1), help="autoscaling upper bound")
    p.add_argument(
        "--target-ongoing",
        type=float,
        default=4.0,
        help="autoscaling: requests in flight per replica it aims at",
    )
    p.add_argument("--max-context", type=_at_least(1), default=2048)
    p.add_argument("--parallel", type=_at_least(1), default=8, help="sequences per replica batch")
    p.add_argument("--queue", type=_at_least(0), default=64, help="waiting requests per replica")
    p.add_argument("--prefill-chunk", type=_at_least(1), default=256)
    p.add_argument(
        "--cache-mb",
        type=_at_least(0),
        default=256,
        help="prefix cache per replica: MiB of prompt KV reused by later requests (0 = off)",
    )
    p.add_argument(
        "--no-lookup",
        dest="lookup",
        action="store_false",
        help="no prompt-lookup decoding (on by default for a greedy request decoding alone)",
    )
    p.add_argument(
        "--reasoning-budget",
        type=_at_least(-1),
        default=-1,
        help="tokens a reasoning model may think (its <think> block) before the close is "
        "forced; -1 = no limit, 0 = no thinking",
    )
    p.add_argument(
        "--drain", type=float, default=10.0, help="seconds running requests get on SIGTERM"
    )
    args = p.parse_args(argv)
    if (args.min_replicas is None) != (args.max_replicas is None):
        p.error("--min-replicas and --max-replicas go together (autoscaling bounds)")
    if args.max_replicas is not None and args.min_replicas > args.max_replicas:
        p.error("--min-replicas must not exceed --max-replicas")
    return args


def resolve_model(model: str) -> Path:
    """server/main.cpp's rule: a checkpoint directory or .gguf, as a path or a store entry."""
    from serve_ray.replica import engine

    def is_model(p: Path) -> bool:
        return p.is_dir() or (p.suffix == ".gguf" and p.is_file())

    try:  # a front end built from the source tree: its models/ is the default store
        import edgellm_deployment

        store = Path(edgellm_deployment.model_store())
    except ImportError:  # the installed package alone: the engine's rule
        store = Path(engine().model_store())
    path = Path(model)
    if not is_model(path):
        path = store / model
    if not is_model(path):
        raise SystemExit(
            f"error: {model}: no such checkpoint directory or .gguf file (nor in the model "
            f"store {store})"
        )
    return path.resolve()


def model_name(path: Path) -> str:
    from serve_ray.replica import engine

    return engine().model_id(str(path))  # edgellm_server's default id


def build_app(args: argparse.Namespace, path: Path, threads: int) -> Any:
    from ray import serve

    from serve_ray.ingress import OpenAIIngress
    from serve_ray.replica import EdgeLLMReplica

    scaling: dict[str, Any] = {"num_replicas": args.replicas}
    if args.max_replicas is not None:
        scaling = {
            "autoscaling_config": {
                "min_replicas": args.min_replicas,
                "initial_replicas": min(max(args.replicas, args.min_replicas), args.max_replicas),
                "max_replicas": args.max_replicas,
                "target_ongoing_requests": args.target_ongoing,
            }
        }
    replica = serve.deployment(EdgeLLMReplica).options(
        name="EdgeLLMReplica",
        ray_actor_options={"num_cpus": threads},
        # A replica gets what its C++ scheduler batches at once; the rest wait in Ray's router,
        # which gives each to the first replica with a free slot (a burst handed to one replica
        # would queue there while another idles). Beyond --queue waiting: 429, as the C++ server.
        max_ongoing_requests=args.parallel,
        max_queued_requests=args.queue,
        health_check_period_s=2,
        health_check_timeout_s=10,
        **scaling,
    )
    bound = replica.bind(
        str(path),
        threads,
        args.max_context,
        args.parallel,
        args.queue,
        args.prefill_chunk,
        args.cache_mb,
        args.lookup,
        args.reasoning_budget,
    )
    return OpenAIIngress.bind(bound, args.name or model_name(path))


def worker_env() -> dict[str, str]:
    paths = [str(_REPO / "build" / "python"), str(_LLMS), str(_REPO)]
    if os.environ.get("PYTHONPATH"):
        paths.insert(0, os.environ["PYTHONPATH"])
    env = {"PYTHONPATH": os.pathsep.join(paths)}
    for name in ("EDGELLM_MODELS", "EDGELLM_ISA", "EDGELLM_GEMM_PRECISION"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    path = resolve_model(args.model)
    cpus = args.num_cpus or os.cpu_count() or 1
    threads = args.threads or max(1, cpus // args.replicas)
    import ray
    from ray import serve

    runtime_env = {"env_vars": worker_env()}
    if args.address:
        ray.init(address=args.address, runtime_env=runtime_env, log_to_driver=False)
    else:
        # Ray runs its workers at nice 15 by default: the engine would lose the cores to any
        # other load on the machine (an engine step 1.7-1.9x slower measured on the shared dev box).
        os.environ.setdefault("RAY_worker_niceness", "0")
        ray.init(
            num_cpus=cpus, include_dashboard=False, runtime_env=runtime_env, log_to_driver=False
        )
    stop = threading.Event()  # after ray.init, which installs a SIGTERM handler of its own
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(build_app(args, path, threads), name="edgellm", route_prefix="/")
        name = args.name or model_name(path)
        print(
            f"edgellm on Ray Serve: http://{args.host}:{args.port}/v1 serving '{name}' "
            f"({args.replicas} replicas x {threads} threads, {args.parallel} sequences each)",
            file=sys.stderr,
            flush=True,
        )
        while not stop.wait(0.5):
            pass
        print("edgellm on Ray Serve: draining", file=sys.stderr, flush=True)
        ingress = serve.get_deployment_handle("OpenAIIngress", app_name="edgellm")
        left = ingress.drain.remote(args.drain).result(timeout_s=args.drain + 30)
        if left:
            print(f"edgellm on Ray Serve: {left} requests cut at the drain limit", file=sys.stderr)
        if args.address:  # a cluster we own goes down whole with ray.shutdown(), Serve with it
            serve.shutdown()
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""python bench/serve_load.py [--scripted] [--requests 200] [--concurrency 32] [--sequential-requests N] [--set loop.max_steps=2] [--poison blank-lines|1mb] [--compare-chat]

Load test of `kair serve`, all on loopback. Starts the app under uvicorn on 127.0.0.1 on a free
port (in a subprocess: this script with --serve-port), waits for /healthz, sends one warm-up
request, then:

  1. concurrent: --requests POST /v1/answer from --concurrency client threads; the server batches
     them into the loop's rounds (continuous batching);
  2. one at a time: the same requests (the first --sequential-requests of them) sequentially;

and prints p50/p95 latency, throughput and errors of each phase and the throughput ratio, all
measured in this run. Target: 0 errors and a ratio >= 4x.

Backends:
  default      configs/serve/default.yaml: the hf backend with SmolLM2-135M on the CPU, MiniLM
               over the embedded demo corpus. Slow on a small CPU: use --requests/--set to size it.
  --scripted   configs/serve/scripted.yaml: no model (the echo backend, BM25). Each generate()
               call sleeps --scripted-delay-ms first, whatever its batch size: the cost model of an
               accelerator, where a batched call costs about what a single one does. With a delay
               of 0 it measures the server's own overhead.

--poison KIND  instead of the two phases above: can one bad model output stall everyone else? With
               --scripted only. Sends --poison-batches times 10 normal concurrent requests, alone and
               together with one request whose every step output is pathological (`blank-lines`:
               1,200 blank lines, the shape that once took 33 s to parse; `1mb`: a megabyte of blank
               lines and labels), and prints the normal requests' latency both ways and the ratio.
               Target: the poison slows the others by less than 2x.

--compare-chat instead of the two phases above: the OpenAI route against /v1/answer. The same
               --requests questions go one at a time to both routes, alternating which goes first,
               and it prints each route's p50/p95 and the chat/answer p50 ratio. Target: <= 1.10
               (the chat route costs no more than 10% more at p50).

Every phase is bounded: no new request starts after --phase-time-limit-s, and each request has
the server's request timeout. Requests that never started are reported as skipped. The server
process is terminated at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import uvicorn

from kair_runtime.demo_data import load_demo_questions
from kair_runtime.llm import build_llm
from kair_runtime.llm.base import Completion, SamplingParams
from kair_runtime.records import Message
from kair_runtime.retrieval import build_retriever
from kair_runtime.serve.app import create_app
from kair_runtime.serve.config import ServeConfig, load_serve_config

ROOT = Path(__file__).resolve().parents[1]


class DelayedLLM:
    """Wraps an LLM: a fixed sleep per generate() call, independent of the batch size."""

    def __init__(self, inner, delay_s: float):
        self.inner, self.delay_s = inner, delay_s
        self.name = f"{inner.name}+{delay_s * 1000:g}ms/call"
        self.calls: list[int] = []

    def generate(self, prompts: list[list[Message]], sampling: SamplingParams) -> list[Completion]:
        self.calls.append(len(prompts))
        time.sleep(self.delay_s)
        return self.inner.generate(prompts, sampling)


POISON_MARK = "[poison]"  # in a question: the server's LLM answers it with a pathological output
POISON_OUTPUTS = {
    "blank-lines": "\n" * 1_200,
    "1mb": ("\n" * 500 + "Query:\n" * 500 + " " * 500) * 222,
}


class PoisonedLLM:
    """Wraps an LLM: every completion for a prompt that carries POISON_MARK is replaced by a
    pathological output, as a broken upstream would send it."""

    def __init__(self, inner, output: str):
        self.inner, self.output = inner, output
        self.name = inner.name

    def generate(self, prompts: list[list[Message]], sampling: SamplingParams) -> list[Completion]:
        out = self.inner.generate(prompts, sampling)
        return [Completion(text=self.output) if any(POISON_MARK in m["content"] for m in p) else c
                for p, c in zip(prompts, out)]


@dataclass
class Phase:
    name: str
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped: int = 0
    wall_s: float = 0.0

    @property
    def done(self) -> int:
        return len(self.latencies)

    @property
    def throughput(self) -> float:
        return self.done / self.wall_s if self.wall_s > 0 else 0.0

    def line(self) -> str:
        lat = sorted(self.latencies)
        p50 = statistics.median(lat) if lat else float("nan")
        p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))] if lat else float("nan")
        return (f"{self.name:<13} ok={self.done:<4} errors={len(self.errors):<3} skipped={self.skipped:<4} "
                f"wall={self.wall_s:7.1f}s  p50={p50:6.2f}s  p95={p95:6.2f}s  throughput={self.throughput:6.2f} req/s")


def _post(client: httpx.Client, body: dict, route: str = "/v1/answer") -> str | None:
    """One request; None when it succeeded, else the error as one short line."""
    try:
        r = client.post(route, json=body)
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {e}"
    return None if r.status_code == 200 else f"{r.status_code}: {r.text[:200]}"


def run_phase(name: str, url: str, bodies: list[dict], clients: int, time_limit_s: float,
              timeout_s: float) -> Phase:
    phase, lock = Phase(name), threading.Lock()
    deadline = time.monotonic() + time_limit_s
    local = threading.local()

    def one(body: dict) -> None:
        if time.monotonic() > deadline:
            with lock:
                phase.skipped += 1
            return
        if not hasattr(local, "client"):  # one keep-alive connection per client thread
            local.client = httpx.Client(base_url=url, timeout=timeout_s)
        t0 = time.perf_counter()
        error = _post(local.client, body)
        with lock:
            if error:
                phase.errors.append(error)
            else:
                phase.latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, bodies))
    phase.wall_s = time.perf_counter() - t0
    return phase


def run_poison_phase(name: str, url: str, normal: list[dict], poison: dict | None, timeout_s: float) -> Phase:
    """All of `normal` at once, plus `poison` (submitted first, so it shares their rounds); only
    the normal requests' latencies are kept. A failed poison request is an error too."""
    phase, lock = Phase(name), threading.Lock()

    def one(body: dict) -> None:
        t0 = time.perf_counter()
        with httpx.Client(base_url=url, timeout=timeout_s) as client:
            error = _post(client, body)
        with lock:
            if error:
                phase.errors.append(error)
            elif body is not poison:
                phase.latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(normal) + 1) as pool:
        list(pool.map(one, ([poison] if poison else []) + normal))
    phase.wall_s = time.perf_counter() - t0
    return phase


def poison_comparison(url: str, bodies: list[dict], batches: int, timeout_s: float) -> None:
    clean, poisoned = Phase("normal x10"), Phase("normal+poison")
    for b in range(batches):  # interleaved, so drift on a shared machine hits both alike
        normal = bodies[(b * 10) % len(bodies):][:10] or bodies[:10]
        poison = {"question": f"{POISON_MARK} {normal[0]['question']}"}
        for target, extra in ((clean, None), (poisoned, poison)):
            ph = run_poison_phase(target.name, url, normal, extra, timeout_s)
            target.latencies += ph.latencies
            target.errors += ph.errors
            target.wall_s += ph.wall_s
    print(clean.line())
    print(poisoned.line())
    p50 = lambda ph: statistics.median(ph.latencies) if ph.latencies else float("nan")
    worst = lambda ph: max(ph.latencies, default=float("nan"))
    ratio, ratio_max = p50(poisoned) / p50(clean), worst(poisoned) / worst(clean)
    errors = len(clean.errors) + len(poisoned.errors)
    for e in (clean.errors + poisoned.errors)[:5]:
        print(f"  error: {e}")
    print(f"normal requests with / without the poison: p50 {ratio:.2f}x, max {ratio_max:.2f}x   errors: {errors}   "
          f"target 0 errors and p50 < 2x: {'met' if errors == 0 and ratio < 2 else 'NOT met'}")


def chat_comparison(url: str, bodies: list[dict], timeout_s: float) -> None:
    """Each question to /v1/answer and to /v1/chat/completions, one request at a time, the order
    alternating, so drift on a shared machine hits both routes alike."""
    model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    phases = {"/v1/answer": Phase("/v1/answer"), "/v1/chat/completions": Phase("chat")}
    with httpx.Client(base_url=url, timeout=timeout_s) as client:
        t0 = time.perf_counter()
        for i, body in enumerate(bodies):
            chat = {"model": model, "messages": [{"role": "user", "content": body["question"]}]}
            pair = [("/v1/answer", body), ("/v1/chat/completions", chat)]
            for route, payload in pair if i % 2 == 0 else pair[::-1]:
                start = time.perf_counter()
                error = _post(client, payload, route)
                if error:
                    phases[route].errors.append(error)
                else:
                    phases[route].latencies.append(time.perf_counter() - start)
        for ph in phases.values():
            ph.wall_s = time.perf_counter() - t0  # shared: throughput is not the point here
    answer, chat = phases.values()
    print(answer.line())
    print(chat.line())
    errors = len(answer.errors) + len(chat.errors)
    for e in (answer.errors + chat.errors)[:5]:
        print(f"  error: {e}")
    p50 = {ph.name: statistics.median(ph.latencies) if ph.latencies else float("nan") for ph in (answer, chat)}
    ratio = p50["chat"] / p50["/v1/answer"]
    print(f"p50 chat {p50['chat'] * 1000:.1f} ms / answer {p50['/v1/answer'] * 1000:.1f} ms: {ratio:.3f}x   "
          f"errors: {errors}   target 0 errors and <= 1.10x: "
          f"{'met' if errors == 0 and ratio <= 1.10 else 'NOT met'}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_app(args: argparse.Namespace, cfg: ServeConfig):
    def build():
        llm = build_llm(cfg.llm)
        if args.scripted:
            llm = DelayedLLM(llm, args.scripted_delay_ms / 1000)
        if args.poison:
            llm = PoisonedLLM(llm, POISON_OUTPUTS[args.poison])
        return llm, build_retriever(cfg.retriever)
    return create_app(cfg, build=build)


def start_server(args: argparse.Namespace, log_path: Path) -> tuple[subprocess.Popen, str]:
    """This script again, as the server process (`--serve-port`): the clients' threads then do
    not compete with the server for one interpreter's GIL, as with a real deployment."""
    port = free_port()
    cmd = [sys.executable, __file__, "--serve-port", str(port), "--scripted-delay-ms", str(args.scripted_delay_ms)]
    cmd += ["--scripted"] if args.scripted else []
    cmd += ["--poison", args.poison] if args.poison else []
    cmd += ["--config", args.config] if args.config else []
    for o in args.overrides:
        cmd += ["--set", o]
    proc = subprocess.Popen(cmd, stdout=log_path.open("w"), stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen, url: str, log_path: Path, timeout_s: float = 900.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
        try:
            r = httpx.get(url + "/healthz", timeout=5)
            if r.status_code == 200:
                return
            if r.json().get("status") == "failed":
                raise SystemExit(f"the server failed to load: {r.json().get('error')}")
        except httpx.TransportError:
            pass  # not listening yet
        time.sleep(0.2)
    raise SystemExit(f"the server was not ready within {timeout_s:.0f}s; log: {log_path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scripted", action="store_true", help="no model: the scripted backend (see above)")
    ap.add_argument("--config", default=None, help="a serve config (default: by backend, see above)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="override a config key")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--sequential-requests", type=int, default=None, help="default: all of --requests")
    ap.add_argument("--scripted-delay-ms", type=float, default=20.0)
    ap.add_argument("--phase-time-limit-s", type=float, default=1800.0)
    ap.add_argument("--poison", choices=sorted(POISON_OUTPUTS), default=None,
                    help="measure how one pathological model output slows 10 normal requests (see above)")
    ap.add_argument("--poison-batches", type=int, default=5)
    ap.add_argument("--compare-chat", action="store_true",
                    help="the OpenAI chat route against /v1/answer, one request at a time (see above)")
    ap.add_argument("--serve-port", type=int, default=None, help=argparse.SUPPRESS)  # the server process
    args = ap.parse_args()
    if args.poison and not args.scripted:
        ap.error("--poison needs --scripted (the poison is injected into the scripted backend's outputs)")
    if not 1 <= args.requests <= 10_000 or not 1 <= args.concurrency <= 256:
        ap.error("--requests must be in 1..10000 and --concurrency in 1..256")

    config = args.config or str(ROOT / "configs" / "serve" / ("scripted.yaml" if args.scripted else "default.yaml"))
    cfg: ServeConfig = load_serve_config(config, args.overrides)
    if args.serve_port is not None:
        uvicorn.run(build_app(args, cfg), host="127.0.0.1", port=args.serve_port, log_level="warning")
        return

    questions = load_demo_questions()
    bodies = [{"question": questions[i % len(questions)].question} for i in range(args.requests)]
    n_seq = min(args.sequential_requests or args.requests, args.requests)
    timeout = cfg.server.request_timeout_s + 5
    print(f"config {config} {' '.join(args.overrides)}")
    print(f"requests={args.requests} concurrency={args.concurrency} sequential={n_seq} "
          f"max_batch={cfg.server.max_batch} batch_wait_ms={cfg.server.batch_wait_ms} "
          f"max_steps={cfg.loop.max_steps} top_k={cfg.loop.top_k} step_max_tokens={cfg.loop.step_max_tokens}")

    with tempfile.TemporaryDirectory(prefix="kair-serve-load-") as tmp:
        log_path = Path(tmp) / "server.log"
        proc, url = start_server(args, log_path)
        try:
            t0 = time.perf_counter()
            wait_ready(proc, url, log_path)
            info = httpx.get(url + "/v1/info", timeout=10).json()
            print(f"server {url} (pid {proc.pid}) ready in {time.perf_counter() - t0:.1f}s: "
                  f"{info['model']['loaded_as']} with {info['retriever']['name']}")
            warm = run_phase("warm-up", url, bodies[:1], 1, args.phase_time_limit_s, timeout)
            if warm.errors:
                raise SystemExit(f"warm-up request failed: {warm.errors[0]}")
            if args.poison:
                print(f"poison: {args.poison} ({len(POISON_OUTPUTS[args.poison]):,} chars per step output)")
                poison_comparison(url, bodies, args.poison_batches, timeout)
                return
            if args.compare_chat:
                chat_comparison(url, bodies, timeout)
                return
            before = httpx.get(url + "/v1/info", timeout=10).json()["batching"]
            conc = run_phase("concurrent", url, bodies, args.concurrency, args.phase_time_limit_s, timeout)
            after = httpx.get(url + "/v1/info", timeout=10).json()["batching"]
            seq = run_phase("one-at-a-time", url, bodies[:n_seq], 1, args.phase_time_limit_s, timeout)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()

    print(conc.line())
    print(seq.line())
    print(f"batching: {after['rounds'] - before['rounds']} loop rounds for {conc.done} concurrent requests, "
          f"up to {after['max_in_flight']} questions in flight together")
    for e in (conc.errors + seq.errors)[:5]:
        print(f"  error: {e}")
    ratio = conc.throughput / seq.throughput if seq.throughput else float("nan")
    errors = len(conc.errors) + len(seq.errors)
    print(f"throughput ratio (concurrent / one-at-a-time): {ratio:.1f}x   errors: {errors}   "
          f"target 0 errors and >= 4x: {'met' if errors == 0 and ratio >= 4 else 'NOT met'}")


if __name__ == "__main__":
    main()

"""Run vLLM's own `vllm bench serve` against a running server and read its result JSON.

The cross-check of our load generator: the same server, the same workload shape (random
prompts of a fixed length, fixed output length with ignore_eos, greedy sampling, same
request count and concurrency), and vLLM's numbers beside ours. It runs as a subprocess
through the same `vllm` launcher as the server (server.vllm_command), so perfgate itself
never imports vLLM.
"""
from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from perfgate.launch.core import ProcessJob
from perfgate.workloads.serving.server import contained_env, remove_short_tmpdir, start_job, vllm_command


@dataclass(frozen=True)
class BenchServeSpec:
    base_url: str
    model: str                   # served model name
    tokenizer: str               # model dir (the random dataset samples token ids from it)
    work_dir: Path
    input_len: int
    output_len: int
    num_prompts: int
    max_concurrency: int | None = None
    request_rate: float | None = None  # None = inf
    seed: int = 0
    timeout_s: float = 600.0

    def argv(self, result_name: str) -> list[str]:
        args = ["bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions",
                "--base-url", self.base_url, "--model", self.model, "--tokenizer", self.tokenizer,
                "--dataset-name", "random", "--random-input-len", str(self.input_len),
                "--random-output-len", str(self.output_len), "--random-range-ratio", "0",
                "--num-prompts", str(self.num_prompts), "--ignore-eos", "--temperature", "0",
                "--seed", str(self.seed), "--disable-tqdm", "--save-result", "--save-detailed",
                "--result-dir", str(self.work_dir), "--result-filename", result_name,
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,95,99"]
        if self.max_concurrency:
            args += ["--max-concurrency", str(self.max_concurrency)]
        if self.request_rate:
            args += ["--request-rate", str(self.request_rate)]
        return args


class BenchServeError(RuntimeError):
    pass


# printed by `vllm bench serve` after its single-prompt test request, right before the timed run
MAIN_RUN_MARKER = "Maximum request concurrency"


class BenchServeRun:
    """`vllm bench serve` running in the background: start(), wait_main_run(), result().

    Lets a caller run its own load at the same time as vLLM's, so both tools measure the
    same server under the same conditions (on a shared or noisy machine, back-to-back runs
    differ by more than the tools do).
    """

    def __init__(self, spec: BenchServeSpec, result_name: str = "bench.json"):
        self.spec = spec
        self.result_name = result_name
        self.work = Path(spec.work_dir)
        self.log_path = self.work / f"{Path(result_name).stem}.log"
        self.proc: subprocess.Popen | None = None
        self.job: ProcessJob | None = None
        self.t0 = 0.0

    def start(self) -> "BenchServeRun":
        self.work.mkdir(parents=True, exist_ok=True)
        argv = [*vllm_command(), *self.spec.argv(self.result_name)]
        self.t0 = time.monotonic()
        self.log_path.unlink(missing_ok=True)
        self.proc, self.job = start_job(argv, contained_env(self.work / "env"), self.log_path, self.work, grace_s=5.0)
        return self

    def _log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_main_run(self, timeout_s: float = 300.0) -> float:
        """Block until the timed run starts (after vLLM's import and its test request); seconds waited."""
        deadline = time.monotonic() + timeout_s
        while MAIN_RUN_MARKER not in self._log():
            if self.proc.poll() is not None:
                self._fail(f"exited {self.proc.returncode} before its timed run")
            if time.monotonic() > deadline:
                self.stop()
                self._fail(f"did not start its timed run within {timeout_s:.0f} s")
            time.sleep(0.05)
        return time.monotonic() - self.t0

    def result(self) -> dict:
        """Wait for the run to end and return its result JSON."""
        try:
            rc = self.proc.wait(timeout=max(1.0, self.spec.timeout_s - (time.monotonic() - self.t0)))
        except subprocess.TimeoutExpired:
            self.stop()
            self._fail(f"ran past {self.spec.timeout_s:.0f} s")
        finally:
            self.stop()
        out = self.work / self.result_name
        if rc != 0 or not out.exists():
            self._fail(f"exited {rc} (no {out.name})")
        result = json.loads(out.read_text())
        result["_wall_s"] = time.monotonic() - self.t0
        result["_argv"] = self.spec.argv(self.result_name)
        return result

    def stop(self) -> None:
        if self.job is not None:
            self.job.kill_all()
        remove_short_tmpdir(self.work / "env")

    def _fail(self, what: str):
        tail = "\n".join(self._log().splitlines()[-40:])
        raise BenchServeError(f"vllm bench serve {what}; log {self.log_path}:\n{tail}")

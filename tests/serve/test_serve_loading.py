"""`c2jax serve --model`: a c2jax run directory or an HF directory, loaded and served."""

import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from c2jax import hf
from c2jax.serve import loading
from c2jax.train import checkpoint as checkpoint_lib
from c2jax.train import profiling

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def run_dir(served, tmp_path_factory):
  """A run directory as a training phase leaves it: config.json + an orbax checkpoint."""
  root = tmp_path_factory.mktemp("run") / "tiny-run"
  (root / "checkpoints").mkdir(parents=True)
  tokenizer_file = root / "tokenizer.json"
  served.tokenizer.save(tokenizer_file)
  config = {"model": served.cfg.to_dict(),
            "data": {"tokenizer_file": str(tokenizer_file)}}
  (root / "config.json").write_text(json.dumps(config))
  checkpointer = checkpoint_lib.Checkpointer(root / "checkpoints", async_save=False)
  checkpointer.save(30, {"params": served.params}, {}, config, force=True)
  checkpointer.close()
  return root


def assert_same_params(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y),
                                                       atol=1e-6), a, b)


def test_loads_a_run_directory(run_dir, served):
  loaded = loading.load(str(run_dir))
  assert loaded.version == 30 and loaded.name == "tiny-run"
  assert loaded.cfg.vocab_size == served.cfg.vocab_size
  assert loaded.tokenizer.vocab_size == served.tokenizer.vocab_size
  assert_same_params(loaded.params, served.params)


def test_loads_an_hf_directory(served, tmp_path):
  hf.save(served.cfg, jax.tree.map(np.asarray, served.params), tmp_path / "hf")
  served.tokenizer.save(tmp_path / "hf" / "tokenizer.json")
  loaded = loading.load(str(tmp_path / "hf"))
  assert loaded.version == 0
  assert_same_params(loaded.params, served.params)


def test_load_errors_name_the_problem(tmp_path, run_dir):
  with pytest.raises(FileNotFoundError, match="no config.json"):
    loading.load(str(tmp_path))
  (tmp_path / "config.json").write_text("{}")
  with pytest.raises(ValueError, match="neither a c2jax run"):
    loading.load(str(tmp_path))
  config = json.loads((run_dir / "config.json").read_text())
  config["model"]["vocab_size"] = 100  # smaller than the tokenizer
  bad = tmp_path / "bad"
  (bad / "checkpoints").mkdir(parents=True)
  (bad / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="vocab_size is 100"):
    loading.load(str(bad))


def test_cli_serves_a_run(run_dir, tmp_path):
  capture = tmp_path / "served.jsonl"
  env = {**os.environ, "PYTHONPATH": os.getcwd(), "C2JAX_API_KEY": "sk-cli-test"}
  process = subprocess.Popen(
      [sys.executable, "-c", "from c2jax.cli import run; run()", "serve",
       f"--model={run_dir}", "--port=0", "--slots=2", "--max_length=96",
       f"--capture={capture}", "--profile_steps=1,1",
       f"--profile_dir={tmp_path / 'profile'}"],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
  try:
    deadline, url = time.time() + 120, None
    while url is None:
      line = process.stdout.readline()
      assert line or process.poll() is None, "c2jax serve exited before listening"
      assert time.time() < deadline, "c2jax serve did not start in time"
      if " on http://" in line:
        url = line.split(" on ")[1].split()[0]
    stranger = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):  # the key came from $C2JAX_API_KEY
      stranger.models.list()
    client = openai.OpenAI(base_url=url, api_key="sk-cli-test", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["tiny-run"]
    response = client.chat.completions.create(
        model="tiny-run", messages=[{"role": "user", "content": "hi"}], temperature=0,
        max_tokens=4)
    assert response.system_fingerprint == "c2jax-v30"
    [line] = capture.read_text().splitlines()
    assert json.loads(line)["id"] == response.id
    # --profile_steps=1,1: the first engine step's trace, written before its reply.
    assert profiling.span_totals(tmp_path / "profile")["serve/step"][0] == 1
  finally:
    process.terminate()
    process.wait(30)


@pytest.mark.slow
def test_cli_serves_on_a_mesh(run_dir, served):
  """--mesh shards the engine over local devices (2 fake CPU devices here) and the
  greedy reply carries the one-device engine's log-probs. Started from configs/serve.py,
  whose 3 slots (which 2 devices cannot split) a --slots flag overrides."""
  env = {**os.environ, "PYTHONPATH": os.getcwd(), "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  bad = subprocess.run(
      [sys.executable, "-c", "from c2jax.cli import run; run()", "serve",
       f"--model={run_dir}", "--slots=3", "--mesh=fsdp=2"],
      capture_output=True, text=True, env=env, timeout=120)
  assert bad.returncode == 2 and "config.engine.mesh: 'fsdp=2'" in bad.stderr, bad.stderr
  assert "use a multiple of 2 slots" in bad.stderr
  process = subprocess.Popen(
      [sys.executable, "-c", "from c2jax.cli import run; run()", "serve",
       "--config=configs/serve.py", f"--config.model={run_dir}", "--config.port=0",
       "--config.engine.slots=3", "--config.engine.max_length=160",
       "--config.engine.mesh=fsdp=2", "--slots=2"],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
  try:
    deadline, url, lines = time.time() + 180, None, []
    while url is None:
      line = process.stdout.readline()
      lines.append(line)
      assert line or process.poll() is None, "c2jax serve exited:\n" + "".join(lines)
      assert time.time() < deadline, "c2jax serve did not start in time"
      if " on http://" in line:
        url = line.split(" on ")[1].split()[0]
    assert any("engine over 2 devices, mesh {'fsdp': 2}" in line for line in lines), lines
    # The weights the engine holds, by tensor group, in the log and on /health: the
    # routed experts split over fsdp=2, so each device holds half of them.
    held = process.stdout.readline()
    assert held.startswith("c2jax serve: weights ") and "routed experts" in held, held
    import httpx  # pylint: disable=g-import-not-at-top
    groups = httpx.get(url.removesuffix("/v1") + "/health", timeout=30).json()["weights"]
    experts = groups["routed experts"]
    assert experts["dtypes"] == ["float32"]
    assert experts["bytes_per_device"] * 2 == experts["bytes"] > 0
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
    from tests.serve.conftest import USERS, messages  # pylint: disable=g-import-not-at-top
    response = client.chat.completions.create(
        model="tiny-run", messages=messages(USERS[0]), temperature=0, max_tokens=10,
        logprobs=True)
    got = [entry.logprob for entry in response.choices[0].logprobs.content]
    want = served.reference[0].logprobs[:len(got)]
    assert len(got) >= 1
    np.testing.assert_allclose(got, want, atol=1e-4)
  finally:
    process.terminate()
    process.wait(30)


@pytest.mark.slow
def test_cli_serves_one_engine_over_two_processes(run_dir, served):
  """`c2jax serve` started once per process (JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES
  / JAX_PROCESS_ID, 2 fake CPU devices each) runs one engine over the 4 devices, the
  experts split across the processes: process 0 answers HTTP with the one-device
  engine's greedy log-probs, process 1 opens no port and follows; when process 0 stops,
  process 1 ends too."""
  group, url, lines = _start_two_processes(run_dir)
  leader, follower = group
  try:
    assert any("engine over 4 devices, mesh {'expert': 2, 'tensor': 2}" in line
               for line in lines), lines
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
    from tests.serve.conftest import USERS, messages  # pylint: disable=g-import-not-at-top
    for user, reference in zip(USERS[:2], served.reference[:2]):
      response = client.chat.completions.create(
          model="tiny-run", messages=messages(user), temperature=0, max_tokens=10,
          logprobs=True)
      got = [entry.logprob for entry in response.choices[0].logprobs.content]
      assert len(got) >= 1
      np.testing.assert_allclose(got, reference.logprobs[:len(got)], atol=1e-4)
    leader.terminate()
    lead_out, _ = leader.communicate(timeout=120)
    out, _ = follower.communicate(timeout=120)
    assert follower.returncode == 0, (lead_out[-3000:], out[-3000:])
    assert "process 1 of 2 follows process 0's engine" in out and " on http://" not in out
  finally:
    for process in group:
      if process.poll() is None:
        process.kill()
        process.wait(30)


def _start_two_processes(run_dir):
  """`c2jax serve` as processes 0 and 1 of one job (2 fake devices each) and the URL
  process 0 serves."""
  from tests.parallel.test_distributed import _free_port  # pylint: disable=g-import-not-at-top
  from tests.subprocess_checks import child_env  # pylint: disable=g-import-not-at-top

  port = _free_port()
  group = [subprocess.Popen(
      [sys.executable, "-c", "from c2jax.cli import run; run()", "serve",
       f"--model={run_dir}", "--port=0", "--slots=2", "--max_length=160",
       "--mesh=expert=2,tensor=2"],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=os.getcwd(),
      env=child_env(XLA_FLAGS="--xla_force_host_platform_device_count=2",
                    JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                    JAX_NUM_PROCESSES=2, JAX_PROCESS_ID=rank)) for rank in (0, 1)]
  deadline, url, lines = time.time() + 300, None, []
  try:
    while url is None:
      line = group[0].stdout.readline()
      lines.append(line)
      assert line or group[0].poll() is None, "c2jax serve exited:\n" + "".join(lines)
      assert time.time() < deadline, "c2jax serve did not start in time"
      if " on http://" in line:
        url = line.split(" on ")[1].split()[0]
  except BaseException:
    for process in group:
      process.kill()
      process.wait(30)
    raise
  return group, url, lines


@pytest.mark.slow
def test_a_served_engine_losing_a_process_answers_503_and_stops_naming_it(run_dir):
  """Process 1 of a two-process server is killed: the next request gets 503 (never
  hangs), and process 0 stops with an error naming process 1."""
  group, url, _ = _start_two_processes(run_dir)
  leader, follower = group
  try:
    follower.kill()
    follower.wait(30)
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
    from tests.serve.conftest import USERS, messages  # pylint: disable=g-import-not-at-top
    with pytest.raises(openai.APIStatusError) as err:
      client.chat.completions.create(model="tiny-run", messages=messages(USERS[0]),
                                     temperature=0, max_tokens=10)
    assert err.value.status_code == 503, err.value
    assert "engine_unavailable" in str(err.value.body)
    out, _ = leader.communicate(timeout=120)
    assert leader.returncode == 1, out[-3000:]
    assert "failed: process 1 no longer answers" in out, out[-3000:]
  finally:
    for process in group:
      if process.poll() is None:
        process.kill()
        process.wait(30)


def test_a_stuck_engine_answers_503_to_the_waiting_and_later_requests(served):
  """What `c2jax serve` does when the watchdog of its engine over several processes finds
  a program that never completes (engine.on_hang = service.loop.fail, with the
  lockstep.EngineHang naming the process): the request waiting inside the stuck step and
  later ones get 503 engine_unavailable with that message, and on_fatal gets the hang (the
  command then stops, exit 1; test_engine_processes runs the watchdog itself)."""
  from concurrent import futures  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top

  from c2jax.rollout import lockstep  # pylint: disable=g-import-not-at-top
  from c2jax.serve import Running, Service  # pylint: disable=g-import-not-at-top
  from tests.serve.conftest import VOCAB, USERS, ScriptedEngine, messages  # pylint: disable=g-import-not-at-top

  inside, release = threading.Event(), threading.Event()

  class Stuck(ScriptedEngine):
    def _decode(self, batch):
      inside.set()
      release.wait(120)  # a collective waiting for a process that never comes
      return super()._decode(batch)

  fatal = []
  running = Running(Service(Stuck([5, 6, 7]), served.tokenizer, "stuck", vocab_size=VOCAB,
                            on_fatal=fatal.append))
  client = openai.OpenAI(base_url=running.base_url, api_key="none", max_retries=0, timeout=60)
  ask = lambda: client.chat.completions.create(model="stuck", messages=messages(USERS[0]),
                                               max_tokens=5)
  hang = lockstep.EngineHang("program 'decode' (engine command 9) has not completed in 600 s "
                             "(hang timeout 600 s) on process 0, waiting for process 1", [1])
  try:
    with futures.ThreadPoolExecutor(1) as pool:
      waiting = pool.submit(ask)
      assert inside.wait(60)
      running.service.loop.fail(hang)  # from the watchdog's thread
      with pytest.raises(openai.APIStatusError) as err:
        waiting.result(60)
    with pytest.raises(openai.APIStatusError) as later:
      ask()
  finally:
    release.set()
    running.stop()
  for error in (err.value, later.value):
    assert error.status_code == 503 and "engine_unavailable" in str(error.body), error
    assert "waiting for process 1" in str(error.body), error.body
  [reported] = fatal
  assert reported.__cause__ is hang


def test_serves_a_qwen3_dense_hf_directory(served, tmp_path):
  """A dense Qwen3 (Qwen3ForCausalLM) HF directory loads and answers over HTTP, with the
  log-probs its engine (decode layout: per-layer arrays) computes for the greedy reply."""
  from c2jax.model import variants  # pylint: disable=g-import-not-at-top
  from c2jax.rollout import JaxEngine  # pylint: disable=g-import-not-at-top
  from c2jax.serve import Running, Service  # pylint: disable=g-import-not-at-top
  from tests.model.conftest import random_params  # pylint: disable=g-import-not-at-top
  from tests.serve.conftest import USERS, VOCAB, messages  # pylint: disable=g-import-not-at-top

  cfg = variants.get("qwen3_tiny", vocab_size=VOCAB)
  hf.save(cfg, jax.tree.map(np.asarray, random_params(cfg)), tmp_path / "qwen3")
  served.tokenizer.save(tmp_path / "qwen3" / "tokenizer.json")
  assert json.loads((tmp_path / "qwen3" / "config.json").read_text())["architectures"] == [
      "Qwen3ForCausalLM"]
  loaded = loading.load(str(tmp_path / "qwen3"))
  assert loaded.cfg.first_k_dense == loaded.cfg.num_layers and loaded.cfg.qk_norm
  engine = JaxEngine(loaded.cfg, loaded.params, num_slots=2, max_length=128,
                     prefill_buckets=(64,), detokenize=loaded.tokenizer.decode)
  running = Running(Service(engine, loaded.tokenizer, "qwen3-dense", vocab_size=VOCAB))
  try:
    client = openai.OpenAI(base_url=running.base_url, api_key="none", max_retries=0,
                           timeout=120)
    response = client.chat.completions.create(
        model="qwen3-dense", messages=messages(USERS[0]), temperature=0, max_tokens=6,
        logprobs=True)
    got = [entry.logprob for entry in response.choices[0].logprobs.content]
    assert 1 <= len(got) <= 6 and all(np.isfinite(got)) and max(got) <= 0
  finally:
    running.stop()

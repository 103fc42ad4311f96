"""The GPU benchmark scripts of tools/bench (issue 20, item 6) run their --smoke mode on
this CPU and print the tables their GPU runs will fill: device and date, every row with a
time, ratios against the named baseline, forward agreement with the reference, and the
roofline columns. tools/device/gpu_all.sh names only modules and flags that exist."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from c2jax.plan import accelerators
from tools.bench import attention, block_scaled, decode, grouped_matmul, lm_head, train
from tools.device import gpu_check_kernels

ROOT = pathlib.Path(__file__).resolve().parents[2]
GPU_ALL = ROOT / "tools" / "device" / "gpu_all.sh"
NUMBER = r"([\d.,]+)"


def _row(out, case):
  """(ms, ratio or None) of a print_table row."""
  match = re.search(rf"^{re.escape(case)}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}%(?:\s+{NUMBER}x)?$",
                    out, re.M)
  assert match, (case, out)
  return float(match.group(1)), match.group(4) and float(match.group(4))


def test_grouped_matmul_smoke_has_both_routings_and_agrees(capsys):
  grouped_matmul.main(["--smoke"])
  out = capsys.readouterr().out
  assert re.search(r"^grouped matmul, \d{4}-\d\d-\d\d, cpu", out, re.M)
  assert "balanced routing" in out and re.search(r"skewed routing: .* [1-9]\d* empty", out)
  for case in ("dense bf16 matmul fwd (equal FLOPs)", "lax.ragged_dot fwd",
               "grouped ragged_dot fwd", "grouped ragged_dot bwd (2 GEMMs)"):
    ms, ratio = _row(out, case)
    assert ms > 0 and ratio > 0
  # lax.ragged_dot is the baseline of its own rows.
  assert _row(out, "lax.ragged_dot bwd (2 GEMMs)")[1] == 1.0
  errors = re.findall(r"forward vs lax.ragged_dot, max \|diff\| / max \|ref\| = ([\d.e+-]+)",
                      out)
  # ragged_dot and tokamax (its XLA implementation on a CPU)
  assert "grouped tokamax fwd" in out
  assert len(errors) == 4 and all(float(e) < 1e-2 for e in errors)
  with pytest.raises(SystemExit, match="--groups: unknown"):
    grouped_matmul.main(["--smoke", "--groups", "zipf"])


def test_block_scaled_smoke_times_grouped_fp8_against_bf16(capsys):
  block_scaled.main(["--smoke", "--recipes", "mxfp8", "--paths", "dequantize"])
  out = capsys.readouterr().out
  assert re.search(r"grouped \(MoE\) GEMMs, M=64 K=96 N=32 G=4, skewed routing: .* 1 empty",
                   out)
  assert _row(out, "bf16 grouped fwd")[1] == 1.0
  for case in ("mxfp8 grouped fwd", "mxfp8 grouped bwd (2 GEMMs)"):
    ms, ratio = _row(out, case)
    assert ms > 0 and ratio > 0
  # MXFP8 changes the numbers by its quantisation error: visible, but small.
  error = float(re.search(r"^mxfp8 grouped\s+([\d.e+-]+)$", out, re.M).group(1))
  assert 1e-4 < error < 0.1


def test_attention_smoke_compares_fused_with_blockwise_and_dense(capsys):
  attention.main(["--smoke", "--heads", "gqa", "--masks", "documents"])
  out = capsys.readouterr().out
  assert re.search(r"^attention, \d{4}-\d\d-\d\d, cpu", out, re.M)
  assert "mask documents; auto picks blockwise (cuDNN needs a GPU" in out
  for impl in ("dense", "blockwise", "fused"):
    ms, ratio = _row(out, f"{impl} fwd+bwd")
    assert ms > 0 and ratio > 0
  errors = dict(re.findall(r"(\w+): forward vs dense, max \|diff\| / max \|ref\| = ([\d.e+-]+)",
                           out))
  assert set(errors) == {"dense", "blockwise", "fused", "tokamax"}
  assert all(float(e) < 2e-2 for e in errors.values())   # bf16 operands


def test_train_smoke_reports_mfu_and_roofline_bound(capsys):
  train.main(["--smoke"])
  out = capsys.readouterr().out
  assert "roofline device: this cpu (measured)" in out
  row = re.search(r"^tiny\s+ragged\s+dense\s+float32\s+2x32\s+" + r"\s+".join([NUMBER] * 3)
                  + r"\s+([\d.]+)%\s+([\d.]+)%\s+([\d.]+)\s+([\d.]+)%", out, re.M)
  assert row, out
  step_ms, mfu, mfu_peak, bound_ms, of_bound = (float(row.group(i)) for i in (1, 4, 5, 6, 7))
  assert step_ms > 0 and mfu > 0 and mfu_peak > 0 and bound_ms > 0
  assert abs(of_bound - 100 * bound_ms / step_ms) < 0.2


def test_decode_smoke_reports_the_hbm_bound(capsys):
  decode.main(["--smoke", "--drafts", "0"])
  out = capsys.readouterr().out
  assert re.search(r"^decode throughput, \d{4}-\d\d-\d\d, cpu", out, re.M)
  row = re.search(r"^\| tiny \| 2 \| ([\d.]+) \| ([\d.]+) \| (memory|compute) \| ([\d.]+) \|",
                  out, re.M)
  assert row, out
  rate, bound, of_bound = float(row.group(1)), float(row.group(2)), float(row.group(4))
  assert rate > 0 and bound > 0 and abs(of_bound - rate / bound) < 0.01


def test_device_kinds_map_to_datasheet_rows():
  assert accelerators.by_device_kind("NVIDIA H100 80GB HBM3").name == "H100 SXM"
  assert accelerators.by_device_kind("NVIDIA H200").name == "H200 SXM"
  assert accelerators.by_device_kind("NVIDIA B200").name == "B200"
  assert accelerators.by_device_kind("TPU v5p").name == "TPU v5p"
  assert accelerators.by_device_kind("TPU v5 lite") is None
  assert accelerators.by_device_kind("cpu") is None


def test_lm_head_smoke_compares_the_fused_losses_with_the_unfused_one(capsys):
  """c2jax's chunked losses agree with the full-logits one; tokamax's row is printed with
  its own error (its chunked XLA loss counts the padding of a vocabulary that is no
  multiple of its 2,048-column block: 1,000 here, DeepSeek-V3's 129,280 alike)."""
  lm_head.main(["--smoke"])
  out = capsys.readouterr().out
  assert re.search(r"^LM-head loss, \d{4}-\d\d-\d\d, cpu .* vocab=1000", out, re.M)
  rows = {match[0].strip(): [float(x) for x in match[1:]] for match in re.findall(
      r"^(\w[\w ]+?)\s+([\d.]+)\s+[\d.]+\s+[\d.nan]+\s+([\d.]+)x\s+([\d.e+-]+)\s+"
      r"([\d.e+-]+)\s+([\d.e+-]+)$", out, re.M)}
  assert set(rows) == {"unfused", "c2jax chunked", "c2jax token_logprobs",
                       "tokamax chunked_xla"}, out
  for name in ("c2jax chunked", "c2jax token_logprobs"):
    loss_err, dh_err, dw_err = rows[name][2:]
    assert loss_err < 1e-5 and dh_err < 1e-2 and dw_err < 1e-2, (name, rows[name])
  assert rows["tokamax chunked_xla"][2] > 1e-2  # the padded columns enter its softmax


def test_gpu_all_names_modules_and_flags_that_exist():
  script = GPU_ALL.read_text()
  subprocess.run(["bash", "-n", str(GPU_ALL)], check=True)
  lines = re.findall(r"^run \w+ \d+ -m (tools\.\S+.*(?:\\\n.*)*)", script, re.M)
  assert len(lines) >= 8, lines
  for line in lines:
    words = line.replace("\\\n", " ").split()
    path = ROOT / (words[0].replace(".", "/") + ".py")
    assert path.is_file(), path
    source = path.read_text()
    for flag in (w for w in words[1:] if w.startswith("--")):
      assert f'"{flag.split("=")[0]}"' in source or f"'{flag.split('=')[0]}'" in source, (
          path.name, flag)
  for name in ("check", "attention_4k", "grouped", "block_scaled", "train_small",
               "train_moe_8b_a1b", "decode", "decode_mtp"):
    assert re.search(rf"^run {name}\b", script, re.M), name


def test_gpu_check_passes_a_right_kernel_and_fails_a_wrong_one(monkeypatch, capsys):
  """gpu_check_kernels' grouped check against its float64 reference: the 'tiled' impl
  passes (forward, both gradients, zero rows past the sum); the same impl 2% off fails."""
  check = gpu_check_kernels
  monkeypatch.setattr(check, "failures", [])
  check.check_grouped(["tiled"], check.SMOKE_SHAPES, 0, interpret=True)
  assert check.failures == [] and capsys.readouterr().out.count("PASS") == 8
  right = check.kernels.grouped_matmul
  monkeypatch.setattr(check.kernels, "grouped_matmul",
                      lambda *args, **kwargs: right(*args, **kwargs) * 1.02)
  check.check_grouped(["tiled"], check.SMOKE_SHAPES, 0, interpret=True)
  assert {"grouped tiled ragged bfloat16 out", "grouped tiled ragged float32 out",
          "grouped tiled ragged float32 dlhs"} <= set(check.failures)


@pytest.mark.slow
def test_gpu_all_runs_its_steps_into_one_log_and_a_summary_within_the_budget(tmp_path):
  """The script itself on this CPU (SMOKE=1): a step runs under its limit into all.txt
  with a header, the summary has the device line and each step's status and seconds;
  with the budget spent, every step is skipped by name and the summary still written."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHON=sys.executable)
  for name in ("OUT", "STEPS", "BUDGET", "SMOKE", "RUNS"):
    env.pop(name, None)
  out = tmp_path / "smoke"
  ran = subprocess.run(["bash", str(GPU_ALL)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=dict(env, OUT=str(out), SMOKE="1", STEPS="check"))
  assert ran.returncode == 0, ran.stderr[-3000:]
  summary = (out / "summary.txt").read_text()
  assert re.search(r"^jax \S+ cpu ", summary, re.M), summary
  assert re.search(r"^check rc=0 \d+s: -m tools.device.gpu_check_kernels --smoke$", summary,
                   re.M), summary
  log = (out / "all.txt").read_text()
  assert re.search(r"^===== check: -m tools.device.gpu_check_kernels --smoke \(limit 300s",
                   log, re.M) and "PASS" in log, log[-3000:]
  spent = tmp_path / "spent"
  ran = subprocess.run(["bash", str(GPU_ALL)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=dict(env, OUT=str(spent), BUDGET="20",
                                             STEPS="check,grouped"))
  assert ran.returncode == 0, ran.stderr[-3000:]
  summary = (spent / "summary.txt").read_text()
  assert re.search(r"^check skipped: \d+s of the budget left$", summary, re.M), summary
  assert re.search(r"^grouped skipped: \d+s of the budget left$", summary, re.M), summary
  assert (spent / "all.txt").read_text() == ""

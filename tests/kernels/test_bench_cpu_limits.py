"""tools/bench/cpu_limits.py --smoke prints its three tables (docs/benchmarks.md,
"What limits `small` on XLA:CPU"), every row timed, and lax.ragged_dot agrees with the tile
loop it is compared against."""

import re

from tools.bench import cpu_limits


def test_cpu_limits_smoke_tables(capsys):
  cpu_limits.main(["--smoke"])
  out = capsys.readouterr().out
  assert re.search(r"^XLA:CPU limits, \d{4}-\d\d-\d\d, cpu .* ceiling [\d.]+ GFLOP/s$", out,
                   re.M)
  for m in (1, 8):  # rows: time per dot and the LM head's, both positive
    row = re.search(rf"^\s+{m} +([\d.]+) .*\| +([\d.]+) ", out, re.M)
    assert row and float(row.group(1)) > 0 and float(row.group(2)) > 0, out
  for case in ("chain of dots (baseline)", "independent dots", "chain of conds",
               "independent conds", "one concatenated dot"):
    assert re.search(rf"^{re.escape(case)} +1 +[\d.]+ +[\d.]+ +[\d.]+x$", out, re.M), case
  assert re.search(r"^chain of dots \(baseline\) +1 .* 1\.00x$", out, re.M)
  agree = float(re.search(r"ragged_dot vs gmm max rel diff ([\d.e+-]+)", out).group(1))
  assert agree < 1e-5
  for case in ("one dense dot (baseline)", "tiled gmm (x W_e)", "tiled tgmm (x_e^T dy_e)",
               "lax.ragged_dot"):
    assert re.search(rf"^{re.escape(case)} +[\d.]+ +[\d.]+x$", out, re.M), case

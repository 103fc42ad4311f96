"""tools/bench/decode_layout.py: the layouts it compares sample the same tokens (the
script asserts it) and each prints its per-step time; a peer bench model name works as
--variant."""

import re

from tools.bench import decode_layout


def test_bench_decode_layout_split_against_fused(capsys):
  decode_layout.main(["--variant", "qwen3_moe_tiny", "--batches", "2", "--steps", "2", "--rounds",
              "1", "--layouts", "layers+experts,layers+fused", "--stat", "median"])
  line = capsys.readouterr().out.strip().splitlines()[-1]
  assert line.startswith("qwen3_moe_tiny batch 2: layers+experts ")
  times = re.findall(r"(\S+) ([0-9.]+) ms/step \(([0-9.]+)x\)", line)
  assert [name for name, _, _ in times] == ["layers+experts", "layers+fused"]
  assert all(float(ms) > 0 for _, ms, _ in times) and times[0][2] == "1.00"

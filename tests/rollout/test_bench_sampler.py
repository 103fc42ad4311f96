"""tools/bench/sampler.py: the three argmax forms agree (the script asserts it) and
each prints its per-step time, alone and with the log-prob."""

from tools.bench import sampler


def test_bench_sampler_times_every_form(capsys):
  sampler.main(["--batches", "2", "--vocabs", "96", "--rounds", "1"])
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].startswith("greedy sampler, ")
  header, row = lines[1], lines[-1]
  assert header.count("us/step") == 6 and "blocks+logprob" in header
  cells = [c.strip() for c in row.strip("|").split("|")]
  assert cells[:2] == ["2", "96"] and all(float(c) > 0 for c in cells[2:])

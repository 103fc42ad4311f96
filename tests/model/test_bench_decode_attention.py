"""tools/bench/bench_decode_attention.py at tiny shapes: the one-token attention forms
agree (the bench checks before timing) and a row per shape comes out."""


def test_decode_attention_bench_rows(bench_script, capsys):
  bench = bench_script("bench_decode_attention")
  bench.main(["--shapes", "2x8x2x2x4,1x5x1x3x8", "--rounds", "1", "--calls", "1"])
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].startswith("one-token attention, cpu")
  rows = [line.split() for line in lines[2:]]
  assert [row[0] for row in rows] == ["2x8x2x2x4", "1x5x1x3x8"]
  assert all(float(value) > 0 for row in rows for value in row[1:])

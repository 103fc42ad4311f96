"""tools/bench/decode_attention.py at tiny shapes: the one-token attention forms
agree (the bench checks before timing) and a row per shape comes out."""

from tools.bench import decode_attention


def test_decode_attention_bench_rows(capsys):
  decode_attention.main(["--shapes", "2x8x2x2x4,1x5x1x3x8", "--rounds", "1", "--calls", "1"])
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].startswith("one-token attention, cpu")
  rows = [line.split() for line in lines[2:]]
  assert [row[0] for row in rows] == ["2x8x2x2x4", "1x5x1x3x8"]
  assert all(float(value) > 0 for row in rows for value in row[1:])

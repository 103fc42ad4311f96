"""c2jax.data.streams: a run's data as S streams gives the same global batches and resumes
to the same batches however many processes read them; merged states from checkpoints of
any process count, including those written before streams existed."""

import json

import numpy as np
import pytest

from c2jax.data import streams

from test_pipeline import KEYS, _chat, _pretrain

ROWS = 2  # one stream's rows per batch


def _stream_set(built, tok, count, held, make="pretrain"):
  if make == "pretrain":
    build = lambda s: _pretrain(built, tok, seed=3, batch_size=ROWS, shard_index=s,
                                shard_count=count)
  else:
    build = lambda s: _chat(tok, seed=3, batch_size=ROWS, shard_index=s, shard_count=count)
  return streams.StreamSet(build, count, held)


def _assert_same(got, want):
  for key in KEYS:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def _concat(batches):
  return {key: np.concatenate([b[key] for b in batches]) for key in KEYS}


@pytest.mark.parametrize("make", ["pretrain", "chat"])
def test_processes_read_the_rows_of_one_global_batch(built, tok, make):
  whole = iter(_stream_set(built, tok, 4, range(4), make))
  halves = [iter(_stream_set(built, tok, 4, held, make)) for held in ([0, 1], [2, 3])]
  for _ in range(3):
    batch = next(whole)
    assert batch["inputs"].shape[0] == 4 * ROWS
    _assert_same(batch, _concat([next(h) for h in halves]))


def test_one_stream_per_process_is_each_process_s_shard(built, tok):
  """The default (streams = processes) reads exactly the per-process shards of before."""
  for index in range(2):
    own = iter(_pretrain(built, tok, seed=3, batch_size=ROWS, shard_index=index,
                         shard_count=2))
    stream = iter(_stream_set(built, tok, 2, [index]))
    for _ in range(3):
      _assert_same(next(stream), next(own))


@pytest.mark.parametrize("before,after", [([[0, 1], [2, 3]], [[0, 1, 2, 3]]),
                                          ([[0, 1, 2, 3]], [[0], [1], [2], [3]]),
                                          ([[0], [1], [2], [3]], [[0, 1], [2, 3]])])
def test_a_checkpoint_of_one_process_count_resumes_on_another(built, tok, before, after):
  reference = iter(_stream_set(built, tok, 4, range(4)))
  readers = [iter(_stream_set(built, tok, 4, held)) for held in before]
  for _ in range(3):
    next(reference)
    for r in readers:
      next(r)
  # As the checkpoint stores them: every process's state, JSON round-tripped.
  saved = json.loads(json.dumps([r.get_state() for r in readers]))
  merged = streams.merge(saved)
  assert merged["count"] == 4 and sorted(merged["streams"], key=int) == ["0", "1", "2", "3"]
  resumed = [iter(_stream_set(built, tok, 4, held)) for held in after]
  for r in resumed:
    r.set_state(merged)
  for _ in range(4):
    _assert_same(_concat([next(r) for r in resumed]), next(reference))


def test_checkpoints_written_before_streams_read_as_one_stream_per_process(built, tok):
  shards = [iter(_pretrain(built, tok, seed=3, batch_size=ROWS, shard_index=i,
                           shard_count=2)) for i in range(2)]
  for s in shards:
    next(s)
  legacy = [s.get_state() for s in shards]  # a plain grain state per process
  merged = streams.merge(legacy)
  assert merged["count"] == 2
  one = iter(_stream_set(built, tok, 2, [0, 1]))
  one.set_state(merged)
  _assert_same(next(one), _concat([next(s) for s in shards]))
  # One process, one plain state: one stream.
  assert streams.merge([legacy[0]])["count"] == 1
  # RL followers save nothing; a run with no data state at all merges to None.
  assert streams.merge([{}, {}]) is None


def test_merge_and_set_state_refuse_states_that_do_not_fit(built, tok):
  a = iter(_stream_set(built, tok, 4, [0, 1])).get_state()
  with pytest.raises(ValueError, match=r"covers streams \['0', '1'\] of 4"):
    streams.merge([a])
  other = iter(_stream_set(built, tok, 2, [0, 1])).get_state()
  with pytest.raises(ValueError, match="different stream counts"):
    streams.merge([a, other])
  with pytest.raises(ValueError, match="of 2 streams; this iterator reads 4"):
    iter(_stream_set(built, tok, 4, [0])).set_state(streams.merge([other]))
  with pytest.raises(ValueError, match="each in"):
    streams.StreamSet(lambda s: None, 2, [2])


def test_held_streams_follow_the_rows_of_a_process():
  assert streams.held_streams([(0, 8)], 8, 4) == [0, 1, 2, 3]
  assert streams.held_streams([(4, 8)], 8, 4) == [2, 3]
  assert streams.held_streams([(0, 2), (6, 8)], 8, 4) == [0, 3]
  with pytest.raises(ValueError, match=r"rows \[0, 4\), which split the 8 rows"):
    streams.held_streams([(0, 4)], 8, 1)
  with pytest.raises(ValueError, match="not divisible into 3 streams"):
    streams.held_streams([(0, 8)], 8, 3)


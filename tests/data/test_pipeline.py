"""grain pipelines: batch format, shuffling, sharding, epochs and checkpoint/resume."""

import collections
import json

import numpy as np
import pytest
from absl import flags

from c2jax.data import chat, pipeline

from test_chat import CONVERSATION
from test_packing import check_row

L, B = 16, 2
KEYS = {"inputs", "targets", "positions", "segment_ids", "loss_mask"}


def _pretrain(built, tok, **kwargs):
  kwargs = {"seq_len": L, "batch_size": B, **kwargs}
  return pipeline.pretrain_dataset(built, "train", tok, **kwargs)


def _chats():
  short = [chat.canonical([{"role": "user", "content": f"q{i}"},
                           {"role": "assistant", "content": f"a{i}"}]) for i in range(6)]
  return [chat.canonical(CONVERSATION)] + short


def _chat(tok, **kwargs):
  kwargs = {"seq_len": 64, "batch_size": B, **kwargs}
  return pipeline.chat_dataset(_chats(), tok, **kwargs)


def _tokens(batches):
  """Multiset of (input, target) pairs at non-padding positions."""
  return collections.Counter(
      (int(i), int(t)) for b in batches
      for i, t in zip(b["inputs"][b["segment_ids"] > 0], b["targets"][b["segment_ids"] > 0]))


def _document_tokens(built, tok, split="train"):
  pairs = collections.Counter()
  for doc in built.file_documents(split):
    ids = [tok.bos_id] + tok.encode(doc["text"]).tolist() + [tok.eos_id]
    pairs.update(zip(ids[:-1], ids[1:]))
  return pairs


def test_batches_have_the_train_step_format(built, tok):
  batch = next(iter(_pretrain(built, tok)))
  assert set(batch) == KEYS
  for value in batch.values():
    assert value.shape == (B, L)
  for row in range(B):
    check_row({k: v[row] for k, v in batch.items()})
  assert (batch["loss_mask"] == 1).all()  # pretraining trains every real token


def test_one_epoch_sees_every_token_exactly_once(built, tok):
  batches = list(_pretrain(built, tok, num_epochs=1, seed=5))
  assert _tokens(batches) == _document_tokens(built, tok)
  for b in batches:
    for row in range(B):
      check_row({k: v[row] for k, v in b.items()})


def test_epochs_are_reshuffled(built, tok):
  batches = list(_pretrain(built, tok, num_epochs=2, seed=5))
  want = _document_tokens(built, tok)
  assert _tokens(batches) == want + want
  half = len(batches) // 2
  first = np.concatenate([b["inputs"] for b in batches[:half]])
  second = np.concatenate([b["inputs"] for b in batches[half:2 * half]])
  assert not np.array_equal(first, second)


def test_seed_controls_the_order(built, tok):
  def first_batches(seed):
    it = iter(_pretrain(built, tok, seed=seed))
    return np.stack([next(it)["inputs"] for _ in range(4)])
  np.testing.assert_array_equal(first_batches(1), first_batches(1))
  assert not np.array_equal(first_batches(1), first_batches(2))


def test_shards_partition_the_data(built, tok):
  shards = [list(_pretrain(built, tok, num_epochs=1, shard_index=i, shard_count=2))
            for i in range(2)]
  assert _tokens(shards[0]) + _tokens(shards[1]) == _document_tokens(built, tok)
  assert _tokens(shards[0]) and _tokens(shards[1])
  with pytest.raises(ValueError, match="shard_index 2"):
    _pretrain(built, tok, shard_index=2, shard_count=2)


@pytest.mark.parametrize("make", ["pretrain", "chat"])
@pytest.mark.parametrize("stop", [1, 4])
def test_resume_from_saved_state_continues_exactly(built, tok, make, stop):
  build = (lambda: _pretrain(built, tok, seed=7)) if make == "pretrain" else (
      lambda: _chat(tok, seed=7))
  reference = iter(build())
  for _ in range(stop):
    next(reference)
  state = json.loads(json.dumps(reference.get_state()))  # as a checkpoint stores it
  expected = [next(reference) for _ in range(6)]
  resumed = iter(build())
  resumed.set_state(state)
  for want in expected:
    got = next(resumed)
    for key in KEYS:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_resume_mid_epoch_neither_skips_nor_repeats(built, tok):
  first = iter(_pretrain(built, tok, num_epochs=1, seed=9))
  seen = [next(first) for _ in range(3)]
  resumed = iter(_pretrain(built, tok, num_epochs=1, seed=9))
  resumed.set_state(first.get_state())
  assert _tokens(seen + list(resumed)) == _document_tokens(built, tok)


def test_repository_granularity_is_one_document_per_repository(built, tok):
  batches = list(pipeline.pretrain_dataset(built, "heldout", tok, seq_len=4096,
                                           batch_size=1, shuffle=False, num_epochs=1,
                                           granularity="repository"))
  assert len(batches) == 1 and batches[0]["segment_ids"].max() == 1
  (doc,) = list(built.repository_documents("heldout"))
  n = int((batches[0]["segment_ids"] > 0).sum())
  assert tok.decode(batches[0]["inputs"][0, :n]) == "<|bos|>" + doc["text"]


def test_chat_batches_train_only_on_assistant_tokens(tok):
  rendered = chat.render(tok, _chats()[0])
  want = rendered.ids[1:][rendered.loss_mask[1:] == 1]
  batches = list(_chat(tok, shuffle=False, num_epochs=1, seq_len=len(rendered.ids)))
  row = {k: v[0] for k, v in batches[0].items()}
  check_row(row)
  first = row["segment_ids"] == 1
  np.testing.assert_array_equal(row["targets"][first][row["loss_mask"][first] == 1], want)
  total = sum(int(b["loss_mask"].sum()) for b in batches)
  assert total == sum(int(chat.render(tok, c).loss_mask[1:].sum()) for c in _chats())


def test_chat_dataset_reads_jsonl(tok, tmp_path):
  path = tmp_path / "traces.jsonl"
  path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in _chats()))
  from_file = list(pipeline.chat_dataset(path, tok, seq_len=64, batch_size=B, num_epochs=1))
  from_list = list(_chat(tok, num_epochs=1))
  assert _tokens(from_file) == _tokens(from_list)


@pytest.fixture
def parsed_flags():
  """grain's worker processes read absl flags, which `c2jax` parses in app.run."""
  if flags.FLAGS.is_parsed():
    yield
    return
  flags.FLAGS.mark_as_parsed()
  yield
  flags.FLAGS.unparse_flags()


@pytest.mark.slow
def test_worker_processes_give_the_same_batches_and_resume(built, tok, parsed_flags):
  in_process = iter(_pretrain(built, tok, seed=4))
  expected = [next(in_process) for _ in range(4)]
  with_worker = iter(_pretrain(built, tok, seed=4, worker_count=1))
  first = next(with_worker)
  state = with_worker.get_state()
  with_worker.close()
  resumed = iter(_pretrain(built, tok, seed=4, worker_count=1))
  resumed.set_state(state)
  got = [first] + [next(resumed) for _ in range(3)]
  resumed.close()
  for want, have in zip(expected, got):
    for key in KEYS:
      np.testing.assert_array_equal(have[key], want[key], err_msg=key)

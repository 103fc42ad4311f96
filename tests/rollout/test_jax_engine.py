"""JaxEngine against teacher-forced forward passes of the same model.

Greedy tokens are the argmax of the full-sequence forward, reported log-probs its
log-softmax and recorded experts its routing, for sequences that share slots, queue for
them and finish at different steps.
"""

import json

import jax
import numpy as np
import pytest

from c2jax import model
from c2jax.rollout import JaxEngine, Request, SamplingParams
from tests.rollout.conftest import MAX_LENGTH, VOCAB, detokenize

TOL = 1e-4
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def prompts():
  rng = np.random.default_rng(0)
  # 20 tokens > the single 16-token bucket: chunked prefill.
  return [rng.integers(0, VOCAB, n).astype(np.int32) for n in (3, 20, 7)]


def check_against_teacher(setup, params, prompt, generation):
  full = np.concatenate([prompt, generation.tokens])
  logp, routing = setup.teacher(params, full)
  n = len(prompt)
  np.testing.assert_array_equal(generation.tokens, logp[n - 1:-1].argmax(-1))
  picked = logp[np.arange(n - 1, len(full) - 1), full[n:]]
  np.testing.assert_allclose(generation.logprobs, picked, atol=TOL)
  # Routing of the tokens this generation fed (its appended tokens, then its own).
  fed = routing[len(full) - len(generation.expert_indices):]
  np.testing.assert_array_equal(np.sort(generation.expert_indices, -1), np.sort(fed, -1))


@pytest.fixture(scope="module")
def greedy_runs(engine):
  requests = [Request(p, GREEDY) for p in prompts()]
  return requests, engine.generate(requests)


def test_greedy_matches_teacher_forcing(setup, greedy_runs):
  requests, generations = greedy_runs
  assert [g.finish_reason for g in generations] == ["max_tokens"] * 3
  for request, generation in zip(requests, generations):
    np.testing.assert_array_equal(generation.prompt_tokens, request.tokens)
    assert len(generation.tokens) == GREEDY.max_tokens
    assert generation.expert_indices.shape == (len(request.tokens) + 8, 1, 2)
    np.testing.assert_array_equal(generation.versions, 0)
    check_against_teacher(setup, setup.params, request.tokens, generation)


def test_slots_join_and_leave_independently(engine, greedy_runs):
  """Three requests on two slots: the third joins when one leaves; the rows' results do
  not depend on their neighbours."""
  requests, expected = greedy_runs
  short = Request(requests[0].tokens, SamplingParams(temperature=0.0, max_tokens=2))
  ids = [engine.submit(r) for r in (short, requests[1], requests[2])]
  finished, steps = {}, 0
  while len(finished) < 3:
    steps += 1
    for g in engine.step():
      finished[g.seq_id] = (steps, g)
  # The short one leaves first; the queued third then runs beside the long second.
  assert finished[ids[0]][0] < finished[ids[1]][0] < finished[ids[2]][0]
  np.testing.assert_array_equal(finished[ids[0]][1].tokens, expected[0].tokens[:2])
  for i in (1, 2):
    np.testing.assert_array_equal(finished[ids[i]][1].tokens, expected[i].tokens)


def test_sampling_logprobs_and_per_sequence_seeds(setup, engine):
  prompt = prompts()[0]
  sampling = SamplingParams(temperature=1.0, max_tokens=10, seed=7)
  alone = engine.generate([Request(prompt, sampling)])[0]
  other = Request(prompts()[2], SamplingParams(temperature=1.0, max_tokens=5, seed=1))
  beside = engine.generate([other, Request(prompt, sampling)])[1]
  np.testing.assert_array_equal(alone.tokens, beside.tokens)
  full = np.concatenate([prompt, alone.tokens])
  logp, _ = setup.teacher(setup.params, full)
  np.testing.assert_allclose(alone.logprobs,
                             logp[np.arange(len(prompt) - 1, len(full) - 1), alone.tokens],
                             atol=TOL)
  reseeded = engine.generate([Request(prompt, SamplingParams(temperature=1.0, max_tokens=10,
                                                             seed=8))])[0]
  assert not np.array_equal(reseeded.tokens, alone.tokens)
  # A sampled (not argmax) sequence: temperature 1 really samples.
  assert not np.array_equal(alone.tokens, logp[len(prompt) - 1:-1].argmax(-1))


def test_requests_admitted_together_prefill_in_one_call(setup, engine):
  """Four requests on four free slots (two greedy, two sampled, one an extension of a live
  sequence) prefill in one batched call, and every result is what the request gets alone:
  tokens, log-probs (against the teacher too) and the routing of its prompt."""
  grouped = JaxEngine(setup.cfg, setup.params, num_slots=4, max_length=MAX_LENGTH,
                      prefill_buckets=(8, 16), max_decode_steps=8)
  calls = []
  prefill_rows = grouped._prefill_rows_fn
  grouped._prefill_rows_fn = lambda *args: calls.append(args[2].shape) or prefill_rows(*args)
  rng = np.random.default_rng(3)
  live = grouped.generate([Request(prompts()[0], GREEDY, keep_alive=True)])[0]
  assert calls == []  # one request alone takes the one-slot prefill
  observation = rng.integers(0, VOCAB, 5).astype(np.int32)
  requests = [Request(rng.integers(0, VOCAB, n).astype(np.int32), sampling)
              for n, sampling in ((11, GREEDY), (4, SamplingParams(temperature=1.0, max_tokens=6, seed=3)),
                                  (16, SamplingParams(temperature=0.8, top_k=5, max_tokens=6,
                                                          seed=4)))]
  requests.insert(1, Request(observation, GREEDY, seq_id=live.seq_id))
  together = grouped.generate(requests)
  assert calls == [(4,)]  # four slots' rows in one call
  alone = [engine.generate([r])[0] for r in requests[:1] + requests[2:]]
  first = engine.generate([Request(prompts()[0], GREEDY, keep_alive=True)])[0]
  alone.insert(1, engine.extend(first.seq_id, observation, GREEDY, keep_alive=False))
  for request, a, b in zip(requests, together, alone):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=TOL)
    np.testing.assert_array_equal(a.expert_indices, b.expert_indices)
  check_against_teacher(setup, setup.params, requests[0].tokens, together[0])
  history = np.concatenate([prompts()[0], live.tokens, observation])
  check_against_teacher(setup, setup.params, history, together[1])


def test_stop_tokens_strings_max_tokens_and_length(engine, greedy_runs):
  requests, expected = greedy_runs
  prompt, reference = requests[1].tokens, expected[1].tokens
  stop_at = next(i for i in range(1, 8) if reference[i] not in reference[:i])
  by_token = engine.generate([Request(prompt, SamplingParams(
      temperature=0.0, stop_tokens=(int(reference[stop_at]),)))])[0]
  assert by_token.finish_reason == "stop_token"
  np.testing.assert_array_equal(by_token.tokens, reference[:stop_at + 1])
  assert len(by_token.expert_indices) == len(prompt) + stop_at + 1

  text = detokenize(reference)
  needle = text[stop_at - 1:stop_at + 1]
  first = text.find(needle)
  by_string = engine.generate([Request(prompt, SamplingParams(
      temperature=0.0, stop_strings=(needle,)))])[0]
  assert by_string.finish_reason == "stop_string"
  np.testing.assert_array_equal(by_string.tokens, reference[:first + 2])

  long_prompt = np.resize(prompt, MAX_LENGTH - 3)
  by_length = engine.generate([Request(long_prompt, SamplingParams(temperature=0.0))])[0]
  assert by_length.finish_reason == "length"
  assert len(long_prompt) + len(by_length.tokens) == MAX_LENGTH
  with pytest.raises(ValueError, match="max_length"):
    engine.submit(Request(np.resize(prompt, MAX_LENGTH), GREEDY))
  with pytest.raises(ValueError, match="detokenize"):
    type(engine).submit(_no_detokenizer(engine), Request(prompt, SamplingParams(
        stop_strings=("x",))))


def _no_detokenizer(engine):
  clone = object.__new__(type(engine))
  clone.__dict__.update(engine.__dict__, _detokenize=None)
  return clone


def test_extend_appends_without_recomputing(setup, engine):
  prompt, observation = prompts()[0], np.array([3, 1, 4, 1, 5], np.int32)
  first = engine.generate([Request(prompt, GREEDY, keep_alive=True)])[0]
  second = engine.extend(first.seq_id, observation, GREEDY)
  np.testing.assert_array_equal(second.prompt_tokens, observation)
  assert second.expert_indices.shape[0] == len(observation) + len(second.tokens)
  history = np.concatenate([prompt, first.tokens])
  check_against_teacher(setup, setup.params, np.concatenate([history, observation]), second)
  engine.release(first.seq_id)
  with pytest.raises(ValueError, match="Cannot extend"):
    engine.extend(first.seq_id, observation)


def test_update_params_between_decode_steps(setup, engine):
  """Only the LM head changes, so the old KV cache is also the new weights' cache and the
  tokens after the swap must be exactly the new model's argmax. Weights swap between
  decode calls, each of which samples max_decode_steps tokens per sequence (no stop
  strings): the longest a staged swap waits."""
  new_params = dict(setup.params)
  rng = np.random.default_rng(5)
  new_params["lm_head"] = {"kernel": rng.standard_normal(
      setup.params["lm_head"]["kernel"].shape).astype(np.float32)}
  prompt = prompts()[2]
  # The prefill and three decode calls: version 0.
  swapped = 1 + 3 * engine.max_decode_steps
  total = swapped + 6
  seq_id = engine.submit(Request(prompt, SamplingParams(temperature=0.0, max_tokens=total)))
  for _ in range(3):
    assert not engine.step()
  engine.update_params(new_params, version=1)
  generation = None
  while generation is None:
    generation = next((g for g in engine.step() if g.seq_id == seq_id), None)
  engine.update_params(setup.params, version=0)
  engine.step()
  np.testing.assert_array_equal(generation.versions, [0] * swapped + [1] * (total - swapped))
  full = np.concatenate([prompt, generation.tokens])
  old_logp, _ = setup.teacher(setup.params, full)
  new_logp, _ = setup.teacher(new_params, full)
  n = len(prompt)
  np.testing.assert_array_equal(generation.tokens[:swapped],
                                old_logp[n - 1:n - 1 + swapped].argmax(-1))
  np.testing.assert_array_equal(generation.tokens[swapped:],
                                new_logp[n - 1 + swapped:-1].argmax(-1))
  assert not np.array_equal(old_logp[n - 1 + swapped:-1].argmax(-1),
                            new_logp[n - 1 + swapped:-1].argmax(-1))
  with pytest.raises(ValueError, match="structure, shapes"):
    engine._set_params({"embed": setup.params["embed"]})


def test_engine_keeps_decode_layout_and_gives_the_stacked_template(setup, engine):
  """Off a mesh the engine holds per-layer (and per-expert) arrays, and a per-layer KV
  cache; loaders still see model.init's stacked tree."""
  assert model.has_unstacked_layers(engine._params)
  assert model.has_unstacked_layers(engine._cache)
  assert jax.tree.leaves(engine._cache)[0].shape[:2] == (engine.num_slots, engine.max_length)
  like = engine.param_like()
  assert jax.tree.structure(like) == jax.tree.structure(setup.params)
  jax.tree.map(lambda l, p: l.shape == np.shape(p) or pytest.fail(f"{l.shape} {np.shape(p)}"),
               like, setup.params)
  jax.tree.map(np.testing.assert_array_equal, model.stack_layers(engine._params),
               setup.params)


def test_decode_layout_only_where_it_pays():
  """The layout pays once a step's token copies reach half a MoE layer's experts (small:
  16 experts, 2 per token: from 4 slots; speculation's draft tokens count as tokens), and
  always for a model without MoE layers."""
  from c2jax.model import variants
  from c2jax.rollout.cpu_decode import decode_layout_pays
  small = variants.get("small")
  assert [decode_layout_pays(small, s) for s in (1, 2, 3, 4, 8, 32)] == [
      False, False, False, True, True, True]
  assert decode_layout_pays(small, 2 * (1 + 1))  # 2 slots, 1 draft token each
  dense_only = variants.get("small", first_k_dense=8)  # every weight is copied per step
  assert all(decode_layout_pays(dense_only, s) for s in (1, 8, 32))


def test_small_experts_fused_in_the_engine(setup, engine):
  """cpu_decode.fused_experts_pay: a MoE layer's experts up to FUSED_EXPERTS_MAX_BYTES
  (tiny: 8 x 3 x 64 x 32 float32, 196 KB) are fused, and the layout then pays at every
  batch; `small`'s (16 x 3 x 512 x 256, 25 MB), quantised and dense models are not. The
  engine stores the tiny model's experts fused (its decode matches the teacher in the
  tests above) and stack_layers gives the stacked tree's shapes back."""
  from c2jax.model import moe_dispatch, variants
  from c2jax.rollout import cpu_decode
  tiny = variants.get("tiny")
  assert cpu_decode.fused_experts_pay(tiny)
  assert all(cpu_decode.decode_layout_pays(tiny, s) for s in (1, 2, 8))
  assert not cpu_decode.fused_experts_pay(variants.get("small"))
  assert not cpu_decode.fused_experts_pay(variants.get("tiny", quant="mxfp8"))
  assert not cpu_decode.fused_experts_pay(variants.get("tiny", first_k_dense=2))
  experts = engine._params["moe_layers"]["0"]["moe"]["experts"]
  assert moe_dispatch.FUSED_GATE_UP in experts and "gate_proj" not in experts
  # (the session engine's weights may have been swapped by earlier tests: compare shapes)
  assert (jax.tree.map(np.shape, model.stack_layers(engine._params))
          == jax.tree.map(np.shape, setup.params))


def test_fastest_keeps_the_kernel_unless_another_form_clearly_wins():
  from c2jax.rollout.cpu_decode import PANELS, TRANSPOSED, measure
  assert measure.fastest({"1": 1.0, "transposed": 0.98}) == 1  # within MIN_GAIN
  assert measure.fastest({"1": 1.0, "transposed": 0.9, "64": 0.95}) == TRANSPOSED
  assert measure.fastest({"1": 1.0, "transposed": 0.99, "64": 0.5}) == 64
  assert measure.candidate_forms(16384) == (1, TRANSPOSED, 64)
  assert measure.candidate_forms(512) == (1, TRANSPOSED)
  assert measure.candidate_forms(512, panels=True) == (1, TRANSPOSED, PANELS)
  assert measure.fastest({"1": 1.0, "transposed": 0.99, "panels": 0.6}) == PANELS


def test_projection_layout_is_measured_once_per_machine_and_shape(setup, tmp_path):
  """Nothing when the weights fit in the last-level cache; otherwise every distinct kernel
  shape is timed in each candidate form at the step's rows, the fastest kept, and the
  timings written per machine, so a second engine reads them instead of measuring; a
  corrupt file is set aside and measured again."""
  from c2jax.rollout.cpu_decode import measure
  from c2jax_kernels import cpu_matmul
  assert measure.projection_layout(setup.cfg, setup.params, 2, cache_bytes=1 << 40) is None
  path = tmp_path / "layout.json"
  timings = measure.ProductTimings(str(path))
  layout = measure.projection_layout(setup.cfg, setup.params, 2, cache_bytes=0,
                                     timings=timings)
  shapes, divisible = set(layout.chosen), measure.kernel_shapes(setup.params)
  assert shapes == set(divisible) and not divisible[64, VOCAB] and divisible[192, 64]
  assert (64, VOCAB) in shapes and timings.measured == len(shapes) >= 3
  [(machine, table)] = json.loads(path.read_text()).items()
  assert machine == measure.machine_key() and f"{2}x64x{VOCAB}:" in " ".join(table)
  for (inputs, outputs), form in layout.chosen.items():
    [seconds] = [v for k, v in table.items() if k.startswith(f"2x{inputs}x{outputs}:")]
    panels = cpu_matmul.available() and divisible[inputs, outputs]
    assert sorted(seconds) == sorted(str(f) for f in measure.candidate_forms(outputs, panels))
    assert all(t > 0 for t in seconds.values()) and form == measure.fastest(seconds)
    assert layout("any_proj", inputs, outputs) == form
  again = measure.ProductTimings(str(path))
  assert measure.projection_layout(setup.cfg, setup.params, 2, cache_bytes=0,
                                   timings=again).chosen == layout.chosen
  assert again.measured == 0
  path.write_text("{not json")
  fresh = measure.ProductTimings(str(path))
  measure.projection_layout(setup.cfg, setup.params, 2, cache_bytes=0, timings=fresh)
  assert fresh.measured == len(shapes) and (tmp_path / "layout.json.corrupt").exists()
  assert json.loads(path.read_text())[machine].keys() == table.keys()
  unwritable = measure.ProductTimings(str(path / "under_a_file.json"))  # kept in memory
  assert measure.projection_layout(setup.cfg, setup.params, 2, cache_bytes=0,
                                   timings=unwritable).chosen.keys() == shapes
  assert unwritable.measured == len(shapes) and unwritable.table().keys() == table.keys()
  assert measure.last_level_cache_bytes() > 0


def test_engine_with_projection_layouts_matches_teacher(setup, monkeypatch, tmp_path):
  """With the weights taken as streaming from memory (a last-level cache of 0 bytes) the
  engine stores each projection in the form measured fastest (here forced: in panels for
  c2jax_kernels.cpu_matmul where it built and the kernel allows, else transposed;
  test_cpu_decode_forms decodes every form) and still decodes the teacher's greedy tokens and
  log-probs; param_like and stack_layers are unchanged."""
  from c2jax.rollout.cpu_decode import PANELS, TRANSPOSED, measure
  from c2jax_kernels import cpu_matmul
  monkeypatch.setattr(measure, "last_level_cache_bytes", lambda: 0)
  monkeypatch.setenv(measure.CACHE_ENV, str(tmp_path / "layout.json"))
  monkeypatch.setattr(measure, "fastest", lambda seconds: PANELS
                      if PANELS in seconds else TRANSPOSED)
  engine = JaxEngine(setup.cfg, setup.params, num_slots=2, max_length=MAX_LENGTH,
                     prefill_buckets=(16,), detokenize=detokenize, max_decode_steps=8)
  down = engine._params["dense_layers"]["0"]["mlp"]["down_proj"]  # [192, 64]
  panels = cpu_matmul.available()
  assert ("kernel_p" if panels else "kernel_t") in down
  assert "kernel_t" in engine._params["lm_head"]  # [64, 16]: too narrow for a panel
  assert engine.projection_forms[192, 64] == (PANELS if panels else TRANSPOSED)
  assert engine.projection_forms[64, VOCAB] == TRANSPOSED
  jax.tree.map(np.testing.assert_array_equal, model.stack_layers(engine._params),
               setup.params)
  requests = [Request(p, GREEDY) for p in prompts()]
  for prompt, generation in zip(prompts(), engine.generate(requests)):
    check_against_teacher(setup, setup.params, prompt, generation)


def test_blockwise_prefill_matches_teacher(setup, monkeypatch):
  """Prefill chunks and scoring in 8-token tiles (prefill_block; the default tile, 128 on
  CPU, exceeds these 48-slot caches, which then score densely): the 20-token prompt's two
  chunks attend to the cache blockwise, the tiles past each chunk's positions skipped, and
  the engine still gives the teacher's greedy tokens, log-probs and routing."""
  from c2jax.model import attention_forms
  kernels, attend_cache = [], attention_forms.attend_cache

  def spy(*args, **kwargs):  # the cached prefill's kernel, recorded as each chunk traces
    kernels.append(args[5])
    return attend_cache(*args, **kwargs)
  monkeypatch.setattr(attention_forms, "attend_cache", spy)
  engine = setup.engine(max_decode_steps=8, prefill_block=8)
  assert (engine._long_cfg.attention_impl, engine._long_cfg.attention_block) == ("auto", 8)
  assert setup.cfg.attention_impl == "dense"  # the training forwards' setting, untouched
  requests = [Request(p, GREEDY) for p in prompts()]
  for prompt, generation in zip(prompts(), engine.generate(requests)):
    check_against_teacher(setup, setup.params, prompt, generation)
  assert kernels and set(kernels) == {"blockwise"}
  tokens = np.concatenate([prompts()[1], prompts()[0]])
  logp, _ = setup.teacher(setup.params, tokens)
  [scored] = engine.logprobs([tokens])
  np.testing.assert_allclose(scored, logp[np.arange(len(tokens) - 1), tokens[1:]], atol=TOL)


def test_prefill_config_names_what_is_wrong(setup):
  from c2jax.rollout import prefill
  kept = prefill.prefill_config(setup.cfg, None)
  assert (kept.attention_impl, kept.attention_block) == ("dense", prefill.CPU_BLOCK)
  assert prefill.prefill_config(setup.cfg, "blockwise", 64).attention_block == 64
  with pytest.raises(ValueError, match="prefill_attention = 'flash'; choose one of"):
    prefill.prefill_config(setup.cfg, "flash")
  with pytest.raises(ValueError, match="prefill_block = 0"):
    prefill.prefill_config(setup.cfg, "auto", 0)


def test_logprobs_scores_sequences(setup, engine):
  tokens = np.concatenate([prompts()[2], prompts()[0]])
  logp, _ = setup.teacher(setup.params, tokens)
  [scored] = engine.logprobs([tokens])
  np.testing.assert_allclose(scored, logp[np.arange(len(tokens) - 1), tokens[1:]], atol=TOL)


def test_top_logprobs_agree_with_what_was_sampled(engine):
  prompt = np.int32([3, 1, 4, 1, 5])
  for temperature in (0.0, 0.7):
    [generation] = engine.generate([Request(prompt, SamplingParams(
        temperature=temperature, max_tokens=5, seed=2))])
    ids, values = engine.top_logprobs(np.concatenate([prompt, generation.tokens]), 4,
                                      temperature)
    assert ids.shape == values.shape == (len(prompt) + 5, 4)
    assert (np.diff(values, axis=1) <= 0).all()
    rows = slice(len(prompt) - 1, len(prompt) + 4)  # positions that sampled the tokens
    for row_ids, row_values, token, logprob in zip(ids[rows], values[rows],
                                                   generation.tokens, generation.logprobs):
      if temperature == 0:
        assert row_ids[0] == token
      if token in row_ids:
        np.testing.assert_allclose(row_values[list(row_ids).index(token)], logprob,
                                   atol=1e-4)
  with pytest.raises(ValueError, match="top_logprobs k"):
    engine.top_logprobs(prompt, 0)

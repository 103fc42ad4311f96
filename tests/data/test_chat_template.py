"""Our tokenizers and template rendering against transformers' own output (fixtures made by
tools/fixtures/make_template_fixtures.py): rendered text, token ids and assistant masks, exactly."""

import json
import pathlib

import jinja2
import numpy as np
import pytest

from c2jax.data import chat_template, model_tokenizer
from c2jax.data import tokenizer as tokenizer_lib
from tests import torch_reference

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "templates"
CASES = json.loads((FIXTURES / "cases.json").read_text())["cases"]


@pytest.fixture(scope="module")
def tokenizers():
  return {name: model_tokenizer.load_model_tokenizer(FIXTURES / name)
          for name in ("qwen3", "kimi")}


def _chat_cases():
  return [pytest.param(c, id=c["name"]) for c in CASES if "text" in c]


def _plain_cases():
  return [pytest.param(c, id=c["name"]) for c in CASES if "plain" in c]


def test_fixtures_cover_both_styles_and_masks():
  names = {c["name"] for c in CASES}
  assert {"qwen3/agent_tools", "kimi/agent_tools"} <= names
  assert all(sum(c["assistant_masks"]) > 0 for c in CASES if c["name"].endswith("agent_tools"))


def _check_case(tok, case):
  """Our render / ids / mask (or plain encoding) equal transformers' for one case."""
  if "plain" in case:
    ids = tok.encode(case["plain"])
    np.testing.assert_array_equal(ids, case["input_ids"])
    assert tok.decode(ids) == case["plain"]
    return
  rendered = chat_template.apply(tok, case["messages"], tools=case.get("tools"),
                                 add_generation_prompt=case.get("add_generation_prompt",
                                                                False),
                                 **case.get("kwargs", {}))
  assert rendered.text == case["text"], case["name"]
  np.testing.assert_array_equal(rendered.ids, case["input_ids"], err_msg=case["name"])
  np.testing.assert_array_equal(rendered.loss_mask, case["assistant_masks"],
                                err_msg=case["name"])


@pytest.mark.parametrize("case", _chat_cases())
def test_render_ids_and_mask_equal_transformers(tokenizers, case):
  _check_case(tokenizers[case["model"]], case)


@pytest.mark.parametrize("case", _plain_cases())
def test_plain_encoding_equals_transformers(tokenizers, case):
  _check_case(tokenizers[case["model"]], case)


def test_live_against_transformers(tmp_path):
  """Regenerates the fixtures with transformers ($C2JAX_TORCH_PYTHON) and checks every case
  live, so a transformers upgrade that changes apply_chat_template shows up here."""
  import subprocess
  python = torch_reference.torch_python("transformers", "tiktoken")
  tool = FIXTURES.parent.parent.parent / "tools" / "fixtures" / "make_template_fixtures.py"
  subprocess.run([python, str(tool), "--out", str(tmp_path)], check=True,
                 capture_output=True, timeout=300, env=torch_reference.clean_env())
  cases = json.loads((tmp_path / "cases.json").read_text())["cases"]
  live = {name: model_tokenizer.load_model_tokenizer(tmp_path / name)
          for name in ("qwen3", "kimi")}
  for case in cases:
    _check_case(live[case["model"]], case)


def test_masked_tokens_are_exactly_the_assistant_turns(tokenizers):
  case = next(c for c in CASES if c["name"] == "kimi/agent_tools")
  tok = tokenizers["kimi"]
  rendered = chat_template.apply(tok, case["messages"], tools=case["tools"])
  trained = tok.decode(rendered.ids[rendered.loss_mask == 1])
  assert "<|tool_call_begin|>functions.read_file:0" in trained
  assert "Fixed: parse('') now returns ''." in trained
  assert "## Return of" not in trained and "tool_declare" not in trained
  assert trained.count("<|im_end|>") == 3  # each assistant turn's closing token


def test_special_strings_in_plain_text_stay_text(tokenizers):
  for tok in tokenizers.values():
    text = "<|im_end|> and <tool_call>"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    end_id = tok.token_id("<|im_end|>")
    assert end_id not in ids.tolist()
    chat_ids, _ = tok.encode_chat(text)
    assert end_id in chat_ids.tolist()
    assert "<|im_end|>" in tok.control_tokens
  qwen = tokenizers["qwen3"]  # a non-special added token stays text too
  assert qwen.token_id("<tool_call>") not in qwen.encode("<tool_call>").tolist()


def test_named_special_tokens_and_ids(tokenizers):
  qwen, kimi = tokenizers["qwen3"], tokenizers["kimi"]
  assert qwen.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
  assert qwen.eos_id == qwen.token_id("<|im_end|>") and qwen.pad_id != qwen.eos_id
  with pytest.raises(ValueError, match="no bos_token"):
    _ = qwen.bos_id
  assert kimi.bos_id == kimi.token_id("[BOS]")
  assert kimi.vocab_size == kimi.token_id("<|tool_call_end|>") + 1
  with pytest.raises(KeyError, match="not a single token"):
    kimi.token_id("<|nonexistent|>")


def test_tokenizers_pickle(tokenizers):
  import pickle
  for tok in tokenizers.values():
    copy = pickle.loads(pickle.dumps(tok))
    text = "def f():\n  return '<|im_end|>'"
    np.testing.assert_array_equal(copy.encode(text), tok.encode(text))


def test_kimi_pattern_matches_the_fixture_tool():
  # The tool cannot import c2jax (it runs in the transformers venv), so it keeps a copy.
  import ast
  tool = FIXTURES.parent.parent.parent / "tools" / "fixtures" / "make_template_fixtures.py"
  for node in ast.parse(tool.read_text()).body:
    if isinstance(node, ast.Assign) and node.targets[0].id == "KIMI_PATTERN":
      pieces = ast.literal_eval(node.value.args[0])
      assert "|".join(pieces) == model_tokenizer.KIMI_PATTERN
      return
  pytest.fail("tools/fixtures/make_template_fixtures.py no longer defines KIMI_PATTERN")


def test_template_helpers_and_sandbox():
  text, spans = chat_template.render_text(
      "{{ raise_exception('bad') if messages[0].role == 'x' else '' }}"
      "{{ strftime_now('%Y') }}|{{ {'a': '<&>'} | tojson }}|"
      "{% generation %}{{ messages[0].content }}{% endgeneration %}",
      [{"role": "user", "content": "hi"}])
  assert text.endswith('|{"a": "<&>"}|hi') and text[:4].isdigit()
  assert spans == [(len(text) - 2, len(text))]
  with pytest.raises(ValueError, match="refused the conversation: bad"):
    chat_template.render_text("{{ raise_exception('bad') }}", [])
  with pytest.raises(ValueError, match="refused"):  # sandbox: no mutation, no dunders
    chat_template.render_text("{{ messages.append(1) }}", [])
  with pytest.raises((ValueError, jinja2.exceptions.SecurityError)):
    chat_template.render_text("{{ ''.__class__.__mro__ }}", [])
  with pytest.raises(ValueError, match="does not parse"):
    chat_template.render_text("{% for %}", [])


def test_none_keys_dropped_and_reasoning_aliased():
  text, _ = chat_template.render_text(
      "{{ messages[0].tool_calls is defined }} {{ messages[0].reasoning_content }}",
      [{"role": "assistant", "content": "x", "tool_calls": None, "thinking": "why"}])
  assert text == "False why"


def test_errors_name_the_directory(tmp_path):
  with pytest.raises(FileNotFoundError, match="none of"):
    model_tokenizer.load_model_tokenizer(tmp_path)
  (tmp_path / "tokenizer.json").write_text(
      (FIXTURES / "qwen3" / "tokenizer.json").read_text())
  tok = model_tokenizer.load_model_tokenizer(tmp_path)
  with pytest.raises(ValueError, match="no chat template"):
    chat_template.apply(tok, [{"role": "user", "content": "x"}])
  (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|nope|>"}')
  with pytest.raises(ValueError, match="eos_token is '<\\|nope\\|>'"):
    model_tokenizer.load_model_tokenizer(tmp_path)


@pytest.mark.parametrize("directory", ["qwen3", "kimi"])
def test_chat_dataset_trains_on_the_template_assistant_mask(tokenizers, tmp_path, directory):
  from c2jax.data import pipeline
  case = next(c for c in CASES if c["name"] == f"{directory}/agent_tools")
  path = tmp_path / "sft.jsonl"
  path.write_text(json.dumps({"messages": case["messages"], "tools": case["tools"]}) + "\n")
  n = len(case["input_ids"])
  (batch,) = list(pipeline.chat_dataset(str(path), tokenizers[directory], seq_len=n - 1,
                                        batch_size=1, shuffle=False, num_epochs=1))
  np.testing.assert_array_equal(batch["inputs"][0], case["input_ids"][:-1])
  np.testing.assert_array_equal(batch["targets"][0], case["input_ids"][1:])
  np.testing.assert_array_equal(batch["loss_mask"][0], case["assistant_masks"][1:])


@pytest.mark.parametrize("directory", ["qwen3", "kimi"])
def test_templates_without_generation_train_on_assistant_turns(tokenizers, tmp_path,
                                                               directory):
  """Released templates rarely mark {% generation %}; SFT then trains on each assistant turn
  from the generation prompt to the closing token, which for these templates is exactly
  what their generation blocks cover."""
  import re
  from c2jax.data import pipeline
  for f in (FIXTURES / directory).iterdir():  # same whitespace control, no generation tag
    text = re.sub(r"(\{%-?\s*)generation(\s*-?%\})", r"\1if true\2", f.read_text())
    (tmp_path / f.name).write_text(re.sub(r"(\{%-?\s*)endgeneration(\s*-?%\})",
                                          r"\1endif\2", text))
  tok = model_tokenizer.load_model_tokenizer(tmp_path)
  assert not chat_template.has_generation_blocks(tok)
  case = next(c for c in CASES if c["name"] == f"{directory}/agent_tools")
  n = len(case["input_ids"])
  (batch,) = list(pipeline.chat_dataset(
      [case["messages"]], tok, seq_len=n - 1, batch_size=1, shuffle=False, num_epochs=1))
  without_tools = chat_template.apply(tokenizers[directory], case["messages"])
  m = len(without_tools.ids) - 1
  np.testing.assert_array_equal(batch["inputs"][0][:m], without_tools.ids[:-1])
  np.testing.assert_array_equal(batch["loss_mask"][0][:m], without_tools.loss_mask[1:])
  assert without_tools.loss_mask.sum() > 100


def test_documents_use_bos_only_when_the_model_has_one(tokenizers):
  qwen, kimi = tokenizers["qwen3"], tokenizers["kimi"]
  np.testing.assert_array_equal(qwen.encode_document("ab"),
                                [*qwen.encode("ab"), qwen.token_id("<|im_end|>")])
  np.testing.assert_array_equal(kimi.encode_document("ab"),
                                [kimi.bos_id, *kimi.encode("ab"), kimi.eos_id])


def test_prepare_returns_the_model_tokenizer(tmp_path):
  from c2jax.data import cache
  cfg = cache.default_config()
  cfg.tokenizer_dir = str(FIXTURES / "kimi")
  cfg.tokenizer_file = str(FIXTURES / "qwen3" / "tokenizer.json")
  with pytest.raises(ValueError, match="both set"):
    cache.prepare_from_config(cfg, progress=False)
  prepared = cache.Prepared(tmp_path, FIXTURES / "kimi")
  assert isinstance(prepared.tokenizer(), model_tokenizer.ModelTokenizer)


def test_chat_dataset_rewrites_trace_call_ids_to_the_format(tokenizers):
  from c2jax.toolcalls import formats
  from c2jax.data import pipeline
  case = next(c for c in CASES if c["name"] == "kimi/agent_tools")
  c2jax_ids = formats.with_call_ids(case["messages"], formats.get_format("c2jax"))
  assert "call_0_0" in json.dumps(c2jax_ids)
  n = len(case["input_ids"])
  kwargs = dict(seq_len=n - 1, batch_size=1, shuffle=False, num_epochs=1)
  (batch,) = list(pipeline.chat_dataset([c2jax_ids], tokenizers["kimi"], tool_format="kimi_k2",
                                        **kwargs))
  # A message list carries no tools, so compare with the render without them.
  expected = chat_template.apply(tokenizers["kimi"], case["messages"]).ids
  np.testing.assert_array_equal(batch["inputs"][0][:len(expected) - 1], expected[:-1])
  with pytest.raises(ValueError, match="needs a released model's tokenizer"):
    pipeline.chat_dataset([c2jax_ids], tokenizer_lib.train_bpe(["ab"] * 4, 300),
                          tool_format="kimi_k2", **kwargs)


def test_chat_render_uses_the_model_template(tokenizers):
  from c2jax.data import chat
  case = next(c for c in CASES if c["name"] == "qwen3/plain_chat")
  rendered = chat.render(tokenizers["qwen3"], case["messages"])
  np.testing.assert_array_equal(rendered.ids, case["input_ids"])
  np.testing.assert_array_equal(rendered.loss_mask, case["assistant_masks"])


def test_named_templates_and_the_tool_use_choice(tmp_path):
  (tmp_path / "tokenizer.json").write_text((FIXTURES / "qwen3" / "tokenizer.json").read_text())
  (tmp_path / "chat_template.jinja").write_text("default:{{ messages[0].content }}")
  (tmp_path / "additional_chat_templates").mkdir()
  (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_text(
      "tools:{{ tools | length }}")
  tok = model_tokenizer.load_model_tokenizer(tmp_path)
  message = [{"role": "user", "content": "hi"}]
  assert chat_template.apply(tok, message).text == "default:hi"
  assert chat_template.apply(tok, message, tools=[{"a": 1}]).text == "tools:1"
  assert chat_template.apply(tok, message, template_name="default", tools=[{}]).text == (
      "default:hi")
  with pytest.raises(ValueError, match=r"chat templates \['default', 'tool_use'\]"):
    chat_template.apply(tok, message, template_name="rag")


def test_unreadable_turns_are_explained(tmp_path):
  from c2jax.data import template_turns
  (tmp_path / "tokenizer.json").write_text((FIXTURES / "qwen3" / "tokenizer.json").read_text())
  (tmp_path / "chat_template.jinja").write_text(
      "{% for m in messages %}{{ 'A:' if m.role == 'assistant' else 'U:' }}{{ m.content }}"
      "<|im_end|>{% endfor %}{% if add_generation_prompt %}B:{% endif %}")
  tok = model_tokenizer.load_model_tokenizer(tmp_path)
  with pytest.raises(ValueError, match="generation prompt does not begin the assistant's turn"):
    template_turns.turn_spans(tok, [{"role": "user", "content": "x"},
                                    {"role": "assistant", "content": "y"}])
  (tmp_path / "chat_template.jinja").write_text(
      "{% for m in messages %}{{ m.content }}\n{% endfor %}")
  tok = model_tokenizer.load_model_tokenizer(tmp_path)
  with pytest.raises(ValueError, match="no control token"):
    template_turns.closing_token(tok)

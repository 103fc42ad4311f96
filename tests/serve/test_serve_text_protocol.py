"""`c2jax serve` reads a text-protocol conversation (<tool_call> blocks in the assistant's
content, <tool_result> blocks in a user message, as `c2jax eval` sends with
policy.tool_calls=text) into the same prompt tokens as its native function-calling form."""

import json

import numpy as np
import pytest

from c2jax.toolcalls import protocol
from c2jax.data import tokenizer as tokenizer_lib
from c2jax.serve import prompts, schema

CALLS = [("read_file", {"path": "pkg/a.py"}), ("edit_file", {"path": "pkg/a.py",
                                                             "old_string": "X = 1\n",
                                                             "new_string": "X = 2\n"})]
RESULTS = [("read_file", True, "1\tX = 1\n2\t</tool_result> inside"),
           ("edit_file", False, "old_string not found")]


@pytest.fixture(scope="module")
def tok():
  texts = [protocol.render_turn("Let me look.", CALLS)] * 10
  texts += [protocol.render_result(*r) for r in RESULTS] * 10
  return tokenizer_lib.train_bpe(texts, 320)


def _request(messages):
  return schema.ChatRequest.model_validate({"model": "m", "messages": messages})


def _native():
  calls = [{"id": f"c{k}", "type": "function",
            "function": {"name": n, "arguments": json.dumps(a)}} for k, (n, a) in enumerate(CALLS)]
  return [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix X"},
          {"role": "assistant", "content": "Let me look.", "tool_calls": calls},
          *[{"role": "tool", "tool_call_id": f"c{k}", "content": out if ok else f"ERROR: {out}"}
            for k, (_, ok, out) in enumerate(RESULTS)]]


def _text():
  return [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix X"},
          {"role": "assistant", "content": protocol.render_turn("Let me look.", CALLS)},
          {"role": "user", "content": "\n".join(protocol.render_result(*r) for r in RESULTS)}]


def test_text_protocol_renders_like_native_tool_calls(tok):
  native = prompts.chat_prompt(tok, _request(_native()), [])
  text = prompts.chat_prompt(tok, _request(_text()), [])
  np.testing.assert_array_equal(text, native)
  # The result markers are single special tokens, as the agent loop writes them.
  assert list(text).count(tok.token_id(protocol.TOOL_RESULT_START)) == 2


def test_text_turn_is_recalled_from_its_sampled_tokens(tok):
  memory = prompts.TurnMemory()
  raw = protocol.render_turn("Let me look.", CALLS)
  sampled = np.concatenate([tok.encode("Let"), tok.encode(raw[3:])]).astype(np.int32)
  memory.remember(prompts.turn_key(raw, None), sampled)
  ids = prompts.chat_prompt(tok, _request(_text()), [], memory)
  start = len(prompts.chat_prompt(tok, _request(_text()[:2]), []))
  np.testing.assert_array_equal(ids[start:start + len(sampled)], sampled)


def test_results_that_do_not_answer_the_calls_stay_a_user_message(tok):
  messages = _text()
  messages[3]["content"] = protocol.render_result("grep", True, "nothing")  # wrong tool
  converted = prompts.from_text_protocol(messages)
  assert [m["role"] for m in converted] == ["system", "user", "assistant", "user"]
  assert len(converted[2]["tool_calls"]) == 2
  malformed = _text()[:3]
  malformed[2]["content"] = "<tool_call>{not json</tool_call>"
  with pytest.raises(schema.APIError, match="tool-call protocol"):
    prompts.chat_prompt(tok, _request(malformed), [])

"""Builds the chat-template parity fixtures under tests/fixtures/templates/ with transformers.

Run with $C2JAX_TORCH_PYTHON, a Python with transformers, tokenizers and tiktoken (not the
project's 3.12 venv; this tool must not import c2jax):

  $C2JAX_TORCH_PYTHON tools/make_template_fixtures.py [--out DIR]

Two tiny model tokenizer directories, each with a template written for c2jax in that model
family's style (tools/templates/*.jinja; real templates cannot be downloaded here):
  qwen3/  tokenizer.json (byte-level BPE, Qwen2 split pattern, ChatML special tokens and
          Qwen3's non-special <tool_call>/<think>/<tool_response> tokens), tokenizer_config.json
          and chat_template.jinja, all written by transformers' save_pretrained.
  kimi/   tiktoken.model (ranks trained here with tiktoken's reference trainer) and a
          tokenizer_config.json holding added_tokens_decoder, the named special tokens and the
          chat template inline, Kimi-K2's layout. transformers reads the same file through its
          TikTokenConverter with Kimi's split pattern.
and cases.json: per case the messages, tools, flags, and transformers' rendered text,
input_ids and assistant_masks (apply_chat_template(..., return_assistant_tokens_mask=True)),
plus plain-text encodings (no special tokens) that pin down the base tokenizers.
"""

from __future__ import annotations

import argparse
import base64
import json
import pathlib
import shutil

import tokenizers
import transformers
from tiktoken import _educational as tiktoken_train
from tokenizers import decoders, models, pre_tokenizers, processors, trainers
from transformers.convert_slow_tokenizer import TikTokenConverter

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "templates"
TEMPLATES = ROOT / "tools" / "templates"
# Kept in step with c2jax/data/model_tokenizer.py KIMI_PATTERN (a test checks they agree).
KIMI_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>",
              "</tool_response>"]
KIMI_SPECIAL = ["[BOS]", "[EOS]", "[PAD]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                "<|im_system|>", "<|im_middle|>", "<|tool_calls_section_begin|>",
                "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                "<|tool_call_argument_begin|>", "<|tool_call_end|>"]

CORPUS = "\n".join([
    "def read_file(path: str) -> str:\n    with open(path) as f:\n        return f.read()\n",
    "The test in tests/test_app.py fails because parse() doesn't handle empty input.",
    "I'll look at the failing module first, then fix it. We're done when pytest passes.",
    'Call {"name": "grep", "arguments": {"pattern": "def parse", "path": "src"}} now.',
    "    1\timport os\n    2\timport sys\n    3\t\n    4\tdef main():\n    5\t    return 0",
    "修复解析器中的错误。测试现在通过了。", "Numbers 12345 and 3.14159, ids 0xFF.",
    "ERROR: file not found: src/missing.py\n\n\nTry another path.",
] * 8)

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "Path from the repo root."}},
            "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "grep", "description": "Search files for a regex <pattern> & print matches.",
        "parameters": {"type": "object", "properties": {
            "pattern": {"type": "string"}, "path": {"type": "string"}},
            "required": ["pattern"]}}},
]


def _calls(style: str, calls: list[tuple[str, dict]], start: int = 0) -> list[dict]:
  result = []
  for k, (name, arguments) in enumerate(calls):
    call_id = f"functions.{name}:{start + k}" if style == "kimi" else f"call_{start + k}"
    # Alternate string and object arguments: templates must handle both.
    args = json.dumps(arguments) if k % 2 == 0 else arguments
    result.append({"id": call_id, "type": "function",
                   "function": {"name": name, "arguments": args}})
  return result


def _conversations(style: str) -> list[dict]:
  tool_id = (lambda n, i: f"functions.{n}:{i}") if style == "kimi" else (lambda n, i: f"call_{i}")
  agent = [
      {"role": "system", "content": "You are a coding agent. Fix the bug."},
      {"role": "user", "content": "tests/test_app.py fails: parse() doesn't handle ''."},
      {"role": "assistant", "content": "I'll look at the failing module first.",
       "reasoning_content": "The parser is in src/app.py.",
       "tool_calls": _calls(style, [("read_file", {"path": "src/app.py"}),
                                    ("grep", {"pattern": "def parse", "path": "src"})])},
      {"role": "tool", "tool_call_id": tool_id("read_file", 0), "name": "read_file",
       "content": "    1\tdef parse(s):\n    2\t    return s.split()[0]"},
      {"role": "tool", "tool_call_id": tool_id("grep", 1), "name": "grep",
       "content": "src/app.py:1:def parse(s):"},
      {"role": "assistant", "content": "",
       "tool_calls": _calls(style, [("read_file", {"path": "tests/test_app.py"})], 2)},
      {"role": "tool", "tool_call_id": tool_id("read_file", 2), "name": "read_file",
       "content": "ERROR: file not found"},
      {"role": "assistant", "content": "<think>\nEmpty input needs a guard.\n</think>\n\n"
                                       "Fixed: parse('') now returns ''. 修复完成。"},
  ]
  cases = [
      {"name": "plain_chat", "messages": [
          {"role": "system", "content": "Be brief."},
          {"role": "user", "content": "What is 2+2? Answer in one word."},
          {"role": "assistant", "content": "Four."},
          {"role": "user", "content": "And 3+3?"},
          {"role": "assistant", "content": "Six."}]},
      {"name": "agent_tools", "messages": agent, "tools": TOOLS},
      {"name": "agent_prompt", "messages": agent[:2], "tools": TOOLS,
       "add_generation_prompt": True},
      {"name": "agent_midway", "messages": agent[:5], "tools": TOOLS,
       "add_generation_prompt": True},
      {"name": "no_system", "messages": agent[1:3]},
  ]
  if style == "qwen3":
    cases.append({"name": "no_thinking_prompt", "messages": agent[:2], "tools": TOOLS,
                  "add_generation_prompt": True, "kwargs": {"enable_thinking": False}})
  return cases


def _qwen3(directory: pathlib.Path):
  hf = tokenizers.Tokenizer(models.BPE())
  hf.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(tokenizers.Regex(QWEN_PATTERN), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  hf.decoder = decoders.ByteLevel()
  hf.post_processor = processors.ByteLevel(trim_offsets=False)
  trainer = trainers.BpeTrainer(vocab_size=420, min_frequency=2, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  hf.train_from_iterator([CORPUS], trainer)
  hf.add_special_tokens(QWEN_SPECIAL)
  hf.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                 for t in QWEN_ADDED])
  tok = transformers.PreTrainedTokenizerFast(
      tokenizer_object=hf, eos_token="<|im_end|>", pad_token="<|endoftext|>")
  tok.chat_template = (TEMPLATES / "qwen3_style.jinja").read_text()
  tok.save_pretrained(directory)
  return transformers.AutoTokenizer.from_pretrained(directory)


def _kimi(directory: pathlib.Path):
  # Ranks trained with a simple split; encoding uses Kimi's pattern on both sides.
  ranks = tiktoken_train.bpe_train(CORPUS, 330, r"\s*\S+|\s+", visualise=None)
  directory.mkdir(parents=True)
  with open(directory / "tiktoken.model", "w") as f:
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
      f.write(f"{base64.b64encode(token).decode()} {rank}\n")
  first = len(ranks)
  decoder = {str(first + i): {"content": t, "lstrip": False, "normalized": False,
                              "rstrip": False, "single_word": False, "special": True}
             for i, t in enumerate(KIMI_SPECIAL)}
  config = {"added_tokens_decoder": decoder, "bos_token": "[BOS]", "eos_token": "[EOS]",
            "pad_token": "[PAD]", "tokenizer_class": "TikTokenTokenizer",
            "chat_template": (TEMPLATES / "kimi_k2_style.jinja").read_text()}
  (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
  converted = TikTokenConverter(vocab_file=str(directory / "tiktoken.model"),
                                pattern=KIMI_PATTERN,
                                extra_special_tokens=KIMI_SPECIAL).converted()
  tok = transformers.PreTrainedTokenizerFast(
      tokenizer_object=converted, bos_token="[BOS]", eos_token="[EOS]", pad_token="[PAD]")
  tok.chat_template = config["chat_template"]
  for i, t in enumerate(KIMI_SPECIAL):
    assert tok.convert_tokens_to_ids(t) == first + i, t
  return tok


PLAIN = [
    "def parse(s):\n    return s.split()[0]  # we're done",
    "I'll read it; they've said it's 'fine'. HTTPServer URLs 1234567 x2",
    "中文和English混合 修复了 3 个错误。\n\n\n  trailing   spaces   ",
    "tabs\tand\r\nwindows newlines, émoji 🙂 and accents naïve café",
]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=str(OUT), help="where to write (default: the fixtures)")
  out = pathlib.Path(parser.parse_args().out)
  if out.exists():
    shutil.rmtree(out)
  out.mkdir(parents=True)
  cases = []
  for style, build in (("qwen3", _qwen3), ("kimi", _kimi)):
    tok = build(out / style)
    for case in _conversations(style):
      encoded = tok.apply_chat_template(
          case["messages"], tools=case.get("tools"), tokenize=True, return_dict=True,
          add_generation_prompt=case.get("add_generation_prompt", False),
          return_assistant_tokens_mask=True, **case.get("kwargs", {}))
      text = tok.apply_chat_template(
          case["messages"], tools=case.get("tools"), tokenize=False,
          add_generation_prompt=case.get("add_generation_prompt", False),
          **case.get("kwargs", {}))
      cases.append({**case, "model": style, "name": f"{style}/{case['name']}", "text": text,
                    "input_ids": list(encoded["input_ids"]),
                    "assistant_masks": list(encoded["assistant_masks"])})
    for i, text in enumerate(PLAIN):
      cases.append({"model": style, "name": f"{style}/plain_{i}", "plain": text,
                    "input_ids": tok.encode(text, add_special_tokens=False)})
  lines = ",\n".join(json.dumps(case, ensure_ascii=False) for case in cases)
  (out / "cases.json").write_text(
      f'{{"transformers": "{transformers.__version__}", "cases": [\n{lines}\n]}}\n')
  print(f"wrote {len(cases)} cases to {out}")


if __name__ == "__main__":
  main()

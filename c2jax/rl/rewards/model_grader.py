"""The `model` behaviour grader: an LLM judge behind any OpenAI-compatible endpoint.

config.rl.reward.behaviour.graders.model:
  base_url        the endpoint (ending in /v1), e.g. a `c2jax serve` or a hosted API
  model           the judge's model id
  api_key_env     the name of the environment variable that holds the key ('' = none):
                  keys never sit in configs, which are saved beside every run
  rubric          what to judge; the judge answers with a score from 0 to 10 first
  max_transcript_chars  the transcript is cut to its head and tail beyond this
  timeout_s       per request

The judge's first number in 0..10 becomes the score / 10. A failed request or an answer
without a score raises GraderError (never a silent neutral score: a broken judge must not
quietly turn into reward).
"""

from __future__ import annotations

import json
import os
import re

from c2jax.rl.rewards.grading import GraderError, Transcript, Verdict

RUBRIC = ("You review how a coding agent worked on a task. Judge its communication and "
          "style, not whether the code is correct: is the final message clear and honest "
          "about what changed and what is left; are the code edits free of leftover "
          "reasoning comments; did it use its tools sensibly. Answer with a score from 0 "
          "(poor) to 10 (excellent) on the first line, then one sentence of reasons.")
_SCORE = re.compile(r"(?<![\d.])\d+(?:\.\d+)?")


def render(transcript: Transcript, max_chars: int) -> str:
  lines = []
  for message in transcript.messages:
    content = message.get("content") or ""
    for call in message.get("tool_calls") or ():
      function = call.get("function", {})
      content += f"\n[tool call {function.get('name')}: {function.get('arguments')}]"
    lines.append(f"## {message.get('role')}\n{content}")
  text = "\n\n".join(lines)
  if len(text) <= max_chars:
    return text
  half = max_chars // 2
  return text[:half] + f"\n\n[... {len(text) - 2 * half} characters cut ...]\n\n" + \
      text[-half:]


def _client(cfg):
  import openai  # pylint: disable=import-outside-toplevel

  key = "none"
  if cfg.api_key_env:
    if cfg.api_key_env not in os.environ:
      raise GraderError(f"behaviour grader 'model': the environment variable "
                        f"{cfg.api_key_env!r} (graders.model.api_key_env) is not set; "
                        "export the endpoint's key there or set api_key_env=''.")
    key = os.environ[cfg.api_key_env]
  return openai.OpenAI(base_url=cfg.base_url, api_key=key, timeout=cfg.timeout_s,
                       max_retries=1)


def model_judge(transcript: Transcript, cfg) -> Verdict:
  if not cfg.base_url or not cfg.model:
    raise GraderError("behaviour grader 'model' needs graders.model.base_url and "
                      "graders.model.model (an OpenAI-compatible endpoint and model id).")
  import openai  # pylint: disable=import-outside-toplevel

  messages = [{"role": "system", "content": cfg.rubric or RUBRIC},
              {"role": "user", "content": render(transcript, cfg.max_transcript_chars)}]
  try:
    reply = _client(cfg).chat.completions.create(model=cfg.model, messages=messages,
                                                 temperature=0.0, max_tokens=128)
  except openai.OpenAIError as e:
    raise GraderError(f"behaviour grader 'model': {cfg.base_url} failed: "
                      f"{type(e).__name__}: {e}") from e
  answer = (reply.choices[0].message.content or "").strip()
  match = _SCORE.search(answer)
  if match is None or not 0.0 <= float(match.group(0)) <= 10.0:
    raise GraderError(f"behaviour grader 'model': the judge's answer has no score from 0 "
                      f"to 10: {json.dumps(answer[:200])}")
  return Verdict(float(match.group(0)) / 10.0, answer[:500])

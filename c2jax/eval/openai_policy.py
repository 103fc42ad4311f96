"""A policy behind any OpenAI-compatible endpoint (`c2jax serve`, vLLM, hosted APIs).

Each episode drives the official `openai` client through the same sandbox, tools and
grader as the in-process agent loop, one chat request per turn:
  native  tools go out as OpenAI function specs and come back as `tool_calls`; results
          return as `tool` messages (the endpoint's own function calling);
  text    the system message lists the tools and the <tool_call> format
          (c2jax.toolcalls.protocol), exactly what c2jax models are trained on; results
          return as a user message of <tool_result> blocks.
The transcript is stored in one OpenAI-style form either way. Token counts come from the
response's `usage`; cost from the configured per-million-token prices.

Infrastructure errors (timeouts, connection errors, 5xx, 429) raise InfraError, which
the runner retries; the client's own retries are off so `policy.retries` is the one knob.
Bad credentials or an unknown model stop the run with an error naming the config key.
"""

from __future__ import annotations

import json
import os
import time

from c2jax.agent import prompt as prompt_lib
from c2jax.toolcalls import protocol
from c2jax.env import reward as reward_lib
from c2jax.env import sandbox as sandbox_lib
from c2jax.env import tools as tools_lib
from c2jax.eval import episode as episode_lib

TOOL_CALL_MODES = ("native", "text")


class EndpointConfigError(RuntimeError):
  """The endpoint refused the run's configuration (key, model); retrying cannot help."""


class OpenAIPolicy:

  def __init__(self, policy_cfg, agent_cfg, client=None):
    import openai  # pylint: disable=g-import-not-at-top

    self.cfg, self.agent_cfg = policy_cfg, agent_cfg
    self._openai = openai
    api_key = os.environ.get(policy_cfg.api_key_env, "") if policy_cfg.api_key_env else ""
    if policy_cfg.api_key_env and not api_key:
      raise EndpointConfigError(
          f"config.policy.api_key_env names ${policy_cfg.api_key_env}, which is not set; "
          "export the key there (or set api_key_env='' for an endpoint without keys).")
    self.client = client or openai.OpenAI(
        base_url=policy_cfg.base_url, api_key=api_key or "none",
        timeout=policy_cfg.timeout_s, max_retries=0)
    self.label = policy_cfg.label or policy_cfg.model

  # ---- one request --------------------------------------------------------------------
  def _complete(self, messages, tools, seed):
    openai = self._openai
    kwargs = dict(model=self.cfg.model, messages=messages,
                  temperature=self.agent_cfg.temperature, top_p=self.agent_cfg.top_p,
                  max_tokens=self.agent_cfg.max_turn_tokens, seed=seed)
    if tools:
      kwargs["tools"] = tools
    try:
      return self.client.chat.completions.create(**kwargs), None
    except (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError,
            openai.InternalServerError) as e:
      raise episode_lib.InfraError(f"endpoint: {type(e).__name__}: {e}") from e
    except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
      raise EndpointConfigError(f"the endpoint {self.cfg.base_url} refused the key in "
                                f"${self.cfg.api_key_env} (config.policy.api_key_env): {e}") from e
    except openai.NotFoundError as e:
      raise EndpointConfigError(f"the endpoint {self.cfg.base_url} does not serve "
                                f"config.policy.model = {self.cfg.model!r}: {e}") from e
    except openai.APIStatusError as e:
      if e.status_code >= 500:
        raise episode_lib.InfraError(f"endpoint: HTTP {e.status_code}: {e}") from e
      # A 4xx on a well-formed request: the conversation outgrew the context, or the
      # model's output broke the request. The episode ends there; it is the model's.
      return None, f"rejected: HTTP {e.status_code}: {str(e)[:300]}"

  def complete_text(self, prompt: str, *, max_tokens: int, stop: list[str]) -> dict:
    """One greedy plain-text completion (/v1/completions: no chat template, as base
    checkpoints are evaluated): {'text', 'finish_reason', 'prompt_tokens',
    'completion_tokens'}, or {'infra_error'} for a failure retrying might cure."""
    openai = self._openai
    try:
      response = self.client.completions.create(
          model=self.cfg.model, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
          stop=stop[:4] or None)
    except (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError,
            openai.InternalServerError) as e:
      return {"infra_error": f"endpoint: {type(e).__name__}: {e}"[:2000]}
    except (openai.AuthenticationError, openai.PermissionDeniedError,
            openai.NotFoundError) as e:
      raise EndpointConfigError(f"the endpoint {self.cfg.base_url} refused "
                                f"config.policy.model = {self.cfg.model!r} or the key in "
                                f"${self.cfg.api_key_env}: {e}") from e
    except openai.APIStatusError as e:
      if e.status_code >= 500:
        return {"infra_error": f"endpoint: HTTP {e.status_code}: {e}"[:2000]}
      return {"infra_error": f"rejected: HTTP {e.status_code}: {str(e)[:300]} (a prompt "
                             "over the endpoint's context is retried after you raise it)"}
    choice, usage = response.choices[0], response.usage
    return {"text": choice.text or "", "finish_reason": choice.finish_reason,
            "prompt_tokens": usage.prompt_tokens if usage else None,
            "completion_tokens": usage.completion_tokens if usage else None}

  # ---- one episode ----------------------------------------------------------------------
  def episode(self, job: episode_lib.Job) -> episode_lib.Outcome:
    task, cfg, started = job.task, self.agent_cfg, time.monotonic()
    try:
      box = sandbox_lib.make_task_sandbox(cfg.backend, task, disk_mb=cfg.sandbox_disk_mb)
    except Exception as e:  # pylint: disable=broad-except
      raise episode_lib.InfraError(f"sandbox did not start: {type(e).__name__}: {e}") from e
    with box:
      reward_lib.prepare(box, task)
      toolbox = tools_lib.Toolbox(box, tools_lib.ToolsetConfig(tools=tuple(cfg.tools),
                                                               strict=cfg.strict_tools))
      native = self.cfg.tool_calls == "native"
      system = (cfg.system_prompt if native else
                prompt_lib.system_message(cfg.system_prompt, toolbox.specs()))
      conversation = prompt_lib.initial_messages(system, task.prompt)
      transcript = [dict(m) for m in conversation]
      tools = toolbox.specs() if native else None
      usage = {"prompt": 0, "completion": 0, "known": True}
      turns, calls, reason, note = 0, 0, None, ""
      while reason is None:
        response, rejected = self._complete(conversation, tools, job.seed)
        if rejected:
          reason, note = "rejected", rejected
          break
        if response.usage is None:
          usage["known"] = False
        else:
          usage["prompt"] += response.usage.prompt_tokens or 0
          usage["completion"] += response.usage.completion_tokens or 0
        message = response.choices[0].message
        turn, observations, sent = (self._native_turn(toolbox, message) if native else
                                    self._text_turn(toolbox, message))
        conversation += sent
        transcript += protocol.to_openai_messages(turn, observations, turns)
        turns += 1
        calls += len(turn.calls)
        if toolbox.finished:
          reason = "finish"
        elif not turn.calls:
          reason = "answer"
        elif turns >= cfg.max_turns:
          reason = "max_turns"
        elif usage["completion"] >= cfg.max_total_tokens:
          reason = "budget"
      passed, _ = reward_lib.run_hidden_tests(box, task, cfg.grade_timeout_s)
    completion = usage["completion"] if usage["known"] else None
    prompt_tokens = usage["prompt"] if usage["known"] else None
    cost = None
    if usage["known"]:
      cost = (prompt_tokens * self.cfg.price_prompt_per_mtok +
              completion * self.cfg.price_completion_per_mtok) / 1e6
    return episode_lib.Outcome(
        passed=passed, finish_reason=reason, messages=transcript, turns=turns,
        tool_calls=calls, wall_s=time.monotonic() - started, completion_tokens=completion,
        prompt_tokens=prompt_tokens, cost=cost, extra={"note": note} if note else {})

  @staticmethod
  def _native_turn(toolbox, message):
    content = message.content or ""
    turn_calls, raw = [], []
    for index, call in enumerate(message.tool_calls or []):
      name = call.function.name
      try:
        arguments = json.loads(call.function.arguments or "{}")
      except ValueError:
        arguments = None
      if isinstance(arguments, dict):
        turn_calls.append(protocol.ToolCall(index, name, arguments))
      else:
        turn_calls.append(protocol.CallError(
            index, f"Tool call {index} ({name}): arguments must be a JSON object.", name))
      raw.append({"id": call.id, "type": "function",
                  "function": {"name": name, "arguments": call.function.arguments}})
    turn = protocol.Turn(content, turn_calls)
    observations = []
    for call in turn_calls:
      if toolbox.finished:
        observations.append(tools_lib.Observation(call.index, call.name, False,
                                                  "Not run: finish was already called."))
      else:
        observations.append(toolbox.call(call))
    sent = [{"role": "assistant", "content": content, **({"tool_calls": raw} if raw else {})}]
    sent += [{"role": "tool", "tool_call_id": raw[o.index]["id"],
              "content": o.output if o.ok else f"ERROR: {o.output}"} for o in observations]
    return turn, observations, sent

  @staticmethod
  def _text_turn(toolbox, message):
    content = message.content or ""
    turn, observations = toolbox.run_turn(content)
    sent = [{"role": "assistant", "content": content}]
    if observations:
      sent.append({"role": "user",
                   "content": "\n".join(o.render() for o in observations)})
    return turn, observations, sent

  def run(self, jobs, on_done, should_start=None) -> None:
    episode_lib.run_in_threads(self.episode, jobs, on_done, self.cfg.concurrency,
                               should_start, fatal=(EndpointConfigError,))

  def close(self) -> None:
    self.client.close()

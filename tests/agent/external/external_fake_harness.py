"""A scripted external harness: a known sequence of chat calls through the openai client.

Calls 1-2 and 4-5 extend the conversation (the history goes back verbatim); call 3
restarts it with a different user message (its prompt does not extend the tokens so far),
so the stitcher must produce two segments of two and three requests.

    python external_fake_harness.py TASK_FILE [PATH=LINE]

With PATH=LINE the harness also "fixes" the repository: it writes LINE to PATH (in its
working directory, the task's copy), so the hidden tests can pass.
"""

import os
import sys

import openai

client = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"],
                       api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
model = os.environ["C2JAX_MODEL"]
task = open(sys.argv[1], encoding="utf-8").read()
base_seed = int(os.environ.get("C2JAX_SEED", "0"))  # call k sends base_seed + k


def ask(messages, seed):
  # Greedy: a reply depends on the model alone, not on the sampler's random stream, so a
  # change to how the engine draws tokens cannot turn a 6-token reply into the start of a
  # tool call with no closing tag (which the server rightly refuses to read back).
  reply = client.chat.completions.create(model=model, messages=messages, max_tokens=6,
                                         temperature=0.0, seed=base_seed + seed)
  return {"role": "assistant", "content": reply.choices[0].message.content}


history = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": task}]
history.append(ask(history, 1))
history += [{"role": "user", "content": "Run the tests."}]
history.append(ask(history, 2))
restart = [{"role": "system", "content": "You fix bugs."},
           {"role": "user", "content": "Summary: tests fail. " + task}]
restart.append(ask(restart, 3))
restart.append({"role": "user", "content": "Go on."})
restart.append(ask(restart, 4))
restart.append({"role": "user", "content": "Done?"})
restart.append(ask(restart, 5))
if len(sys.argv) > 2:
  path, line = sys.argv[2].split("=", 1)
  with open(path, "w", encoding="utf-8") as f:
    f.write(line.replace("_", " ") + "\n")

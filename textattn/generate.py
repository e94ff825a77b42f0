"""Sample text from a trained language-model workdir.

    python -m textattn.generate --workdir=runs/imdb_lm_bytes --text="This movie was"
    python -m textattn.generate --workdir=runs/imdb_lm_bytes --input=prompts.txt --json \
        --max_tokens=200 --temperature=0.8 --top_k=40 --seed=1

Each prompt starts a document and is continued for at most --max_tokens tokens or until the
model ends the document; one continuation per line (newlines inside it escaped as \\n), or with
--json one JSON line {"text", "continuation"}. --temperature=0 is greedy; the same prompts and
--seed give the same text. From Python: `textattn.load(workdir).generate(prompts, ...)`.
"""

from __future__ import annotations

import json
import os

from textattn.command_line import text_lines
from textattn.errors import DataError, user_errors


def load(workdir: str, checkpoint: str = "best", plugins=()):
  """The generator of a language-model workdir (textattn/tasks/language_model's Generator)."""
  from textattn import run  # (lazy: `python -m textattn.generate --help` stays instant)
  generator = run.load(workdir, checkpoint, plugins)
  if not hasattr(generator, "generate"):
    raise DataError(f"{workdir} is not a language-model run (it is a {generator.config.task} "
                    f"run); use python -m textattn.predict or textattn.translate.")
  return generator


def main(argv) -> None:
  from absl import flags, logging
  del argv
  values = flags.FLAGS
  if not values["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  with user_errors():
    prompts = text_lines(values.text, values.input, "prompts")
    generator = load(values.workdir, values.checkpoint, values.plugin)
    outputs = generator.generate(prompts, max_tokens=values.max_tokens,
                                 temperature=values.temperature, top_k=values.top_k,
                                 seed=values.seed)
  for prompt, output in zip(prompts, outputs):
    print(json.dumps({"text": prompt, "continuation": output}, ensure_ascii=False)
          if values.json else prompt + output.replace("\n", "\\n"))


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  from absl import app, flags
  flags.DEFINE_string("workdir", None, "A language-model training workdir.")
  flags.DEFINE_multi_string("text", [], "A prompt to continue; repeatable.")
  flags.DEFINE_string("input", None, "A UTF-8 file, one prompt per line.")
  flags.DEFINE_integer("max_tokens", 200, "Most tokens drawn per prompt.")
  flags.DEFINE_float("temperature", 1.0, "Softmax temperature; 0 = greedy.")
  flags.DEFINE_integer("top_k", 0, "Draw from the k most probable tokens only; 0 = all.")
  flags.DEFINE_integer("seed", 0, "The draws' seed (same prompts and seed: same text).")
  flags.DEFINE_bool("json", False, "JSON lines {text, continuation} instead of plain lines.")
  flags.DEFINE_string("checkpoint", "best", "best, last, or a step.")
  flags.DEFINE_multi_string("plugin", [], "A module to import first that registers the "
                            "attention variant the run used (as textattn.main --plugin).")
  flags.mark_flag_as_required("workdir")
  from textattn.command_line import flags_parser
  app.run(main, flags_parser=flags_parser(None))

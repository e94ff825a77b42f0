"""Times decoding a finished run's whole test split with the current code (greedy and beam), and
checks the translations equal the run's own test_translations.jsonl.

    python experiments/translation/decode_time.py runs/spa_eng --beam=4
"""

import argparse
import json
import pathlib
import time

from textattn import translate
from textattn.data import pairs as pairs_lib
from textattn.tasks import translation


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("workdir")
  parser.add_argument("--beam", type=int, default=4)
  args = parser.parse_args()
  model = translate.load(args.workdir)
  config = model.config
  pairs = pairs_lib.read_pairs(config.dataset, config.source_field, config.target_field)
  test = pairs_lib.split_indices(pairs, config.data_seed, config.split_by == "source")["test"]
  sources = model.source_tokenizer.encode(
      [pairs_lib.standardize_source(pairs.sources[i]) for i in test], config.source_len, "post",
      standardized=True)
  saved = [json.loads(line) for line in pathlib.Path(
      args.workdir, "test_translations.jsonl").read_text(encoding="utf-8").splitlines()]
  for name, beam in (("greedy", 0), (f"beam{args.beam}", args.beam)):
    started = time.perf_counter()
    out = translation.translate_ids(model.model, model.params, sources, model.target_tokenizer,
                                    int(config.platform.eval_batch_size), beam,
                                    float(config.length_penalty))
    seconds = time.perf_counter() - started
    same = sum(o == r[name] for o, r in zip(out, saved)) if name in saved[0] else None
    print(f"{name}: {len(out):,} sentences in {seconds:.1f} s ({len(out) / seconds:,.0f}/s, "
          f"compilation included); equal to the run's report: {same} of {len(out)}")


if __name__ == "__main__":
  main()

"""Multi-reference BLEU and chrF of a finished translation run: the test pairs grouped by their
standardised English sentence, one hypothesis per distinct sentence scored against all of its
test translations (sacreBLEU's variable reference count, `nrefs:var`), beside the run's own
one-reference-per-pair scores. spa.txt gives many sentences several translations, so the
one-reference score counts a valid alternative translation as wrong.

    python experiments/translation/multi_ref.py runs/spa_eng_src_s0
"""

import argparse
import collections

import sacrebleu
import samples  # experiments/translation/samples.py, beside this script

from textattn.data import pairs as pairs_lib


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("workdir")
  parser.add_argument("--dataset", default="", help="the pairs file, if it moved")
  args = parser.parse_args()
  pairs, test, rows = samples.load_test(args.workdir, args.dataset)
  groups = collections.defaultdict(list)  # standardised source -> its rows, in file order
  for i, index in enumerate(test):
    groups[pairs_lib.standardize_source(pairs.sources[index])].append(i)
  width = max(len(g) for g in groups.values())
  outputs = [k for k in rows[0] if k != "reference"]
  print(f"{len(rows):,} test pairs, {len(groups):,} distinct sources, up to {width} references "
        f"each ({sum(len(g) > 1 for g in groups.values()):,} sources with more than one)")
  for name in outputs:
    for refs_name, hyps, refs in [
        ("one reference a pair", [r[name] for r in rows], [[r["reference"] for r in rows]]),
        ("all references a source", [rows[g[0]][name] for g in groups.values()],
         [[rows[g[k]]["reference"] if k < len(g) else None for g in groups.values()]
          for k in range(width)])]:
      bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
      b, c = bleu.corpus_score(hyps, refs).score, chrf.corpus_score(hyps, refs).score
      print(f"{name:8s} {refs_name:24s} BLEU {b:6.2f}  chrF {c:6.2f}  ({bleu.get_signature()})")


if __name__ == "__main__":
  main()

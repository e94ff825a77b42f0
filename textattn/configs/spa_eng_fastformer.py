r"""English to Spanish with Fastformer attention: an additive encoder and a causal additive
decoder in its recurrent form (each key scored once with its own position's global query, so a
decoding step costs O(1) from a fixed-size state; `causal_additive` is the direct form, O(t) a
step). Cross-attention stays softmax (additive cross-attention has no standard definition).
Everything else is configs/spa_eng_transformer.py's.

    python -m textattn.main --config=configs/spa_eng_fastformer.py --workdir=runs/spa_eng_ff \
      --config.dataset=spa.txt

Result (seed 0, pair split, CPU-5, 2026-11-26; experiments/RESULTS.md, section 23): validation
token accuracy 69.22%, test 69.05%; test BLEU / chrF 34.73 / 57.51 greedy, 36.75 / 58.28 beam 4
(configs/spa_eng_transformer.py on the same test sentences: 35.39 / 58.19, 37.75 / 59.01). With
--config.num_epochs=1: test token accuracy 55.61%, greedy BLEU 19.76 (the direct form: 55.57%,
19.69).
"""

from textattn import defaults


def get_config():
  config = defaults.sibling(__file__, "spa_eng_transformer.py")
  config.model.encoder_attention = "additive"
  config.model.decoder_attention = "causal_additive_recurrent"
  return config

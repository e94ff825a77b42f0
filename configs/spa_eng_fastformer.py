"""English to Spanish with Fastformer attention: an additive encoder and a causal additive
decoder in its recurrent form (each key scored once with its own position's global query, so a
decoding step costs O(1) from a fixed-size state; `causal_additive` is the direct form, O(t) a
step). Cross-attention stays softmax (additive cross-attention has no standard definition).
Everything else is configs/spa_eng_transformer.py's.

    python -m textattn.main --config=configs/spa_eng_fastformer.py --workdir=runs/spa_eng_ff \\
      --config.dataset=spa.txt

Result at its 7 epochs: not measured yet. With --config.num_epochs=1 (pair split, seed 0, CPU-5,
2026-11-26): test token accuracy 55.61%, greedy BLEU 19.76 (the direct form: 55.57%, 19.69);
experiments/RESULTS.md, section 23.
"""

from textattn import defaults


def get_config():
  config = defaults.sibling(__file__, "spa_eng_transformer.py")
  config.model.encoder_attention = "additive"
  config.model.decoder_attention = "causal_additive_recurrent"
  return config

r"""English to Spanish with subwords: configs/spa_eng_transformer.py with one BPE vocabulary of
16,000 subwords (HF tokenizers, trained on both sides of the training pairs), one token table for
source, target and the output layer (shared and tied embeddings, as Vaswani et al. 2017), and 24
tokens a side (subwords lengthen a few sentences). Token accuracies of another tokenization are
not comparable: compare it with the word-level configs by test BLEU / chrF, computed on the same
standardised words of the same test sentences.

    python -m textattn.main --config=configs/spa_eng_bpe.py --workdir=runs/spa_eng_bpe \
      --config.dataset=spa.txt

Result: not measured yet.
"""

from textattn import defaults


def get_config():
  config = defaults.sibling(__file__, "spa_eng_transformer.py")
  config.update(tokenizer="bpe", shared_vocab=True, source_vocab=16000, target_vocab=16000,
                source_len=24, target_len=24)
  config.model.update(share_embeddings=True, tie_output=True)
  return config

"""The translation model (textattn/models/seq2seq.py) and pairs data (textattn/data/pairs.py):
causality, padding, cached decoding against the full decoder, greedy decoding, the pairs
loader and its splits."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from textattn import decoding
from textattn.data import pairs as pairs_lib
from textattn.data.splits import DataError
from textattn.models import seq2seq

CAUSAL = ["causal", "causal_additive", "causal_additive_recurrent"]
S, T = 6, 8


def small(decoder_attention, encoder_attention="softmax", **options):
  model = seq2seq.Seq2Seq(source_vocab=25 if options else 30, target_vocab=25, source_len=S,
                          target_len=T, embed_dim=16, num_heads=2, ffn_dim=32,
                          encoder_attention=encoder_attention,
                          decoder_attention=decoder_attention, **options)
  sources = jnp.array([[3, 4, 5, 6, 0, 0], [7, 8, 9, 10, 11, 12]])
  targets = jnp.array([[2, 5, 6, 7, 8, 9, 10, 11], [2, 12, 13, 0, 0, 0, 0, 0]])
  params = jax.jit(model.init)(jax.random.key(0), sources, targets)["params"]
  return model, params, sources, targets


@pytest.mark.parametrize("attention", CAUSAL)
def test_no_logit_depends_on_a_later_target_token(attention):
  model, params, sources, targets = small(attention)
  apply = jax.jit(model.apply)
  logits = apply({"params": params}, sources, targets)
  for t in range(T - 1):
    changed = targets.at[0, t + 1:].set((targets[0, t + 1:] + 3) % 25 + 1)
    again = apply({"params": params}, sources, changed)
    np.testing.assert_allclose(again[0, :t + 1], logits[0, :t + 1], rtol=1e-5, atol=1e-5)
    assert not np.allclose(again[0, t + 1:], logits[0, t + 1:])


@pytest.mark.parametrize("attention", CAUSAL)
def test_padding_on_either_side_changes_no_real_position(attention):
  model, params, sources, targets = small(attention, encoder_attention="additive")
  logits = jax.jit(model.apply)({"params": params}, sources, targets)
  wide = model.clone(source_len=S + 3, target_len=T + 2)
  wide_params = jax.tree.map(lambda x: x, params)
  for side, extra in (("source_embed", S + 3), ("target_embed", T + 2)):
    table = params[side]["position"]
    wide_params[side]["position"] = jnp.concatenate(
        [table, jnp.zeros((extra - table.shape[0], table.shape[1]))])
  padded = jax.jit(wide.apply)({"params": wide_params}, jnp.pad(sources, ((0, 0), (0, 3))),
                               jnp.pad(targets, ((0, 0), (0, 2))))
  real = np.asarray(targets != 0)
  np.testing.assert_allclose(np.asarray(padded[:, :T])[real], np.asarray(logits)[real],
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention, options", [(a, {}) for a in CAUSAL] + [
    ("causal", {"share_embeddings": True, "tie_output": True})])
def test_cached_decoding_steps_give_the_full_decoders_logits(attention, options):
  model, params, sources, targets = small(attention, **options)
  encode = jax.jit(lambda p, s: model.apply({"params": p}, s, method=seq2seq.Seq2Seq.encode))
  memory, memory_mask = encode(params, sources)
  decode = jax.jit(lambda p, t: model.apply({"params": p}, t, memory, memory_mask,
                                            method=seq2seq.Seq2Seq.decode))
  full = decode(params, targets[:1].repeat(2, 0))
  cache = jax.jit(lambda p: decoding.init_cache(model, p, memory, memory_mask))(params)
  step = jax.jit(lambda c, tok: decoding.decode_step(model, params, c, tok, memory, memory_mask))
  for t in range(T):
    logits, cache = step(cache, targets[:1, t].repeat(2, 0))
    np.testing.assert_allclose(logits, full[:, t], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attention", CAUSAL)
def test_greedy_decoding_with_and_without_the_cache_agree(attention):
  model, params, sources, _ = small(attention)
  decode = jax.jit(lambda p, s, cached: decoding.greedy_decode(model, p, s, 2, 9, cached=cached),
                   static_argnums=2)
  cached, uncached = decode(params, sources, True), decode(params, sources, False)
  np.testing.assert_array_equal(cached, uncached)
  for row in np.asarray(cached):  # nothing after a row's first [end]
    ends = np.flatnonzero(row == 9)
    if ends.size:
      assert not row[ends[0] + 1:].any()


def test_shared_and_tied_embeddings_compute_the_untied_model_with_one_table_copied_in():
  tied, tied_params, sources, targets = small("causal", share_embeddings=True, tie_output=True)
  untied, params, _, _ = small("causal", share_embeddings=False, tie_output=False)
  table = tied_params["token_table"]["embedding"]
  assert "token" not in tied_params["source_embed"] and "logits" not in tied_params
  params = {**params, "encoder_0": tied_params["encoder_0"], "decoder_0": tied_params["decoder_0"]}
  for side in ("source_embed", "target_embed"):
    params[side] = {"token": {"embedding": table}, "position": tied_params[side]["position"]}
  params["logits"] = {"kernel": table.T, "bias": tied_params["logits_bias"]}
  np.testing.assert_allclose(jax.jit(untied.apply)({"params": params}, sources, targets),
                             jax.jit(tied.apply)({"params": tied_params}, sources, targets),
                             rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="shared embeddings need one vocabulary; the source has "
                                       "30 entries, the target 25"):
    seq2seq.Seq2Seq(source_vocab=30, target_vocab=25, source_len=S, target_len=T,
                    share_embeddings=True).init(jax.random.key(0), sources, targets)


def test_a_non_causal_decoder_attention_is_refused_in_one_sentence():
  with pytest.raises(ValueError, match="decoder_attention='additive' is not a causal variant"):
    small("additive")


def test_pairs_loader_reads_tabs_quotes_blank_lines_and_non_ascii(tmp_path):
  path = tmp_path / "spa.txt"
  path.write_text('Go.\tVe.\n\n"Hi," he said.\t"Hola", dijo.\tCC-BY 2.0 (France)\n'
                  "Where's José?\t¿Dónde está José?\n", encoding="utf-8")
  pairs = pairs_lib.read_pairs(str(path))
  assert pairs.sources == ["Go.", '"Hi," he said.', "Where's José?"]
  assert pairs.targets[1] == '"Hola", dijo.'
  assert pairs_lib.standardize_source(pairs.sources[2]) == "wheres josé"
  assert pairs_lib.standardize_target(pairs.targets[2]) == "[start] dónde está josé [end]"
  bad = tmp_path / "bad.tsv"
  bad.write_text("one\ttwo\nno tab here\n", encoding="utf-8")
  with pytest.raises(DataError, match=r"bad.tsv, line 2: expected source<TAB>target"):
    pairs_lib.read_pairs(str(bad))
  jsonl = tmp_path / "p.jsonl"
  jsonl.write_text('{"en": "Hi.", "es": "Hola."}\n{"en": "", "es": "x"}\n', encoding="utf-8")
  with pytest.raises(DataError, match="line 2: a pair needs a non-empty source and target"):
    pairs_lib.read_pairs(str(jsonl), "en", "es")


def test_a_headered_pairs_csv_is_read_strictly(tmp_path):
  # An unquoted comma once shifted the columns silently ("Hello" translated as " world").
  path = tmp_path / "pairs.csv"
  path.write_text('id,en,es\n1,"Hello, world",Hola mundo\n,,\n   \n2,"two\nlines",dos\n',
                  encoding="utf-8")
  pairs = pairs_lib.read_pairs(str(path), "en", "es")
  assert pairs.sources == ["Hello, world", "two\nlines"] and pairs.targets == ["Hola mundo", "dos"]
  for content, message in [("id,en,es\n1,Hello, world,Hola mundo\n",
                            "pairs.csv, line 2: expected 3 fields"),
                           ("en,es,en\na,b,c\n", "column 'en' appears 2 times"),
                           ("english,es\na,b\n", "line 1: column(s) ['en'] not found")]:
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(message)):
      pairs_lib.read_pairs(str(path), "en", "es")


def test_pairs_loader_ends_lines_at_newlines_only(tmp_path):
  # str.splitlines would end a line at U+2028 / U+0085 inside a sentence and lose the pair.
  tsv = tmp_path / "odd.txt"
  tsv.write_text("a\u2028b\tc\u0085d\r\ne\tf\n", encoding="utf-8")
  pairs = pairs_lib.read_pairs(str(tsv))
  assert pairs.sources == ["a\u2028b", "e"] and pairs.targets == ["c\u0085d", "f"]
  jsonl = tmp_path / "odd.jsonl"
  jsonl.write_text('{"en": "x\u2028y", "es": "z"}\n[1]\n', encoding="utf-8")
  with pytest.raises(DataError, match="odd.jsonl, line 2: expected a JSON object, found list"):
    pairs_lib.read_pairs(str(jsonl), "en", "es")
  jsonl.write_text('{"en": "x\u2028y", "es": "z"}\n', encoding="utf-8")
  assert pairs_lib.read_pairs(str(jsonl), "en", "es").sources == ["x\u2028y"]


def test_splits_are_seeded_70_15_15_and_grouping_keeps_a_sources_translations_together():
  sources = [f"sentence {i // 3}" for i in range(300)]  # 100 sources, 3 translations each
  pairs = pairs_lib.Pairs(sources, [f"t{i}" for i in range(300)])
  plain = pairs_lib.split_indices(pairs, seed=0)
  assert [len(plain[s]) for s in pairs_lib.SPLITS] == [210, 45, 45]
  assert np.array_equal(np.sort(np.concatenate(list(plain.values()))), np.arange(300))
  leaks = {sources[i] for i in plain["test"]} & {sources[i] for i in plain["train"]}
  assert leaks  # the plain split shares sources between train and test
  grouped = pairs_lib.split_indices(pairs, seed=0, group_by_source=True)
  assert not {sources[i] for i in grouped["test"]} & {sources[i] for i in grouped["train"]}
  assert [len(grouped[s]) for s in pairs_lib.SPLITS] == [210, 45, 45]
  again = pairs_lib.split_indices(pairs, seed=0, group_by_source=True)
  assert all(np.array_equal(again[s], grouped[s]) for s in pairs_lib.SPLITS)


@pytest.mark.parametrize("attention", ["causal", "causal_additive_recurrent"])
def test_beam_of_one_without_length_penalty_is_greedy_and_a_beams_score_is_its_log_p(attention):
  model, params, sources, _ = small(attention)
  greedy = jax.jit(lambda p, s: decoding.greedy_decode(model, p, s, 2, 9))(params, sources)
  search = jax.jit(lambda p, s, k, a: decoding.beam_search(model, p, s, 2, 9, beam_size=k,
                                                           alpha=a), static_argnums=(2, 3))
  one, _ = search(params, sources, 1, 0.0)
  # Equal where greedy finishes; where it runs out of positions unfinished, beam search may
  # instead return a finished hypothesis it met on the way (it prefers finished ones).
  compared = [(g, o) for g, o in zip(np.asarray(greedy), np.asarray(one)) if 9 in g or 9 not in o]
  assert compared  # (not vacuous: this model has such rows for every decoder)
  for g, o in compared:
    np.testing.assert_array_equal(o, g)

  @jax.jit
  def log_prob(tokens):  # the model's log p of a decoded row (teacher-forced; id 0 excluded)
    full = jnp.concatenate([jnp.full((len(tokens), 1), 2), tokens], axis=1)[:, :T]
    logits = model.apply({"params": params}, sources, full)[:, :tokens.shape[1]]
    log_p = jax.nn.log_softmax(logits.at[..., 0].set(-1e9))
    picked = jnp.take_along_axis(log_p, tokens[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(tokens != 0, picked, 0.0), axis=1)

  # A wider beam's score is its output's own log p (alpha 0: no length penalty). (It need not
  # beat greedy: a finished hypothesis is preferred to an unfinished one, and beam search may
  # prune the greedy path.)
  four, scores = search(params, sources, 4, 0.0)
  np.testing.assert_allclose(scores, log_prob(four), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("alpha", [0.6, 0.0, -0.5])
def test_beam_search_stopping_early_returns_what_the_full_search_returns(alpha):
  model, params, _, _ = small("causal")
  sources = jax.random.randint(jax.random.key(1), (16, S), 0, 30)
  search = jax.jit(lambda p, stop: decoding.beam_search(model, p, sources, 2, 9, beam_size=3,
                                                        alpha=alpha, stop_early=stop),
                   static_argnums=1)
  for end_bias in (0.0, 2.0, 3.0, 5.0):  # from rarely to nearly always ending early
    biased = jax.tree.map(lambda x: x, params)
    biased["logits"]["bias"] = params["logits"]["bias"].at[9].add(end_bias)
    early, full = search(biased, True), search(biased, False)
    np.testing.assert_array_equal(early[0], full[0])
    np.testing.assert_allclose(early[1], full[1], rtol=1e-6)


def test_decoding_runs_as_many_positions_as_training_teaches():
  # Training's labels fill target_len positions (a target_len - 1 word sentence's [end] is the
  # last): decoding stopped one short, so beam search could never finish such a sentence.
  model, params, sources, _ = small("causal")
  assert decoding.greedy_decode(model, params, sources, 1, 2).shape == (2, T)
  assert decoding.greedy_decode(model, params, sources, 1, 2, cached=False).shape == (2, T)
  tokens, _ = decoding.beam_search(model, params, sources, 1, 2, beam_size=2)
  assert tokens.shape == (2, T)

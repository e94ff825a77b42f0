"""Errors stay one short sentence (issue 52): at most 300 characters, naming the problem and
where the allowed values are listed, never a library's paragraph. The benchmark's unknown
variant, an unreadable checkpoint (Orbax's exceptions run to 500 characters: only their type is
shown, the text goes to the debug log) and a directory given as a data file."""

import logging
import pathlib

import pytest

from textattn import checkpointing, defaults
from textattn.benchmark import plan
from textattn.data import file_source
from textattn.data.splits import DataError
from textattn.errors import RunError

LIMIT = 300
# What Orbax raises for damaged files is a paragraph; none of it may reach the user's sentence.
ORBAX_LIKE = ("Failed to restore item 'state': " + "tensorstore OUT_OF_RANGE error reading "
              "'ocdbt/d/abc' " * 12)


def one_sentence(error: Exception) -> str:
  text = str(error)
  assert len(text) <= LIMIT, (len(text), text)
  assert "\n" not in text and text.endswith("."), text
  return text


@pytest.mark.parametrize("name", ["softmax_flash", "no_such_attention"])
def test_an_unknown_variant_points_to_the_help_instead_of_listing_them(name):
  with pytest.raises(ValueError) as raised:
    plan.parse_variant(name)
  text = one_sentence(raised.value)
  assert f"{name!r} is not a known variant" in text
  assert "python -m textattn.benchmark --help" in text and "registry" in text


class FakeManager:
  def __init__(self, directory: pathlib.Path, steps):
    self.directory, self.steps = directory, steps

  def all_steps(self):
    return self.steps


def test_an_unreadable_checkpoint_names_its_path_and_the_exception_type_only(tmp_path, caplog):
  manager = FakeManager(tmp_path / "run" / "checkpoints", [10, 20])
  with caplog.at_level(logging.DEBUG):
    error = checkpointing._unreadable_checkpoint(manager, 20, ValueError(ORBAX_LIKE))
  assert isinstance(error, RunError)
  text = one_sentence(error)
  assert str(tmp_path / "run" / "checkpoints" / "20") in text and "cannot be read" in text
  assert "(ValueError)" in text and "tensorstore" not in text
  assert "resume from step 10" in text  # the way out
  assert "tensorstore" in caplog.text  # the full exception: in the debug log only
  # Without an older checkpoint the way out is a fresh start.
  assert "to start afresh" in one_sentence(
      checkpointing._unreadable_checkpoint(FakeManager(manager.directory, [20]), 20,
                                           OSError(ORBAX_LIKE)))


def test_unreadable_checkpoints_on_opening_are_one_short_sentence(tmp_path, monkeypatch):
  def damaged(*args, **kwargs):
    raise ValueError(ORBAX_LIKE)

  monkeypatch.setattr(checkpointing, "checkpoint_manager", damaged)
  with pytest.raises(RunError) as raised:
    checkpointing.open_manager(str(tmp_path / "run"), keep=2)
  text = one_sentence(raised.value)
  assert str(tmp_path / "run" / "checkpoints") in text and "cannot be read (ValueError)" in text
  assert "tensorstore" not in text


@pytest.mark.parametrize("field", ["dataset", "validation_file"])
def test_a_directory_given_as_a_data_file_is_called_a_directory(tmp_path, field):
  train = tmp_path / "train.jsonl"
  train.write_text('{"text": "good", "label": "pos"}\n{"text": "bad", "label": "neg"}\n')
  directory = tmp_path / "reviews.jsonl"  # a directory, though its name says otherwise
  directory.mkdir()
  config = defaults.complete(defaults.classification())
  config.dataset = str(directory if field == "dataset" else train)
  if field == "validation_file":
    config.source.validation_file = str(directory)
  with pytest.raises(DataError) as raised:
    file_source.FileSource(config).read(0.5, 0)
  text = one_sentence(raised.value)
  assert f"{directory}: is a directory" in text and "does not exist" not in text
  assert f"config.{field} must be" in text and ".csv/.tsv/.jsonl" in text


def test_a_missing_data_file_is_still_called_missing(tmp_path):
  config = defaults.complete(defaults.classification())
  config.dataset = str(tmp_path / "nope.csv")
  with pytest.raises(DataError) as raised:
    file_source.FileSource(config).read(0.5, 0)
  assert "nope.csv: file does not exist" in one_sentence(raised.value)

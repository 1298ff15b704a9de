"""Token ids a model cannot embed are a one-line error naming the samples, not an IndexError in the embedding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gptforge.data.gpt_dataset import build_gpt_datasets
from gptforge.data.indexed_writer import IndexedDatasetWriter
from gptforge.errors import GptforgeError
from gptforge.train.data import BatchReader, batch


def _train_set(tmp_path, docs):
    with IndexedDatasetWriter(tmp_path / "d", np.int32) as writer:
        writer.add_documents([np.asarray(d) for d in docs])
    train, _, _ = build_gpt_datasets(tmp_path / "d", seq_length=8, num_samples=(4, 0, 0), split="1",
                                     cache_dir=tmp_path / "c")
    return train


@pytest.mark.parametrize("bad,needle", [(5000, "token id 5000"), (-7, "token id -7")])
def test_ids_outside_the_vocabulary(tmp_path, bad, needle):
    train = _train_set(tmp_path, [[1, 2, 3, bad, 4, 5, 6, 7, 8, 9, 10] * 3])
    with pytest.raises(GptforgeError) as err:
        batch(train, 0, 4, torch.device("cpu"), vocab_size=100)
    assert needle in err.value.one_line() and "outside the tokenizer's vocabulary [0, 100)" in err.value.one_line()
    with pytest.raises(GptforgeError):
        BatchReader(train, 4, torch.device("cpu"), vocab_size=100).get(0)


def test_ids_inside_the_vocabulary_pass(tmp_path):
    train = _train_set(tmp_path, [list(range(100)) * 2])
    x, y = batch(train, 0, 4, torch.device("cpu"), vocab_size=100)
    assert x.shape == (4, 8) and int(y.max()) < 100

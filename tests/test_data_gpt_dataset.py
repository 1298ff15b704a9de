"""GPT datasets: splits, sample contents, epochs, cached indices, blending, the default corpus."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from gptforge.data.default_corpus import corpus_documents, prepare_default
from gptforge.data.gpt_dataset import build_gpt_datasets, build_indices, parse_split, split_ranges
from gptforge.data.indexed import IndexedDataset
from gptforge.data.indexed_writer import IndexedDatasetWriter
from gptforge.data.tokenizer import load_tokenizer
from gptforge.errors import UsageError


def _dataset(path, lengths, dtype=np.uint16):
    """Documents whose tokens encode (document id, position) so a sample's origin is readable."""
    docs = []
    start = 0
    for n in lengths:
        docs.append(np.arange(start, start + n) % 60000)
        start += n
    with IndexedDatasetWriter(path, dtype) as writer:
        writer.add_documents(docs)
    return path


def test_split_is_contiguous_document_ranges():
    flat = [x for bookend in parse_split("949,50,1") for x in bookend]
    assert flat == pytest.approx([0, 0.949, 0.949, 0.999, 0.999, 1.0])
    assert split_ranges(1000, "949,50,1") == [range(0, 949), range(949, 999), range(999, 1000)]
    assert split_ranges(10, "100,0,0") == [range(0, 10), None, None]
    assert split_ranges(10, "8,2") == [range(0, 8), range(8, 10), None]
    with pytest.raises(UsageError):
        parse_split("0,0,0")


def test_samples_are_windows_of_the_split_documents(tmp_path):
    lengths = [int(x) for x in np.random.default_rng(3).integers(5, 300, size=200)]
    prefix = _dataset(tmp_path / "d", lengths)
    train, valid, test = build_gpt_datasets(prefix, split="90,10,0", seq_length=64, num_samples=(500, 40, 0),
                                            cache_dir=tmp_path / "cache")
    assert test is None
    assert len(train) == 500 and len(valid) == 40
    boundaries = np.cumsum([0] + lengths)
    train_tokens = set(range(boundaries[0], boundaries[180]))
    valid_tokens = set(range(boundaries[180], boundaries[200]))
    for ds, allowed in ((train, train_tokens), (valid, valid_tokens)):
        for i in range(len(ds)):
            sample = ds[i]
            assert sample.dtype == np.int64 and sample.shape == (65,)
            assert set(sample.tolist()) <= allowed
    # consecutive samples (before shuffling) share one token: sample index rows step by seq_length
    rows = np.asarray(train.sample_index)
    assert rows.shape[1] == 2 and rows[0].tolist() == [0, 0]


def test_epochs_repeat_until_num_samples(tmp_path):
    prefix = _dataset(tmp_path / "small", [10, 20, 30])  # 60 tokens: under one sample of 128 per epoch
    train, _, _ = build_gpt_datasets(prefix, split="1,0,0", seq_length=128, num_samples=(50, 0, 0), cache_dir=tmp_path / "c")
    assert len(train) == 50
    seen = np.concatenate([train[i] for i in range(50)])
    assert set(seen.tolist()) == set(range(60))  # every token appears, many times over
    with pytest.raises(IndexError):
        train[50]


@pytest.mark.parametrize("num_samples, passes", [(37, 37 / 111), (111, 1.0), (333, 3.0)])
def test_passes_counts_how_often_the_samples_go_over_the_split(tmp_path, num_samples, passes):
    prefix = _dataset(tmp_path / "d", [100] * 10)  # 1000 tokens: (1000 - 1) // 9 = 111 samples of 9 per epoch
    train, _, _ = build_gpt_datasets(prefix, split="1,0,0", seq_length=9, num_samples=(num_samples, 0, 0),
                                     cache_dir=tmp_path / "c")
    assert train.passes == pytest.approx(passes, rel=0.01)
    again, _, _ = build_gpt_datasets(prefix, split="1,0,0", seq_length=9, num_samples=(num_samples, 0, 0),
                                     cache_dir=tmp_path / "c")
    assert again.passes == train.passes  # read back from the cached indices alike


def test_indices_are_cached_and_reused(tmp_path):
    prefix = _dataset(tmp_path / "d", [50] * 1000)
    kw = dict(split="949,50,1", seq_length=32, num_samples=(100, 10, 1), cache_dir=tmp_path / "cache")
    first = build_gpt_datasets(prefix, **kw)
    files = sorted((tmp_path / "cache").glob("*.npy"))
    assert len(files) == 9  # three arrays for each of the three splits
    stamps = {f: f.stat().st_mtime_ns for f in files}
    second = build_gpt_datasets(prefix, **kw)
    assert {f: f.stat().st_mtime_ns for f in files} == stamps
    assert all(np.array_equal(a[i], b[i]) for a, b in zip(first, second) for i in range(len(a)))
    assert isinstance(second[0].shuffle_index, np.memmap)
    description = next((tmp_path / "cache").glob("*-train-description.txt")).read_text()
    assert json.loads(description)["num_samples"] == 100
    build_gpt_datasets(prefix, **{**kw, "seed": 99})  # another seed: another cache entry
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 18


def _truncated(path):
    path.write_bytes(path.read_bytes()[:100])


def _objects(path):
    with open(path, "wb") as f:
        np.save(f, np.array([object()]), allow_pickle=True)


def _out_of_range(path):
    with open(path, "wb") as f:
        np.save(f, np.full(200, 10**9, np.int64))


@pytest.mark.parametrize("damage", [_truncated, _objects, _out_of_range, lambda p: (p.unlink(), os.mkfifo(p))],
                         ids=["truncated", "python-objects", "out-of-range", "fifo"])
def test_a_damaged_cached_index_is_built_again(tmp_path, damage):
    """Not a traceback, nor a wait on a FIFO: the cache entry is built again, with the same samples."""
    prefix = _dataset(tmp_path / "d", [50] * 100)
    kw = dict(split="1,0,0", seq_length=32, num_samples=(100, 0, 0), cache_dir=tmp_path / "cache")
    first, _, _ = build_gpt_datasets(prefix, **kw)
    samples = [first[i].copy() for i in range(len(first))]  # read before the damage: the arrays are memory maps
    shuffle = next((tmp_path / "cache").glob("*-train-shuffle_index.npy"))
    damage(shuffle)
    again, _, _ = build_gpt_datasets(prefix, **kw)
    assert shuffle.is_file() and all(np.array_equal(samples[i], again[i]) for i in range(len(samples)))


def _offset_past_a_short_document(index):
    index[1, 1] = 199  # documents are 20 or 200 tokens: inside the longest, past a short one
    return index


def _a_sample_one_token_long(index):
    index[2, 1] += 1 if index[2, 1] + 1 < 20 else -1
    return index


@pytest.mark.parametrize("change", [_offset_past_a_short_document, _a_sample_one_token_long])
def test_a_crafted_sample_index_within_the_bounds_is_built_again(tmp_path, change):
    """Offsets are checked against their own document and every sample's length, not the longest document."""
    prefix = _dataset(tmp_path / "d", [20, 200] * 50)
    kw = dict(split="1,0,0", seq_length=16, num_samples=(100, 0, 0), cache_dir=tmp_path / "cache")
    first, _, _ = build_gpt_datasets(prefix, **kw)
    samples = [first[i].copy() for i in range(len(first))]
    path = next((tmp_path / "cache").glob("*-train-sample_index.npy"))
    crafted = change(np.load(path).copy())
    with open(path, "wb") as f:
        np.save(f, crafted)
    again, _, _ = build_gpt_datasets(prefix, **kw)
    assert all(np.array_equal(samples[i], again[i]) for i in range(len(samples)))
    assert not np.array_equal(np.load(path), crafted)


def test_seed_changes_order_not_content(tmp_path):
    prefix = _dataset(tmp_path / "d", [40] * 50)
    a, _, _ = build_gpt_datasets(prefix, split="1,0,0", seq_length=16, num_samples=(100, 0, 0), seed=1, cache_dir=tmp_path / "c")
    b, _, _ = build_gpt_datasets(prefix, split="1,0,0", seq_length=16, num_samples=(100, 0, 0), seed=2, cache_dir=tmp_path / "c")
    assert any(not np.array_equal(a[i], b[i]) for i in range(100))


def test_empty_split_or_zero_samples_is_none(tmp_path):
    prefix = _dataset(tmp_path / "d", [30] * 5)  # 5 documents: round(0.999 * 5) leaves test empty
    train, valid, test = build_gpt_datasets(prefix, seq_length=8, num_samples=(10, 0, 10), cache_dir=tmp_path / "c")
    assert train is not None and valid is None and test is None


@pytest.mark.parametrize("split", ["nan,1,1", "inf,1,1", "1,x", "-1,1,1", "1,1,1,1", "0,0,0"])
def test_split_strings_that_are_not_finite_weights(split):
    """'nan,1,1' used to read as '1,1' (the number pattern skipped what it did not match)."""
    with pytest.raises(UsageError, match="--split"):
        parse_split(split)


def test_float_token_files_are_refused(tmp_path):
    """Megatron's format allows float64; token ids are integers and are not cast silently."""
    prefix = _dataset(tmp_path / "f", [30] * 5, dtype=np.float64)
    with pytest.raises(UsageError, match="holds float64 values, not integer token ids"):
        build_gpt_datasets(prefix, seq_length=8, num_samples=(10, 1, 0), cache_dir=tmp_path / "c")
    with pytest.raises(UsageError, match="holds float64 values"):
        build_gpt_datasets([_dataset(tmp_path / "u", [30] * 5), prefix], [0.5, 0.5], seq_length=8,
                           num_samples=(10, 1, 0), cache_dir=tmp_path / "c")


def test_empty_dataset_is_named(tmp_path):
    """Used to read 'weights [0.0] must be >= 0 and not all 0'."""
    prefix = _dataset(tmp_path / "e", [0] * 4)
    with pytest.raises(UsageError, match=r"e holds no tokens \(4 documents, all empty\)"):
        build_gpt_datasets(prefix, seq_length=8, num_samples=(10, 1, 0), cache_dir=tmp_path / "c")


def test_index_larger_than_memory_is_refused_before_allocating():
    """1e8 steps x batch 16 used to die in a 47 GiB MemoryError (or the OOM killer) building the index."""
    lengths = np.full(10, 100, dtype=np.int32)
    with pytest.raises(UsageError, match=r"the sample index for 10,000,000,000,000 samples of 64 tokens needs [\d,.]+ GiB, "
                                          r"more than this machine's"):
        build_indices(lengths, np.arange(10, dtype=np.int32), 10**13, 64, seed=1)


def test_blending_follows_weights(tmp_path):
    a = _dataset(tmp_path / "a", [100] * 100)
    b = _dataset(tmp_path / "b", [100] * 100)
    # shift b's tokens so the source of each sample is visible
    ds_b = IndexedDataset(b)
    with IndexedDatasetWriter(tmp_path / "b2", np.uint16) as writer:
        writer.add_documents([ds_b.document(k) + 30000 for k in range(ds_b.num_documents)])
    train, valid, _ = build_gpt_datasets([a, tmp_path / "b2"], [0.25, 0.75], split="9,1,0", seq_length=32,
                                         num_samples=(400, 40, 0), cache_dir=tmp_path / "c")
    assert len(train) == 400 and len(valid) == 40
    from_b = sum(1 for i in range(len(train)) if train[i][0] >= 30000)
    assert from_b == 300
    with pytest.raises(UsageError, match="weights"):
        build_gpt_datasets([a, b], [1.0], seq_length=32, num_samples=(1, 0, 0), cache_dir=tmp_path / "c")


def test_a_blend_reports_its_most_repeated_dataset(tmp_path):
    small, large = _dataset(tmp_path / "s", [50] * 4), _dataset(tmp_path / "l", [100] * 100)
    train, _, _ = build_gpt_datasets([small, large], [0.5, 0.5], split="1,0,0", seq_length=16,
                                     num_samples=(200, 0, 0), cache_dir=tmp_path / "c")
    assert train.passes == max(ds.passes for ds in train.datasets) and train.passes > 5  # 100 samples of 12 per pass


# What a build of the default corpus writes, relative to its directory
BUILT_FILES = ["stdlib_docs_text_document.bin", "stdlib_docs_text_document.idx", "tokenizer/vocab.json",
               "tokenizer/merges.txt"]


VOCAB = 2048  # gpt2-tiny's default-vocab-size


@pytest.fixture(scope="module")
def default_corpus(train_data_cache):
    """The embedded corpus where the session's gpt2-tiny runs find it (train/data.py names the directory): built once
    for the tests below and those runs (each build takes seconds)."""
    return prepare_default(train_data_cache / f"default-{VOCAB}", vocab_size=VOCAB)


def test_default_corpus_holds_every_document_in_its_own_tokenizer(default_corpus, tmp_path):
    manifest = json.loads((default_corpus.prefix.parent / "manifest.json").read_text())
    assert manifest["python"] and manifest["documents"] > 500 and manifest["tokens"] > 100_000
    assert default_corpus.prefix.name == "stdlib_docs_text_document"
    tok = load_tokenizer("bytelevel", tokenizer_dir=default_corpus.tokenizer_dir)
    assert tok.vocab_size == VOCAB and tok.eod_id == manifest["eod_id"]
    ds = IndexedDataset(default_corpus.prefix)
    docs = list(corpus_documents())
    assert ds.num_documents == len(docs)
    assert tok.decode(ds.document(0).tolist()) == docs[0] + "<|endoftext|>"
    train, valid, test = build_gpt_datasets(default_corpus.prefix, seq_length=256, num_samples=(64, 8, 8),
                                            cache_dir=tmp_path / "c")
    assert train[0].max() < tok.vocab_size


def test_default_corpus_is_cached(default_corpus):
    out_dir = default_corpus.prefix.parent
    stamp = os.stat(default_corpus.bin).st_mtime_ns
    again = prepare_default(out_dir, vocab_size=VOCAB)
    assert again.prefix == default_corpus.prefix and os.stat(default_corpus.bin).st_mtime_ns == stamp
    with pytest.raises(Exception, match="fewer than one sequence"):
        prepare_default(out_dir, vocab_size=VOCAB, seq_hint=10**9)


def test_default_corpus_is_deterministic_and_a_truncated_file_is_built_again(default_corpus, tmp_path):
    """A truncated cached file used to fail later with "re-run gptforge prepare". Built again in another
    directory, from the corpus text to a newly trained tokenizer, it gives the first build's bytes."""
    copy = tmp_path / "copy"
    shutil.copytree(default_corpus.prefix.parent, copy)
    first = {name: (default_corpus.prefix.parent / name).read_bytes() for name in BUILT_FILES}
    trained_at = (copy / "tokenizer" / "vocab.json").stat().st_mtime_ns  # copytree keeps the first build's time
    with open(copy / "stdlib_docs_text_document.bin", "r+b") as f:
        f.truncate(len(first["stdlib_docs_text_document.bin"]) // 2)
    rebuilt = prepare_default(copy, vocab_size=VOCAB)
    assert rebuilt.prefix == copy / "stdlib_docs_text_document"
    assert (copy / "tokenizer" / "vocab.json").stat().st_mtime_ns != trained_at  # a genuine second build
    for name in BUILT_FILES:
        assert (copy / name).read_bytes() == first[name], name
    assert IndexedDataset(rebuilt.prefix).num_tokens > 0


@pytest.mark.parametrize("manifest", [b"[" * 100_000 + b"]" * 100_000, b"[1]", b"\xff\xfe", "file_bytes", "tokens", None],
                         ids=["deep", "a-list", "not-utf8", "sizes-a-list", "tokens-a-string", "fifo"])
def test_a_damaged_default_corpus_manifest_is_a_miss(default_corpus, tmp_path, manifest):
    """The cache's manifest is read through the bounded reader: damage means build again, never a traceback."""
    from gptforge.data.default_corpus import _cached, _expected_manifest

    copy = tmp_path / "copy"
    shutil.copytree(default_corpus.prefix.parent, copy)
    assert _cached(copy, _expected_manifest(VOCAB)) is not None
    if isinstance(manifest, str):  # the right keys, one of them of the wrong kind
        manifest = json.dumps({**json.loads((copy / "manifest.json").read_text()), manifest: ["x"]}).encode()
    (copy / "manifest.json").unlink()
    os.mkfifo(copy / "manifest.json") if manifest is None else (copy / "manifest.json").write_bytes(manifest)
    assert _cached(copy, _expected_manifest(VOCAB)) is None


def test_cli_default_corpus_and_inspect(cli, default_corpus):
    """The command on the corpus built above (the build itself: the tests above)."""
    proc = cli("prepare", "--default-corpus", str(default_corpus.prefix.parent), "--vocab-size", str(VOCAB), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["prefix"] == str(default_corpus.prefix)
    inspect = json.loads(cli("data", "inspect", report["prefix"], "--json").stdout)
    assert inspect["documents"] == report["documents"] and inspect["tokens"] == report["tokens"]
    assert inspect["dtype"] == "uint16" and inspect["max_token"] < VOCAB


def test_cli_merge(cli, tmp_path):
    _dataset(tmp_path / "a", [5, 6])
    _dataset(tmp_path / "b", [7])
    proc = cli("data", "merge", "--input", str(tmp_path / "a"), str(tmp_path / "b"), "--output-prefix", str(tmp_path / "m"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"prefix": str(tmp_path / "m"), "documents": 3, "sequences": 3, "tokens": 18}
    merged = IndexedDataset(tmp_path / "m")
    assert merged.document(2).tolist() == IndexedDataset(tmp_path / "b").document(0).tolist()

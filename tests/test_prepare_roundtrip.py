"""prepare -> .bin/.idx -> read back: every document equals its tokenization; inspect agrees."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import examples
from gptforge.data.indexed import IndexedDataset
from gptforge.data.prepare import prepare
from gptforge.data.summary import summarize
from gptforge.data.tokenizer import load_tokenizer, train_bytelevel


TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)
DOCUMENT = st.one_of(
    st.just(""),
    TEXT,
    st.sampled_from(["naïve café", "日本語のテキスト", "emoji 🎉🧪 mix", "tabs\tand\nnewlines\r\n", " <|endoftext|> "]),
    st.tuples(TEXT, st.integers(200, 2000)).map(lambda t: (t[0] or "long ") * t[1]),  # very long
    st.sampled_from(["a", " ", ".", "\n", "0"]),  # tiny
)
CORPUS = st.lists(DOCUMENT, min_size=1, max_size=40).filter(lambda docs: any(docs))


def _write_jsonl(path: Path, docs: list[str]) -> None:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")


def _check_round_trip(prefix: Path, docs: list[str], tok, append_eod: bool) -> None:
    ds = IndexedDataset(prefix)
    assert ds.num_documents == len(docs)
    for k, doc in enumerate(docs):
        expected = tok.encode(doc) + ([tok.eod_id] if doc and append_eod else [])
        got = ds.document(k)
        assert got.tolist() == expected, f"document {k} differs"
        if expected:  # a view of the memory map, not a copy
            assert not got.flags.owndata
    summary = summarize(prefix)
    assert summary.documents == len(docs)
    assert summary.empty_documents == sum(1 for d in docs if not d)
    assert summary.sequences == len(ds)
    assert summary.tokens == sum(len(tok.encode(d)) + (1 if d and append_eod else 0) for d in docs)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=CORPUS, append_eod=st.booleans(), chunked=st.booleans())
def test_gpt2_round_trip(tmp_path_factory, docs, append_eod, chunked):
    tmp = tmp_path_factory.mktemp("rt")
    corpus = tmp / "corpus.jsonl"
    _write_jsonl(corpus, docs)
    tok = load_tokenizer("gpt2")
    if chunked:  # several inputs are read in order
        half = len(docs) // 2
        _write_jsonl(corpus, docs[:half])
        _write_jsonl(tmp / "more.jsonl", docs[half:])
        inputs = [corpus, tmp / "more.jsonl"]
    else:
        inputs = [corpus]
    result = prepare(inputs, tmp / "out", tokenizer="gpt2", append_eod=append_eod, progress=False)
    assert result.documents == len(docs)
    _check_round_trip(result.prefixes["text"], docs, tok, append_eod)
    assert list(tmp.glob("*.partial-*")) == []


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=CORPUS)
def test_bytelevel_round_trip_with_trained_tokenizer(tmp_path_factory, docs):
    tmp = tmp_path_factory.mktemp("bl")
    corpus = tmp / "corpus.jsonl"
    _write_jsonl(corpus, docs)
    result = prepare([corpus], tmp / "out", tokenizer="bytelevel", vocab_size=300, append_eod=True, progress=False)
    tok = load_tokenizer("bytelevel", tokenizer_dir=result.tokenizer_dir)
    assert result.tokenizer_dir == tmp / "out_tokenizer"
    _check_round_trip(result.prefixes["text"], docs, tok, True)
    for doc in docs:
        assert tok.decode(tok.encode(doc)) == doc


def test_many_tiny_documents(tmp_path):
    docs = [chr(ord("a") + i % 26) if i % 7 else "" for i in range(5000)]
    _write_jsonl(tmp_path / "tiny.jsonl", docs)
    result = prepare([tmp_path / "tiny.jsonl"], tmp_path / "tiny", append_eod=True, workers=2, progress=False)
    _check_round_trip(result.prefixes["text"], docs, load_tokenizer("gpt2"), True)


def test_workers_do_not_change_the_output(tmp_path):
    docs = [f"document {i} " + "word " * (i % 50) for i in range(2000)] + ["", "last"]
    _write_jsonl(tmp_path / "c.jsonl", docs)
    one = prepare([tmp_path / "c.jsonl"], tmp_path / "one", append_eod=True, workers=1, progress=False)
    two = prepare([tmp_path / "c.jsonl"], tmp_path / "two", append_eod=True, workers=2, progress=False)
    for suffix in (".bin", ".idx"):
        a = Path(f"{one.prefixes['text']}{suffix}").read_bytes()
        b = Path(f"{two.prefixes['text']}{suffix}").read_bytes()
        assert a == b


def test_parquet_and_text_inputs(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    docs = ["first parquet row", "", "third row with ünïcode"]
    pq.write_table(pa.table({"text": docs, "title": ["a", "b", "c"]}), tmp_path / "wiki.parquet")
    (tmp_path / "a.txt").write_text("a whole file\nis one document\n")
    tok = load_tokenizer("gpt2")
    res = prepare([tmp_path / "wiki.parquet"], tmp_path / "pq", json_keys=["text", "title"], progress=False)
    _check_round_trip(res.prefixes["text"], docs, tok, False)
    _check_round_trip(res.prefixes["title"], ["a", "b", "c"], tok, False)
    assert res.prefixes["title"] == tmp_path / "pq_title_document"
    res = prepare([tmp_path / "a.txt"], tmp_path / "txt", progress=False)
    _check_round_trip(res.prefixes["text"], ["a whole file\nis one document\n"], tok, False)


def test_dtype_follows_vocabulary_size(tmp_path):
    _write_jsonl(tmp_path / "c.jsonl", ["some text"])
    assert IndexedDataset(prepare([tmp_path / "c.jsonl"], tmp_path / "g", progress=False).prefixes["text"]).dtype == np.uint16
    # a vocabulary of >= 65500 tokens is stored as int32, as Megatron's DType.optimal_dtype does
    from gptforge.data.indexed import optimal_dtype

    assert optimal_dtype(65499) == np.uint16 and optimal_dtype(65500) == np.int32 and optimal_dtype(128256) == np.int32


def test_trained_tokenizer_is_deterministic(tmp_path):
    texts = [f"The quick brown fox {i} jumps over the lazy dog." for i in range(300)]
    a = train_bytelevel(texts, tmp_path / "a", vocab_size=400)
    b = train_bytelevel(texts, tmp_path / "b", vocab_size=400)
    assert (tmp_path / "a" / "merges.txt").read_bytes() == (tmp_path / "b" / "merges.txt").read_bytes()
    assert a.vocab_size == b.vocab_size <= 400 and a.eod_id == 0  # vocab_size is an upper bound

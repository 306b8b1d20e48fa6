"""tollgate.count_tokens: every estimator the Rust crate has, and OpenAI's counts equal to
tiktoken's on the same vocabulary (tiktoken's encoding built from the local file: these
machines can't download tiktoken's own)."""

import pytest

import local_tiktoken
import tollgate
from conftest import ROOT, tokenizers, vocabulary

DATA = ROOT / "estimators" / "tests" / "data"

EDGES = [
    "",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\nnew\r\nlines\n\n\n",
    "it's they'll we've I'M CAN'T",
    "1234567890 3.14159 -42 1e10",
    "Café naïve Ωμέγα Привет e\u0301",
    "中文字符 日本語のテキスト 한국어",
    "🦀👩\u200d👧 emoji ✨",
    "<|endoftext|> <|im_start|> special-looking text",
    "a" * 5000,
    " " * 300 + "x",
    "def f(x):\n    return x ** 2  # code\n",
]


def texts():
    for path in sorted(DATA.glob("*.txt")):
        yield path.name, path.read_text(encoding="utf-8")
    for i, text in enumerate(EDGES):
        yield f"edge{i}", text


def local(name: str):
    pytest.importorskip("tiktoken")
    return local_tiktoken.encoding(name, vocabulary(name))


@pytest.fixture(scope="module")
def o200k_encoding():
    return local("o200k_base")


def test_openai_counts_equal_tiktokens_on_the_same_vocabulary(o200k_encoding):
    counted = 0
    for name, text in texts():
        expected = len(o200k_encoding.encode_ordinary(text))
        assert tollgate.count_tokens(text) == expected, name
        assert tollgate.count_tokens(text, "tiktoken:o200k_base") == expected, name
        assert tollgate.count_tokens(text, "openai:gpt-4o") == expected, name
        counted += expected
    # Every text was counted, the four files of estimators/tests/data among them.
    assert counted == 6366


def test_cl100k_counts_equal_tiktokens():
    encoding = local("cl100k_base")
    for name, text in texts():
        assert tollgate.count_tokens(text, "tiktoken:cl100k_base") == len(encoding.encode_ordinary(text)), name
        assert tollgate.count_tokens(text, "openai:gpt-4") == len(encoding.encode_ordinary(text)), name


def test_a_hugging_face_tokenizer_file_counts_like_its_vocabulary():
    gpt4o = tokenizers() / "gpt-4o" / "tokenizer.json"
    qwen3 = tokenizers() / "qwen3" / "tokenizer.json"
    for name, text in texts():
        # The gpt-4o tokenizer.json is o200k_base; qwen3's is voyage-3's vocabulary.
        assert tollgate.count_tokens(text, f"hf:{gpt4o}") == tollgate.count_tokens(text, "openai"), name
        assert tollgate.count_tokens(text, f"hf:{qwen3}") == tollgate.count_tokens(text, "voyageai"), name


def test_a_wordpiece_file_with_truncation_and_padding_counts_every_token():
    minilm = tokenizers() / "all-MiniLM-L6-v2" / "tokenizer.json"
    long_text = "rate limits keep agents polite " * 100
    assert tollgate.count_tokens(long_text, f"hf:{minilm}") > 128
    assert tollgate.count_tokens("hello world", f"hf:{minilm}") < 128


def test_words_needs_no_vocabulary_and_errs_high(o200k_encoding):
    text = (DATA / "english.txt").read_text(encoding="utf-8")
    assert tollgate.count_tokens(text, "words") >= len(o200k_encoding.encode_ordinary(text))


@pytest.mark.parametrize("name, message", [
    ("nonsense", "unknown estimator `nonsense`"),
    ("tiktoken:o300k", "unknown encoding `o300k`"),
    ("openai:not-a-model", "knows no encoding for model `not-a-model`"),
    ("hf:/no/such/tokenizer.json", "could not load `/no/such/tokenizer.json`"),
])
def test_an_estimator_that_cant_be_had_is_a_value_error(name, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        tollgate.count_tokens("text", name)


def test_count_tokens_takes_only_text():
    with pytest.raises(TypeError):
        tollgate.count_tokens(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        tollgate.count_tokens(None)  # type: ignore[arg-type]


def test_lone_surrogates_are_refused_not_a_crash():
    with pytest.raises(UnicodeEncodeError):
        tollgate.count_tokens("\ud800")


def test_estimate_counts_a_chat_body_as_openai_bills_it():
    body = {"model": "gpt-4o", "max_tokens": 256, "n": 2,
            "messages": [{"role": "user", "content": "Hello, world!"}]}
    # 3 per message + "user" (1) + the content (4) + 3 for the reply's priming.
    assert tollgate.estimate(body) == (11, 512)


def test_arguments_nested_past_128_levels_are_refused():
    deep: list = []
    node = deep
    for _ in range(200):
        node.append([])
        node = node[0]
    with pytest.raises(ValueError, match="deeper than 128"):
        tollgate.estimate(deep)
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(ValueError):
        tollgate.estimate(cycle)

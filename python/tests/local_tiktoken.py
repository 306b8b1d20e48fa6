"""tiktoken's encodings built from local vocabulary files (tiktoken would download them, and
these machines can't): the patterns and special tokens of `tiktoken_ext.openai_public`, with
the ranks read from the files the tiktoken-rs crate carries (the Rust estimators' own)."""

import json
import subprocess
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]

O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
CL100K_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""

P50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""

ENCODINGS = {
    "p50k_base": (P50K_PATTERN, {"<|endoftext|>": 50256}),
    "o200k_base": (O200K_PATTERN, {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}),
    "cl100k_base": (CL100K_PATTERN, {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258,
                                     "<|fim_middle|>": 100259, "<|fim_suffix|>": 100260,
                                     "<|endofprompt|>": 100276}),
}


def vocabulary_file(name: str) -> Optional[Path]:
    """`name.tiktoken` from the tiktoken-rs crate in the cargo registry, or None."""
    metadata = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--manifest-path", str(ROOT / "Cargo.toml")],
        check=True, capture_output=True, text=True).stdout
    for package in json.loads(metadata)["packages"]:
        if package["name"] == "tiktoken-rs":
            path = Path(package["manifest_path"]).parent / "assets" / f"{name}.tiktoken"
            if path.exists():
                return path
    return None


def encoding(name: str, path: Path):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    pattern, specials = ENCODINGS[name]
    return tiktoken.Encoding(name=f"{name}-local", pat_str=pattern,
                             mergeable_ranks=load_tiktoken_bpe(str(path)), special_tokens=specials)

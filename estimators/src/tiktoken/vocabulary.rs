//! Counting the tokens of a text in one of OpenAI's vocabularies without encoding it: no token
//! vector, no allocation, nothing shared to wait on.
//!
//! A text is cut into pieces ([`Pieces`]); a piece that is itself a token (most words of most
//! texts) counts one after a hash lookup, as in tiktoken. Another short piece is merged by
//! tiktoken's own rule (the pair of lowest rank first, until no pair is a token) in an array
//! on the stack. A long piece goes to bpe-openai's linear-time encoder, so a megabyte without
//! a space costs what it costs tiktoken's merge to do a word, times its length, not its
//! square.

use std::collections::HashMap;
use std::sync::LazyLock;

use rustc_hash::FxBuildHasher;

use super::pieces::{Pieces, Rules};

/// Pieces shorter than this are merged on the stack; longer ones by bpe-openai's encoder.
const SHORT: usize = 128;

/// One vocabulary, ready to count with.
pub(super) struct Vocabulary {
    /// Every token's bytes → its rank (its id: tiktoken merges lower ranks first).
    ranks: HashMap<&'static [u8], u32, FxBuildHasher>,
    /// The rank of each two-byte token, by its two bytes (`u32::MAX`: none), the first step
    /// of every merge.
    pairs: Box<[u32]>,
    pieces: Pieces,
    /// The same vocabulary in bpe-openai, for long pieces.
    long: &'static bpe_openai::Tokenizer,
}

/// `o200k_base`, loaded on first use.
pub(super) static O200K_BASE: LazyLock<Vocabulary> =
    LazyLock::new(|| Vocabulary::new(bpe_openai::o200k_base(), Rules::O200k));

/// `cl100k_base`, loaded on first use.
pub(super) static CL100K_BASE: LazyLock<Vocabulary> =
    LazyLock::new(|| Vocabulary::new(bpe_openai::cl100k_base(), Rules::Cl100k));

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocabulary")
            .field("tokens", &self.ranks.len())
            .finish_non_exhaustive()
    }
}

impl Vocabulary {
    /// The vocabulary of bpe-openai's `tokenizer`, whose token ids are tiktoken's ranks (both
    /// are the line numbers of the same `.tiktoken` file; the tests compare every count with
    /// tiktoken-rs's).
    fn new(tokenizer: &'static bpe_openai::Tokenizer, rules: Rules) -> Vocabulary {
        let bpe = &tokenizer.bpe;
        let tokens = bpe.num_tokens();
        let mut ranks = HashMap::with_capacity_and_hasher(tokens, FxBuildHasher);
        let mut pairs = vec![u32::MAX; 1 << 16].into_boxed_slice();
        for id in 0..tokens as u32 {
            let bytes = bpe.token_bytes(id);
            ranks.insert(bytes, id);
            if let [first, second] = bytes {
                pairs[usize::from(*first) << 8 | usize::from(*second)] = id;
            }
        }
        Vocabulary {
            ranks,
            pairs,
            pieces: Pieces::new(rules),
            long: tokenizer,
        }
    }

    /// The number of tokens `encode_ordinary(text)` gives.
    pub(super) fn count(&self, text: &str) -> usize {
        let mut count = 0;
        self.pieces
            .each(text, |piece| count += self.count_piece(piece));
        count
    }

    #[inline]
    fn count_piece(&self, piece: &[u8]) -> usize {
        if piece.len() < 2 || self.ranks.contains_key(piece) {
            1
        } else if piece.len() < SHORT {
            self.merge(piece)
        } else {
            self.long.bpe.count(piece)
        }
    }

    #[inline(always)]
    fn rank(&self, bytes: &[u8]) -> u32 {
        match bytes {
            [first, second] => self.pairs[usize::from(*first) << 8 | usize::from(*second)],
            _ => self.ranks.get(bytes).copied().unwrap_or(u32::MAX),
        }
    }

    /// tiktoken's `_byte_pair_merge` on a piece of 2 to `SHORT - 1` bytes, in an array: the
    /// number of tokens it leaves.
    fn merge(&self, piece: &[u8]) -> usize {
        debug_assert!((2..SHORT).contains(&piece.len()));
        // (start, rank of the pair that starts there), as tiktoken keeps them.
        let mut parts = [(0u32, u32::MAX); SHORT + 1];
        let mut len = piece.len() + 1;
        let mut min = (u32::MAX, usize::MAX);
        for i in 0..piece.len() - 1 {
            let rank = self.rank(&piece[i..i + 2]);
            if rank < min.0 {
                min = (rank, i);
            }
            parts[i] = (i as u32, rank);
        }
        parts[piece.len() - 1] = (piece.len() as u32 - 1, u32::MAX);
        parts[piece.len()] = (piece.len() as u32, u32::MAX);
        let rank_at = |parts: &[(u32, u32)], len: usize, i: usize| {
            if i + 3 < len {
                self.rank(&piece[parts[i].0 as usize..parts[i + 3].0 as usize])
            } else {
                u32::MAX
            }
        };
        while min.0 != u32::MAX {
            let i = min.1;
            if i > 0 {
                parts[i - 1].1 = rank_at(&parts, len, i - 1);
            }
            parts[i].1 = rank_at(&parts, len, i);
            parts.copy_within(i + 2..len, i + 1);
            len -= 1;
            min = (u32::MAX, usize::MAX);
            for (i, &(_, rank)) in parts[..len - 1].iter().enumerate() {
                if rank < min.0 {
                    min = (rank, i);
                }
            }
        }
        len - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bpe-openai's token ids are tiktoken-rs's ranks, token for token, in both vocabularies:
    /// the merge order the counter follows is tiktoken's.
    #[test]
    fn ranks_are_tiktokens() {
        let vocabularies = [
            (&*O200K_BASE, tiktoken_rs::o200k_base_singleton()),
            (&*O200K_BASE, tiktoken_rs::o200k_harmony_singleton()),
            (&*CL100K_BASE, tiktoken_rs::cl100k_base_singleton()),
        ];
        for (vocabulary, tiktoken) in vocabularies {
            let tokens = vocabulary.long.bpe.num_tokens();
            assert_eq!(
                vocabulary.ranks.len(),
                tokens,
                "every token's bytes are its own"
            );
            for id in 0..tokens as u32 {
                let bytes = vocabulary.long.bpe.token_bytes(id);
                assert_eq!(tiktoken.decode_bytes(&[id]).unwrap(), bytes, "token {id}");
                assert_eq!(vocabulary.ranks[bytes], id);
                assert_eq!(vocabulary.rank(bytes), id);
            }
            // No ordinary token past the last one: the next rank is a special token or none.
            let next = tiktoken.decode_bytes(&[tokens as u32]);
            assert!(next.map_or(true, |bytes| bytes.starts_with(b"<|")));
        }
    }
}

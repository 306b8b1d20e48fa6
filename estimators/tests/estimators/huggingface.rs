//! The Hugging Face estimator on real tokenizer files (see shared/fixtures/tokenizers).

use std::sync::Arc;
use std::time::Instant;

use tollgate_estimators::{
    Estimator, EstimatorError, HuggingFace, Tiktoken, Voyage, estimator, estimator_strict,
};

#[test]
fn truncation_and_padding_are_switched_off() {
    let Some(path) = crate::common::fixture("all-MiniLM-L6-v2") else {
        return;
    };
    let hf = HuggingFace::from_file(&path).unwrap();
    // The file pads and truncates to 128; the counter must do neither.
    assert_eq!(hf.count("hello world"), 2);
    let long = crate::common::sample("english.txt");
    assert!(hf.count(&long) > 400, "{}", hf.count(&long));
    assert_eq!(hf.count(""), 0);
}

#[test]
fn gpt4o_tokenizer_json_counts_like_o200k() {
    let Some(path) = crate::common::fixture("gpt-4o") else {
        return;
    };
    let hf = HuggingFace::from_file(&path).unwrap();
    let o200k = Tiktoken::for_encoding("o200k_base").unwrap();
    for text in crate::common::tricky_texts() {
        assert_eq!(
            hf.count(&text),
            o200k.count(&text),
            "on {:?}",
            &text[..text.len().min(60)]
        );
    }
}

#[test]
fn voyage_matches_the_qwen3_vocabulary_token_for_token() {
    let Some(path) = crate::common::fixture("qwen3") else {
        return;
    };
    let qwen = HuggingFace::from_file(&path).unwrap();
    let voyage = bpe_openai::voyage3_base();
    // qwen3's file declares `<|fim_prefix|>` and friends as added tokens that are not
    // "special", so the tokenizer matches them even in ordinary text; voyage3_base has no added
    // tokens. That one text is the known difference, and is left out here.
    for text in crate::common::tricky_texts()
        .into_iter()
        .filter(|t| !t.contains("<|"))
    {
        let ours: Vec<String> = voyage
            .encode(text.as_str())
            .iter()
            .map(|&id| {
                // Compare token strings in the byte-level alphabet the tokenizer.json uses.
                byte_level(voyage.bpe.token_bytes(id))
            })
            .collect();
        let theirs = qwen.tokens(&text);
        assert_eq!(ours, theirs, "on {:?}", &text[..text.len().min(60)]);
        assert_eq!(Voyage.count(&text), qwen.count(&text));
    }
}

/// GPT-2's byte-to-unicode map, as byte-level BPE files spell their tokens.
fn byte_level(bytes: &[u8]) -> String {
    let printable = |b: u8| {
        (b'!'..=b'~').contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut extra = 0u32;
    let mut table = [' '; 256];
    for b in 0..=255u8 {
        table[b as usize] = if printable(b) {
            char::from(b)
        } else {
            extra += 1;
            char::from_u32(255 + extra).unwrap()
        };
    }
    bytes.iter().map(|&b| table[b as usize]).collect()
}

#[test]
fn each_file_is_loaded_once_per_process() {
    let Some(path) = crate::common::fixture("gpt-4o") else {
        return;
    };
    let name = format!("hf:{}", path.display());
    let started = Instant::now();
    let first = estimator_strict(&name).unwrap();
    let first_call = started.elapsed();
    let read_after_first = HuggingFace::files_read();
    let started = Instant::now();
    let second = estimator_strict(&name).unwrap();
    let second_call = started.elapsed();
    assert!(Arc::ptr_eq(&first, &second), "the same estimator is shared");
    // Another route to the same file shares the parsed tokenizer too.
    HuggingFace::from_file(&path).unwrap();
    assert_eq!(HuggingFace::files_read(), read_after_first);
    eprintln!("hf gpt-4o: first call {first_call:?}, second {second_call:?}");
}

#[test]
fn missing_or_corrupt_files_fall_back_unless_strict() {
    let missing = "hf:/nonexistent/tokenizer.json";
    let err = estimator_strict(missing).unwrap_err();
    assert!(matches!(err, EstimatorError::Load { .. }), "{err:?}");
    assert!(err.to_string().starts_with("estimator `hf:/nonexistent/tokenizer.json`: could not load `/nonexistent/tokenizer.json`"), "{err}");

    let fallback = estimator(missing).unwrap();
    assert_eq!(fallback.name(), missing);
    let text = crate::common::sample("english.txt");
    assert_eq!(fallback.count(&text), Tiktoken::default().count(&text));

    let dir = std::env::temp_dir().join(format!("tollgate-corrupt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let corrupt = dir.join("tokenizer.json");
    std::fs::write(&corrupt, "{ not json").unwrap();
    let name = format!("hf:{}", corrupt.display());
    assert!(matches!(
        estimator_strict(&name),
        Err(EstimatorError::Load { .. })
    ));
    assert_eq!(estimator(&name).unwrap().count("Hello, world!"), 4);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Counts WARN events, to check that a fallback warns once and only once.
struct CountWarnings(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl tracing::Subscriber for CountWarnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn a_fallback_warns_once() {
    let warnings = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let subscriber = CountWarnings(Arc::clone(&warnings));
    tracing::subscriber::with_default(subscriber, || {
        let name = "hf:/nonexistent/warns-once/tokenizer.json";
        for _ in 0..5 {
            assert_eq!(estimator(name).unwrap().count("Hello, world!"), 4);
        }
    });
    assert_eq!(warnings.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A deterministic text of `len` bytes or a little more, drawn from `alphabet`, without
/// spaces: the input that makes one pre-tokenized piece of everything.
fn without_spaces(alphabet: &[char], len: usize, seed: u64) -> String {
    let mut state = seed;
    let mut text = String::with_capacity(len + 4);
    while text.len() < len {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        text.push(alphabet[((state >> 33) % alphabet.len() as u64) as usize]);
    }
    text
}

#[test]
fn cutting_a_long_text_without_spaces_never_undercounts() {
    let alphabets: [&[char]; 3] = [
        &[
            'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l', 'm', 'n', 'o', 'p',
        ],
        &['0', '1', '2', '3', '4', '5', '6', '7', '8', '9'],
        &['速', '率', '限', '制', 'x', '1', '.', '-'],
    ];
    for model in ["gpt-4o", "qwen3", "all-MiniLM-L6-v2"] {
        let Some(path) = crate::common::fixture(model) else {
            return;
        };
        let hf = HuggingFace::from_file(&path).unwrap();
        for (i, alphabet) in alphabets.iter().enumerate() {
            // Just past the size above which texts are cut: several forced cuts.
            let text = without_spaces(alphabet, 1_200_000, i as u64 + 7);
            let exact = hf.tokens(&text).len();
            let counted = hf.count(&text);
            assert!(
                counted >= exact,
                "{model}, alphabet {i}: counted {counted}, exact {exact}"
            );
            // Erring high by a few tokens a piece, not more.
            assert!(
                counted <= exact + exact / 50 + 200,
                "{model}, alphabet {i}: counted {counted}, exact {exact}"
            );
        }
    }
}

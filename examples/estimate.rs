//! Prints the token count of standard input, taken as one plain text, by a named estimator.
//!
//! ```text
//! cargo run --release --example estimate -- openai < file.txt
//! cargo run --release --example estimate -- openai:gpt-4 < file.txt
//! cargo run --release --features huggingface --example estimate -- hf:path/to/tokenizer.json < file.txt
//! ```
//!
//! The count is alone on the last line; a line before it says which estimator counted and
//! how long the vocabulary took to load.

use std::io::Read;
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    let Some(name) = std::env::args().nth(1) else {
        eprintln!("usage: estimate <estimator name> < file.txt");
        eprintln!("names: openai, openai:<model>, tiktoken:<encoding>, voyageai, hf:<path>, words");
        return ExitCode::from(2);
    };
    let mut text = String::new();
    if let Err(err) = std::io::stdin().read_to_string(&mut text) {
        eprintln!("estimate: could not read standard input as UTF-8 text: {err}");
        return ExitCode::FAILURE;
    }
    let started = Instant::now();
    let estimator = match tollgate::estimators::estimator_strict(&name) {
        Ok(estimator) => estimator,
        Err(err) => {
            eprintln!("estimate: {err}");
            return ExitCode::FAILURE;
        }
    };
    let tokens = estimator.count(&text);
    eprintln!(
        "{}: {} bytes counted in {:?} (including the first load of the vocabulary)",
        estimator.name(),
        text.len(),
        started.elapsed()
    );
    println!("{tokens}");
    ExitCode::SUCCESS
}

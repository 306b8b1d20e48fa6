//! The estimators: counts against the reference tokenizers, extraction from arguments and
//! request bodies, billing rules, and the accuracy table. One binary (each file a module);
//! `large_inputs` measures peak memory, so it has a binary of its own.

mod accuracy;
mod billing;
mod common;
mod extract;
#[cfg(feature = "huggingface")]
mod huggingface;
mod tiktoken;
mod words;

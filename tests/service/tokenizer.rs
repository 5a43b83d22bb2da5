//! Token counting: the production counter (`bpe-openai`) against the reference
//! (`tiktoken-rs`, OpenAI's BPE ranks) on committed vectors, the chat format's
//! overhead as OpenAI's cookbook documents it, and the fast heuristic's error.

use ctxbudget::estimator::count::{count, tiktoken_count};
use ctxbudget::estimator::heuristic;
use ctxbudget::estimator::{ChatMessage, Encoding, Method, Prompt};

#[derive(serde::Deserialize)]
struct Vector {
    source: String,
    encoding: Encoding,
    tokens: u64,
    text: String,
}

/// `tests/data/token_vectors.json`: each text's source is named; the counts are
/// tiktoken's (`tiktoken-rs` 0.12, `encode_ordinary`).
fn vectors() -> Vec<Vector> {
    let text = include_str!("../data/token_vectors.json");
    serde_json::from_str(text).expect("valid vectors")
}

#[test]
fn counts_match_the_reference_vectors() {
    let vectors = vectors();
    assert!(vectors.len() >= 16);
    for v in vectors {
        let reference = tiktoken_count(v.encoding, &v.text) as u64;
        assert_eq!(reference, v.tokens, "tiktoken changed for {}", v.source);
        let ours = count(
            Method::Exact(v.encoding),
            &Prompt::Text(v.text.clone()),
            u64::MAX,
        );
        assert_eq!(ours.tokens, v.tokens, "{} ({:?})", v.source, v.encoding);
    }
}

#[test]
fn whole_corpus_counts_match_tiktoken() {
    for file in ["english", "thai", "chinese", "european", "emoji", "code"] {
        let path = format!(
            "{}/tests/data/corpus/{file}.txt",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(path).unwrap();
        for e in [Encoding::O200kBase, Encoding::Cl100kBase] {
            let ours = count(Method::Exact(e), &Prompt::Text(text.clone()), u64::MAX).tokens;
            assert_eq!(ours, tiktoken_count(e, &text) as u64, "{file} with {e:?}");
        }
    }
}

fn message(role: &str, name: Option<&str>, content: &str) -> ChatMessage {
    ChatMessage {
        role: role.into(),
        content: content.into(),
        name: name.map(str::to_string),
    }
}

/// The example of OpenAI's cookbook "How to count tokens with tiktoken", whose
/// documented totals are 129 prompt tokens for gpt-4-0613 and gpt-3.5-turbo
/// (cl100k_base) and 124 for gpt-4o and gpt-4o-mini (o200k_base).
#[test]
fn chat_overhead_matches_openais_documented_format() {
    let messages = vec![
        message(
            "system",
            None,
            "You are a helpful, pattern-following assistant that translates corporate jargon into plain English.",
        ),
        message(
            "system",
            Some("example_user"),
            "New synergies will help drive top-line growth.",
        ),
        message(
            "system",
            Some("example_assistant"),
            "Things working well together will increase revenue.",
        ),
        message(
            "system",
            Some("example_user"),
            "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage.",
        ),
        message(
            "system",
            Some("example_assistant"),
            "Let's talk later when we're less busy about how to do better.",
        ),
        message(
            "user",
            None,
            "This late pivot means we don't have time to boil the ocean for the client deliverable.",
        ),
    ];
    let prompt = Prompt::Messages(messages);
    let cl100k = count(Method::Exact(Encoding::Cl100kBase), &prompt, u64::MAX);
    assert_eq!(cl100k.tokens, 129);
    let o200k = count(Method::Exact(Encoding::O200kBase), &prompt, u64::MAX);
    assert_eq!(o200k.tokens, 124);
    // Counting stops early, and says so, once the limit is passed.
    let capped = count(Method::Exact(Encoding::O200kBase), &prompt, 100);
    assert!(capped.exceeded);
    assert!(!count(Method::Exact(Encoding::O200kBase), &prompt, 124).exceeded);
}

#[test]
fn the_fast_path_stays_close_to_exact_counts() {
    for file in ["english", "thai", "chinese", "european", "code"] {
        let path = format!(
            "{}/tests/data/corpus/{file}.txt",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(path).unwrap();
        for e in [Encoding::O200kBase, Encoding::Cl100kBase] {
            let exact = tiktoken_count(e, &text) as f64;
            let fast = heuristic::estimate(e, &text) as f64;
            let error = (fast - exact).abs() / exact;
            assert!(
                error < 0.25,
                "{file} with {e:?}: fast {fast}, exact {exact}"
            );
        }
    }
}

//! Counting throughput in MB/s on English, Thai and code: tiktoken-rs (the
//! reference), bpe-openai (what the service counts with), the early-stopping
//! count, and the fast heuristic.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ctxbudget_engine::estimator::count::{count, tiktoken_count};
use ctxbudget_engine::estimator::heuristic;
use ctxbudget_engine::estimator::{Encoding, Method, Prompt};
use std::hint::black_box;

fn corpus(name: &str) -> String {
    // The workspace's test corpus, two directories up from this crate.
    let path = format!(
        "{}/../../tests/data/corpus/{name}.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(path).expect("corpus file");
    // About 100 KB, the size of a long prompt.
    text.repeat(100_000 / text.len() + 1)
}

fn benches(c: &mut Criterion) {
    let e = Encoding::O200kBase;
    ctxbudget_engine::estimator::count::warm_up();
    let _ = tiktoken_count(e, "warm up");
    let mut group = c.benchmark_group("count 100 KB");
    group.sample_size(20);
    for name in ["english", "thai", "code"] {
        let text = corpus(name);
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_with_input(BenchmarkId::new("tiktoken-rs", name), &text, |b, t| {
            b.iter(|| black_box(tiktoken_count(e, t)))
        });
        let prompt = Prompt::Text(text.clone());
        group.bench_with_input(BenchmarkId::new("bpe-openai", name), &prompt, |b, p| {
            b.iter(|| black_box(count(Method::Exact(e), p, u64::MAX)))
        });
        group.bench_with_input(
            BenchmarkId::new("bpe-openai, stop at 8K tokens", name),
            &prompt,
            |b, p| b.iter(|| black_box(count(Method::Exact(e), p, 8_000))),
        );
        group.bench_with_input(BenchmarkId::new("fast heuristic", name), &text, |b, t| {
            b.iter(|| black_box(heuristic::estimate(e, t)))
        });
    }
    group.finish();
}

criterion_group!(tokenizers, benches);
criterion_main!(tokenizers);

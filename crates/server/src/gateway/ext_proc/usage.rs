//! An LLM answer read as it passes: the usage the provider reported and the
//! completion text delivered, from a whole JSON body or from server-sent
//! events split anywhere (a line, a UTF-8 character or a usage chunk may
//! straddle two body messages).
//!
//! Where the usage is, per API:
//! - OpenAI chat: `usage` of the answer, or of the final chunk of a stream
//!   (`stream_options.include_usage`); text in `choices[].delta.content`.
//! - OpenAI Responses: `usage` of the answer, or of `response.completed`
//!   (also `response.incomplete`, `response.failed`); text in
//!   `response.output_text.delta`.
//! - Anthropic: `usage` of the answer; in a stream, the prompt in
//!   `message_start`, the output (cumulative) in each `message_delta`; text in
//!   `content_block_delta`.
//!
//! Size: three APIs' answers, whole and streamed, in one reader (its tests
//! apart, in `usage/tests.rs`).

use serde_json::Value;

/// The usage a provider reported, in ctxbudget's terms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens, cached ones included.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Of the prompt, tokens read from the provider's cache.
    pub cached_prompt_tokens: u64,
    /// Of the prompt, tokens written to the cache for 5 minutes.
    pub cache_write_prompt_tokens: u64,
    /// Of the prompt, tokens written to the cache for an hour.
    pub cache_write_1h_prompt_tokens: u64,
    /// Of the completion, reasoning tokens.
    pub reasoning_tokens: u64,
}

/// The longest answer kept to read (a whole JSON body; one event of a
/// stream): past it, the answer is settled by its text as far as it was kept.
pub const MAX_KEPT_BYTES: usize = 8 << 20;

/// Reads one answer.
#[derive(Debug)]
pub struct AnswerReader {
    sse: bool,
    /// No content type was seen: the first bytes decide.
    sniff: bool,
    /// JSON: the body so far; events: the line not ended yet.
    pending: Vec<u8>,
    /// Events: the `data:` lines of the event not dispatched yet.
    data: String,
    /// The completion text delivered (events; a JSON body's at its end).
    text: String,
    prompt: Option<u64>,
    completion: Option<u64>,
    cached: u64,
    /// Written to the cache for 5 minutes and for an hour.
    cache_write: (u64, u64),
    reasoning: u64,
    /// Whether the usage is whole (Anthropic streams report it in two parts).
    complete: bool,
    /// Body bytes passed on to the caller.
    delivered: u64,
    /// A JSON body outgrew [`MAX_KEPT_BYTES`].
    overflowed: bool,
    /// The end was read.
    finished: bool,
    /// The last line ended with a CR (its LF may open the next piece).
    after_cr: bool,
}

impl AnswerReader {
    /// A reader for an answer whose `content-type` is `content_type`.
    pub fn new(content_type: &str) -> Self {
        AnswerReader {
            sse: content_type
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream"),
            sniff: content_type.trim().is_empty(),
            pending: Vec::new(),
            data: String::new(),
            text: String::new(),
            prompt: None,
            completion: None,
            cached: 0,
            cache_write: (0, 0),
            reasoning: 0,
            complete: false,
            delivered: 0,
            overflowed: false,
            finished: false,
            after_cr: false,
        }
    }

    /// Whether the answer is a stream of events.
    pub fn is_stream(&self) -> bool {
        self.sse
    }

    /// Reads the next piece of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.sniff && !chunk.is_empty() {
            self.sniff = false;
            let start = chunk.trim_ascii_start();
            self.sse = [&b"data:"[..], b"event:", b":"]
                .iter()
                .any(|p| start.starts_with(p));
        }
        self.delivered += chunk.len() as u64;
        if !self.sse {
            if self.pending.len() + chunk.len() > MAX_KEPT_BYTES {
                self.overflowed = true;
            } else {
                self.pending.extend_from_slice(chunk);
            }
            return;
        }
        let mut rest = chunk;
        // Lines end with LF, CRLF or a bare CR (the event stream format).
        while let Some(end) = rest.iter().position(|b| matches!(b, b'\n' | b'\r')) {
            let (line, tail) = rest.split_at(end);
            rest = &tail[1..];
            let cr = tail[0] == b'\r';
            // The LF of a CRLF split from its CR by a chunk boundary.
            let lf_of_crlf = std::mem::replace(&mut self.after_cr, cr) && !cr && end == 0;
            if lf_of_crlf && self.pending.is_empty() {
                continue;
            }
            if self.pending.is_empty() {
                self.line(line);
            } else {
                let mut whole = std::mem::take(&mut self.pending);
                whole.extend_from_slice(line);
                self.line(&whole);
            }
        }
        if self.pending.len() + rest.len() <= MAX_KEPT_BYTES {
            self.pending.extend_from_slice(rest);
        }
    }

    /// The body ended: reads a JSON body, or the last event if unterminated.
    pub fn finish(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        if self.sse {
            if !self.pending.is_empty() {
                let line = std::mem::take(&mut self.pending);
                self.line(&line);
            }
            self.dispatch();
        } else if !self.overflowed {
            let body = std::mem::take(&mut self.pending);
            if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                self.read_answer(&v);
            } else {
                self.text = String::from_utf8_lossy(&body).into_owned();
            }
        }
    }

    /// Body bytes passed on so far.
    pub fn delivered_bytes(&self) -> u64 {
        self.delivered
    }

    /// The usage, when the provider reported all of it.
    pub fn usage(&self) -> Option<Usage> {
        match (self.complete, self.completion) {
            (true, Some(completion)) => Some(Usage {
                completion_tokens: completion,
                reasoning_tokens: self.reasoning.min(completion),
                ..self.reported_prompt()?
            }),
            _ => None,
        }
    }

    /// The prompt the provider reported, with its parts, if it did (an
    /// Anthropic stream cut after `message_start`); no completion.
    pub fn reported_prompt(&self) -> Option<Usage> {
        let prompt = self.prompt?;
        // The parts, as far as the whole holds them.
        let cached = self.cached.min(prompt);
        let write = self.cache_write.0.min(prompt - cached);
        let write_1h = self.cache_write.1.min(prompt - cached - write);
        Some(Usage {
            prompt_tokens: prompt,
            completion_tokens: 0,
            cached_prompt_tokens: cached,
            cache_write_prompt_tokens: write,
            cache_write_1h_prompt_tokens: write_1h,
            reasoning_tokens: 0,
        })
    }

    /// The completion text delivered: what the stream carried, or for a JSON
    /// body cut short, the body as far as it came (an upper bound).
    pub fn delivered_text(&mut self) -> String {
        if !self.sse && self.text.is_empty() && !self.pending.is_empty() {
            return String::from_utf8_lossy(&self.pending).into_owned();
        }
        std::mem::take(&mut self.text)
    }

    /// One line of an event stream (its `\n` removed).
    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.dispatch();
            return;
        }
        if let Some(data) = line.strip_prefix(b"data:") {
            let data = data.strip_prefix(b" ").unwrap_or(data);
            if !self.data.is_empty() {
                self.data.push('\n');
            }
            self.data.push_str(&String::from_utf8_lossy(data));
        }
        // `event:`, `id:`, `retry:` and comments: the data's `type` says it all.
    }

    /// The event whose data lines were read.
    fn dispatch(&mut self) {
        if self.data.is_empty() {
            return;
        }
        let data = std::mem::take(&mut self.data);
        if data == "[DONE]" {
            return;
        }
        if let Ok(v) = serde_json::from_str::<Value>(&data) {
            self.read_event(&v);
        }
    }

    /// One event of a stream, whichever API sent it.
    fn read_event(&mut self, v: &Value) {
        match v.get("type").and_then(Value::as_str) {
            // OpenAI Responses.
            Some("response.output_text.delta" | "response.function_call_arguments.delta") => {
                self.push_text(v.get("delta"));
            }
            Some("response.completed" | "response.incomplete" | "response.failed") => {
                if let Some(u) = v.get("response").and_then(|r| r.get("usage")) {
                    self.openai_usage(u, "input_tokens", "output_tokens", "input_tokens_details");
                }
            }
            // Anthropic.
            Some("message_start") => {
                if let Some(u) = v.get("message").and_then(|m| m.get("usage")) {
                    self.anthropic_prompt(u);
                    self.completion = u.get("output_tokens").and_then(Value::as_u64);
                }
            }
            Some("content_block_delta") => {
                if let Some(d) = v.get("delta") {
                    for key in ["text", "partial_json", "thinking"] {
                        self.push_text(d.get(key));
                    }
                }
            }
            Some("message_delta") => {
                if let Some(u) = v.get("usage") {
                    if u.get("input_tokens").is_some() {
                        self.anthropic_prompt(u);
                    }
                    if let Some(out) = u.get("output_tokens").and_then(Value::as_u64) {
                        self.completion = Some(out);
                        self.complete = self.prompt.is_some();
                    }
                }
            }
            Some(_) => {}
            // OpenAI chat chunks carry no type.
            None => {
                if let Some(choices) = v.get("choices").and_then(Value::as_array) {
                    for c in choices {
                        let Some(delta) = c.get("delta") else {
                            continue;
                        };
                        self.push_text(delta.get("content"));
                        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                            for call in calls {
                                self.push_text(
                                    call.get("function").and_then(|f| f.get("arguments")),
                                );
                            }
                        }
                    }
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    self.openai_usage(
                        u,
                        "prompt_tokens",
                        "completion_tokens",
                        "prompt_tokens_details",
                    );
                }
            }
        }
    }

    /// A whole JSON answer.
    fn read_answer(&mut self, v: &Value) {
        let Some(u) = v.get("usage").filter(|u| u.is_object()) else {
            self.text = answer_text(v);
            return;
        };
        if u.get("prompt_tokens").is_some() {
            self.openai_usage(
                u,
                "prompt_tokens",
                "completion_tokens",
                "prompt_tokens_details",
            );
        } else if v.get("type").and_then(Value::as_str) == Some("message") {
            self.anthropic_prompt(u);
            self.completion = u.get("output_tokens").and_then(Value::as_u64);
            self.complete = self.completion.is_some();
        } else {
            self.openai_usage(u, "input_tokens", "output_tokens", "input_tokens_details");
        }
        if self.usage().is_none() {
            self.text = answer_text(v);
        }
    }

    fn openai_usage(&mut self, u: &Value, prompt: &str, completion: &str, details: &str) {
        self.prompt = u.get(prompt).and_then(Value::as_u64);
        self.completion = u.get(completion).and_then(Value::as_u64);
        self.cached = u
            .get(details)
            .and_then(|d| d.get("cached_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        // Chat's completion_tokens_details, Responses' output_tokens_details.
        self.reasoning = ["completion_tokens_details", "output_tokens_details"]
            .iter()
            .find_map(|k| u.get(*k))
            .and_then(|d| d.get("reasoning_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        self.complete = self.prompt.is_some() && self.completion.is_some();
    }

    /// Anthropic's prompt: uncached input plus what was read from and written
    /// to the cache; cached = read from it; written = its 5-minute and 1-hour
    /// parts (`cache_creation`), or all of it for 5 minutes.
    fn anthropic_prompt(&mut self, u: &Value) {
        let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
        if u.get("input_tokens").is_some() {
            let written = n("cache_creation_input_tokens");
            self.prompt = Some(n("input_tokens") + n("cache_read_input_tokens") + written);
            self.cached = n("cache_read_input_tokens");
            let ttl = |k: &str| {
                u.get("cache_creation")
                    .and_then(|c| c.get(k))
                    .and_then(Value::as_u64)
            };
            self.cache_write = match (
                ttl("ephemeral_5m_input_tokens"),
                ttl("ephemeral_1h_input_tokens"),
            ) {
                // A message_delta repeats the total without the split: the
                // split message_start gave stands while it adds up.
                (None, None) if self.cache_write.0 + self.cache_write.1 == written => {
                    self.cache_write
                }
                (None, None) => (written, 0),
                (five, hour) => (five.unwrap_or(0), hour.unwrap_or(0)),
            };
        }
    }

    fn push_text(&mut self, v: Option<&Value>) {
        if let Some(Value::String(s)) = v {
            self.text.push_str(s);
        }
    }
}

/// The text of a whole answer without usage: chat's `choices[].message`,
/// Responses' `output[].content[].text`, Anthropic's `content[].text`.
fn answer_text(v: &Value) -> String {
    let mut out = String::new();
    let mut push = |t: Option<&Value>| {
        if let Some(Value::String(s)) = t {
            out.push_str(s);
        }
    };
    for c in v
        .get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        push(c.get("message").and_then(|m| m.get("content")));
    }
    for o in v
        .get("output")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for c in o
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            push(c.get("text"));
        }
    }
    for c in v
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        push(c.get("text"));
    }
    out
}

#[cfg(test)]
mod tests;

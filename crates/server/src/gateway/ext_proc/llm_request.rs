//! An LLM request body as the processor reads it: which API (OpenAI chat
//! completions, OpenAI Responses, Anthropic messages), the model, the prompt
//! as chat messages to count (system, messages or input, tools), the output
//! limit asked for, whether the answer streams; and the body rewritten with
//! the output limit granted.
//!
//! Size: three APIs' request shapes side by side, and their tests: one
//! reading of a body, whichever API sent it.

use crate::api::MAX_MODEL_BYTES as MAX_LABEL_BYTES;
use crate::domain::ChatMessage;
use crate::domain::plan::check_tokens;
use serde_json::{Map, Value};

/// The API a request speaks: decides the fields read and written, and how
/// its answer carries the usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// OpenAI chat completions (`/v1/chat/completions`).
    Chat,
    /// OpenAI Responses (`/v1/responses`).
    Responses,
    /// Anthropic messages (`/v1/messages`).
    Messages,
}

impl Api {
    /// The API a path names by its last segments; `None` for another path
    /// (the body then decides: [`LlmRequest::parse`]).
    pub fn of_path(path: &str) -> Option<Api> {
        let path = path.trim_end_matches('/');
        if path.ends_with("/chat/completions") {
            Some(Api::Chat)
        } else if path.ends_with("/responses") {
            Some(Api::Responses)
        } else if path.ends_with("/messages") {
            Some(Api::Messages)
        } else {
            None
        }
    }

    /// The body field of the output limit this API reads, in order of
    /// preference; the first is written when the body has none.
    fn limit_fields(self) -> &'static [&'static str] {
        match self {
            // `max_tokens` is deprecated and refused by reasoning models;
            // `max_completion_tokens` is understood by every current one.
            Api::Chat => &["max_completion_tokens", "max_tokens"],
            Api::Responses => &["max_output_tokens"],
            Api::Messages => &["max_tokens"],
        }
    }

    /// Lower-case name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Chat => "chat_completions",
            Api::Responses => "responses",
            Api::Messages => "messages",
        }
    }
}

/// Why a body is not read as an LLM call.
#[derive(Debug, PartialEq, Eq)]
pub enum NotRead {
    /// Not an LLM call this processor knows (not JSON, no model, no
    /// messages): passed or refused as `[ext_proc] other_requests` says.
    Other(String),
    /// An LLM call with a field in error: always refused (400), since the
    /// upstream would refuse it too.
    Invalid(String),
}

/// A request body, read.
#[derive(Debug)]
pub struct LlmRequest {
    /// The API it speaks.
    pub api: Api,
    /// The model it names.
    pub model: String,
    /// The prompt, as chat messages to count.
    pub messages: Vec<ChatMessage>,
    /// The output limit the body asks for per choice, if it sets one (the
    /// largest of its limit fields: an upstream may honour any of them).
    pub max_output_tokens: Option<u64>,
    /// Choices generated (chat's `n`), each up to the output limit.
    pub choices: u64,
    /// Whether the answer streams (server-sent events).
    pub stream: bool,
    /// The body as parsed, for the rewrite.
    body: Map<String, Value>,
}

impl LlmRequest {
    /// Reads `body`, sent on `path` (`anthropic`: the request carried an
    /// `anthropic-version` header).
    pub fn parse(path: &str, anthropic: bool, body: &[u8]) -> Result<LlmRequest, NotRead> {
        let other = |why: &str| NotRead::Other(why.to_owned());
        let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(body) else {
            return Err(other("the body is not a JSON object"));
        };
        let api = match Api::of_path(path) {
            Some(api) => api,
            None if anthropic && body.contains_key("messages") => Api::Messages,
            None if body.contains_key("input") => Api::Responses,
            None if body.contains_key("messages") => Api::Chat,
            None => return Err(other("the body has neither messages nor input")),
        };
        let model = match body.get("model") {
            Some(Value::String(m)) if !m.is_empty() => m.clone(),
            _ => return Err(other("the body names no model")),
        };
        if model.len() > MAX_LABEL_BYTES || model.chars().any(char::is_control) {
            return Err(NotRead::Invalid(format!(
                "model must be at most {MAX_LABEL_BYTES} bytes without control characters"
            )));
        }
        let messages = match api {
            Api::Chat => chat_messages(&body)?,
            Api::Responses => responses_messages(&body)?,
            Api::Messages => anthropic_messages(&body)?,
        };
        let max_output_tokens = output_limit(api, &body)?;
        let choices = match (api, body.get("n")) {
            (Api::Chat, Some(v)) if !v.is_null() => match v.as_u64() {
                Some(n @ 1..=128) => n,
                _ => return Err(NotRead::Invalid(format!("n must be 1 to 128, not {v}"))),
            },
            _ => 1,
        };
        if let Some(m) = max_output_tokens {
            check_tokens("max_output_tokens", m.saturating_mul(choices))
                .map_err(|e| NotRead::Invalid(format!("the output limit × n: {e}")))?;
        }
        let stream = match body.get("stream") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(NotRead::Invalid("stream must be true or false".into())),
        };
        Ok(LlmRequest {
            api,
            model,
            messages,
            max_output_tokens,
            choices,
            stream,
            body,
        })
    }

    /// The output to reserve: the limit asked for, times the choices; 0
    /// (the tier's default) when the body sets none.
    pub fn output_to_reserve(&self) -> u64 {
        self.max_output_tokens.map_or(0, |m| m * self.choices)
    }

    /// A streamed chat completion that does not ask for its usage chunk.
    pub fn lacks_stream_usage(&self) -> bool {
        self.api == Api::Chat
            && self.stream
            && self
                .body
                .get("stream_options")
                .and_then(|o| o.get("include_usage"))
                .is_none_or(|v| v.as_bool() != Some(true))
    }

    /// The body to send upstream when it must change: `model` when a
    /// fallback was chosen; every output limit
    /// field it sets capped at the grant per choice (`granted` ÷ choices),
    /// or the API's own field written when it sets none; with `ask_usage`,
    /// `stream_options.include_usage` set. `None`: send it as is.
    pub fn rewrite(
        &mut self,
        granted: u64,
        ask_usage: bool,
        model: Option<&str>,
    ) -> Option<Vec<u8>> {
        let mut changed = false;
        if let Some(m) = model.filter(|m| *m != self.model) {
            self.body.insert("model".into(), Value::from(m));
            m.clone_into(&mut self.model);
            changed = true;
        }
        let per_choice = (granted / self.choices).max(1);
        let fields = self.api.limit_fields();
        // Each field the body sets keeps the caller's value when it is the
        // smaller one: a cap never raises a limit the caller chose.
        let mut most = None;
        for field in fields {
            if let Some(v) = self.body.get_mut(*field)
                && !v.is_null()
            {
                let capped = v.as_u64().map_or(per_choice, |n| n.min(per_choice));
                if v.as_u64() != Some(capped) {
                    *v = Value::from(capped);
                    changed = true;
                }
                most = most.max(Some(capped));
            }
        }
        if most.is_none() {
            self.body
                .insert(fields[0].to_owned(), Value::from(per_choice));
            changed = true;
        }
        self.max_output_tokens = Some(most.unwrap_or(per_choice));
        if ask_usage && self.lacks_stream_usage() {
            let options = self
                .body
                .entry("stream_options")
                .or_insert_with(|| Value::Object(Map::new()));
            if !options.is_object() {
                *options = Value::Object(Map::new());
            }
            if let Value::Object(o) = options {
                o.insert("include_usage".into(), Value::Bool(true));
            }
            changed = true;
        }
        changed.then(|| serde_json::to_vec(&self.body).expect("a JSON map serializes"))
    }
}

/// The output limit a body asks for: the largest of the API's fields set
/// (an upstream may honour any of them).
fn output_limit(api: Api, body: &Map<String, Value>) -> Result<Option<u64>, NotRead> {
    let mut most = None;
    for field in api.limit_fields() {
        match body.get(*field) {
            None | Some(Value::Null) => continue,
            Some(v) => {
                let n = v.as_u64().ok_or_else(|| {
                    NotRead::Invalid(format!("{field} must be a whole number of tokens, not {v}"))
                })?;
                let n = check_tokens("max_output_tokens", n)
                    .map_err(|e| NotRead::Invalid(format!("{field}: {e}")))?;
                most = most.max(Some(n));
            }
        }
    }
    Ok(most)
}

/// OpenAI chat: `messages` (role, content as text or parts, name, tool
/// calls), and `tools`.
fn chat_messages(body: &Map<String, Value>) -> Result<Vec<ChatMessage>, NotRead> {
    let Some(Value::Array(list)) = body.get("messages") else {
        return Err(NotRead::Invalid("messages must be a list".into()));
    };
    let mut out = Vec::with_capacity(list.len() + 1);
    for m in list {
        out.push(message(m, "user"));
    }
    push_tools(body, &mut out);
    Ok(out)
}

/// OpenAI Responses: `instructions`, `input` (text, or items: messages,
/// function calls and their outputs), and `tools`.
fn responses_messages(body: &Map<String, Value>) -> Result<Vec<ChatMessage>, NotRead> {
    let mut out = Vec::new();
    if let Some(Value::String(s)) = body.get("instructions") {
        out.push(chat("system", s.clone()));
    }
    match body.get("input") {
        Some(Value::String(s)) => out.push(chat("user", s.clone())),
        Some(Value::Array(items)) => {
            out.reserve(items.len());
            for item in items {
                let role = item
                    .get("role")
                    .or_else(|| item.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("user");
                let mut content = String::new();
                collect_text(item, &mut content);
                out.push(chat(role, content));
            }
        }
        // A stored prompt or conversation (`prompt`, `conversation`,
        // `previous_response_id`) holds the context: what is not in the body
        // is not counted (the Commit charges the real usage).
        None | Some(Value::Null)
            if ["prompt", "conversation", "previous_response_id"]
                .iter()
                .any(|k| body.contains_key(*k)) => {}
        _ => {
            return Err(NotRead::Invalid(
                "input must be text or a list of items".into(),
            ));
        }
    }
    push_tools(body, &mut out);
    Ok(out)
}

/// Anthropic messages: `system` (text or blocks), `messages` (text or
/// blocks: text, tool uses and results), and `tools`.
fn anthropic_messages(body: &Map<String, Value>) -> Result<Vec<ChatMessage>, NotRead> {
    let Some(Value::Array(list)) = body.get("messages") else {
        return Err(NotRead::Invalid("messages must be a list".into()));
    };
    let mut out = Vec::with_capacity(list.len() + 2);
    if let Some(system) = body.get("system") {
        let mut content = String::new();
        collect_text(system, &mut content);
        out.push(chat("system", content));
    }
    for m in list {
        out.push(message(m, "user"));
    }
    push_tools(body, &mut out);
    Ok(out)
}

/// One message object: its role (else `default_role`), its text, its name.
fn message(m: &Value, default_role: &str) -> ChatMessage {
    let role = m
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or(default_role);
    let mut content = String::new();
    if let Some(c) = m.get("content") {
        collect_text(c, &mut content);
    }
    for key in ["tool_calls", "function_call"] {
        if let Some(calls) = m.get(key) {
            collect_text(calls, &mut content);
        }
    }
    let mut msg = chat(role, content);
    msg.name = m
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| is_label(n))
        .map(str::to_owned);
    msg
}

/// Tool definitions count as their JSON, one message.
fn push_tools(body: &Map<String, Value>, out: &mut Vec<ChatMessage>) {
    if let Some(tools @ Value::Array(list)) = body.get("tools")
        && !list.is_empty()
    {
        out.push(chat("tools", tools.to_string()));
    }
}

fn chat(role: &str, content: String) -> ChatMessage {
    ChatMessage {
        role: if is_label(role) { role } else { "user" }.to_owned(),
        content,
        name: None,
    }
}

fn is_label(s: &str) -> bool {
    s.len() <= MAX_LABEL_BYTES && !s.chars().any(char::is_control)
}

/// The keys whose values are text a model reads (a block's `text`, a
/// message's `content`, a tool call's `arguments`, a tool result's
/// `output`...). Others — `image_url`, `source`, `cache_control`, ids —
/// are not text, and base64 images must not be counted as words.
const TEXT_KEYS: [&str; 11] = [
    "text",
    "content",
    "output",
    "arguments",
    "input",
    "function",
    "name",
    "thinking",
    "refusal",
    "summary",
    "tool_calls",
];

/// Appends the text of `v`: strings as they are; lists item by item;
/// objects by their [`TEXT_KEYS`], a tool's `input`/`arguments` object as JSON.
fn collect_text(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(s);
        }
        Value::Array(items) => items.iter().for_each(|i| collect_text(i, out)),
        Value::Object(o) => {
            for key in TEXT_KEYS {
                match o.get(key) {
                    Some(args @ Value::Object(_)) if matches!(key, "input" | "arguments") => {
                        collect_text(&Value::String(args.to_string()), out);
                    }
                    Some(inner) => collect_text(inner, out),
                    None => {}
                }
            }
        }
        Value::Number(_) | Value::Bool(_) | Value::Null => {}
    }
}

#[cfg(test)]
mod tests;

//! Reading bodies of the three APIs, rewriting their output limits (never
//! raised), and telling what is no LLM call apart from what is in error.

use super::*;

#[test]
fn chat_bodies_are_read_and_their_limit_rewritten_in_place() {
    let body = br#"{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},
        {"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url","image_url":{"url":"data:AAAA"}}]}],
        "max_tokens":500,"stream":true}"#;
    let mut r = LlmRequest::parse("/v1/chat/completions", false, body).unwrap();
    assert_eq!((r.api, r.model.as_str()), (Api::Chat, "gpt-4o"));
    assert_eq!(r.messages[1].content, "Hi", "no image bytes counted");
    assert_eq!((r.max_output_tokens, r.stream), (Some(500), true));
    assert!(r.lacks_stream_usage());
    let out: Value = serde_json::from_slice(&r.rewrite(200, true, None).unwrap()).unwrap();
    assert_eq!(out["max_tokens"], 200);
    assert!(out.get("max_completion_tokens").is_none());
    assert_eq!(out["stream_options"]["include_usage"], true);
    assert!(
        r.rewrite(200, true, None).is_none(),
        "nothing left to change"
    );
    // Every limit field is capped, never raised; the largest reserved, times n.
    let body = br#"{"model":"m","messages":[],"max_completion_tokens":1,"max_tokens":900,"n":3}"#;
    let mut r = LlmRequest::parse("/v1/chat/completions", false, body).unwrap();
    assert_eq!(r.output_to_reserve(), 2700);
    let out: Value = serde_json::from_slice(&r.rewrite(1500, false, None).unwrap()).unwrap();
    assert_eq!(
        (&out["max_completion_tokens"], &out["max_tokens"]),
        (&1.into(), &500.into())
    );
    assert_eq!(r.max_output_tokens, Some(500));
    // The caller's smaller limit survives a grant above it.
    let body = br#"{"model":"m","messages":[],"max_tokens":100,"max_completion_tokens":300}"#;
    let mut r = LlmRequest::parse("/v1/chat/completions", false, body).unwrap();
    assert_eq!(r.output_to_reserve(), 300);
    assert!(
        r.rewrite(300, false, None).is_none(),
        "a grant of all it asked changes neither limit"
    );
    let out: Value = serde_json::from_slice(&r.rewrite(200, false, None).unwrap()).unwrap();
    assert_eq!(
        (&out["max_tokens"], &out["max_completion_tokens"]),
        (&100.into(), &200.into())
    );
}

#[test]
fn a_callers_smaller_output_limit_survives_in_every_api() {
    let cases: [(&str, &[u8], &str); 3] = [
        (
            "/v1/chat/completions",
            br#"{"model":"m","messages":[],"max_completion_tokens":100}"#,
            "max_completion_tokens",
        ),
        (
            "/v1/responses",
            br#"{"model":"m","input":"q","max_output_tokens":100}"#,
            "max_output_tokens",
        ),
        (
            "/v1/messages",
            br#"{"model":"m","messages":[],"max_tokens":100}"#,
            "max_tokens",
        ),
    ];
    for (path, body, field) in cases {
        let mut r = LlmRequest::parse(path, false, body).unwrap();
        assert!(r.rewrite(300, false, None).is_none(), "{path}: kept at 100");
        assert_eq!(r.max_output_tokens, Some(100));
        let out: Value = serde_json::from_slice(&r.rewrite(40, false, None).unwrap()).unwrap();
        assert_eq!(out[field], 40, "{path}: capped at the grant");
    }
}

#[test]
fn responses_and_anthropic_bodies_are_read() {
    let body = br#"{"model":"gpt-4.1","instructions":"Sys","input":[{"role":"user","content":[{"type":"input_text","text":"Q"}]},
        {"type":"function_call_output","call_id":"c1","output":"42"}]}"#;
    let mut r = LlmRequest::parse("/v1/responses", false, body).unwrap();
    let texts: Vec<_> = r.messages.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(texts, ["Sys", "Q", "42"]);
    assert_eq!(r.max_output_tokens, None);
    let out: Value = serde_json::from_slice(&r.rewrite(64, true, None).unwrap()).unwrap();
    assert_eq!(out["max_output_tokens"], 64);
    let body = br#"{"model":"claude-x","system":[{"type":"text","text":"S"}],"max_tokens":1024,
        "messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":1}}]}]}"#;
    let r = LlmRequest::parse("/anthropic/v1/messages", true, body).unwrap();
    assert_eq!(r.api, Api::Messages);
    assert_eq!(r.messages[1].content, "{\"a\":1}\nf");
    assert_eq!(r.max_output_tokens, Some(1024));
}

#[test]
fn what_is_no_llm_call_or_is_in_error_is_told_apart() {
    let parse = |b: &[u8]| LlmRequest::parse("/v1/chat/completions", false, b);
    assert!(matches!(parse(b"not json"), Err(NotRead::Other(_))));
    assert!(matches!(
        parse(br#"{"messages":[]}"#),
        Err(NotRead::Other(_))
    ));
    assert!(matches!(
        parse(br#"{"model":"m","messages":[],"max_tokens":-1}"#),
        Err(NotRead::Invalid(_))
    ));
    assert!(matches!(
        parse(br#"{"model":"m","messages":[],"stream":"yes"}"#),
        Err(NotRead::Invalid(_))
    ));
}

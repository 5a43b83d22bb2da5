//! The answer reader on each API's answers, whole and cut at every byte.

use super::*;

/// Feeds `body` cut at every `step` bytes.
fn read(content_type: &str, body: &[u8], step: usize) -> AnswerReader {
    let mut r = AnswerReader::new(content_type);
    for chunk in body.chunks(step) {
        r.feed(chunk);
    }
    r.finish();
    r
}

const CHAT_STREAM: &str = concat!(
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hé\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"llo\"}}]}\r\n\r\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,",
    "\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n",
    "data: [DONE]\n\n"
);

#[test]
fn a_chat_stream_cut_anywhere_reads_the_same() {
    for step in 1..CHAT_STREAM.len() {
        let mut r = read(
            "text/event-stream; charset=utf-8",
            CHAT_STREAM.as_bytes(),
            step,
        );
        let want = Usage {
            prompt_tokens: 12,
            completion_tokens: 3,
            cached_prompt_tokens: 4,
            ..Usage::default()
        };
        assert_eq!(r.usage(), Some(want), "cut every {step} bytes");
        assert_eq!(r.delivered_text(), "Héllo");
    }
}

#[test]
fn lines_may_end_with_a_bare_cr() {
    let cr = CHAT_STREAM.replace("\r\n", "\n").replace('\n', "\r");
    for step in [1, 3, 50] {
        let mut r = read("text/event-stream", cr.as_bytes(), step);
        assert_eq!(
            r.usage().map(|u| u.completion_tokens),
            Some(3),
            "every {step}"
        );
        assert_eq!(r.delivered_text(), "Héllo");
    }
    // A two-line event in CRLF, cut between each CR and its LF.
    let two = "data: {\"choices\":[],\r\ndata: \"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\r\n\r\n";
    let r = read("text/event-stream", two.as_bytes(), 1);
    assert_eq!(r.usage().map(|u| u.completion_tokens), Some(2));
}

#[test]
fn an_answer_without_content_type_is_told_by_its_first_bytes() {
    let r = read("", CHAT_STREAM.as_bytes(), 9);
    assert_eq!(r.usage().map(|u| u.completion_tokens), Some(3));
    let json = br#"{"usage":{"prompt_tokens":1,"completion_tokens":2}}"#;
    assert_eq!(
        read("", json, 4).usage().map(|u| u.completion_tokens),
        Some(2)
    );
}

#[test]
fn anthropic_streams_join_prompt_and_output() {
    let body = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":",
        "{\"input_tokens\":10,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
    );
    let mut cut = read("text/event-stream", body.as_bytes(), 7);
    assert_eq!(cut.usage(), None, "no message_delta yet");
    let prompt = cut.reported_prompt().unwrap();
    assert_eq!((prompt.prompt_tokens, prompt.cached_prompt_tokens), (15, 5));
    assert_eq!(cut.delivered_text(), "Hi");
    let whole = format!(
        "{body}event: message_delta\ndata: {{\"type\":\"message_delta\",\"usage\":{{\"output_tokens\":9}}}}\n\n"
    );
    let r = read("text/event-stream", whole.as_bytes(), 5);
    assert_eq!(
        r.usage().map(|u| (u.prompt_tokens, u.completion_tokens)),
        Some((15, 9))
    );
}

#[test]
fn whole_answers_of_each_api_give_their_usage() {
    let chat = br#"{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":7,"completion_tokens":2}}"#;
    let responses = br#"{"object":"response","usage":{"input_tokens":7,"output_tokens":2,"input_tokens_details":{"cached_tokens":1}}}"#;
    let anthropic = br#"{"type":"message","usage":{"input_tokens":6,"cache_creation_input_tokens":1,"output_tokens":2}}"#;
    for body in [&chat[..], responses, anthropic] {
        let r = read("application/json", body, 3);
        let u = r.usage().unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens), (7, 2));
    }
    let responses_event = "data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":4}}}\n\n";
    let r = read("text/event-stream", responses_event.as_bytes(), 2);
    assert_eq!(r.usage().map(|u| u.completion_tokens), Some(4));
}

#[test]
fn a_streams_cache_write_split_outlives_a_delta_without_it() {
    let body = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":",
        "{\"input_tokens\":10,\"cache_creation_input_tokens\":30,\"cache_creation\":",
        "{\"ephemeral_5m_input_tokens\":10,\"ephemeral_1h_input_tokens\":20},\"output_tokens\":1}}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":",
        "{\"input_tokens\":10,\"cache_creation_input_tokens\":30,\"output_tokens\":9}}\n\n",
    );
    for step in [1, 7, 300] {
        let u = read("text/event-stream", body.as_bytes(), step)
            .usage()
            .unwrap();
        assert_eq!(
            (
                u.prompt_tokens,
                u.cache_write_prompt_tokens,
                u.cache_write_1h_prompt_tokens
            ),
            (40, 10, 20),
            "every {step}"
        );
        assert_eq!(u.completion_tokens, 9);
    }
}

#[test]
fn cache_writes_and_reasoning_are_read_apart() {
    // Anthropic: the 5-minute and 1-hour writes, or all of it for 5 minutes.
    let split = br#"{"type":"message","usage":{"input_tokens":6,"cache_read_input_tokens":3,"cache_creation_input_tokens":10,"cache_creation":{"ephemeral_5m_input_tokens":4,"ephemeral_1h_input_tokens":6},"output_tokens":2}}"#;
    let u = read("application/json", split, 5).usage().unwrap();
    assert_eq!(
        (u.prompt_tokens, u.cached_prompt_tokens),
        (19, 3),
        "input, read and written"
    );
    assert_eq!(
        (u.cache_write_prompt_tokens, u.cache_write_1h_prompt_tokens),
        (4, 6)
    );
    let whole = br#"{"type":"message","usage":{"input_tokens":6,"cache_creation_input_tokens":10,"output_tokens":2}}"#;
    let u = read("application/json", whole, 5).usage().unwrap();
    assert_eq!(
        (u.cache_write_prompt_tokens, u.cache_write_1h_prompt_tokens),
        (10, 0)
    );
    // OpenAI chat and Responses: reasoning within the completion.
    let chat = br#"{"usage":{"prompt_tokens":7,"completion_tokens":20,"completion_tokens_details":{"reasoning_tokens":12}}}"#;
    let responses = br#"{"object":"response","usage":{"input_tokens":7,"output_tokens":20,"output_tokens_details":{"reasoning_tokens":12}}}"#;
    for body in [&chat[..], responses] {
        let u = read("application/json", body, 4).usage().unwrap();
        assert_eq!((u.completion_tokens, u.reasoning_tokens), (20, 12));
    }
}

//! Billing beyond text: tool definitions by the OpenAI cookbook's rule (against its published
//! counts), tool calls and results in the conversation, and images priced from the headers of
//! real image files built here.

use serde_json::{Value, json};

use crate::common::{base64, png};
use tollgate_estimators::{
    Billing, Estimator, ImageSize, Words, estimate, estimate_with, estimator,
};

/// The cookbook's example (How_to_count_tokens_with_tiktoken): one function, two messages.
fn cookbook_body(model: &str) -> Value {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant that can answer to questions about the weather."},
            {"role": "user", "content": "What's the weather like in San Francisco?"}
        ],
        "tools": [{
            "type": "function",
            "function": {
                "name": "get_current_weather",
                "description": "Get the current weather in a given location",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "location": {
                            "type": "string",
                            "description": "The city and state, e.g. San Francisco, CA"
                        },
                        "unit": {
                            "type": "string",
                            "description": "The unit of temperature to return",
                            "enum": ["celsius", "fahrenheit"]
                        }
                    },
                    "required": ["location"]
                }
            }
        }]
    })
}

#[test]
fn tools_count_as_the_cookbook_publishes_for_o200k_and_cl100k() {
    // The cookbook prints 101 prompt tokens for gpt-4o and gpt-4o-mini, and 105 for
    // gpt-3.5-turbo and gpt-4, on this example.
    for (model, published) in [
        ("gpt-4o", 101),
        ("gpt-4o-mini", 101),
        ("gpt-3.5-turbo", 105),
        ("gpt-4", 105),
    ] {
        let est = estimator(&format!("openai:{model}")).unwrap();
        let counted = estimate(&*est, &cookbook_body(model)).unwrap().input_tokens;
        assert_eq!(counted, published, "{model}");
    }
}

#[test]
fn the_legacy_functions_field_counts_the_same() {
    let est = estimator("openai:gpt-4o").unwrap();
    let mut body = cookbook_body("gpt-4o");
    let tools = body.as_object_mut().unwrap().remove("tools").unwrap();
    let functions: Vec<Value> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"].clone())
        .collect();
    body["functions"] = Value::Array(functions);
    assert_eq!(estimate(&*est, &body).unwrap().input_tokens, 101);
}

#[test]
fn without_an_openai_encoding_tools_cost_their_json_text_which_errs_high() {
    // Anthropic's shape, counted with an estimator that has no tool rule.
    let tool = json!({
        "name": "get_weather",
        "description": "Get the current weather in a given location",
        "input_schema": {
            "type": "object",
            "properties": {"location": {"type": "string", "description": "City and state"}},
            "required": ["location"]
        }
    });
    let body = json!({
        "model": "claude-sonnet-4",
        "max_tokens": 1024,
        "tools": [tool],
        "messages": [{"role": "user", "content": "Weather in Paris?"}]
    });
    let counted = estimate(&Words, &body).unwrap().input_tokens;
    let messages = estimate(&Words, &json!({"messages": body["messages"]}))
        .unwrap()
        .input_tokens;
    let json_text = serde_json::to_string(&tool).unwrap();
    assert_eq!(counted, messages + Words.count(&json_text) as u64);
    // The tool's own text (name, description, property) is well below its JSON.
    let plain = Words.count(
        "get_weather Get the current weather in a given location location string City and state",
    );
    assert!(Words.count(&json_text) > plain);
}

#[test]
fn tool_calls_and_tool_results_in_the_conversation_count() {
    let est = estimator("openai").unwrap();
    let result_text = "Sunny, 24 degrees, light wind from the west, no rain expected today.";
    let anthropic = json!({
        "model": "claude-sonnet-4",
        "max_tokens": 512,
        "messages": [
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": result_text},
                {"type": "tool_result", "tool_use_id": "toolu_02", "content": [{"type": "text", "text": result_text}]}
            ]}
        ]
    });
    let counted = estimate(&*est, &anthropic).unwrap().input_tokens;
    // At least every text the model reads: the prompt, the call and both results.
    let plain: usize = [
        "What's the weather in Paris?",
        "Let me check.",
        "get_weather",
        r#"{"city":"Paris"}"#,
        result_text,
        result_text,
    ]
    .iter()
    .map(|t| est.count(t))
    .sum();
    assert!(counted as usize >= plain, "{counted} < {plain}");
    // And the results are not ignored: without them the count drops by at least their text.
    let mut without = anthropic.clone();
    without["messages"].as_array_mut().unwrap().pop();
    let fewer = estimate(&*est, &without).unwrap().input_tokens;
    assert!(counted - fewer >= 2 * est.count(result_text) as u64);

    // OpenAI's shapes: an assistant's tool call, and the tool's message.
    let openai = json!({
        "model": "gpt-4o",
        "messages": [
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": result_text}
        ]
    });
    let counted = estimate(&*est, &openai).unwrap().input_tokens;
    let plain =
        est.count("get_weather") + est.count("{\"city\":\"Paris\"}") + est.count(result_text);
    assert!(counted as usize >= plain, "{counted} < {plain}");
}

/// A JPEG with an APP0 segment before its baseline start-of-frame.
fn jpeg(w: u16, h: u16) -> Vec<u8> {
    let mut bytes = vec![0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10];
    bytes.extend_from_slice(b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00");
    bytes.extend_from_slice(&[0xff, 0xc0, 0x00, 0x11, 0x08]);
    bytes.extend_from_slice(&h.to_be_bytes());
    bytes.extend_from_slice(&w.to_be_bytes());
    bytes.extend_from_slice(&[3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
    bytes
}

fn gif(w: u16, h: u16) -> Vec<u8> {
    let mut bytes = b"GIF89a".to_vec();
    bytes.extend_from_slice(&w.to_le_bytes());
    bytes.extend_from_slice(&h.to_le_bytes());
    bytes.extend_from_slice(&[0xf7, 0, 0]);
    bytes
}

/// An extended WebP (VP8X): 24-bit width and height, each minus one.
fn webp(w: u32, h: u32) -> Vec<u8> {
    let mut bytes = b"RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x00\x00\x00\x00".to_vec();
    bytes.extend_from_slice(&(w - 1).to_le_bytes()[..3]);
    bytes.extend_from_slice(&(h - 1).to_le_bytes()[..3]);
    bytes
}

fn data_url(kind: &str, bytes: &[u8]) -> String {
    format!("data:image/{kind};base64,{}", base64(bytes))
}

/// The image tokens of one OpenAI image part, as the estimate adds them.
fn openai_image(est: &dyn Estimator, url: &str, detail: Option<&str>) -> u64 {
    let mut part = json!({"type": "image_url", "image_url": {"url": url}});
    if let Some(detail) = detail {
        part["image_url"]["detail"] = json!(detail);
    }
    let with = json!([{"role": "user", "content": [part]}]);
    let without = json!([{"role": "user", "content": []}]);
    estimate(est, &with).unwrap().input_tokens - estimate(est, &without).unwrap().input_tokens
}

#[test]
fn openai_images_cost_their_tiles_from_the_size_in_their_header() {
    let est = estimator("openai:gpt-4o").unwrap();
    // 1024 × 1024: scaled to 768 × 768, 4 tiles: 765. Low detail: 85.
    assert_eq!(
        openai_image(&*est, &data_url("png", &png(1024, 1024)), None),
        765
    );
    assert_eq!(
        openai_image(&*est, &data_url("png", &png(1024, 1024)), Some("low")),
        85
    );
    // 2048 × 4096: 768 × 1536, 6 tiles: 1105 (OpenAI's own example).
    assert_eq!(
        openai_image(&*est, &data_url("jpeg", &jpeg(2048, 4096)), Some("high")),
        1105
    );
    // 200 × 100 is one tile, not scaled up: 255.
    assert_eq!(
        openai_image(&*est, &data_url("gif", &gif(200, 100)), Some("auto")),
        255
    );
    assert_eq!(
        openai_image(&*est, &data_url("webp", &webp(1000, 1000)), None),
        765
    );
    // A remote image can't be read: the most an image costs, unless the caller says more.
    assert_eq!(
        openai_image(&*est, "https://example.com/cat.png", None),
        1445
    );
    let small = Billing::default().remote_image_size(ImageSize {
        width: 512,
        height: 512,
    });
    let body = json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]);
    let empty = json!([{"role": "user", "content": []}]);
    assert_eq!(
        estimate_with(&*est, &body, &small).unwrap().input_tokens
            - estimate(&*est, &empty).unwrap().input_tokens,
        255
    );
    // The responses API puts the URL and the detail side by side.
    let responses = json!({"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": data_url("png", &png(1024, 1024)), "detail": "low"}
    ]}]});
    let no_image = json!({"input": [{"role": "user", "content": []}]});
    assert_eq!(
        estimate(&*est, &responses).unwrap().input_tokens
            - estimate(&*est, &no_image).unwrap().input_tokens,
        85
    );
}

#[test]
fn patch_models_count_patches_with_their_multiplier() {
    let est = estimator("openai:gpt-4.1-mini").unwrap();
    // 32 × 32 patches, times 1.62.
    assert_eq!(
        openai_image(&*est, &data_url("png", &png(1024, 1024)), None),
        1659
    );
}

#[test]
fn anthropic_images_cost_their_area_over_750() {
    let est = estimator("openai").unwrap();
    let image = |bytes: &[u8]| {
        let body = json!({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64(bytes)}}
        ]}]});
        let empty = json!({"messages": [{"role": "user", "content": []}]});
        estimate(&*est, &body).unwrap().input_tokens - estimate(&*est, &empty).unwrap().input_tokens
    };
    assert_eq!(image(&png(1000, 1000)), 1334);
    assert_eq!(image(&jpeg(200, 200)), 54);
    // Scaled to a long edge of 1568 first, and never above the cap.
    assert_eq!(image(&png(8000, 8000)), 1600);
}

//! The accuracy table of BENCHMARKS.md: tollgate's estimate of six realistic request bodies (and one
//! that shows where it errs high) against a reference count made here without tollgate's
//! code: tiktoken-rs's `num_tokens_from_messages`, the OpenAI cookbook's `num_tokens_for_tools`
//! written out again below, the image rules computed by hand, and bare tiktoken encodings.
//!
//! The test fails when an estimate falls below its reference, when an OpenAI shape is not
//! exact, or when the table in BENCHMARKS.md differs from what this run computes (the failure
//! prints the table to paste).

use serde_json::{Value, json};
use tiktoken_rs::{ChatCompletionRequestMessage, CoreBPE, num_tokens_from_messages};
use tollgate_estimators::{Estimator, estimate, estimator};

const START: &str = "<!-- accuracy table: estimators/tests/estimators/accuracy.rs -->";
const END: &str = "<!-- end of accuracy table -->";

fn o200k() -> CoreBPE {
    tiktoken_rs::o200k_base().unwrap()
}

fn count(bpe: &CoreBPE, text: &str) -> u64 {
    bpe.encode_with_special_tokens(text).len() as u64
}

fn message(role: &str, content: &str) -> ChatCompletionRequestMessage {
    ChatCompletionRequestMessage {
        role: role.to_owned(),
        content: Some(content.to_owned()),
        ..Default::default()
    }
}

fn as_json(messages: &[ChatCompletionRequestMessage]) -> Value {
    Value::Array(
        messages
            .iter()
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect(),
    )
}

/// The cookbook's `num_tokens_for_tools` for gpt-4o, written out from its Python: 7 per
/// function, `name:description` (without a final period), 3 to open the properties, 3 per
/// property and its `name:type:description`, −3 for an enum and 3 plus its text per item, 12 to
/// end.
fn cookbook_tools(bpe: &CoreBPE, tools: &Value) -> u64 {
    let (func_init, prop_init, prop_key, enum_init, enum_item, func_end) = (7, 3, 3, -3, 3, 12);
    let trim = |s: &str| s.strip_suffix('.').unwrap_or(s).to_owned();
    let mut total: i64 = 0;
    for tool in tools.as_array().unwrap() {
        let function = &tool["function"];
        total += func_init;
        let line = format!(
            "{}:{}",
            function["name"].as_str().unwrap(),
            trim(function["description"].as_str().unwrap())
        );
        total += count(bpe, &line) as i64;
        let properties = function["parameters"]["properties"].as_object().unwrap();
        if !properties.is_empty() {
            total += prop_init;
            for (key, property) in properties {
                total += prop_key;
                if let Some(items) = property.get("enum") {
                    total += enum_init;
                    for item in items.as_array().unwrap() {
                        total += enum_item + count(bpe, item.as_str().unwrap()) as i64;
                    }
                }
                let line = format!(
                    "{key}:{}:{}",
                    property["type"].as_str().unwrap(),
                    trim(property["description"].as_str().unwrap())
                );
                total += count(bpe, &line) as i64;
            }
        }
    }
    if !tools.as_array().unwrap().is_empty() {
        total += func_end;
    }
    u64::try_from(total).unwrap()
}

/// OpenAI's tile rule by hand: fit into 2048 × 2048, scale the short side down to 768, then
/// 170 a 512-px tile plus 85.
fn tiles(width: u64, height: u64) -> u64 {
    let (mut w, mut h) = (width as f64, height as f64);
    if w > 2048.0 || h > 2048.0 {
        let scale = 2048.0 / w.max(h);
        (w, h) = ((w * scale).floor(), (h * scale).floor());
    }
    if w.min(h) > 768.0 {
        let scale = 768.0 / w.min(h);
        (w, h) = ((w * scale).floor(), (h * scale).floor());
    }
    let across = (w / 512.0).ceil() as u64;
    let down = (h / 512.0).ceil() as u64;
    170 * across * down + 85
}

/// A real PNG header for an image of `w` × `h`, as a base64 data URL.
fn png_url(w: u32, h: u32) -> String {
    format!(
        "data:image/png;base64,{}",
        crate::common::base64(&crate::common::png(w, h))
    )
}

/// Paragraphs of the sample texts, to make turns of a long conversation from.
fn paragraphs() -> Vec<String> {
    ["english.txt", "code_rs.txt", "chinese.txt", "japanese.txt"]
        .iter()
        .flat_map(|name| {
            crate::common::sample(name)
                .split("\n\n")
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

struct Row {
    body: &'static str,
    estimator: &'static str,
    reference_rule: &'static str,
    estimate: u64,
    reference: u64,
    why: &'static str,
}

fn rows() -> Vec<Row> {
    let bpe = o200k();
    let gpt4o = estimator("openai:gpt-4o").unwrap();
    let input = |est: &dyn Estimator, body: &Value| estimate(est, body).unwrap().input_tokens;
    let mut rows = Vec::new();

    // 1. A chat with a system prompt.
    let chat = vec![
        message(
            "system",
            "You are a support assistant for a bicycle shop. Answer in two sentences at most, \
             and never promise a delivery date.",
        ),
        message(
            "user",
            "My rear derailleur skips under load. Is it the cable or the hanger?",
        ),
        message(
            "assistant",
            "Skipping under load is most often cable stretch; try a quarter turn on the barrel \
             adjuster first. If that doesn't help, the hanger may be bent.",
        ),
        message("user", "It still skips. Can you book me in for Saturday?"),
    ];
    let body = json!({"model": "gpt-4o", "max_tokens": 200, "messages": as_json(&chat)});
    rows.push(Row {
        body: "chat with a system prompt (4 messages)",
        estimator: "`openai:gpt-4o`",
        reference_rule: "`num_tokens_from_messages`",
        estimate: input(&*gpt4o, &body),
        reference: num_tokens_from_messages("gpt-4o", &chat).unwrap() as u64,
        why: "exact",
    });

    // 2. A chat with tools (two functions, one with an enum).
    let tools = json!([
        {"type": "function", "function": {
            "name": "find_order",
            "description": "Look up an order by its number or the customer's email address.",
            "parameters": {"type": "object", "properties": {
                "order_number": {"type": "string", "description": "The order number, like A-10293."},
                "email": {"type": "string", "description": "The customer's email address."}
            }}
        }},
        {"type": "function", "function": {
            "name": "book_repair",
            "description": "Book a workshop slot for a repair.",
            "parameters": {"type": "object", "properties": {
                "day": {"type": "string", "description": "The day of the week.",
                        "enum": ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday"]},
                "kind": {"type": "string", "description": "What needs repairing.",
                         "enum": ["gears", "brakes", "wheel", "other"]},
                "note": {"type": "string", "description": "Anything the mechanic should know."}
            }, "required": ["day", "kind"]}
        }}
    ]);
    let body = json!({"model": "gpt-4o", "messages": as_json(&chat), "tools": tools});
    rows.push(Row {
        body: "chat with two tools (the same 4 messages)",
        estimator: "`openai:gpt-4o`",
        reference_rule: "`num_tokens_from_messages` + cookbook `num_tokens_for_tools`",
        estimate: input(&*gpt4o, &body),
        reference: num_tokens_from_messages("gpt-4o", &chat).unwrap() as u64
            + cookbook_tools(&bpe, &tools),
        why: "exact",
    });

    // 3. A chat with images whose size the request carries (PNG data URLs).
    let question = "Which of these two photos shows the bent hanger?";
    let image_body = |first: String, second: String| {
        json!({"model": "gpt-4o", "messages": [
            {"role": "system", "content": chat[0].content},
            {"role": "user", "content": [
                {"type": "text", "text": question},
                {"type": "image_url", "image_url": {"url": first}},
                {"type": "image_url", "image_url": {"url": second, "detail": "low"}}
            ]}
        ]})
    };
    let text_only = vec![chat[0].clone(), message("user", question)];
    let text_reference = num_tokens_from_messages("gpt-4o", &text_only).unwrap() as u64;
    rows.push(Row {
        body: "chat with a 1920×1080 image and a low-detail one",
        estimator: "`openai:gpt-4o`",
        reference_rule: "`num_tokens_from_messages` + tiles by hand (1,105 + 85)",
        estimate: input(&*gpt4o, &image_body(png_url(1920, 1080), png_url(640, 480))),
        reference: text_reference + tiles(1920, 1080) + 85,
        why: "exact",
    });
    rows.push(Row {
        body: "the same, the first image a remote URL",
        estimator: "`openai:gpt-4o`",
        reference_rule: "as above",
        estimate: input(
            &*gpt4o,
            &image_body(
                "https://example.com/photos/hanger-1920x1080.jpg".to_owned(),
                png_url(640, 480),
            ),
        ),
        reference: text_reference + tiles(1920, 1080) + 85,
        why: "high: a remote image's size can't be read, so it costs the most an image can \
              (1,445)",
    });

    // 4. A long multi-turn conversation: 60 turns over the sample texts.
    let paragraphs = paragraphs();
    let mut long = vec![message("system", "You are a careful technical editor.")];
    for turn in 0..60usize {
        let role = if turn.is_multiple_of(2) {
            "user"
        } else {
            "assistant"
        };
        long.push(message(role, &paragraphs[turn % paragraphs.len()]));
    }
    let body = json!({"model": "gpt-4o", "max_tokens": 1000, "messages": as_json(&long)});
    rows.push(Row {
        body: "long chat: 61 messages of prose, code, Chinese and Japanese",
        estimator: "`openai:gpt-4o`",
        reference_rule: "`num_tokens_from_messages`",
        estimate: input(&*gpt4o, &body),
        reference: num_tokens_from_messages("gpt-4o", &long).unwrap() as u64,
        why: "exact",
    });

    // 5. An Anthropic messages request: system, a tool, a tool call and its result.
    let openai = estimator("openai").unwrap();
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Lyon"}
    }, "required": ["city"]});
    let result = "Light rain until 14:00, then clearing; 17 °C, wind 12 km/h from the south-west.";
    let body = json!({
        "model": "claude-sonnet-4",
        "max_tokens": 1024,
        "system": "You plan cycling routes and check the weather before you suggest one.",
        "tools": [{"name": "get_weather", "description": "Today's weather for a city.", "input_schema": schema}],
        "messages": [
            {"role": "user", "content": "Is it a good afternoon for the Lyon to Vienne route?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check the weather first."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Lyon"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": result}
            ]}
        ]
    });
    // Anthropic publishes no tokenizer: the reference is the floor, every text the model reads
    // counted bare in o200k (no framing, the tool as its name, description and schema text).
    let bare: u64 = [
        "You plan cycling routes and check the weather before you suggest one.",
        "get_weather",
        "Today's weather for a city.",
        "city",
        "The city, e.g. Lyon",
        "Is it a good afternoon for the Lyon to Vienne route?",
        "Let me check the weather first.",
        "get_weather",
        r#"{"city":"Lyon"}"#,
        result,
    ]
    .iter()
    .map(|t| count(&bpe, t))
    .sum();
    rows.push(Row {
        body: "Anthropic messages: system, a tool, a tool call and its result",
        estimator: "`openai`",
        reference_rule: "bare text in o200k (Anthropic publishes no tokenizer)",
        estimate: input(&*openai, &body),
        reference: bare,
        why: "high: OpenAI's framing per message, the tool schema as its JSON text",
    });

    // 6. An embeddings batch of 16 inputs.
    let inputs: Vec<&str> = paragraphs.iter().take(16).map(String::as_str).collect();
    let small = estimator("openai:text-embedding-3-small").unwrap();
    let cl100k = tiktoken_rs::cl100k_base().unwrap();
    let body = json!({"model": "text-embedding-3-small", "input": inputs});
    rows.push(Row {
        body: "embeddings batch: 16 inputs",
        estimator: "`openai:text-embedding-3-small`",
        reference_rule: "each input in cl100k, summed",
        estimate: input(&*small, &body),
        reference: inputs.iter().map(|t| count(&cl100k, t)).sum(),
        why: "exact",
    });
    rows
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| request body | estimator | reference | tollgate | reference count | error |\n\
         |---|---|---|---|---|---|\n",
    );
    for row in rows {
        let error = if row.estimate == row.reference {
            "exact".to_owned()
        } else {
            let over = row.estimate - row.reference;
            format!(
                "+{} (+{:.1}%), {}",
                thousands(over),
                100.0 * over as f64 / row.reference as f64,
                row.why.trim_start_matches("high: ")
            )
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            row.body,
            row.estimator,
            row.reference_rule,
            thousands(row.estimate),
            thousands(row.reference),
            error
        ));
    }
    out
}

#[test]
fn estimates_never_fall_below_the_reference_and_openai_shapes_are_exact() {
    for row in rows() {
        assert!(
            row.estimate >= row.reference,
            "{}: {} < {}",
            row.body,
            row.estimate,
            row.reference
        );
        if row.why == "exact" {
            assert_eq!(row.estimate, row.reference, "{}", row.body);
        } else {
            assert!(
                row.estimate > row.reference,
                "{} was meant to err high",
                row.body
            );
        }
    }
}

#[test]
fn the_benchmarks_page_shows_the_table_this_test_computes() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../BENCHMARKS.md");
    let Ok(page) = std::fs::read_to_string(path) else {
        // Built from the published package, where the workspace's pages are not beside it.
        assert!(
            std::env::var_os("TOLLGATE_REQUIRE_FIXTURES").is_none(),
            "{path} not found (TOLLGATE_REQUIRE_FIXTURES is set, so this fails instead of skipping)"
        );
        eprintln!("SKIPPED: {path} not found");
        return;
    };
    let computed = table(&rows());
    let start = page
        .find(START)
        .expect("BENCHMARKS.md has the table's start marker")
        + START.len();
    let end = page
        .find(END)
        .expect("BENCHMARKS.md has the table's end marker");
    let shown = page[start..end].trim();
    assert_eq!(
        shown,
        computed.trim(),
        "the accuracy table in BENCHMARKS.md is out of date; paste this between its markers:\n{computed}"
    );
}

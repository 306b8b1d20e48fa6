//! Text from arguments: chat messages billed as OpenAI bills them, request bodies of each
//! provider's shape, plain values and user structs.

use serde::Serialize;
use serde_json::json;
use tiktoken_rs::{ChatCompletionRequestMessage, num_tokens_from_messages};
use tollgate_estimators::{Estimate, Estimator, Words, estimate, estimator, tally};

fn openai() -> std::sync::Arc<dyn Estimator> {
    estimator("openai").unwrap()
}

fn message(role: &str, content: &str, name: Option<&str>) -> ChatCompletionRequestMessage {
    ChatCompletionRequestMessage {
        role: role.to_owned(),
        content: Some(content.to_owned()),
        name: name.map(str::to_owned),
        ..Default::default()
    }
}

fn as_json(messages: &[ChatCompletionRequestMessage]) -> serde_json::Value {
    serde_json::Value::Array(
        messages
            .iter()
            .map(|m| {
                let mut v = json!({"role": m.role, "content": m.content});
                if let Some(name) = &m.name {
                    v["name"] = json!(name);
                }
                v
            })
            .collect(),
    )
}

fn conversations() -> Vec<Vec<ChatCompletionRequestMessage>> {
    vec![
        vec![message("user", "Hello!", None)],
        vec![
            message(
                "system",
                "You are a helpful assistant that only speaks French.",
                None,
            ),
            message("user", "Hello, how are you?", None),
            message("assistant", "Je vais bien, merci. Et vous ?", None),
            message("user", "Parlez-vous anglais?", Some("example_user")),
        ],
        vec![
            message("system", "You summarise documents.", Some("summariser")),
            message("user", &crate::common::sample("english.txt"), None),
        ],
        vec![
            message(
                "user",
                &crate::common::sample("japanese.txt"),
                Some("tanaka"),
            ),
            message(
                "assistant",
                &crate::common::sample("chinese.txt"),
                Some("wang"),
            ),
            message("user", "", None),
        ],
        vec![message("user", &crate::common::sample("code_rs.txt"), None)],
    ]
}

#[test]
fn chat_messages_equal_tiktoken_rs_num_tokens_from_messages() {
    for (i, conversation) in conversations().iter().enumerate() {
        for model in ["gpt-4o", "gpt-4"] {
            let expected = num_tokens_from_messages(model, conversation).unwrap() as u64;
            let est = estimator(&format!("openai:{model}")).unwrap();
            // As a JSON list, as a request body, and as typed structs.
            let list = estimate(&*est, &as_json(conversation)).unwrap();
            assert_eq!(list.input_tokens, expected, "conversation {i} on {model}");
            let body =
                json!({"model": model, "temperature": 0.2, "messages": as_json(conversation)});
            assert_eq!(estimate(&*est, &body).unwrap().input_tokens, expected);
            let typed: Vec<Msg> = conversation
                .iter()
                .map(|m| Msg {
                    role: m.role.clone(),
                    content: m.content.clone().unwrap_or_default(),
                    name: m.name.clone(),
                })
                .collect();
            assert_eq!(estimate(&*est, &typed).unwrap().input_tokens, expected);
        }
    }
}

#[derive(Serialize)]
struct Msg {
    role: String,
    content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
}

#[test]
fn content_parts_count_their_text_and_their_images() {
    let est = openai();
    let parts = json!([{
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this image?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a-very-long-url.png"}},
            {"type": "text", "text": "Answer briefly."}
        ]
    }]);
    // The URL is not text; the remote image, whose size can't be read, costs the most an image
    // can cost under OpenAI's tiles (a 2048 × 768 image: 8 tiles, 1,445 tokens).
    let expected = 3
        + est.count("user")
        + est.count("What is in this image?")
        + est.count("Answer briefly.")
        + 1_445
        + 3;
    assert_eq!(
        estimate(&*est, &parts).unwrap().input_tokens,
        expected as u64
    );
}

#[test]
fn openai_chat_body_counts_messages_not_model_and_reserves_output() {
    let est = openai();
    let body = json!({
        "model": "gpt-4o-mini-with-a-very-long-deployment-name",
        "max_completion_tokens": 300,
        "n": 3,
        "temperature": 0.7,
        "user": "user-1234567890",
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Name three rivers."}
        ]
    });
    let expected = 3
        + est.count("system")
        + est.count("Be terse.")
        + 3
        + est.count("user")
        + est.count("Name three rivers.")
        + 3;
    assert_eq!(
        estimate(&*est, &body).unwrap(),
        Estimate {
            input_tokens: expected as u64,
            reserved_output: 900
        }
    );
}

#[test]
fn anthropic_body_counts_system_and_messages() {
    let est = openai();
    let body = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": [{"type": "text", "text": "You are a careful reviewer."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Review this patch."}]}
        ]
    });
    let expected = est.count("You are a careful reviewer.")
        + 3
        + est.count("user")
        + est.count("Review this patch.")
        + 3;
    assert_eq!(
        estimate(&*est, &body).unwrap(),
        Estimate {
            input_tokens: expected as u64,
            reserved_output: 1024
        }
    );
    // A plain string system prompt counts the same.
    let body = json!({"system": "You are a careful reviewer.", "messages": []});
    assert_eq!(
        estimate(&*est, &body).unwrap().input_tokens,
        est.count("You are a careful reviewer.") as u64
    );
}

/// Every field a provider bills counts, whatever the endpoint: the responses API's
/// `instructions` and input items (tool outputs among them), a predicted output, a
/// completion's `suffix`, a rerank's query and documents; and a field the rules don't know
/// counts too (a request errs high, never low), while parameters like `model` and `stop` don't.
#[test]
fn every_billed_field_of_a_request_counts_and_parameters_do_not() {
    let est = openai();
    let count = |text: &str| est.count(text) as u64;
    let responses = json!({
        "model": "gpt-4.1",
        "instructions": "Answer as a pirate would.",
        "input": [
            {"role": "user", "content": "Where is the treasure?"},
            {"type": "function_call_output", "call_id": "c1", "output": "Under the palm tree."}
        ],
        "stop": ["\n\n"],
        "reasoning": {"effort": "high"}
    });
    let input = estimate(&*est, &responses).unwrap().input_tokens;
    let message = 3 + count("user") + count("Where is the treasure?");
    let tool = count("c1") + count("Under the palm tree.");
    assert_eq!(
        input,
        count("Answer as a pirate would.") + message + tool + 3
    );

    let predicted = json!({
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "Fix the bug."}],
        "prediction": {"type": "content", "content": "fn main() { println!(\"hi\"); }"}
    });
    let base = 3 + count("user") + count("Fix the bug.") + 3;
    assert_eq!(
        estimate(&*est, &predicted).unwrap().input_tokens,
        base + count("fn main() { println!(\"hi\"); }")
    );

    let suffix = json!({"model": "x", "prompt": "def f(", "suffix": "    return y"});
    assert_eq!(
        estimate(&*est, &suffix).unwrap().input_tokens,
        count("def f(") + count("    return y")
    );

    let rerank = json!({"model": "rerank-2", "query": "rivers", "documents": ["Nile", "Amazon"], "top_k": 1});
    assert_eq!(
        estimate(&*est, &rerank).unwrap().input_tokens,
        count("rivers") + count("Nile") + count("Amazon")
    );

    let unknown = json!({"messages": [], "new_field": "a long text the rules don't know"});
    assert_eq!(
        estimate(&*est, &unknown).unwrap().input_tokens,
        count("a long text the rules don't know")
    );
}

#[test]
fn embedding_bodies_count_input() {
    let est = estimator("voyageai").unwrap();
    let voyage = json!({
        "model": "voyage-3",
        "input_type": "document",
        "input": ["first document", "second, longer document about rivers"]
    });
    let expected = est.count("first document") + est.count("second, longer document about rivers");
    assert_eq!(
        estimate(&*est, &voyage).unwrap().input_tokens,
        expected as u64
    );
    assert_eq!(estimate(&*est, &voyage).unwrap().reserved_output, 0);

    let openai = openai();
    let single = json!({"model": "text-embedding-3-small", "input": "one string"});
    assert_eq!(
        estimate(&*openai, &single).unwrap().input_tokens,
        openai.count("one string") as u64
    );
    // Pre-tokenized input: each integer is a token.
    let tokens = json!({"model": "text-embedding-3-small", "input": [[1, 2, 3], [4, 5]]});
    assert_eq!(estimate(&*openai, &tokens).unwrap().input_tokens, 5);
    // A completion prompt.
    let prompt =
        json!({"model": "gpt-3.5-turbo-instruct", "prompt": "Once upon a time", "max_tokens": 50});
    assert_eq!(
        estimate(&*openai, &prompt).unwrap(),
        Estimate {
            input_tokens: openai.count("Once upon a time") as u64,
            reserved_output: 50
        }
    );
}

#[test]
fn plain_values_count_every_string() {
    let est = openai();
    let count = |s: &str| est.count(s) as u64;
    assert_eq!(
        estimate(&*est, "a plain string").unwrap().input_tokens,
        count("a plain string")
    );
    let list = vec!["one", "two three", "four"];
    assert_eq!(
        estimate(&*est, &list).unwrap().input_tokens,
        count("one") + count("two three") + count("four")
    );
    let nested =
        json!({"title": "Rivers", "tags": ["nile", "amazon"], "pages": 12, "draft": false});
    assert_eq!(
        estimate(&*est, &nested).unwrap().input_tokens,
        count("Rivers") + count("nile") + count("amazon")
    );
    assert_eq!(
        estimate(&*est, &Some("maybe")).unwrap().input_tokens,
        count("maybe")
    );
    assert_eq!(
        estimate(&*est, &('x', "y")).unwrap().input_tokens,
        count("x") + count("y")
    );
}

#[derive(Serialize)]
struct Ticket {
    id: u64,
    title: String,
    body: String,
    labels: Vec<String>,
    assignee: Option<String>,
    priority: Priority,
    history: Vec<Event>,
}

#[derive(Serialize)]
enum Priority {
    High,
}

#[derive(Serialize)]
enum Event {
    Comment { author: String, text: String },
    Closed(String),
}

#[test]
fn user_struct_with_derived_serialize() {
    let est = openai();
    let count = |s: &str| est.count(s) as u64;
    let ticket = Ticket {
        id: 7,
        title: "Limiter drops tokens".into(),
        body: "After a refusal the partial credit vanished.".into(),
        labels: vec!["bug".into(), "core".into()],
        assignee: None,
        priority: Priority::High,
        history: vec![
            Event::Comment {
                author: "ana".into(),
                text: "Reproduced on main.".into(),
            },
            Event::Closed("fixed in 0.1.1".into()),
        ],
    };
    let expected = count("Limiter drops tokens")
        + count("After a refusal the partial credit vanished.")
        + count("bug")
        + count("core")
        + count("ana")
        + count("Reproduced on main.")
        + count("fixed in 0.1.1");
    assert_eq!(estimate(&*est, &ticket).unwrap().input_tokens, expected);
}

#[test]
fn empty_input_costs_at_least_one_token() {
    let est = openai();
    assert_eq!(estimate(&*est, "").unwrap().input_tokens, 1);
    assert_eq!(
        estimate(&*est, &Vec::<String>::new()).unwrap().input_tokens,
        1
    );
    assert_eq!(estimate(&*est, &json!({})).unwrap().input_tokens, 1);
    assert_eq!(estimate(&Words, &()).unwrap().input_tokens, 1);
}

struct Failing;

impl Serialize for Failing {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("this value refuses to serialize"))
    }
}

#[test]
fn a_failing_serialize_is_an_error_not_a_panic() {
    let err = estimate(&Words, &vec![Failing]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "could not read the text of the arguments: this value refuses to serialize"
    );
}

/// A value nested `depth` lists deep, built without recursion.
fn nested_lists(depth: usize) -> serde_json::Value {
    let mut value = serde_json::json!("deep text");
    for _ in 0..depth {
        value = serde_json::Value::Array(vec![value]);
    }
    value
}

/// Takes a nested value apart without recursion (serde_json's own drop recurses).
fn flatten(mut value: serde_json::Value) {
    let mut stack = Vec::new();
    loop {
        match value {
            serde_json::Value::Array(items) => stack.extend(items),
            serde_json::Value::Object(map) => stack.extend(map.into_iter().map(|(_, v)| v)),
            _ => {}
        }
        match stack.pop() {
            Some(next) => value = next,
            None => return,
        }
    }
}

#[derive(Serialize)]
struct Nest(Option<Box<Nest>>);

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    // On a thread with a small stack, so that unbounded recursion would overflow it.
    std::thread::Builder::new()
        .stack_size(512 << 10)
        .spawn(|| {
            let shallow = nested_lists(100);
            assert_eq!(tally(&Words, &shallow).unwrap().input_tokens, 2);
            flatten(shallow);
            for depth in [129, 3_000, 100_000] {
                let deep = nested_lists(depth);
                let err = tally(&Words, &deep).unwrap_err();
                assert!(err.to_string().contains("deeper than 128"), "{err}");
                flatten(deep);
            }
            // Options and newtypes count as levels too.
            let mut nest = Nest(None);
            for _ in 0..10_000 {
                nest = Nest(Some(Box::new(nest)));
            }
            assert!(tally(&Words, &nest).is_err());
            let mut nest = Some(nest);
            // Taken apart by hand, for the same reason as the lists.
            while let Some(Nest(inner)) = nest {
                nest = inner.map(|b| *b);
            }
        })
        .unwrap()
        .join()
        .unwrap();
}

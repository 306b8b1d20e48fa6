//! The official SDKs through the proxy: Python's `openai` and `anthropic`, Node's `openai`.
//!
//! They are installed by `proxy/tests/install-clients.sh DIR` and found through
//! `TOLLGATE_PROXY_CLIENTS=DIR`. Without it these tests say so and pass, unless
//! `TOLLGATE_REQUIRE_CLIENTS=1` (as in CI), where a missing SDK fails them. Each test runs one
//! case of `proxy/tests/clients/sdk_calls.{py,js}`, which prints what the SDK handed back as
//! one JSON line.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use tollgate_proxy::Running;
use tollgate_testkit::provider::{self, Options, Provider};

use crate::common::*;

/// The SDK tests run one at a time: each starts Python or Node processes, and on two cores
/// their start-up would otherwise land inside the timing of the 80-call run. (The status page's
/// browser test takes it too.)
pub static SDK_RUNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Where the SDKs are.
pub(crate) struct Clients {
    dir: PathBuf,
}

#[derive(Clone, Copy)]
pub(crate) enum Sdk {
    Python,
    Node,
}

/// The SDKs, or `None` (with a message) when they are not installed and not required.
pub(crate) fn clients(test: &str) -> Option<Clients> {
    let required = std::env::var("TOLLGATE_REQUIRE_CLIENTS").is_ok_and(|v| v == "1");
    let dir = std::env::var_os("TOLLGATE_PROXY_CLIENTS").map(PathBuf::from);
    match dir {
        Some(dir) => {
            let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
            let python = dir.join("python/bin/python").exists()
                || dir.join("python-packages/openai").exists();
            let node = dir.join("node/node_modules/openai").exists();
            assert!(
                python && node,
                "TOLLGATE_PROXY_CLIENTS={} holds no SDKs: run proxy/tests/install-clients.sh {0}",
                dir.display()
            );
            Some(Clients { dir })
        }
        None if required => panic!(
            "TOLLGATE_REQUIRE_CLIENTS=1 but TOLLGATE_PROXY_CLIENTS is not set: run proxy/tests/install-clients.sh DIR and export TOLLGATE_PROXY_CLIENTS=DIR"
        ),
        None => {
            eprintln!(
                "{test}: skipped, the SDKs are not installed (proxy/tests/install-clients.sh DIR, then TOLLGATE_PROXY_CLIENTS=DIR)"
            );
            None
        }
    }
}

fn scripts() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients"))
}

/// Variables of the test's own environment that would send an SDK elsewhere or change what
/// it sends.
const UNWANTED: [&str; 12] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "OPENAI_ORG_ID",
    "OPENAI_PROJECT_ID",
    "OPENAI_LOG",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_LOG",
    "NODE_OPTIONS",
];

impl Clients {
    /// Runs one case with the SDK pointed at `proxy`, and reads the JSON it printed last.
    pub(crate) async fn run(&self, sdk: Sdk, proxy: std::net::SocketAddr, case: &[&str]) -> Value {
        let mut command = match sdk {
            Sdk::Python => {
                let venv = self.dir.join("python/bin/python");
                let mut command = if venv.exists() {
                    tokio::process::Command::new(venv)
                } else {
                    let mut command = tokio::process::Command::new("python3");
                    command.env("PYTHONPATH", self.dir.join("python-packages"));
                    command
                };
                command.arg(scripts().join("sdk_calls.py"));
                command
            }
            Sdk::Node => {
                let mut command = tokio::process::Command::new("node");
                command
                    .env("NODE_PATH", self.dir.join("node/node_modules"))
                    .arg(scripts().join("sdk_calls.js"));
                command
            }
        };
        for name in UNWANTED {
            command.env_remove(name);
        }
        command
            .args(case)
            .env("OPENAI_BASE_URL", format!("http://{proxy}/v1"))
            .env("OPENAI_API_KEY", "sk-tollgate-test")
            .env("ANTHROPIC_BASE_URL", format!("http://{proxy}"))
            .env("ANTHROPIC_API_KEY", "sk-ant-tollgate-test")
            .env("NO_PROXY", "*")
            .kill_on_drop(true);
        let output = tokio::time::timeout(Duration::from_secs(120), command.output())
            .await
            .expect("the SDK's script ends within 2 minutes")
            .expect("the SDK's interpreter starts");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{case:?} failed ({}):\n{stdout}\n{stderr}",
            output.status
        );
        let last = stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last)
            .unwrap_or_else(|e| panic!("{case:?} printed no JSON ({e}):\n{stdout}\n{stderr}"))
    }
}

/// The body the scripts send for `chat` and `stream` (`PROMPT` in them), as the stand-in
/// counts it.
fn prompt_tokens() -> u64 {
    provider::chat_prompt(
        &json!({"messages": [{"role": "user", "content": "Say hello to the proxy"}]}),
    )
}

/// What the stand-in's model writes for a prompt, given the output reserved.
fn written(prompt: u64, reserved: u64) -> u64 {
    reserved.min(10 + prompt % 40)
}

/// One upstream, named `name` (metrics are process-wide: each test has its own name).
fn openai_config(name: &str, url: &str, extra: &str) -> String {
    format!(
        r#"
        [[upstream]]
        name = "{name}"
        url = "{url}"
        profile = "openai"
        {extra}
        "#
    )
}

/// A stand-in with these options, and a proxy in front of it with the same limits.
async fn openai_stand_in(name: &str, options: Options) -> (Provider, Running) {
    let stand_in = Provider::start_with(options.clone()).await;
    let seconds = options.period.as_secs();
    let limits = format!(
        r#"requests = "{}/{seconds}s"
        tokens = "{}/{seconds}s""#,
        options.requests, options.tokens
    );
    let proxy = proxy(&openai_config(
        name,
        &format!("http://{}", stand_in.addr),
        &limits,
    ))
    .await;
    (stand_in, proxy)
}

/// The issue's limits: 60 requests and 20,000 tokens per 10 s.
fn ten_seconds() -> Options {
    Options::openai(60, 20_000, Duration::from_secs(10))
}

/// The same per 10 minutes: what little refills while an interpreter starts is not a whole
/// request, so the `remaining` headers are exact.
fn ten_minutes() -> Options {
    Options::openai(60, 20_000, Duration::from_secs(600))
}

#[tokio::test]
async fn both_sdks_chat_through_the_proxy_and_see_the_providers_headers() {
    let Some(clients) = clients("chat") else {
        return;
    };
    let _alone = SDK_RUNS.lock().await;
    let (stand_in, proxy) = openai_stand_in("sdk-chat", ten_minutes()).await;
    let prompt = prompt_tokens();
    for (sdk, remaining) in [(Sdk::Python, "59"), (Sdk::Node, "58")] {
        let answer = clients.run(sdk, proxy.addr, &["chat"]).await;
        assert_eq!(
            answer,
            json!({"content": "ok", "prompt_tokens": prompt,
                "completion_tokens": written(prompt, 20), "remaining_requests": remaining})
        );
    }
    assert_eq!(stand_in.stats.ok.load(Ordering::Relaxed), 2);
    assert_eq!(stand_in.stats.refused.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn both_sdks_read_a_stream_through_the_proxy_to_its_usage() {
    let Some(clients) = clients("stream") else {
        return;
    };
    let _alone = SDK_RUNS.lock().await;
    let (stand_in, proxy) = openai_stand_in("sdk-stream", ten_minutes()).await;
    let prompt = prompt_tokens();
    for sdk in [Sdk::Python, Sdk::Node] {
        let answer = clients.run(sdk, proxy.addr, &["stream"]).await;
        // Three chunks of choices, then the usage alone.
        assert_eq!(
            answer,
            json!({"content": "ok", "events": 4, "prompt_tokens": prompt,
                "completion_tokens": written(prompt, 50)})
        );
    }
    assert_eq!(stand_in.stats.ok.load(Ordering::Relaxed), 2);
    // Both streams were settled from the usage that passed.
    let series = r#"tollgate_proxy_settled_tokens_total{upstream="sdk-stream"}"#;
    let total = 2.0 * (prompt + written(prompt, 50)) as f64;
    let mut seen = 0.0;
    for _ in 0..100 {
        seen = metric(
            &String::from_utf8_lossy(&get(proxy.addr, "/metrics").await.body),
            series,
        )
        .unwrap_or(0.0);
        if seen == total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen, total);
}

#[tokio::test]
async fn both_sdks_embed_through_the_proxy() {
    let Some(clients) = clients("embeddings") else {
        return;
    };
    let _alone = SDK_RUNS.lock().await;
    let (stand_in, proxy) = openai_stand_in("sdk-embeddings", ten_minutes()).await;
    let input = provider::embedding_input(
        &json!({"input": ["rate limits keep agents polite", "calls cheap"]}),
    );
    for sdk in [Sdk::Python, Sdk::Node] {
        let answer = clients.run(sdk, proxy.addr, &["embeddings"]).await;
        // Node writes 0.0 as 0: compare numbers, not JSON.
        let vectors: Vec<Vec<f64>> = serde_json::from_value(answer["vectors"].clone()).unwrap();
        assert_eq!(vectors, [[0.0, 0.5, 1.0], [0.0, 0.5, 1.0]], "{answer}");
        assert_eq!(answer["prompt_tokens"], input, "{answer}");
    }
    assert_eq!(stand_in.stats.ok.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn a_spent_quota_is_the_sdks_rate_limit_error_and_is_not_retried() {
    let Some(clients) = clients("permanent") else {
        return;
    };
    let _alone = SDK_RUNS.lock().await;
    let (stand_in, proxy) = openai_stand_in("sdk-spent", ten_minutes().permanent()).await;
    let python = clients.run(Sdk::Python, proxy.addr, &["permanent"]).await;
    assert_eq!(python["error"], "RateLimitError", "{python}");
    assert_eq!(python["status"], 429);
    assert_eq!(python["body"]["code"], "insufficient_quota", "{python}");
    let node = clients.run(Sdk::Node, proxy.addr, &["permanent"]).await;
    assert_eq!(
        node,
        json!({"error": "RateLimitError", "rateLimit": true, "status": 429, "code": "insufficient_quota"})
    );
    // Each SDK was allowed two retries and used none: the proxy said `x-should-retry: false`.
    assert_eq!(stand_in.stats.permanent.load(Ordering::Relaxed), 2);
}

/// An upstream whose first answer is a 429 and second a 500, both asking for a retry in
/// 20 ms, and whose third is a chat answer.
async fn flaky() -> Scripted {
    Scripted::start(|n, _| {
        let pause = [("retry-after-ms", "20"), ("retry-after", "1")];
        match n {
            0 => json_response(
                429,
                &pause,
                &json!({"error": {"code": "rate_limit_exceeded", "type": "requests", "message": "Rate limit reached"}}),
            ),
            1 => json_response(
                500,
                &pause,
                &json!({"error": {"code": null, "type": "server_error", "message": "The server had an error"}}),
            ),
            _ => json_response(200, &[], &chat_answer(8, 1)),
        }
    })
    .await
}

#[tokio::test]
async fn the_sdks_own_retries_work_through_the_proxy() {
    let Some(clients) = clients("retries") else {
        return;
    };
    let _alone = SDK_RUNS.lock().await;
    // The proxy retries no 429 itself here: the SDK sees each failure and retries it.
    let extra = r#"requests = "100/m"
        tokens = "100000/m"
        retries = 0"#;
    for sdk in [Sdk::Python, Sdk::Node] {
        let upstream = flaky().await;
        let through = proxy(&openai_config("sdk-retries", &upstream.url(), extra)).await;
        let answer = clients.run(sdk, through.addr, &["retries", "2"]).await;
        assert_eq!(answer, json!({"error": null, "content": "ok"}));
        assert_eq!(upstream.count.load(Ordering::SeqCst), 3);

        // One retry allowed: the 500 is the last word.
        let upstream = flaky().await;
        let through = proxy(&openai_config("sdk-retries", &upstream.url(), extra)).await;
        let answer = clients.run(sdk, through.addr, &["retries", "1"]).await;
        assert_eq!(answer["error"], "InternalServerError", "{answer}");
        assert_eq!(answer["status"], 500, "{answer}");
        assert_eq!(upstream.count.load(Ordering::SeqCst), 2);
    }
}

async fn anthropic_stand_in(options: Options) -> (Provider, Running) {
    let stand_in = Provider::start_with(options).await;
    let proxy = proxy(&format!(
        r#"
        [[upstream]]
        name = "claude"
        url = "http://{}"
        profile = "anthropic"
        requests = "50/m"
        tokens = "30000/m"
        output_tokens = "8000/m"
        "#,
        stand_in.addr
    ))
    .await;
    (stand_in, proxy)
}

#[tokio::test]
async fn the_anthropic_sdk_sends_messages_plain_and_streamed() {
    let Some(clients) = clients("messages") else {
        return;
    };
    let _alone = SDK_RUNS.lock().await;
    let (stand_in, proxy) = anthropic_stand_in(Options::anthropic(
        50,
        30_000,
        8_000,
        Duration::from_secs(60),
    ))
    .await;
    let input = provider::anthropic_input(
        &json!({"messages": [{"role": "user", "content": "Say hello to the proxy"}]}),
    );
    let expected =
        json!({"content": "ok", "input_tokens": input, "output_tokens": written(input, 30)});
    for case in ["messages", "messages-stream"] {
        let answer = clients.run(Sdk::Python, proxy.addr, &[case]).await;
        assert_eq!(answer, expected, "{case}");
    }
    assert_eq!(stand_in.stats.ok.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn anthropics_spent_quota_is_the_sdks_rate_limit_error_and_is_not_retried() {
    let Some(clients) = clients("messages-permanent") else {
        return;
    };
    let _alone = SDK_RUNS.lock().await;
    let (stand_in, proxy) = anthropic_stand_in(
        Options::anthropic(50, 30_000, 8_000, Duration::from_secs(60)).permanent(),
    )
    .await;
    let answer = clients
        .run(Sdk::Python, proxy.addr, &["messages-permanent"])
        .await;
    assert_eq!(answer["error"], "RateLimitError", "{answer}");
    assert_eq!(answer["status"], 429);
    assert_eq!(
        answer["body"]["error"]["type"], "rate_limit_error",
        "{answer}"
    );
    assert_eq!(stand_in.stats.permanent.load(Ordering::Relaxed), 1);
}

/// The issue's workload: 80 chat calls at once from `AsyncOpenAI`, through the proxy to a
/// stand-in that allows 60 requests and 20,000 tokens per 10 s, the proxy set to the same.
/// The one test here that takes real time (about 15 s). It runs alone, in a step of its own
/// (`cargo test --workspace --test proxy -- --ignored clients::eighty`, which `.ci/run`
/// runs once): beside the other proxy tests on two cores, the proxy's sends and the
/// stand-in's arrivals drift apart by the scheduler's delays. It was flaky until issue 30 (1
/// run in 5 let 11 to 16 429s through: a 429 cascaded, each pause ending into a window the
/// stand-in's counted refusals had spent); the limiter now brings its windows to the
/// provider's after a 429 and credits refill from when the provider counted a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "takes real time and runs alone: cargo test --workspace --test proxy -- --ignored clients::eighty"]
async fn eighty_calls_at_once_from_the_python_sdk_stay_inside_the_quota() {
    let Some(clients) = clients("burst") else {
        return;
    };
    let _alone = SDK_RUNS.lock().await;
    let options = ten_seconds();
    let bodies = provider::chats(0, 80);
    let ideal = provider::ideal_seconds(&bodies, &options, 0.0);
    let (stand_in, proxy) = openai_stand_in("sdk-burst", options).await;
    let file =
        std::env::temp_dir().join(format!("tollgate-proxy-burst-{}.json", std::process::id()));
    std::fs::write(&file, Value::from(bodies).to_string()).unwrap();
    let outcome = clients
        .run(Sdk::Python, proxy.addr, &["burst", file.to_str().unwrap()])
        .await;
    let _ = std::fs::remove_file(&file);
    let refused = stand_in.stats.refused.load(Ordering::Relaxed);
    let seconds = outcome["seconds"].as_f64().unwrap();
    eprintln!(
        "80 calls from the Python SDK: {} ok, {refused} 429s at the stand-in, {seconds:.2} s (ideal {ideal:.2} s, {:.3}×)",
        outcome["ok"],
        seconds / ideal
    );
    assert_eq!(outcome["ok"], 80, "{outcome}");
    assert_eq!(stand_in.stats.ok.load(Ordering::Relaxed), 80);
    assert!(refused <= 2, "{refused} 429s reached the stand-in");
    assert!(
        seconds <= 1.15 * ideal,
        "{seconds:.2} s against an ideal of {ideal:.2} s"
    );
}

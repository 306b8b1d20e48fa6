//! The operators' live view (`admin_listen`): its JSON after calls through the proxy (levels to
//! the token, counts exact), the keys it lists and the tenants it aggregates, that its paths are
//! served on its own listener only, and its status page in a real browser (Debian's Chromium,
//! driven by `playwright-core` from Node: `proxy/tests/clients/status_page.js`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tollgate_proxy::{Config, Running};
use tollgate_testkit::provider::{self, Options, Provider};

use crate::common::*;

const DAY: Duration = Duration::from_secs(86_400);

fn fresh(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("{prefix}{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A proxy with its live view on a free port.
async fn watched(toml: &str) -> Running {
    let running = proxy(&format!("admin_listen = \"127.0.0.1:0\"\n{toml}")).await;
    assert!(running.admin.is_some(), "admin_listen was set");
    running
}

/// `GET /admin/api/keys`.
async fn keys(running: &Running) -> Value {
    let answer = get(running.admin.unwrap(), "/admin/api/keys").await;
    assert_eq!(answer.status, 200, "{}", answer.body_str());
    assert_eq!(answer.headers["content-type"], "application/json");
    answer.json()
}

/// The entry of `key` in a view.
fn entry<'a>(view: &'a Value, key: &str) -> Option<&'a Value> {
    view["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key"] == key)
}

/// The level of `key`'s `currency` window.
fn level(view: &Value, key: &str, currency: &str) -> f64 {
    let entry = entry(view, key).unwrap_or_else(|| panic!("no {key} in {view:#}"));
    entry["windows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["currency"] == currency)
        .and_then(|w| w["level"].as_f64())
        .unwrap_or_else(|| panic!("no {currency} level at {key} in {view:#}"))
}

/// Polls the view until `done` holds (a call settles after its answer's last byte is read),
/// at most 5 s; answers the last view.
async fn until(running: &Running, done: impl Fn(&Value) -> bool) -> Value {
    let mut view = keys(running).await;
    for _ in 0..100 {
        if done(&view) {
            return view;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        view = keys(running).await;
    }
    view
}

fn chat(model: &str, content: &str, max_tokens: u64) -> Value {
    json!({"model": model, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": content}]})
}

/// A rate's refill a second.
fn per_second(amount: u64, period: Duration) -> f64 {
    amount as f64 / period.as_secs_f64()
}

/// `windows` with each refill a second checked against the expected one to 1e-12 (JSON's
/// floats are read back to within a bit), then set to it: ready to compare whole.
fn refills_near(mut windows: Value, expected: &Value) -> Value {
    let (Some(got), Some(want)) = (windows.as_array_mut(), expected.as_array()) else {
        return windows;
    };
    for (window, wanted) in got.iter_mut().zip(want) {
        let (a, b) = (
            window["refill_per_second"].as_f64().unwrap(),
            wanted["refill_per_second"].as_f64().unwrap(),
        );
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        window["refill_per_second"] = wanted["refill_per_second"].clone();
    }
    windows
}

/// What the stand-in bills a chat body of `max_tokens` once answered: its prompt and what its
/// model wrote.
fn billed(body: &Value, max_tokens: u64) -> u64 {
    let prompt = provider::chat_prompt(body);
    prompt + max_tokens.min(10 + prompt % 40)
}

#[tokio::test]
async fn the_view_lists_each_key_with_its_levels_to_the_token_and_its_counts() {
    let stand_in = Provider::start_with(Options::openai(1_000, 10_000, DAY).exact()).await;
    let name = fresh("live");
    let running = watched(&format!(
        r#"
        [[upstream]]
        name = "{name}"
        url = "http://user:secret@{}"
        profile = "openai"
        requests = "1000/d"
        tokens = "10000/d"
        "#,
        stand_in.addr
    ))
    .await;
    let before = keys(&running).await;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let seen_at = Duration::from_millis(before["now"].as_u64().unwrap());
    assert!(now.abs_diff(seen_at) < Duration::from_secs(5), "{before:#}");
    assert_eq!(before["version"], 1);
    assert_eq!(before["store"], json!({"kind": "memory", "ok": true}));
    assert_eq!(before["draining"], false);
    // The URL is shown without its credentials.
    assert_eq!(
        before["upstreams"],
        json!([{"name": name, "profile": "openai", "url": format!("http://{}", stand_in.addr),
            "mount": "", "limits": "fixed"}])
    );
    // Before any call: the upstream's own key, full.
    let mut listed = before["keys"].clone();
    let windows = json!([
        {"currency": "requests", "rate": "1000/d", "capacity": 1000, "level": 1000.0,
            "refill_per_second": per_second(1_000, DAY)},
        {"currency": "tokens", "rate": "10000/d", "capacity": 10000, "level": 10000.0,
            "refill_per_second": per_second(10_000, DAY)},
    ]);
    listed[0]["windows"] = refills_near(listed[0]["windows"].clone(), &windows);
    assert_eq!(
        listed,
        json!([{
            "key": name, "upstream": name, "kind": "upstream", "model": null, "tenant": null,
            "limits": "requests 1000/d, tokens 10000/d",
            "windows": windows,
            "waiting": 0,
            "counts": {"admitted": 0, "local_429s": 0, "upstream_429s": 0, "budget_refusals": 0},
            "spend": null, "pause": null,
        }])
    );

    // Three calls of one model (a dated name shares its family's key). The stand-in has one
    // window for every model, as one of the provider's per-model limits: a second model's calls
    // would read as spending elsewhere at this one.
    let started = std::time::Instant::now();
    let bodies = [
        chat("gpt-4o", "How far is the moon?", 20),
        chat("gpt-4o", "And the sun, in light seconds?", 30),
        chat("gpt-4o-2024-08-06", "Name three rivers", 25),
    ];
    for body in &bodies {
        let answer = post(running.addr, "/v1/chat/completions", body).await;
        assert_eq!(answer.status, 200, "{}", answer.body_str());
    }
    let tokens: u64 = bodies
        .iter()
        .map(|b| billed(b, b["max_tokens"].as_u64().unwrap()))
        .sum();
    let key = format!("{name}:gpt-4o");
    // Settled from each answer's usage: the window holds what the stand-in's does, to the
    // token, plus what refilled since (a tenth of a token a second).
    let after = until(&running, |view| {
        entry(view, &key).is_some() && level(view, &key, "tokens") >= (10_000 - tokens) as f64
    })
    .await;
    let refilled = |amount: u64| per_second(amount, DAY) * started.elapsed().as_secs_f64();
    let names: Vec<&str> = after["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert_eq!(names, [name.as_str(), &key], "{after:#}");
    let view = entry(&after, &key).unwrap();
    assert_eq!(view["kind"], "model");
    assert_eq!(view["model"], "gpt-4o");
    assert_eq!(
        view["counts"],
        json!({"admitted": 3, "local_429s": 0, "upstream_429s": 0, "budget_refusals": 0})
    );
    assert_eq!(view["waiting"], 0);
    let requests = level(&after, &key, "requests");
    assert!(
        (997.0..=997.0 + refilled(1_000)).contains(&requests),
        "{requests}"
    );
    let left = level(&after, &key, "tokens");
    let spent = (10_000 - tokens) as f64;
    assert!(
        (spent..=spent + refilled(10_000)).contains(&left),
        "{left}: expected {spent} and a little refill"
    );
    // It has fractions: the refill since the calls.
    assert!(left.fract() != 0.0, "{left}");
    // The stand-in agrees (its own count of the same calls).
    assert_eq!(stand_in.tokens_left(), 10_000 - tokens);
    // The upstream's own key took no call.
    let own = entry(&after, &name).unwrap();
    assert_eq!(own["counts"]["admitted"], 0);
    assert_eq!(level(&after, &name, "requests"), 1_000.0);
}

#[tokio::test]
async fn limits_learned_from_the_headers_show_once_learned() {
    let stand_in = Provider::start_with(Options::openai(600, 90_000, DAY).exact()).await;
    let name = fresh("learned");
    let running = watched(&format!(
        r#"
        [[upstream]]
        name = "{name}"
        url = "http://{}"
        profile = "openai"
        limits = "from-headers"
        "#,
        stand_in.addr
    ))
    .await;
    let before = keys(&running).await;
    assert_eq!(before["upstreams"][0]["limits"], "from-headers");
    let own = entry(&before, &name).unwrap();
    assert_eq!(own["limits"], Value::Null, "{before:#}");
    assert_eq!(own["windows"], json!([]));
    let answer = post(
        running.addr,
        "/v1/chat/completions",
        &chat("gpt-4o", "hi", 5),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body_str());
    // The headers' limits, read per minute; the call is on them (its request at least).
    let key = format!("{name}:gpt-4o");
    let view = until(&running, |v| entry(v, &key).is_some()).await;
    let learned = entry(&view, &key).unwrap();
    assert_eq!(
        learned["limits"], "requests 600/m, tokens 90000/m",
        "{view:#}"
    );
    let requests = level(&view, &key, "requests");
    assert!((599.0..600.0).contains(&requests), "{requests}");
    assert_eq!(learned["counts"]["admitted"], 1);
}

#[tokio::test]
async fn waiting_calls_and_429s_here_and_upstream_show_at_their_keys() {
    let stand_in = Provider::start_with(Options::openai(1_000, 100_000, DAY).exact()).await;
    let spent = Provider::start_with(Options::openai(1_000, 100_000, DAY).permanent()).await;
    let (slow, strict, refused) = (fresh("slow"), fresh("strict"), fresh("spent"));
    let running = watched(&format!(
        r#"
        [[upstream]]
        name = "{slow}"
        url = "http://{stand_in}"
        profile = "openai"
        requests = "1/2s"
        timeout_seconds = 10

        [[upstream]]
        name = "{strict}"
        url = "http://{stand_in}"
        profile = "openai"
        mount = "/strict"
        requests = "1/h"
        timeout_seconds = 0.5

        [[upstream]]
        name = "{refused}"
        url = "http://{spent}"
        profile = "openai"
        mount = "/spent"
        requests = "1000/d"
        "#,
        stand_in = stand_in.addr,
        spent = spent.addr,
    ))
    .await;
    let body = chat("gpt-4o", "hi", 5);
    let addr = running.addr;

    // One request every 2 s: the second call waits at the key, and the view says so.
    assert_eq!(post(addr, "/v1/chat/completions", &body).await.status, 200);
    let second = {
        let body = body.clone();
        tokio::spawn(async move { post(addr, "/v1/chat/completions", &body).await.status })
    };
    let key = format!("{slow}:gpt-4o");
    let waiting = until(&running, |v| {
        entry(v, &key).is_some_and(|k| k["waiting"] == 1)
    })
    .await;
    assert_eq!(entry(&waiting, &key).unwrap()["waiting"], 1, "{waiting:#}");
    assert_eq!(entry(&waiting, &key).unwrap()["counts"]["admitted"], 1);
    assert_eq!(second.await.unwrap(), 200);
    let passed = until(&running, |v| {
        entry(v, &key).unwrap()["counts"]["admitted"] == 2
    })
    .await;
    let passed = entry(&passed, &key).unwrap();
    assert_eq!(passed["waiting"], 0);
    assert_eq!(
        passed["counts"],
        json!({"admitted": 2, "local_429s": 0, "upstream_429s": 0, "budget_refusals": 0})
    );

    // One request an hour and half a second to wait: the second call is answered 429 here.
    let path = "/strict/v1/chat/completions";
    assert_eq!(post(addr, path, &body).await.status, 200);
    let answer = post(addr, path, &body).await;
    assert_eq!(answer.status, 429);
    assert_eq!(answer.headers["x-tollgate"], "local");
    let view = keys(&running).await;
    let key = format!("{strict}:gpt-4o");
    assert_eq!(
        entry(&view, &key).unwrap()["counts"],
        json!({"admitted": 1, "local_429s": 1, "upstream_429s": 0, "budget_refusals": 0}),
        "{view:#}"
    );
    let requests = level(&view, &key, "requests");
    assert!((0.0..0.01).contains(&requests), "{requests}");

    // A spent quota upstream: its 429 is handed on, and counted at the key.
    let answer = post(addr, "/spent/v1/chat/completions", &body).await;
    assert_eq!(answer.status, 429, "{}", answer.body_str());
    let view = keys(&running).await;
    assert_eq!(
        entry(&view, &format!("{refused}:gpt-4o")).unwrap()["counts"],
        json!({"admitted": 1, "local_429s": 0, "upstream_429s": 1, "budget_refusals": 0}),
        "{view:#}"
    );
    assert_eq!(spent.stats.permanent.load(Ordering::Relaxed), 1);
    let upstreams: Vec<(&str, &str)> = view["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| (u["name"].as_str().unwrap(), u["mount"].as_str().unwrap()))
        .collect();
    assert_eq!(
        upstreams,
        [
            (slow.as_str(), ""),
            (strict.as_str(), "/strict"),
            (refused.as_str(), "/spent")
        ]
    );
}

#[tokio::test]
async fn named_tenants_are_listed_and_the_others_only_counted_together() {
    let stand_in = Provider::start_with(Options::openai(1_000, 100_000, DAY).exact()).await;
    let name = fresh("teams");
    let running = watched(&format!(
        r#"
        [tenants]
        from = "key"
        default = "anonymous"
        requests = "100/d"

        [[upstream]]
        name = "{name}"
        url = "http://{}"
        profile = "openai"
        requests = "1000/d"
        "#,
        stand_in.addr
    ))
    .await;
    // Before any call, the named tenant is listed (full); no aggregate yet.
    let before = keys(&running).await;
    let anonymous = format!("{name}:tenant:anonymous");
    assert_eq!(level(&before, &anonymous, "requests"), 100.0);
    assert!(entry(&before, &format!("{name}:tenant:other")).is_none());
    let body = Bytes::from(chat("gpt-4o", "hi", 5).to_string());
    let path = "/v1/chat/completions";
    for key in ["sk-tenant-one-secret", "sk-tenant-two-secret"] {
        let auth = format!("Bearer {key}");
        let answer = send(
            running.addr,
            path,
            &[("authorization", &auth)],
            body.clone(),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.body_str());
    }
    for _ in 0..3 {
        assert_eq!(
            send(running.addr, path, &[], body.clone()).await.status,
            200
        );
    }
    let view = keys(&running).await;
    let text = view.to_string();
    assert!(!text.contains("sk-tenant"), "a key leaked: {text}");
    let names: Vec<&str> = view["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    let (model, other) = (format!("{name}:gpt-4o"), format!("{name}:tenant:other"));
    assert_eq!(names, [name.as_str(), &model, &anonymous, &other]);
    let tenant = entry(&view, &anonymous).unwrap();
    assert_eq!(tenant["kind"], "tenant");
    assert_eq!(tenant["tenant"], "anonymous");
    assert_eq!(tenant["counts"]["admitted"], 3);
    let requests = level(&view, &anonymous, "requests");
    assert!((97.0..97.05).contains(&requests), "{requests}");
    let others = entry(&view, &other).unwrap();
    assert_eq!(others["kind"], "tenants");
    assert_eq!(others["tenants"], 2);
    assert_eq!(others["counts"]["admitted"], 2);
    let windows = json!([{"currency": "requests", "rate": "100/d", "capacity": 100,
        "level": null, "refill_per_second": per_second(100, DAY)}]);
    assert_eq!(refills_near(others["windows"].clone(), &windows), windows);
    // Each call paid its tenant's window and the organization's.
    assert_eq!(entry(&view, &model).unwrap()["counts"]["admitted"], 5);
}

#[tokio::test]
async fn the_admin_paths_are_served_on_the_admin_listener_only() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 1))).await;
    for other_paths in ["refuse", "pass"] {
        let running = watched(&format!(
            r#"
            other_paths = "{other_paths}"
            [[upstream]]
            name = "{}"
            url = "{}"
            profile = "openai"
            requests = "100/m"
            "#,
            fresh("paths"),
            upstream.url()
        ))
        .await;
        let admin = running.admin.unwrap();
        assert_ne!(admin, running.addr);
        for path in ["/admin/api/keys", "/admin/", "/admin"] {
            let answer = get(running.addr, path).await;
            match other_paths {
                // Refused like any path no upstream meters.
                "refuse" => {
                    assert_eq!(answer.status, 404, "{path}");
                    assert_eq!(answer.headers["x-tollgate"], "local");
                }
                // Handed to the upstream, which answers what it answers.
                _ => {
                    let seen = upstream.seen.lock().unwrap();
                    let sent = &seen.last().unwrap().path;
                    assert!(sent.starts_with("/admin"), "{path}: {sent}");
                    assert_eq!(answer.status, 200, "{path}");
                }
            }
            assert!(!answer.body_str().contains("\"upstreams\""), "{path}");
            assert!(!answer.body_str().contains("<script"), "{path}");
        }
        // And the admin listener serves nothing else but the operators' metrics: no proxying.
        for path in ["/v1/models", "/healthz"] {
            assert_eq!(get(admin, path).await.status, 404, "{path}");
        }
        assert_eq!(get(admin, "/metrics").await.status, 200);
        let answer = post(admin, "/v1/chat/completions", &chat("gpt-4o", "hi", 1)).await;
        assert_eq!(answer.status, 405);
        let redirect = get(admin, "/admin").await;
        assert_eq!(redirect.status, 308);
        assert_eq!(redirect.headers["location"], "/admin/");
    }
    // Off unless configured.
    let running = proxy(&format!(
        "[[upstream]]\nname = \"{}\"\nurl = \"{}\"\nrequests = \"1/s\"\n",
        fresh("off"),
        upstream.url()
    ))
    .await;
    assert!(running.admin.is_none());
    let err = Config::from_toml("admin_listen = \"nowhere\"\n").unwrap_err();
    assert!(err.to_string().contains("admin_listen: `nowhere`"), "{err}");
}

#[tokio::test]
async fn the_status_page_is_one_file_with_nothing_from_elsewhere() {
    let running = watched("[[upstream]]\nurl = \"http://127.0.0.1:9\"\nrequests = \"1/s\"\n").await;
    let page = get(running.admin.unwrap(), "/admin/").await;
    assert_eq!(page.status, 200);
    assert_eq!(page.headers["content-type"], "text/html; charset=utf-8");
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.starts_with("default-src 'none'"), "{csp}");
    let html = page.body_str();
    assert!(html.contains("<script>") && html.contains("<style>"));
    assert!(html.contains("fetch(\"api/keys\""));
    for external in ["src=", "http://", "https://", "@import", "url("] {
        assert!(!html.contains(external), "the page loads {external}");
    }
}

// ---- The page in Chromium ----

/// Chromium and Node's `playwright-core`, or `None` (with `SKIPPED:`) when either is missing
/// and `TOLLGATE_REQUIRE_CLIENTS` is not set.
fn browser(test: &str) -> Option<(PathBuf, PathBuf)> {
    let required =
        std::env::var_os("TOLLGATE_REQUIRE_CLIENTS").is_some_and(|v| !v.is_empty() && v != "0");
    let chromium = std::env::var_os("TOLLGATE_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    let modules = std::env::var_os("TOLLGATE_PROXY_CLIENTS")
        .map(|dir| PathBuf::from(dir).join("node/node_modules"));
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let missing = if !chromium.exists() {
        Some(format!(
            "no Chromium at {} (apt-get install chromium, or TOLLGATE_CHROMIUM=PATH)",
            chromium.display()
        ))
    } else if !node {
        Some("no node".to_owned())
    } else if !modules
        .as_ref()
        .is_some_and(|m| m.join("playwright-core").exists())
    {
        Some(
            "no playwright-core (bash proxy/tests/install-clients.sh DIR, then TOLLGATE_PROXY_CLIENTS=DIR)"
                .to_owned(),
        )
    } else {
        None
    };
    match missing {
        None => Some((chromium, modules.expect("checked"))),
        Some(what) if required => panic!("{test}: TOLLGATE_REQUIRE_CLIENTS is set but {what}"),
        Some(what) => {
            eprintln!("SKIPPED: {test}: {what}");
            None
        }
    }
}

/// The browser's side of the test: a Node process that prints one JSON line per stage and
/// reads its next instructions from standard input.
struct Page {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    stdin: tokio::process::ChildStdin,
}

impl Page {
    async fn open(chromium: &Path, modules: &Path, admin: SocketAddr, screenshot: &Path) -> Page {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/status_page.js");
        let mut child = tokio::process::Command::new("node")
            .arg(script)
            .env("NODE_PATH", modules)
            .env("CHROMIUM", chromium)
            .env("ADMIN_URL", format!("http://{admin}/admin/"))
            .env("SCREENSHOT", screenshot)
            .env("NO_PROXY", "*")
            .env_remove("HTTP_PROXY")
            .env_remove("http_proxy")
            .env_remove("NODE_OPTIONS")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("node starts");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let stdin = child.stdin.take().unwrap();
        Page {
            child,
            lines,
            stdin,
        }
    }

    /// The next stage the script reports.
    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
            .await
            .expect("the browser reports within a minute")
            .expect("its output can be read")
            .expect("the browser script reports before it ends (see its stderr above)");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    async fn tell(&mut self, message: &Value) {
        let line = format!("{message}\n");
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        self.stdin.flush().await.unwrap();
    }
}

/// What the page shows, as the script read it: the keys in its order, and per key its counts
/// and each window's level, as text.
fn shown_keys(stage: &Value) -> Vec<String> {
    stage["cards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["key"].as_str().unwrap().to_owned())
        .collect()
}

fn card<'a>(stage: &'a Value, key: &str) -> &'a Value {
    stage["cards"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["key"] == key)
        .unwrap_or_else(|| panic!("the page shows no {key}: {stage:#}"))
}

fn view_keys(view: &Value) -> Vec<String> {
    view["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn the_status_page_shows_the_running_proxy_in_chromium_and_follows_its_calls() {
    let Some((chromium, modules)) = browser("status page") else {
        return;
    };
    // Chromium's start-up takes both cores for a moment: not inside another test's timing.
    let _alone = crate::clients::SDK_RUNS.lock().await;
    let period = Duration::from_secs(600);
    let openai = Provider::start_with(Options::openai(60, 20_000, period)).await;
    let anthropic = Provider::start_with(Options::anthropic(50, 20_000, 8_000, period)).await;
    let running = watched(&format!(
        r#"
        [tenants]
        from = "header:x-team"
        trusted_network = true
        default = "anonymous"
        requests = "4/10m"
        tokens = "8000/10m"

        [[upstream]]
        name = "openai"
        url = "http://{}"
        profile = "openai"
        requests = "60/10m"
        tokens = "20000/10m"
        timeout_seconds = 2

        [[upstream]]
        name = "anthropic"
        url = "http://{}"
        profile = "anthropic"
        requests = "50/10m"
        tokens = "20000/10m"
        output_tokens = "8000/10m"
        timeout_seconds = 2
        "#,
        openai.addr, anthropic.addr
    ))
    .await;
    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&screenshot);
    let mut page = Page::open(&chromium, &modules, running.admin.unwrap(), &screenshot).await;

    // Loaded: the page shows the keys the JSON lists, no more, no fewer.
    let loaded = page.next().await;
    assert_eq!(loaded["stage"], "loaded", "{loaded:#}");
    assert_eq!(loaded["status"], "live");
    let view = keys(&running).await;
    assert_eq!(shown_keys(&loaded), view_keys(&view), "{loaded:#}");
    assert!(shown_keys(&loaded).contains(&"openai:tenant:anonymous".to_owned()));
    assert_eq!(
        card(&loaded, "openai:tenant:anonymous")["levels"]["requests"],
        "4.0"
    );

    // Calls through the proxy: two teams the configuration doesn't name, the default tenant
    // until its 4 requests are spent (the fifth would wait 2.5 minutes: 429 here), and three
    // calls to Anthropic.
    let addr = running.addr;
    let chat_path = "/v1/chat/completions";
    let body = |content: &str, max_tokens: u64| {
        Bytes::from(chat("gpt-4o", content, max_tokens).to_string())
    };
    for team in ["research", "support"] {
        let answer = send(
            addr,
            chat_path,
            &[("x-team", team)],
            body("Summarize the rate limits", 200),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.body_str());
    }
    for i in 0..4 {
        let answer = send(addr, chat_path, &[], body(&format!("Question {i}"), 400)).await;
        assert_eq!(answer.status, 200, "{}", answer.body_str());
    }
    let answer = send(addr, chat_path, &[], body("One more", 50)).await;
    assert_eq!(answer.status, 429, "{}", answer.body_str());
    for i in 0..3 {
        let message = json!({"model": "claude-sonnet-4-20250514", "max_tokens": 300,
            "messages": [{"role": "user", "content": format!("Write a haiku about queue {i}")}]});
        let answer = send(
            addr,
            "/v1/messages",
            &[
                ("x-api-key", "sk-ant-test"),
                ("anthropic-version", "2023-06-01"),
            ],
            Bytes::from(message.to_string()),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.body_str());
    }
    let view = until(&running, |v| {
        entry(v, "anthropic:claude-sonnet-4").is_some_and(|k| k["counts"]["admitted"] == 3)
    })
    .await;
    let counts = |key: &str| entry(&view, key).unwrap()["counts"].clone();
    assert_eq!(
        counts("openai:gpt-4o"),
        json!({"admitted": 6, "local_429s": 0, "upstream_429s": 0, "budget_refusals": 0})
    );
    assert_eq!(
        counts("openai:tenant:anonymous"),
        json!({"admitted": 4, "local_429s": 1, "upstream_429s": 0, "budget_refusals": 0})
    );

    // The page follows: it waits until it shows these counts, then is photographed.
    page.tell(&json!({"expect": [
        {"key": "openai:gpt-4o", "count": "admitted", "text": "6"},
        {"key": "openai:tenant:anonymous", "count": "admitted", "text": "4"},
        {"key": "openai:tenant:anonymous", "count": "local_429s", "text": "1"},
        {"key": "openai:tenant:other", "count": "admitted", "text": "2"},
        {"key": "anthropic:claude-sonnet-4", "count": "admitted", "text": "3"},
    ]}))
    .await;
    let updated = page.next().await;
    assert_eq!(updated["stage"], "updated", "{updated:#}");
    assert_eq!(updated["matched"], true, "{updated:#}");
    let view = keys(&running).await;
    assert_eq!(shown_keys(&updated), view_keys(&view), "{updated:#}");
    // The levels moved with the calls: the default tenant spent its 4 requests (0.0 of 4, plus
    // what refilled since: a 150th a second), the model key 6 of its 60 (plus a tenth a second).
    let anonymous = card(&updated, "openai:tenant:anonymous");
    let spent: f64 = anonymous["levels"]["requests"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((0.0..0.2).contains(&spent), "{anonymous:#}");
    assert_eq!(anonymous["counts"]["local_429s"], "1");
    let model = card(&updated, "openai:gpt-4o");
    let requests: f64 = model["levels"]["requests"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((54.0..55.0).contains(&requests), "{model:#}");
    assert_eq!(
        card(&updated, "anthropic:claude-sonnet-4")["windows"],
        json!(["requests", "tokens", "output_tokens"])
    );
    assert_eq!(updated["status"], "live");

    let status = tokio::time::timeout(Duration::from_secs(30), page.child.wait())
        .await
        .expect("the browser closes")
        .unwrap();
    assert!(status.success(), "{status}");
    let png = std::fs::read(&screenshot).expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000);
    // `TOLLGATE_UPDATE_SCREENSHOT=1` keeps it as the README's picture.
    if std::env::var_os("TOLLGATE_UPDATE_SCREENSHOT").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/status-page.png");
        std::fs::create_dir_all(docs.parent().unwrap()).unwrap();
        std::fs::write(docs, &png).unwrap();
    }
}

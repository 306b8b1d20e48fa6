//! Reload without a restart: a key whose limits did not change keeps its levels, a changed one
//! starts from its new limits never above what it held, a configuration that can't be used is
//! refused (the one in force stays), virtual keys are added and revoked, and the binary reloads
//! on SIGHUP and when its file changes.

use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use tollgate_proxy::{Config, Proxy};

use crate::common::*;

fn chat() -> Bytes {
    let body = json!({"model": "gpt-4o", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    Bytes::from(body.to_string())
}

/// A configuration for an upstream at `url` with `requests` an hour (no refill a test sees),
/// tenants from `x-team` with the tier `team` at `team` an hour, and these virtual keys.
fn config(name: &str, url: &str, requests: &str, team: &str, keys: &[(&str, &str)]) -> Config {
    let keys: Vec<String> = keys
        .iter()
        .map(|(key, tenant)| format!("\"{key}\" = \"{tenant}\""))
        .collect();
    let tenants = if keys.is_empty() {
        "from = \"header:x-team\"\ntrusted_network = true".to_owned()
    } else {
        format!("virtual_keys = {{ {} }}", keys.join(", "))
    };
    let mut config = Config::from_toml(&format!(
        r#"
        listen = "127.0.0.1:0"
        [tiers.team]
        requests = "{team}"
        [tenants]
        {tenants}
        default_tier = "team"
        [[upstream]]
        name = "{name}"
        url = "{url}"
        profile = "openai"
        per_model = false
        requests = "{requests}"
        timeout_seconds = 0.3
        api_key_env = "PATH"
        "#
    ))
    .expect("a valid configuration");
    config.listen = "127.0.0.1:0".parse().unwrap();
    config
}

/// How many of `count` calls as `team` pass (the rest are refused by the proxy).
async fn passing(addr: std::net::SocketAddr, headers: &[(&str, &str)], count: usize) -> usize {
    let mut passed = 0;
    for _ in 0..count {
        let answer = send(addr, "/v1/chat/completions", headers, chat()).await;
        match answer.status.as_u16() {
            200 => passed += 1,
            429 => assert_eq!(
                answer.headers["x-tollgate"],
                "local",
                "{}",
                answer.body_str()
            ),
            other => panic!("{other}: {}", answer.body_str()),
        }
    }
    passed
}

#[tokio::test]
async fn an_unchanged_key_keeps_its_levels_and_a_changed_one_never_refills() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 2))).await;
    let url = upstream.url();
    let team = [("x-team", "alpha")];
    let running = Proxy::bind(config("reload-a", &url, "6/h", "100/h", &[]))
        .await
        .unwrap()
        .spawn();
    assert_eq!(passing(running.addr, &team, 4).await, 4);
    // The same limits, and a tier changed that this key does not use: 2 are left, as before.
    running
        .reloader
        .reload(config("reload-a", &url, "6/h", "50/h", &[]))
        .await
        .unwrap();
    assert_eq!(passing(running.addr, &team, 3).await, 2);
    // Raised to 20 an hour: the key held nothing, and a reload can't refill it.
    running
        .reloader
        .reload(config("reload-a", &url, "20/h", "50/h", &[]))
        .await
        .unwrap();
    assert_eq!(passing(running.addr, &team, 2).await, 0);
    assert_eq!(upstream.count.load(std::sync::atomic::Ordering::SeqCst), 6);
}

#[tokio::test]
async fn a_lowered_limit_holds_at_once_and_a_raised_one_gives_only_its_new_room() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 2))).await;
    let url = upstream.url();
    let team = [("x-team", "beta")];
    let running = Proxy::bind(config("reload-b", &url, "10/h", "100/h", &[]))
        .await
        .unwrap()
        .spawn();
    assert_eq!(passing(running.addr, &team, 3).await, 3);
    // 7 were left; lowered to 4 an hour, at most 4 are left.
    running
        .reloader
        .reload(config("reload-b", &url, "4/h", "100/h", &[]))
        .await
        .unwrap();
    assert_eq!(passing(running.addr, &team, 5).await, 4);
    // Back to 10 an hour: what the key held under 4 (nothing) is all it holds.
    running
        .reloader
        .reload(config("reload-b", &url, "10/h", "100/h", &[]))
        .await
        .unwrap();
    assert_eq!(passing(running.addr, &team, 1).await, 0);
}

/// A tier raised by a reload: a tenant that had spent from it keeps only what it held, and a
/// tenant that had not (or never called) starts full at the new limits: it spent nothing a
/// reload could refill. (A reviewer's tenant in a new $10/d tier started at the old default
/// tier's $0.01.)
#[tokio::test]
async fn a_tenant_that_spent_nothing_starts_full_at_its_raised_limits() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 2))).await;
    let url = upstream.url();
    let (spent, idle) = ([("x-team", "spent")], [("x-team", "idle")]);
    let running = Proxy::bind(config("reload-f", &url, "100/h", "3/h", &[]))
        .await
        .unwrap()
        .spawn();
    assert_eq!(passing(running.addr, &spent, 1).await, 1);
    running
        .reloader
        .reload(config("reload-f", &url, "100/h", "10/h", &[]))
        .await
        .unwrap();
    assert_eq!(passing(running.addr, &spent, 5).await, 2, "it held 2 of 3");
    assert_eq!(
        passing(running.addr, &idle, 12).await,
        10,
        "it held all of 3"
    );
}

#[tokio::test]
async fn a_configuration_that_cannot_be_used_is_refused_and_the_one_in_force_stays() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 2))).await;
    let url = upstream.url();
    let running = Proxy::bind(config(
        "reload-c",
        &url,
        "100/h",
        "100/h",
        &[("vk-alice-000001", "alice")],
    ))
    .await
    .unwrap()
    .spawn();
    let alice = [("authorization", "Bearer vk-alice-000001")];
    assert_eq!(passing(running.addr, &alice, 1).await, 1);
    // An upstream whose real key's variable is not set can't serve virtual keys.
    let mut broken = config(
        "reload-c",
        &url,
        "100/h",
        "100/h",
        &[("vk-alice-000001", "alice")],
    );
    broken.upstreams[0].api_key_env = Some("TOLLGATE_NO_SUCH_VARIABLE".to_owned());
    let err = running.reloader.reload(broken).await.unwrap_err();
    assert!(
        err.to_string().contains("TOLLGATE_NO_SUCH_VARIABLE"),
        "{err}"
    );
    assert_eq!(passing(running.addr, &alice, 1).await, 1);
}

#[tokio::test]
async fn virtual_keys_are_added_and_revoked_by_a_reload() {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 2))).await;
    let url = upstream.url();
    let running = Proxy::bind(config(
        "reload-d",
        &url,
        "100/h",
        "100/h",
        &[("vk-alice-000001", "alice")],
    ))
    .await
    .unwrap()
    .spawn();
    let alice = [("authorization", "Bearer vk-alice-000001")];
    let bob = [("authorization", "Bearer vk-bob-00000001")];
    assert_eq!(passing(running.addr, &alice, 1).await, 1);
    let refused = send(running.addr, "/v1/chat/completions", &bob, chat()).await;
    assert_eq!(refused.status, 401);
    running
        .reloader
        .reload(config(
            "reload-d",
            &url,
            "100/h",
            "100/h",
            &[("vk-bob-00000001", "bob")],
        ))
        .await
        .unwrap();
    assert_eq!(passing(running.addr, &bob, 1).await, 1);
    let revoked = send(running.addr, "/v1/chat/completions", &alice, chat()).await;
    assert_eq!(revoked.status, 401, "{}", revoked.body_str());
    assert!(revoked.body_str().contains("unknown API key"));
}

#[tokio::test]
async fn on_redis_a_reload_keeps_the_levels_every_proxy_shares() {
    let Some(server) = tollgate_testkit::redis::RedisServer::start() else {
        return;
    };
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 2))).await;
    let url = upstream.url();
    let team = [("x-team", "gamma")];
    let with_redis = |requests: &str| {
        let mut config = config("reload-e", &url, requests, "100/h", &[]);
        config.redis = Some(server.url());
        config
    };
    let first = Proxy::bind(with_redis("5/h")).await.unwrap().spawn();
    let second = Proxy::bind(with_redis("5/h")).await.unwrap().spawn();
    assert_eq!(passing(first.addr, &team, 2).await, 2);
    first.reloader.reload(with_redis("5/h")).await.unwrap();
    assert_eq!(passing(second.addr, &team, 1).await, 1);
    assert_eq!(passing(first.addr, &team, 3).await, 2);
}

/// Runs the binary on a configuration file with one virtual key; `change` rewrites the file
/// with another key (and, with `hangup`, sends SIGHUP): the new key must pass and the old one
/// be refused. Then a broken file is refused and the key in force still passes.
async fn binary_reloads(watch: bool) {
    let upstream = Scripted::start(|_, _| json_response(200, &[], &chat_answer(3, 2))).await;
    let dir = std::env::temp_dir().join(format!("tollgate-reload-{}-{watch}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("proxy.toml");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let write = |key: &str, tenant: &str| {
        std::fs::write(
            &file,
            format!(
                "listen = \"127.0.0.1:{port}\"\n[tenants]\nvirtual_keys = {{ \"{key}\" = \"{tenant}\" }}\n[[upstream]]\nname = \"reload-bin-{watch}\"\nurl = \"{}\"\nrequests = \"100/h\"\napi_key_env = \"PATH\"\n",
                upstream.url()
            ),
        )
        .unwrap();
    };
    write("vk-first-0000001", "first");
    let mut args = vec!["--config", file.to_str().unwrap(), "--log", "text"];
    if watch {
        args.extend(["--watch", "0.2"]);
    }
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate-proxy"))
        .args(&args)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let hangup = || {
        let sent = std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap();
        assert!(sent.success());
    };
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let status = |key: &'static str| async move {
        let header = format!("Bearer {key}");
        send(
            addr,
            "/v1/chat/completions",
            &[("authorization", &header)],
            chat(),
        )
        .await
        .status
        .as_u16()
    };
    let mut up = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "the binary listens");
    assert_eq!(status("vk-first-0000001").await, 200);
    write("vk-second-000001", "second");
    if !watch {
        // Without a watch, a changed file is not read until the hangup.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(status("vk-first-0000001").await, 200);
        hangup();
    }
    let mut reloaded = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if status("vk-second-000001").await == 200 {
            reloaded = true;
            break;
        }
    }
    assert!(reloaded, "the new key passes after the reload");
    assert_eq!(status("vk-first-0000001").await, 401);
    assert!(
        child.try_wait().unwrap().is_none(),
        "a reload never stops it"
    );
    // A broken file is refused: the key in force still passes.
    std::fs::write(&file, "listen = [").unwrap();
    if !watch {
        hangup();
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(status("vk-second-000001").await, 200);
    // So is an empty one (a file caught while it is written): read as the defaults, it would
    // serve the public upstreams with no virtual key at all.
    std::fs::write(&file, "# being written\n").unwrap();
    if !watch {
        hangup();
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(status("vk-second-000001").await, 200);
    assert!(child.try_wait().unwrap().is_none());
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_binary_reloads_on_sighup() {
    binary_reloads(false).await;
}

#[tokio::test]
async fn the_binary_reloads_when_its_file_changes_with_watch() {
    binary_reloads(true).await;
}

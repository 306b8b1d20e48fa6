//! Stored objects belong to the tenant that created them. A response, a stored chat completion,
//! a file, a batch, an assistant, a vector store, a thread, a conversation: when a tenant's call
//! creates one, its id is recorded with its tenant in the store (memory, or Redis, where every
//! proxy of a fleet reads it); a call that names an id (in its path, or in a body field such as
//! `previous_response_id`, `file_id` or `vector_store_ids`) is answered 404 in the provider's
//! shape unless its tenant owns it, and a list of the organisation's objects is refused. With
//! no tenants, nothing is recorded or checked.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tollgate::store::redis::RedisStore;

/// How long a Redis store keeps an id's owner (OpenAI keeps a stored response 30 days; files
/// and the rest until they are deleted).
pub(crate) const KEEP: Duration = Duration::from_secs(90 * 86_400);
/// The most owners the memory store keeps (the oldest go first).
pub(crate) const MEMORY_MOST: usize = 1_000_000;

/// The collections whose objects have owners, as their paths follow `/v1/` (`/openai/` on
/// Azure). A call to `{collection}/{id}/...` names the object `id`.
const COLLECTIONS: [&str; 12] = [
    "responses",
    "chat/completions",
    "files",
    "batches",
    "assistants",
    "vector_stores",
    "threads",
    "conversations",
    "containers",
    "uploads",
    "messages/batches",
    "fine_tuning/jobs",
];

/// The prefixes of the ids these collections hand out: a body field that names one of these
/// is checked too.
const ID_PREFIXES: [&str; 18] = [
    "resp_",
    "chatcmpl-",
    "file-",
    "file_",
    "batch_",
    "asst_",
    "vs_",
    "thread_",
    "conv_",
    "cntr_",
    "upload_",
    "msgbatch_",
    "ftjob-",
    "run_",
    "eval_",
    "evalrun_",
    "video_",
    "cthr_",
];

/// Where owners are kept.
pub(crate) enum Owners {
    Memory(Mutex<Memory>),
    Redis(RedisStore),
}

#[derive(Default)]
pub(crate) struct Memory {
    owners: HashMap<String, String>,
    order: VecDeque<String>,
}

impl Owners {
    /// `tenant` owns `id`.
    pub(crate) async fn record(&self, id: &str, tenant: &str) {
        match self {
            Owners::Memory(memory) => {
                let mut memory = memory.lock().unwrap_or_else(PoisonError::into_inner);
                if memory.owners.len() >= MEMORY_MOST
                    && let Some(oldest) = memory.order.pop_front()
                {
                    memory.owners.remove(&oldest);
                }
                // The first owner stays: an id is created once, and an answer that names an
                // id already recorded can't hand it to another tenant.
                if !memory.owners.contains_key(id) {
                    memory.owners.insert(id.to_owned(), tenant.to_owned());
                    memory.order.push_back(id.to_owned());
                }
            }
            Owners::Redis(store) => {
                let name = format!("owner:{id}");
                match store.get_record(&name).await {
                    Ok(Some(_)) => return,
                    Ok(None) => {}
                    Err(err) => {
                        tracing::warn!(error = %err, "the owner of a stored object could not be read; not recorded");
                        return;
                    }
                }
                if let Err(err) = store.put_record(&name, tenant, KEEP).await {
                    tracing::warn!(error = %err, "the owner of a stored object could not be recorded; its tenant will get 404 for it");
                }
            }
        }
    }

    /// The provider paused `key` until `until_ms` (Unix ms) for `pause`: kept on Redis, so that
    /// every proxy's live view shows it (in memory, the process's own counts show it).
    pub(crate) async fn record_pause(&self, key: &str, until_ms: u64, pause: Duration) {
        if let Owners::Redis(store) = self {
            let key = key.split('@').next().unwrap_or(key);
            if let Err(err) = store
                .put_record(&format!("pause:{key}"), &until_ms.to_string(), pause)
                .await
            {
                tracing::warn!(error = %err, "a pause could not be recorded for the live view");
            }
        }
    }

    /// Until when (Unix ms) `key` is paused, as a fleet's proxies recorded it on Redis (`None`
    /// in memory, or none recorded).
    pub(crate) async fn pause_of(&self, key: &str) -> Option<u64> {
        match self {
            Owners::Memory(_) => None,
            Owners::Redis(store) => store
                .get_record(&format!("pause:{key}"))
                .await
                .ok()
                .flatten()
                .and_then(|text| text.parse().ok()),
        }
    }

    /// The most input a call with unseen inputs of `tenant` and `model` was billed, as any
    /// proxy of a fleet learned it (`None` in memory: the process's own is all there is).
    pub(crate) async fn ceiling_of(&self, tenant: &str, model: &str) -> Option<u64> {
        match self {
            Owners::Memory(_) => None,
            Owners::Redis(store) => store
                .get_record(&format!("ceiling:{tenant}:{model}"))
                .await
                .ok()
                .flatten()
                .and_then(|text| text.parse().ok()),
        }
    }

    /// Shares a ceiling learned here with the fleet (the larger of this and what is there).
    pub(crate) async fn share_ceiling(&self, tenant: &str, model: &str, most: u64) {
        if let Owners::Redis(store) = self {
            let name = format!("ceiling:{tenant}:{model}");
            let there = store
                .get_record(&name)
                .await
                .ok()
                .flatten()
                .and_then(|text| text.parse::<u64>().ok())
                .unwrap_or(0);
            if most > there
                && let Err(err) = store.put_record(&name, &most.to_string(), KEEP).await
            {
                tracing::warn!(error = %err, "a learned ceiling could not be shared");
            }
        }
    }

    /// Who owns `id` (`Err`: the store did not answer).
    pub(crate) async fn owner(&self, id: &str) -> Result<Option<String>, tollgate::Error> {
        match self {
            Owners::Memory(memory) => Ok(memory
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .owners
                .get(id)
                .cloned()),
            Owners::Redis(store) => store.get_record(&format!("owner:{id}")).await,
        }
    }
}

/// What a request does with stored objects.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Touches {
    /// The ids it names (path and body), each of which its tenant must own.
    pub(crate) names: Vec<String>,
    /// It lists a collection (the organisation's objects, every tenant's).
    pub(crate) lists: bool,
    /// It may create an object: the id its answer carries is its tenant's.
    pub(crate) creates: bool,
    /// What it creates is of a collection the proxy doesn't know: its answer's id is the
    /// tenant's whatever its prefix.
    pub(crate) any_id: bool,
}

/// The part of a path after its API's root (`/v1/`, or Azure's `/openai/`, in any case), without
/// a query.
fn api_path(path: &str) -> Option<&str> {
    let path = path.split('?').next().unwrap_or(path);
    let lower = path.to_ascii_lowercase();
    ["/v1/", "/openai/"]
        .iter()
        .filter_map(|root| lower.find(root).map(|at| &path[at + root.len()..]))
        .next()
}

/// Collections whose entries are no tenant's objects: the models everyone may read.
const SHARED: [&str; 1] = ["models"];

/// Whether a path segment is an object's id rather than a word of the API: ids carry digits,
/// capitals or dashes (`resp_67cc…`, `file-AbC…`, `eval_67ab…`); the API's words are lowercase
/// with underscores (`generations`, `count_tokens`, `input_items`).
fn id_like(segment: &str) -> bool {
    ID_PREFIXES.iter().any(|p| segment.starts_with(p))
        || segment
            .bytes()
            .any(|b| !(b.is_ascii_lowercase() || b == b'_'))
}

/// What `method` on `path` with `body` (the JSON read, or `Null`) does with stored objects.
/// Collections are matched in any case, and `.` segments (which servers drop) are dropped. A
/// collection the list below doesn't know is read the same way, failing closed: its first
/// segment that looks like an id is named (it must be the tenant's), a `GET` of it without
/// one lists the organisation's objects, and a `POST` to it creates one.
pub(crate) fn touches(method: &http::Method, path: &str, body: &Value) -> Touches {
    let mut touches = Touches::default();
    if let Some(rest) = api_path(path) {
        let mut segments: Vec<&str> = rest
            .split('/')
            .filter(|s| !s.is_empty() && *s != ".")
            .collect();
        // Azure's deployments name a model, not an object: what follows is the operation.
        if segments
            .first()
            .is_some_and(|s| s.eq_ignore_ascii_case("deployments"))
        {
            segments.drain(..segments.len().min(2));
        }
        let lower: Vec<String> = segments.iter().map(|s| s.to_ascii_lowercase()).collect();
        let known = COLLECTIONS.iter().find_map(|collection| {
            let parts: Vec<&str> = collection.split('/').collect();
            (lower.len() >= parts.len() && lower[..parts.len()] == parts[..]).then_some(parts.len())
        });
        let shared = lower.first().is_some_and(|s| SHARED.contains(&s.as_str()));
        if !shared && !segments.is_empty() {
            let (id_at, any) = match known {
                // `threads/runs` creates a thread and its run: no id named.
                Some(1) if lower.len() >= 2 && lower[0] == "threads" && lower[1] == "runs" => {
                    (None, false)
                }
                Some(n) => (segments.get(n).map(|_| n), false),
                None => (
                    segments
                        .iter()
                        .skip(1)
                        .position(|s| id_like(s))
                        .map(|i| i + 1),
                    true,
                ),
            };
            match id_at {
                Some(at) => {
                    touches.names.push(segments[at].to_owned());
                    // A message, a run, a file added under an object the tenant owns; and the
                    // files the provider made for it (a batch's output), read from the object
                    // itself. Never from what lies under it: a file's content is the tenant's
                    // own bytes, not the provider's word.
                    touches.creates = *method == http::Method::POST
                        || (*method == http::Method::GET && at + 1 == segments.len());
                }
                None => match *method {
                    http::Method::GET => touches.lists = true,
                    http::Method::POST => {
                        touches.creates = true;
                        touches.any_id = any;
                    }
                    _ => {}
                },
            }
        }
    }
    named_in(body, 0, &mut touches.names);
    touches.names.sort();
    touches.names.dedup();
    touches
}

/// Fields other than `..._id` that name a stored object, as an id or as `{"id": ...}`.
const NAMING: [&str; 2] = ["conversation", "container"];

/// The ids a body names in fields that name objects: `..._id`, `id` and `..._file` (a string),
/// `..._ids` and `..._files` (a list of strings), `conversation` and `container`, when the value
/// has an id's prefix.
fn named_in(value: &Value, depth: usize, out: &mut Vec<String>) {
    if depth > 64 || out.len() > 1_000 {
        return;
    }
    let is_id = |text: &str| ID_PREFIXES.iter().any(|p| text.starts_with(p));
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match value {
                    // `..._id`; `id` itself (an eval's data source `{"type": "file_id", "id":
                    // ...}`); `..._file` (a fine-tuning job's `training_file` and
                    // `validation_file`); `conversation`, `container`.
                    Value::String(text)
                        if (key.ends_with("_id")
                            || key == "id"
                            || key.ends_with("_file")
                            || NAMING.contains(&key.as_str()))
                            && is_id(text) =>
                    {
                        out.push(text.clone());
                    }
                    // `"conversation": {"id": "conv_..."}`: the object form names it too.
                    Value::Object(inner) if NAMING.contains(&key.as_str()) => {
                        if let Some(id) = inner.get("id").and_then(Value::as_str)
                            && is_id(id)
                        {
                            out.push(id.to_owned());
                        }
                        named_in(value, depth + 1, out);
                    }
                    Value::Array(items) if key.ends_with("_ids") || key.ends_with("_files") => {
                        out.extend(
                            items
                                .iter()
                                .filter_map(Value::as_str)
                                .filter(|t| is_id(t))
                                .map(str::to_owned),
                        );
                    }
                    _ => named_in(value, depth + 1, out),
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                named_in(item, depth + 1, out);
            }
        }
        _ => {}
    }
}

/// Reads the ids an answer creates from its start: the first `"id"` (the object's own: a
/// response's, even inside a stream's first event) and any `"thread_id"`.
#[derive(Debug, Default)]
pub(crate) struct IdCatcher {
    /// The end of what was read before: enough to hold a field and its id split across frames.
    tail: Vec<u8>,
    /// How much was read.
    scanned: usize,
    found: Vec<String>,
    /// The first `"id"` was found.
    own: bool,
    done: bool,
    /// The answer's own id is taken whatever its prefix (an object of a collection the proxy
    /// doesn't know).
    any_own: bool,
}

/// How much of an answer's start is read for its ids.
const CATCH_MOST: usize = 64 << 10;
/// How much of the last frame is read again with the next (a field name and a 256-byte id).
const TAIL: usize = 512;

impl IdCatcher {
    /// A catcher that takes the answer's own id whatever its prefix, as long as it looks like
    /// an id.
    pub(crate) fn any_own() -> IdCatcher {
        IdCatcher {
            any_own: true,
            ..IdCatcher::default()
        }
    }

    /// Reads `data`; answers the ids found in it not answered before.
    pub(crate) fn feed(&mut self, data: &[u8]) -> Vec<String> {
        if self.done {
            return Vec::new();
        }
        // Each byte is read about once: the frame, after the end of the one before it.
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(data);
        let mut new = Vec::new();
        let text = String::from_utf8_lossy(&window).into_owned();
        for (field, own) in [
            ("\"id\"", true),
            ("\"thread_id\"", false),
            ("\"output_file_id\"", false),
            ("\"error_file_id\"", false),
        ] {
            if own && self.own {
                continue;
            }
            let mut from = 0;
            while let Some(at) = text[from..].find(field) {
                let start = from + at + field.len();
                from = start;
                let rest = text[start..].trim_start();
                let Some(rest) = rest.strip_prefix(':') else {
                    continue;
                };
                let Some(rest) = rest.trim_start().strip_prefix('"') else {
                    continue;
                };
                let Some(end) = rest.find('"') else {
                    break;
                };
                let id = &rest[..end];
                if (ID_PREFIXES.iter().any(|p| id.starts_with(p))
                    || (own && self.any_own && !id.is_empty() && id_like(id)))
                    && id.len() <= 256
                    && !self.found.iter().any(|f| f == id)
                {
                    self.found.push(id.to_owned());
                    new.push(id.to_owned());
                }
                if own {
                    self.own = true;
                    break;
                }
            }
        }
        self.scanned = self.scanned.saturating_add(data.len());
        if self.scanned >= CATCH_MOST {
            self.done = true;
        } else {
            self.tail = window[window.len().saturating_sub(TAIL)..].to_vec();
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;
    use serde_json::json;

    #[test]
    fn a_call_names_the_objects_in_its_path_and_its_body() {
        let t = touches(&Method::GET, "/v1/responses/resp_abc", &Value::Null);
        assert_eq!(t.names, ["resp_abc"]);
        // What a stored object of the tenant's names (a batch's output file) becomes its own.
        assert!(!t.lists && t.creates);
        let t = touches(
            &Method::GET,
            "/v1/responses/resp_abc/input_items?limit=5",
            &Value::Null,
        );
        assert_eq!(t.names, ["resp_abc"]);
        assert!(touches(&Method::GET, "/v1/files", &Value::Null).lists);
        assert!(touches(&Method::GET, "/v1/chat/completions", &Value::Null).lists);
        assert!(touches(&Method::POST, "/v1/files", &Value::Null).creates);
        assert!(touches(&Method::POST, "/v1/threads/runs", &Value::Null).creates);
        let t = touches(
            &Method::POST,
            "/v1/responses",
            &json!({"model": "gpt-4o", "previous_response_id": "resp_alice",
                "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-x1"},
                    {"type": "input_text", "text": "mention file-y2 in text"}]}],
                "tools": [{"type": "file_search", "vector_store_ids": ["vs_1", "not-an-id"]}]}),
        );
        assert!(t.creates);
        assert_eq!(t.names, ["file-x1", "resp_alice", "vs_1"]);
        let t = touches(
            &Method::DELETE,
            "/azure/openai/files/file-9?api-version=1",
            &Value::Null,
        );
        assert_eq!(t.names, ["file-9"]);
        // Text that looks like an id names nothing; embeddings are a collection the list
        // doesn't know (what such a POST creates is followed on passed paths only).
        let t = touches(&Method::POST, "/v1/embeddings", &json!({"input": "resp_x"}));
        assert!(t.names.is_empty() && !t.lists && t.any_id);
        let t = touches(
            &Method::POST,
            "/v1/responses",
            &json!({"model": "gpt-4o", "input": "x", "conversation": {"id": "conv_a"}}),
        );
        assert_eq!(t.names, ["conv_a"]);
        // Any case, `.` segments, a trailing slash: the same object.
        for path in [
            "/V1/Responses/resp_abc",
            "/v1/./responses/resp_abc/",
            "/v1/responses/./resp_abc",
        ] {
            assert_eq!(
                touches(&Method::GET, path, &Value::Null).names,
                ["resp_abc"],
                "{path}"
            );
        }
        // A file's content is the tenant's bytes: nothing in it is caught.
        let t = touches(&Method::GET, "/v1/files/file-1/content", &Value::Null);
        assert_eq!(t.names, ["file-1"]);
        assert!(!t.creates);
        // Collections the list doesn't know fail closed: ids named, lists refused.
        let t = touches(&Method::GET, "/v1/evals/eval_67ab/runs", &Value::Null);
        assert_eq!(t.names, ["eval_67ab"]);
        assert!(touches(&Method::GET, "/v1/videos", &Value::Null).lists);
        assert!(touches(&Method::GET, "/v1/chatkit/threads", &Value::Null).lists);
        assert!(touches(&Method::GET, "/v1/organization/costs", &Value::Null).lists);
        let t = touches(&Method::POST, "/v1/videos", &Value::Null);
        assert!(t.creates && t.any_id);
        // The API's own words are not ids; models are everyone's; Azure's deployment is not
        // an object.
        for (method, path) in [
            (Method::POST, "/v1/images/generations"),
            (Method::POST, "/v1/messages/count_tokens"),
            (Method::GET, "/v1/models"),
            (Method::GET, "/v1/models/gpt-4o-2024-08-06"),
            (Method::POST, "/openai/deployments/prod-4o/chat/completions"),
        ] {
            let t = touches(&method, path, &Value::Null);
            assert!(t.names.is_empty() && !t.lists, "{method} {path}: {t:?}");
        }
    }

    #[test]
    fn an_answers_ids_are_caught_whatever_its_frames() {
        let stream = br#"event: response.created
data: {"type":"response.created","response":{"id":"resp_123","object":"response"}}

data: {"type":"x","item":{"id":"msg_9"}}
"#;
        for cut in 1..stream.len() {
            let mut catcher = IdCatcher::default();
            let mut ids = Vec::new();
            for piece in stream.chunks(cut) {
                ids.extend(catcher.feed(piece));
            }
            assert_eq!(ids, ["resp_123"], "{cut}");
        }
        let mut catcher = IdCatcher::default();
        assert_eq!(
            catcher.feed(br#"{"id": "run_1", "object": "thread.run", "thread_id": "thread_7"}"#),
            ["run_1", "thread_7"]
        );
        // A batch's files, made by the provider, are its owner's; a quoted field inside a
        // string names nothing.
        let mut catcher = IdCatcher::default();
        assert_eq!(
            catcher.feed(
                br#"{"id": "batch_1", "output_file_id": "file-out", "note": "\"thread_id\": \"thread_x\""}"#
            ),
            ["batch_1", "file-out"]
        );
    }
}

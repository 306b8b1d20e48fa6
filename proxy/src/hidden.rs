//! Inputs the proxy can't measure: a previous response, a conversation, a file by id or by URL
//! (or a PDF, whose pages it doesn't count), a stored prompt, and what server-side tools
//! (search, file search, code execution, MCP servers) bring in. The provider bills them; the
//! request doesn't show them. Such a call is reserved from its budgets at a ceiling learned
//! from what such calls of its tenant and model were billed before (the most input one was
//! billed); until one has settled, they go one at a time per tenant and model, so that a burst
//! can take a budget past its end by one call's bill at most.
//!
//! On Redis, what one proxy of a fleet learns is shared with the others through the store (a
//! proxy that finds a ceiling there needs no turn); while none has learned it, each proxy lets
//! one call at a time through.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use tokio::sync::Semaphore;

/// The most (tenant, model) pairs remembered (past it, they are forgotten and learned again).
const MOST: usize = 10_000;

#[derive(Debug)]
struct Entry {
    /// The most input a settled call was billed.
    most: Option<u64>,
    /// One call at a time while nothing is learned.
    alone: Arc<Semaphore>,
}

/// What calls with unseen inputs were billed, per tenant and model.
#[derive(Debug, Default)]
pub(crate) struct Hidden {
    entries: Mutex<HashMap<(String, String), Entry>>,
}

impl Hidden {
    /// The ceiling learned for `tenant` and `model` (`None`: nothing yet), and the turn a call
    /// takes while there is none.
    pub(crate) fn ceiling(&self, tenant: &str, model: &str) -> (Option<u64>, Arc<Semaphore>) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= MOST && !entries.contains_key(&(tenant.to_owned(), model.to_owned())) {
            entries.clear();
        }
        let entry = entries
            .entry((tenant.to_owned(), model.to_owned()))
            .or_insert_with(|| Entry {
                most: None,
                alone: Arc::new(Semaphore::new(1)),
            });
        (entry.most, Arc::clone(&entry.alone))
    }

    /// A call of `tenant` and `model` with unseen inputs was billed `input` tokens of input:
    /// answers the ceiling now.
    pub(crate) fn learned(&self, tenant: &str, model: &str, input: u64) -> u64 {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = entries
            .entry((tenant.to_owned(), model.to_owned()))
            .or_insert_with(|| Entry {
                most: None,
                alone: Arc::new(Semaphore::new(1)),
            });
        let most = entry.most.map_or(input, |most| most.max(input));
        entry.most = Some(most);
        most
    }
}

/// Whether a request brings input the proxy can't count: see the module's docs.
pub(crate) fn unmeasured(value: &Value) -> bool {
    let Some(map) = value.as_object() else {
        return false;
    };
    let named = |key: &str| map.get(key).is_some_and(|v| !v.is_null());
    if named("previous_response_id")
        || named("conversation")
        || named("container")
        || named("web_search_options")
        || map.get("prompt").is_some_and(Value::is_object)
        || map
            .get("mcp_servers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
    {
        return true;
    }
    if let Some(tools) = map.get("tools").and_then(Value::as_array) {
        let server_side = [
            "web_search",
            "file_search",
            "code_interpreter",
            "code_execution",
            "mcp",
            "web_fetch",
            "computer",
        ];
        if tools.iter().any(|tool| {
            tool.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| server_side.iter().any(|s| t.starts_with(s)))
        }) {
            return true;
        }
    }
    hides(value, 0)
}

/// A part that names input by reference, or a document the proxy doesn't count.
fn hides(value: &Value, depth: usize) -> bool {
    if depth > 64 {
        return true;
    }
    match value {
        Value::Object(map) => {
            let kind = map.get("type").and_then(Value::as_str);
            if map.get("file_id").is_some_and(Value::is_string)
                || map.get("file_url").is_some_and(Value::is_string)
                || matches!(kind, Some("input_file" | "file" | "item_reference"))
            {
                return true;
            }
            // Anthropic: a document that isn't plain text, or any source by URL or file id.
            if let Some(source) = map.get("source").and_then(Value::as_object) {
                let source_kind = source.get("type").and_then(Value::as_str);
                if matches!(source_kind, Some("url" | "file"))
                    || (kind == Some("document") && source_kind != Some("text"))
                {
                    return true;
                }
            }
            map.values().any(|v| hides(v, depth + 1))
        }
        Value::Array(items) => items.iter().any(|v| hides(v, depth + 1)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn inputs_by_reference_and_server_tools_are_unmeasured() {
        for hidden in [
            json!({"model": "gpt-4o", "input": "x", "previous_response_id": "resp_1"}),
            json!({"model": "gpt-4o", "input": [{"role": "user", "content": [{"type": "input_file", "file_url": "https://x/a.pdf"}]}]}),
            json!({"model": "gpt-4o", "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]}),
            json!({"model": "gpt-4o", "input": "x", "tools": [{"type": "web_search"}]}),
            json!({"model": "claude-sonnet-4", "messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}}]}]}),
            json!({"model": "claude-sonnet-4", "messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            json!({"model": "gpt-4o", "input": "x", "prompt": {"id": "pmpt_1"}}),
            json!({"model": "gpt-4o", "input": [{"type": "item_reference", "id": "msg_1"}]}),
        ] {
            assert!(unmeasured(&hidden), "{hidden}");
        }
        for seen in [
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "file_id is a word"}]}),
            json!({"model": "gpt-4o", "input": "x", "tools": [{"type": "function", "name": "f"}]}),
            json!({"model": "gpt-3.5-turbo-instruct", "prompt": "a completion's prompt"}),
        ] {
            assert!(!unmeasured(&seen), "{seen}");
        }
    }

    #[test]
    fn the_ceiling_is_the_most_a_settled_call_was_billed() {
        let hidden = Hidden::default();
        assert_eq!(hidden.ceiling("alice", "gpt-4o").0, None);
        hidden.learned("alice", "gpt-4o", 60_000);
        hidden.learned("alice", "gpt-4o", 1_000);
        assert_eq!(hidden.ceiling("alice", "gpt-4o").0, Some(60_000));
        assert_eq!(hidden.ceiling("bob", "gpt-4o").0, None);
    }
}

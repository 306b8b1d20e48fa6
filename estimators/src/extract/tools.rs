//! What tool definitions cost.
//!
//! OpenAI renders function definitions into the prompt in a syntax of its own; the OpenAI
//! cookbook's `num_tokens_for_tools` reproduces the count with fixed overheads per function,
//! property and enum value, which [`ToolOverheads`] holds for the encodings it was measured on.
//! Any other estimator (Anthropic, a Hugging Face vocabulary, words) counts each definition's
//! JSON text, which errs high: the punctuation and quotes of JSON cost more than the rendered
//! form.

use super::tree::Tree;
use crate::Estimator;

/// The cookbook's fixed costs of a tool definition, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolOverheads {
    /// Each function.
    pub function: i64,
    /// A function's parameters, when it has any.
    pub properties: i64,
    /// Each parameter.
    pub property: i64,
    /// A parameter's enum, when it has one.
    pub enumeration: i64,
    /// Each enum value.
    pub enum_item: i64,
    /// Once, after all the functions.
    pub end: i64,
}

impl ToolOverheads {
    /// `o200k_base` models (GPT-4o, GPT-4.1, o-series): 7, 3, 3, −3, 3, 12.
    pub const O200K: ToolOverheads = ToolOverheads {
        function: 7,
        properties: 3,
        property: 3,
        enumeration: -3,
        enum_item: 3,
        end: 12,
    };

    /// `cl100k_base` models (GPT-3.5, GPT-4): 10, 3, 3, −3, 3, 12.
    pub const CL100K: ToolOverheads = ToolOverheads {
        function: 10,
        ..ToolOverheads::O200K
    };
}

/// The function of an OpenAI tool: `{type: "function", function: {...}}` (chat completions),
/// the definition itself (legacy `functions`, or the responses API's flattened form).
fn function(tool: &Tree) -> Option<&Tree> {
    match tool.get("function") {
        Some(inner @ Tree::Map(_)) => Some(inner),
        _ if tool.get("name").is_some() => Some(tool),
        _ => None,
    }
}

fn text(tree: Option<&Tree>) -> &str {
    tree.and_then(Tree::as_str).unwrap_or("")
}

/// A description as the cookbook counts it: without a final period.
fn trimmed(description: &str) -> &str {
    description.strip_suffix('.').unwrap_or(description)
}

/// The tokens of the `tools` (or `functions`) of a request.
pub(crate) fn count<E: Estimator + ?Sized>(tools: &Tree, estimator: &E) -> u64 {
    let items = tools.as_list();
    if items.is_empty() {
        return 0;
    }
    let count = |text: &str| estimator.count(text) as i64;
    let Some(o) = estimator.tool_overheads() else {
        return items.iter().map(|tool| count(&tool.json()) as u64).sum();
    };
    let mut total: i64 = 0;
    for tool in items {
        let Some(f) = function(tool) else {
            // Not a function (a built-in tool such as web search): its JSON, erring high.
            total += count(&tool.json());
            continue;
        };
        total += o.function;
        total += count(&format!(
            "{}:{}",
            text(f.get("name")),
            trimmed(text(f.get("description")))
        ));
        let properties = f
            .get("parameters")
            .and_then(|p| p.get("properties"))
            .map(Tree::fields)
            .unwrap_or(&[]);
        if !properties.is_empty() {
            total += o.properties;
            for (name, fields) in properties {
                total += o.property;
                if let Some(values) = fields.get("enum") {
                    total += o.enumeration;
                    for value in values.as_list() {
                        total += o.enum_item;
                        total += count(&match value {
                            Tree::Str(s) => s.clone(),
                            other => other.json(),
                        });
                    }
                }
                let kind = match fields.get("type") {
                    Some(Tree::Str(s)) => s.clone(),
                    Some(other) => other.json(),
                    None => String::new(),
                };
                total += count(&format!(
                    "{name}:{kind}:{}",
                    trimmed(text(fields.get("description")))
                ));
                // Nested objects and arrays are rendered too; the cookbook's rule doesn't
                // cover them, so their schema's JSON is added, erring high.
                for nested in ["properties", "items", "anyOf", "oneOf", "allOf"] {
                    if let Some(inner) = fields.get(nested) {
                        total += count(&inner.json());
                    }
                }
            }
        }
    }
    total += o.end;
    total.max(0) as u64
}

//! The billing rules: which keys change how a value counts, and what a value is from where it
//! sits. The walker asks these; it knows only how to walk.

/// OpenAI's framing of each chat message.
pub const TOKENS_PER_MESSAGE: u64 = 3;
/// OpenAI's extra token for a message's `name`.
pub const TOKENS_PER_NAME: u64 = 1;
/// OpenAI's priming of the reply, once per conversation.
pub const REPLY_PRIMING: u64 = 3;

/// What a value is, from where it sits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Ctx {
    /// The value passed in: a map here may be a request body.
    Root,
    /// Ordinary data: every string counts.
    Any,
    /// A message's or system prompt's content: strings count; in a part (a map), only the
    /// fields that carry text, tool calls and results, and images.
    Content,
    /// `input` of an embeddings request: strings count, integers are tokens.
    Input,
    /// Not text (a `type` tag, an id).
    Skip,
}

/// The keys that change how a value counts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Key {
    Role,
    Content,
    Name,
    Text,
    ToolCalls,
    FunctionCall,
    Refusal,
    Arguments,
    Output,
    Messages,
    System,
    Prompt,
    Input,
    /// Text a request bills beside its messages: the responses API's `instructions`, a
    /// completion's `suffix`, a predicted output, a rerank's `query` and `documents`, Voyage's
    /// multimodal `inputs`.
    Billed,
    /// A request parameter that is not text the provider bills (`model`, `user`, `stop` ...).
    Param,
    Tools,
    MaxTokens,
    N,
    Type,
    ImageUrl,
    Source,
    Detail,
    Other,
}

pub(super) fn classify(key: &str) -> Key {
    match key {
        "role" => Key::Role,
        "content" => Key::Content,
        "name" => Key::Name,
        "text" => Key::Text,
        "tool_calls" => Key::ToolCalls,
        "function_call" | "function" => Key::FunctionCall,
        "refusal" => Key::Refusal,
        "arguments" => Key::Arguments,
        "output" => Key::Output,
        "messages" => Key::Messages,
        "system" => Key::System,
        "prompt" => Key::Prompt,
        "input" => Key::Input,
        "instructions" | "suffix" | "prediction" | "query" | "documents" | "inputs" => Key::Billed,
        "model"
        | "user"
        | "metadata"
        | "stream"
        | "stream_options"
        | "service_tier"
        | "store"
        | "safety_identifier"
        | "prompt_cache_key"
        | "prompt_cache_retention"
        | "encoding_format"
        | "input_type"
        | "output_dtype"
        | "output_dimension"
        | "truncation"
        | "reasoning_effort"
        | "reasoning"
        | "tool_choice"
        | "parallel_tool_calls"
        | "modalities"
        | "include"
        | "previous_response_id"
        | "background"
        | "verbosity"
        | "stop"
        | "stop_sequences"
        | "conversation"
        | "return_documents"
        | "top_k"
        | "top_p"
        | "temperature"
        | "seed"
        | "user_id" => Key::Param,
        "tools" | "functions" => Key::Tools,
        "max_tokens" | "max_completion_tokens" | "max_output_tokens" => Key::MaxTokens,
        "n" => Key::N,
        "type" => Key::Type,
        "image_url" => Key::ImageUrl,
        "source" => Key::Source,
        "detail" => Key::Detail,
        _ => Key::Other,
    }
}

/// What a field of a part of content holds, and how it counts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum PartField {
    /// Text: counted (`text`, a tool's `name`, a result's `output`, a call's `arguments`).
    Text,
    /// A tool result's content: content again, so its parts count too.
    Nested,
    /// A tool call's input object: counted as its JSON text.
    Json,
    /// An OpenAI image: captured, priced by the image rule.
    OpenAiImage,
    /// An Anthropic block's source: captured, priced by the area rule if the block is an image.
    Source,
    /// The detail of an OpenAI image, beside its URL.
    Detail,
    /// The part's type, which says what a `source` is.
    Type,
    /// Anything else (ids, cache control): not text.
    Skip,
}

pub(super) fn part_field(key: Key) -> PartField {
    match key {
        Key::Text | Key::Name | Key::Output | Key::Arguments | Key::Refusal => PartField::Text,
        Key::Content => PartField::Nested,
        Key::Input => PartField::Json,
        Key::ImageUrl => PartField::OpenAiImage,
        Key::Source => PartField::Source,
        Key::Detail => PartField::Detail,
        Key::Type => PartField::Type,
        _ => PartField::Skip,
    }
}

/// The context of a field's value in a map outside content.
pub(super) fn child(ctx: Ctx, key: Key) -> Ctx {
    match (ctx, key) {
        (Ctx::Skip, _) | (_, Key::Type) => Ctx::Skip,
        (Ctx::Input, _) => Ctx::Input,
        (_, Key::Content) => Ctx::Content,
        _ => Ctx::Any,
    }
}

/// True for the fields a chat message bills.
pub(super) fn billed_in_message(key: Key) -> bool {
    matches!(
        key,
        Key::Role | Key::Name | Key::Content | Key::ToolCalls | Key::FunctionCall | Key::Refusal
    )
}

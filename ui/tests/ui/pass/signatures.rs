//! Every supported signature: free functions, methods on &self and &mut self, generics,
//! lifetimes, impl Trait arguments, async fns in traits, kept attributes and doc comments.

use serde::Serialize;

#[derive(Debug)]
pub struct AppError(tollgate::Error);

impl From<tollgate::Error> for AppError {
    fn from(err: tollgate::Error) -> AppError {
        AppError(err)
    }
}

#[derive(Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

pub struct Client;

/// Doc comments stay on the function.
#[tollgate::limit(key = "pass-free", requests = "500/m", tokens = "200000/m", estimator = "words", timeout = "30s")]
#[allow(clippy::needless_lifetimes)]
pub async fn chat<'a>(client: &'a Client, messages: &[Message], max_tokens: u32) -> Result<&'a Client, AppError> {
    let _ = (messages, max_tokens);
    Ok(client)
}

#[tollgate::limit(key = "pass-generic", tokens = "1000/m", estimator = "words")]
async fn generic<T: Serialize, U>(text: T, other: U) -> Result<(T, U), AppError> {
    Ok((text, other))
}

#[tollgate::limit(key = "pass-impl", tokens = "1000/m", estimator = "words", timeout = "none")]
async fn impl_trait(text: impl Serialize + Send, f: impl Fn() -> u8) -> Result<u8, AppError> {
    let _ = text;
    Ok(f())
}

#[tollgate::limit(key = "pass-where", requests = "10/s")]
async fn where_clause<T>(value: T) -> Result<T, AppError>
where
    T: Serialize + Send,
{
    Ok(value)
}

pub struct Service {
    host: String,
    count: u32,
}

impl Service {
    #[tollgate::limit(key = format!("pass-host:{}", self.host), requests = "5/s")]
    pub async fn get(&self, path: &str) -> Result<usize, AppError> {
        Ok(path.len())
    }

    #[tollgate::limit(key = "pass-mut", requests = "5/s", tokens = "100/s; 1000/m", estimator = "words", tokens_from = [prompt], reserve_output = limit)]
    pub async fn bump(&mut self, prompt: String, limit: Option<u32>) -> Result<u32, AppError> {
        let _ = (prompt, limit);
        self.count += 1;
        Ok(self.count)
    }
}

pub trait Llm {
    fn complete(&self, prompt: &str) -> impl std::future::Future<Output = Result<String, AppError>> + Send;
}

pub struct Model;

impl Llm for Model {
    #[tollgate::limit(key = "pass-trait", requests = "100 per minute", tokens = "5/s burst 10", estimator = "words", reserve_output)]
    async fn complete(&self, prompt: &str) -> Result<String, AppError> {
        Ok(prompt.to_uppercase())
    }
}

impl tollgate::RateLimited for AppError {
    fn is_rate_limited(&self) -> bool {
        false
    }
}

/// Limits from the configuration, and retries of refused calls.
#[tollgate::limit(key = "pass-config", retries = 2)]
pub async fn from_config(client: &Client, prompt: &str) -> Result<usize, AppError> {
    let _ = client;
    Ok(prompt.len())
}

pub struct Answer {
    pub text: String,
    pub total_tokens: u64,
}

/// Output tokens limited apart, and settled with the usage the answer reports; an early
/// `return` in the body is settled too.
#[tollgate::limit(key = "pass-settle", tokens = "1000/m", output_tokens = "500/m", estimator = "words", reserve_output = 100u32, settle = |answer: &Answer| answer.total_tokens)]
async fn settled(prompt: &str) -> Result<Answer, AppError> {
    if prompt.is_empty() {
        return Ok(Answer { text: String::new(), total_tokens: 0 });
    }
    Ok(Answer { text: prompt.to_owned(), total_tokens: 7 })
}

pub type Res<T> = Result<T, AppError>;

#[tollgate::limit(key = "pass-alias", requests = "1/s")]
async fn aliased() -> Res<()> {
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    tollgate::install_config(tollgate::Config::from_toml("[default]\nrequests = \"5/s\"").unwrap()).unwrap();
    assert_eq!(from_config(&Client, "four").await.unwrap(), 4);
    chat(&Client, &[], 10).await.unwrap();
    assert_eq!(generic("hi", 3).await.unwrap(), ("hi", 3));
    assert_eq!(impl_trait("x", || 7).await.unwrap(), 7);
    assert_eq!(where_clause(5).await.unwrap(), 5);
    let mut service = Service { host: "example".into(), count: 0 };
    assert_eq!(service.get("/a").await.unwrap(), 2);
    assert_eq!(service.bump("go".into(), Some(3)).await.unwrap(), 1);
    assert_eq!(Model.complete("ok").await.unwrap(), "OK");
    aliased().await.unwrap();
    assert_eq!(settled("hi").await.unwrap().text, "hi");
    assert_eq!(settled("").await.unwrap().total_tokens, 0);
}

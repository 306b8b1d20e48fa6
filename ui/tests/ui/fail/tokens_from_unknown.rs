#[tollgate::limit(key = "k", tokens = "100/s", tokens_from = [messages])]
async fn call(prompt: String) -> Result<(), tollgate::Error> {
    let _ = prompt;
    Ok(())
}

fn main() {}

#[tollgate::limit(key = "k", tokens = "5/s", estimator = "gemini")]
async fn call() -> Result<(), tollgate::Error> {
    Ok(())
}

fn main() {}

#[tollgate::limit(key = "k", estimator = "openai")]
async fn call() -> Result<(), tollgate::Error> {
    Ok(())
}

fn main() {}

#[tollgate::limit(key = "k", requests = "500/q")]
async fn call() -> Result<(), tollgate::Error> {
    Ok(())
}

fn main() {}

#[tollgate::limit(key = "k", requests = "5/s", timeout = "30 parsecs")]
async fn call() -> Result<(), tollgate::Error> {
    Ok(())
}

fn main() {}

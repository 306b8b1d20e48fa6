#[tollgate::limit(key = "k", requests = "5/s", tokens = "5/s burst 0")]
async fn call() -> Result<(), tollgate::Error> {
    Ok(())
}

fn main() {}

#[tollgate::limit(key = "k", requests = "5/s", burst = "10")]
async fn call() -> Result<(), tollgate::Error> {
    Ok(())
}

fn main() {}

#[tollgate::limit(requests = "5/s")]
async fn call() -> Result<(), tollgate::Error> {
    Ok(())
}

fn main() {}

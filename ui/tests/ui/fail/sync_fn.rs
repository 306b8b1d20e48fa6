#[tollgate::limit(key = "k", requests = "5/s")]
fn call() -> Result<(), tollgate::Error> {
    Ok(())
}

fn main() {}

#[derive(Debug)]
struct MyError;

#[tollgate::limit(key = "k", requests = "5/s")]
async fn call() -> Result<(), MyError> {
    Ok(())
}

fn main() {}

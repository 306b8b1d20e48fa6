#[tollgate::limit(key = "k", requests = "5/s")]
async fn call() -> u32 {
    1
}

#[tollgate::limit(key = "k", requests = "5/s")]
async fn nothing() {}

fn main() {}

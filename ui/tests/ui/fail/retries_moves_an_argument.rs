#[derive(Debug)]
struct AppError;
impl From<tollgate::Error> for AppError {
    fn from(_: tollgate::Error) -> AppError {
        AppError
    }
}
impl tollgate::RateLimited for AppError {
    fn is_rate_limited(&self) -> bool {
        false
    }
}

struct Request(String);

fn send(request: Request) -> Result<usize, AppError> {
    Ok(request.0.len())
}

// With retries the body may run again, so it must not move its arguments out.
#[tollgate::limit(key = "k", requests = "5/s", retries = 3)]
async fn create(request: Request) -> Result<usize, AppError> {
    send(request)
}

fn main() {}

struct Client;

#[tollgate::limit(key = "k", tokens = "100/s", tokens_from = [client])]
async fn call(client: Client) -> Result<(), tollgate::Error> {
    let _ = client;
    Ok(())
}

fn main() {}

//! Proof against a provider stand-in that enforces its limits: the agent's 60 calls get 429s
//! when nothing paces them (so the stand-in really enforces), and none through tollgate.
//! Real time (a network server can't run on tokio's paused clock): about 25 s.

use std::time::Duration;

use tollgate_testkit::provider::{Provider, billed_tokens, unthrottled, with_tollgate, workload};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgate_gets_no_429_where_an_unthrottled_client_does() {
    let bodies = workload();
    let total: u64 = bodies.iter().map(billed_tokens).sum();
    // 120 requests and 20,000 tokens per 10 s; the workload bills about twice the burst.
    assert!(total > 30_000, "{total}");
    let period = Duration::from_secs(10);

    let server = Provider::start(120, 20_000, period).await;
    let raw = unthrottled(server.addr, &bodies).await;
    assert_eq!(raw.calls, 60);
    assert!(raw.refused > 0, "the stand-in enforced nothing: {raw:?}");

    let server = Provider::start(120, 20_000, period).await;
    let paced = with_tollgate(server.addr, &bodies).await;
    assert_eq!(paced.calls, 60);
    assert_eq!(paced.refused, 0, "{paced:?}");
    assert_eq!(
        server
            .stats
            .refused
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    // Not throttled into the ground: the ideal is the burst at once, the rest at 2,000 tokens
    // a second. The margin is wide because this is real time on a possibly loaded machine; the
    // example measures how close it comes.
    let ideal = (total - 20_000) as f64 / 2_000.0;
    assert!(
        paced.seconds < ideal * 1.5 + 3.0,
        "{paced:?}, ideal {ideal:.1} s"
    );
    eprintln!("unthrottled {raw:?}; tollgate {paced:?}; ideal {ideal:.2} s");
}

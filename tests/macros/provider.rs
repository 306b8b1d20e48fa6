//! Proof against a provider stand-in that enforces its limits as unfriendly as a real one (it
//! takes its time, its count strays from tiktoken's by up to 3%, a refused request counts): the
//! agent's 60 calls get dozens of 429s when nothing paces them (so the stand-in really
//! enforces), and at most the one its count's error makes through tollgate set to the
//! provider's own limits, bursts included. Real time (a network server can't run on tokio's
//! paused clock): about 25 s.

use std::time::Duration;

use tollgate_testkit::provider::{
    Options, Provider, billed_tokens, ideal_seconds, unthrottled, with_tollgate, workload,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgate_keeps_429s_to_the_estimates_error_where_an_unthrottled_client_meets_dozens() {
    let bodies = workload();
    let total: u64 = bodies.iter().map(billed_tokens).sum();
    // 120 requests and 20,000 tokens per 10 s; the workload bills about twice the burst.
    assert!(total > 30_000, "{total}");
    let period = Duration::from_secs(10);

    let server = Provider::start(120, 20_000, period).await;
    let raw = unthrottled(server.addr, &bodies).await;
    assert_eq!(raw.calls, 60);
    assert!(raw.refused > 0, "the stand-in enforced nothing: {raw:?}");

    let options = Options::openai(120, 20_000, period);
    let ideal = ideal_seconds(&bodies, &options, 0.0);
    let server = Provider::start_with(options).await;
    let paced = with_tollgate(server.addr, &bodies).await;
    assert_eq!(paced.calls, 60);
    // The macro reads no rate-limit headers: when the whole burst goes at once, a provider
    // whose count strays above tiktoken's can refuse its last call (1 in each of 3 runs here;
    // through the HTTP gate, which syncs, none). It is retried after its pause.
    assert!(paced.refused <= 1, "{paced:?}");
    assert_eq!(
        server
            .stats
            .refused
            .load(std::sync::atomic::Ordering::Relaxed),
        paced.refused
    );
    // Not throttled into the ground: within 1.3 times the best schedule the stand-in allows
    // (which knows every count in advance).
    assert!(
        paced.seconds <= ideal * 1.3,
        "{paced:?}, ideal {ideal:.1} s"
    );
    eprintln!("unthrottled {raw:?}; tollgate {paced:?}; ideal {ideal:.2} s");
}

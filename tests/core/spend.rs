//! Spend, the fourth currency: budgets in micro-dollars, kept by the same exact arithmetic as
//! tokens, admitted all or nothing with the other currencies and settled from what a call
//! really cost.

use std::time::Duration;

use tollgate::{Config, Cost, Currency, Error, Limiter, Limits, Rates, Usage};

fn budget(text: &str) -> Rates {
    Rates::parse_money(text).unwrap()
}

#[test]
fn budgets_are_written_in_dollars_and_kept_in_micro_dollars() {
    let rates = budget("$50/d; $2000/30d");
    assert_eq!(rates.as_slice()[0].amount(), 50_000_000);
    assert_eq!(rates.as_slice()[0].period(), Duration::from_secs(86_400));
    assert_eq!(rates.as_slice()[1].amount(), 2_000_000_000);
    assert_eq!(rates.money().to_string(), "$50/d; $2000/30d");
    let fine = budget("$0.000001/s burst $0.25");
    assert_eq!(fine.as_slice()[0].amount(), 1);
    assert_eq!(fine.as_slice()[0].burst(), 250_000);
    assert_eq!(fine.money().to_string(), "$0.000001/s burst $0.25");
    assert_eq!(budget("$1_000.5/h").as_slice()[0].amount(), 1_000_500_000);
}

#[test]
fn a_budget_that_is_not_money_is_named() {
    for (text, says) in [
        ("50/d", "not a dollar amount"),
        ("$0.0000001/d", "finer than a micro-dollar"),
        ("$-5/d", "negative"),
        ("$/d", "not a whole number"),
        ("$5/q", "unknown unit"),
        ("$0/d", "0"),
        ("$5/d burst 7", "not a dollar amount"),
        ("$99999999999999/d", "too large"),
    ] {
        let err = Rates::parse_money(text).unwrap_err().to_string();
        assert!(err.contains(says), "{text}: {err}");
    }
}

#[test]
fn limits_show_serialize_and_configure_spend_in_dollars() {
    let limits = Limits::parse("60/m", "")
        .unwrap()
        .with_spend(budget("$50/d"));
    assert_eq!(limits.to_string(), "requests 60/m, spend $50/d");
    let json = serde_json::to_string(&limits).unwrap();
    assert_eq!(json, r#"{"requests":"60/m","spend":"$50/d"}"#);
    assert_eq!(serde_json::from_str::<Limits>(&json).unwrap(), limits);
    let err = serde_json::from_str::<Limits>(r#"{"spend":"50/d"}"#).unwrap_err();
    assert!(err.to_string().contains("not a dollar amount"), "{err}");
    let config = Config::from_toml(
        "[keys.openai]\nrequests = \"60/m\"\nspend = \"$50/d\"\nspend_burst = \"$5\"\n",
    )
    .unwrap();
    let spend = config.key("openai").unwrap().limits.spend().as_slice()[0];
    assert_eq!((spend.amount(), spend.burst()), (50_000_000, 5_000_000));
    let err = Config::from_toml("[keys.openai]\nspend = \"$50/d\"\nspend_burst = 5\n").unwrap_err();
    assert!(err.to_string().contains("dollar amount"), "{err}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_call_pays_its_price_with_its_tokens_all_or_nothing() -> Result<(), Error> {
    // $1 a day, 1,000,000 micro-dollars; tokens plentiful.
    let limits = Limits::parse("", "1000000/m")?.with_spend(budget("$1/d"));
    let limiter = Limiter::builder("spend", limits).build()?;
    let call = |tokens: u64, micros: u64| Cost::call(tokens).with_spend(micros);
    let first = limiter.try_acquire(call(1_000, 600_000)).await?.permit();
    assert!(first.is_some());
    // $0.40 left: a call priced $0.41 is refused whole, its tokens untouched.
    assert!(
        !limiter
            .try_acquire(call(1_000, 410_000))
            .await?
            .is_admitted()
    );
    let snapshot = limiter.snapshot().await?;
    assert_eq!(snapshot.least(Currency::Spend).unwrap().whole(), 400_000);
    assert_eq!(snapshot.tokens().unwrap().whole(), 999_000);
    // The first call really cost $0.25: $0.35 comes back, and the $0.41 call passes.
    let settled = first
        .unwrap()
        .settle_usage(Usage::tokens(1_000).with_spend(250_000))
        .await?;
    assert_eq!(settled.spend, 350_000);
    assert!(limiter.try_acquire(call(10, 410_000)).await?.is_admitted());
    let left = limiter.snapshot().await?.least(Currency::Spend).unwrap();
    assert_eq!(left.whole(), 340_000);
    // A day refills $1: a micro-dollar is 86.4 ms of it, exactly.
    tokio::time::advance(Duration::from_millis(864)).await;
    let left = limiter.snapshot().await?.least(Currency::Spend).unwrap();
    assert!(left.is(340_010, 1), "{left:?}");
    tokio::time::advance(Duration::from_micros(86_399)).await;
    let left = limiter.snapshot().await?.least(Currency::Spend).unwrap();
    assert_eq!(left.whole(), 340_010, "86.399 ms is not yet a micro-dollar");
    // A price above the day's budget can never pass.
    let err = limiter.try_acquire(call(1, 1_000_001)).await.unwrap_err();
    assert!(err.to_string().contains("spend"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_underpriced_call_settles_its_shortfall_into_the_budget() -> Result<(), Error> {
    let limits = Limits::parse("", "")?.with_spend(budget("$10/h"));
    let limiter = Limiter::builder("shortfall", limits).build()?;
    let permit = limiter
        .acquire(Cost::new(0, 0).with_spend(1_000_000))
        .await?;
    let settled = permit
        .settle_usage(Usage::default().with_spend(3_500_000))
        .await?;
    assert_eq!(settled.spend, -2_500_000);
    let left = limiter.snapshot().await?.least(Currency::Spend).unwrap();
    assert_eq!(left.whole(), 6_500_000);
    Ok(())
}

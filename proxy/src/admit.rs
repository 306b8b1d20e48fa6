//! The toll a metered call pays before it goes: what the gate's estimate leaves out reserved
//! (inputs the proxy can't see, images an Azure deployment bills by its own model's rule), a
//! model its upstream doesn't serve refused, its tenant's windows paid (before the
//! organization's, which each attempt pays), and its price reserved from every budget it spends
//! from (budgets never wait).

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tollgate::http::{Attempts, Estimated};
use tollgate::{Attempt, Currency, Dollars, Error, Limits, Rates, Snapshot};

use crate::answer::{ErrorKind, Reject};
use crate::config::{Family, UnknownModels};
use crate::estimate::Estimate;
use crate::exchange::{CallPool, Exchange};
use crate::keys::{BUDGET, TENANT_PART};
use crate::refusal::{refusal, short_of};
use crate::state::{ReadyUpstream, Shared, model_entry, model_of};
use crate::tenant::Tenant;

/// What a tenant's windows held when its call was admitted: the rate-limit headers its answer
/// carries in place of (or beside) the organization's.
pub(crate) struct TenantView {
    pub(crate) snapshot: Snapshot,
    pub(crate) at: Instant,
}

/// A prepared call: its head, its attempts, its pool and budgets, and its tenant's windows
/// when it has some: what the toll worked out once, for every attempt and the settlement.
pub(crate) struct Prepared {
    /// The request's head at its upstream (without `accept-encoding`), as the gate read it.
    pub(crate) head: http::request::Parts,
    pub(crate) attempts: Attempts,
    pub(crate) tenant_view: Option<TenantView>,
    /// The call brings inputs the proxy can't see: its tenant and model, whose ceiling its
    /// bill teaches (`hidden.rs`).
    pub(crate) hidden: Option<(String, String)>,
    /// Its turn, while such calls go one at a time: held until it settles.
    pub(crate) alone: Option<tokio::sync::OwnedSemaphorePermit>,
    /// The pool of its upstream for its model (no members: it has none).
    pub(crate) pool: CallPool,
    /// The keys of the budgets it spends from (see [`budgets`]).
    pub(crate) budgets: Vec<String>,
}

/// On Azure the body's `model` (often absent) is not what reads the images: the deployment's
/// model is, and its rule bills them (a gpt-4o-mini deployment 2,833 an image and 5,667 a tile,
/// 33 times gpt-4o's). The tokens of images the gate's estimate, made by the body's model's
/// rule, leaves out.
fn azure_images_missed(
    upstream: &ReadyUpstream,
    parts: &http::request::Parts,
    value: &serde_json::Value,
    body_model: Option<&str>,
) -> u64 {
    use tollgate::estimators::{Billing, ImageRule, estimate_with};
    if upstream.family != Family::Azure {
        return 0;
    }
    let Some(deployment) = model_of(Family::Azure, parts, &serde_json::Value::Null) else {
        return 0;
    };
    let serves = upstream
        .config
        .models
        .iter()
        .find(|m| m.name == deployment)
        .and_then(|m| m.model.as_deref())
        .unwrap_or(deployment);
    let Some(rule) = ImageRule::for_model(serves) else {
        return 0;
    };
    let used = body_model.and_then(ImageRule::for_model);
    if used == Some(rule) {
        return 0;
    }
    let Ok(estimator) = tollgate::estimators::estimator(upstream.profile.estimator_name()) else {
        return 0;
    };
    let billing = |rule: Option<ImageRule>| {
        rule.map_or_else(Billing::default, |r| Billing::default().image_rule(r))
    };
    let count =
        |rule| estimate_with(&*estimator, value, &billing(rule)).map_or(0, |e| e.input_tokens);
    count(Some(rule)).saturating_sub(count(used))
}

/// The budgets a call spends from: its tenant's, its tier's shared one, its upstream's. Each
/// with its key, its windows, and how it is named to the client.
pub(crate) fn budgets(
    shared: &Shared,
    upstream: &ReadyUpstream,
    tenant: Option<&Tenant>,
) -> Vec<(String, Limits, String)> {
    let mut out = Vec::new();
    let spend_only = |rates: &Rates| Limits::default().with_spend(rates.clone());
    if let Some(tenant) = tenant
        && let Some(tier) = shared.tier(&tenant.name)
    {
        if !tier.spend.is_empty() {
            out.push((
                format!("{BUDGET}{TENANT_PART}{}", tenant.name),
                spend_only(&tier.spend),
                format!(
                    "the budget of tenant `{}` ({}, tier `{}`)",
                    crate::answer::printable(&tenant.name),
                    tier.spend.money(),
                    tier.name
                ),
            ));
        }
        if !tier.spend_total.is_empty() {
            out.push((
                format!("{BUDGET}tier:{}", tier.name),
                spend_only(&tier.spend_total),
                format!(
                    "the shared budget of tier `{}` ({})",
                    tier.name,
                    tier.spend_total.money()
                ),
            ));
        }
    }
    if !upstream.config.spend.is_empty() {
        out.push((
            format!("{BUDGET}upstream:{}", upstream.name),
            spend_only(&upstream.config.spend),
            format!(
                "the budget of upstream `{}` ({})",
                upstream.name,
                upstream.config.spend.money()
            ),
        ));
    }
    out
}

/// A duration as people write it: `45 s`, `12 min`, `3 h 20 min`, `2 d 4 h`.
fn human(wait: Duration) -> String {
    let s = wait.as_secs();
    match s {
        0..60 => format!("{:.0} s", wait.as_secs_f64().ceil().max(1.0)),
        60..3_600 => format!("{} min", s.div_ceil(60)),
        3_600..86_400 => format!("{} h {} min", s / 3_600, (s % 3_600).div_ceil(60)),
        _ => format!("{} d {} h", s / 86_400, (s % 86_400).div_ceil(3_600)),
    }
}

/// The toll phase: what the gate's estimate leaves out reserved, a model the upstream doesn't
/// serve refused, the tenant's toll paid (its tier's windows, at this upstream), and the
/// call's price reserved from every budget it spends from: the attempts to forward it.
pub(crate) async fn toll(exchange: &Exchange<'_>, estimate: Estimate) -> Result<Prepared, Reject> {
    let Estimate {
        head,
        estimated,
        pool,
    } = estimate;
    let (shared, upstream) = (exchange.shared, &exchange.upstream);
    let tenant = exchange.tenant.as_ref();
    let body = &exchange.body;
    let budgets = budgets(shared, upstream, tenant);
    // A pool's members' own budgets are paid by the member that serves the call.
    let pooled_budgets = pool.members.iter().any(|m| !m.config.spend.is_empty());
    let (estimated, hidden, alone) = if pooled_budgets || !budgets.is_empty() {
        reserve_unseen(shared, upstream, tenant, &head, body, estimated).await?
    } else {
        (estimated, None, None)
    };
    refuse_unknown_model(upstream, &head, &estimated)?;
    // A tenant's calls wait at the organisation's keys in fair order by its weight; calls with
    // no tenant keep arrival order among themselves.
    let estimated = match tenant {
        Some(tenant) => estimated.with_share(shared.share_of(&tenant.name)),
        None => estimated,
    };
    let mut attempts = Attempts::of(&upstream.gate, estimated);
    let tenant_view = match tenant {
        Some(tenant) => tenant_toll(shared, upstream, tenant, &mut attempts).await?,
        None => None,
    };
    let pooled = !pool.members.is_empty();
    pay_budgets(shared, upstream, pooled, &budgets, &mut attempts).await?;
    Ok(Prepared {
        head,
        attempts,
        tenant_view,
        hidden,
        alone,
        pool,
        budgets: budgets.into_iter().map(|(key, _, _)| key).collect(),
    })
}

/// A call's tenant and model, when it brings input the proxy can't see; and its turn, while
/// such calls go one at a time.
type Unseen = (
    Estimated,
    Option<(String, String)>,
    Option<OwnedSemaphorePermit>,
);

/// Input the gate's estimate leaves out, reserved from the budgets beside it (asked only under
/// a budget, its own or a pool member's):
/// the images an Azure deployment bills by its own model's rule, and inputs the proxy can't
/// see, reserved at what such calls were billed before, or, until one has settled, one call
/// at a time.
async fn reserve_unseen(
    shared: &Shared,
    upstream: &ReadyUpstream,
    tenant: Option<&Tenant>,
    parts: &http::request::Parts,
    body: &Bytes,
    estimated: Estimated,
) -> Result<Unseen, Reject> {
    let read = estimated.body().map_or(&body[..], |b| &b[..]);
    let value = crate::lenient::read(read);
    let images = azure_images_missed(upstream, parts, &value, estimated.model());
    let seen = estimated.input_tokens().saturating_add(images);
    let mut unseen = images;
    let (mut hidden, mut alone) = (None, None);
    if crate::hidden::unmeasured(&value) {
        let (extra, turn, who) =
            ceiling(shared, upstream, tenant, &value, &estimated, seen).await?;
        unseen += extra;
        alone = turn;
        hidden = Some(who);
    }
    let estimated = if unseen > 0 {
        estimated.with_unseen_input(unseen)
    } else {
        estimated
    };
    Ok((estimated, hidden, alone))
}

/// What a call bringing input the proxy can't see reserves beyond `seen`: up to the ceiling
/// such calls of its tenant and model were billed, or, until one has been billed, nothing,
/// with its turn to go alone; and its tenant and model.
async fn ceiling(
    shared: &Shared,
    upstream: &ReadyUpstream,
    tenant: Option<&Tenant>,
    value: &serde_json::Value,
    estimated: &Estimated,
    seen: u64,
) -> Result<(u64, Option<OwnedSemaphorePermit>, (String, String)), Reject> {
    let mut extra = 0;
    let mut alone = None;
    // A background response answers at once, queued, and is billed later, where the
    // proxy doesn't see it: its unseen input can't be learnt, nor settled (it had freed
    // its turn as soon as it was queued, and been settled at its visible estimate).
    if value.get("background").and_then(serde_json::Value::as_bool) == Some(true) {
        return Err(Reject::new(
            ErrorKind::Invalid,
            "tollgate-proxy: under a budget, a background call can't bring input the proxy can't see (a previous response, a file by reference, a server-side tool): it is billed after its answer, where the proxy doesn't see it; send it in the foreground",
        ));
    }
    let who = tenant.map_or("-", |t| t.name.as_str()).to_owned();
    // A model's snapshots are the model (`gpt-4o-2024-08-06` is gpt-4o's): each name
    // had a turn of its own, so as many such calls went at once, each blind.
    let model = estimated.model().map_or_else(
        || "-".to_owned(),
        |m| model_entry(&upstream.config, &upstream.profile, m).unwrap_or_else(|| m.to_owned()),
    );
    let (mut most, turn) = shared.hidden.ceiling(&who, &model);
    if most.is_none()
        && let Some(shared_most) = shared.owners.ceiling_of(&who, &model).await
    {
        most = Some(shared.hidden.learned(&who, &model, shared_most));
    }
    match most {
        Some(most) => extra = most.saturating_sub(seen),
        None => {
            let deadline = upstream
                .gate
                .deadline()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3_600));
            match tokio::time::timeout_at(deadline, turn.acquire_owned()).await {
                // The call before it may have taught the ceiling while it waited:
                // then it goes at once, reserved at it.
                Ok(Ok(permit)) => match shared.hidden.ceiling(&who, &model).0 {
                    Some(most) => {
                        drop(permit);
                        extra = most.saturating_sub(seen);
                    }
                    None => alone = Some(permit),
                },
                _ => {
                    upstream.metrics.local_429s.increment(1);
                    return Err(Reject::new(
                        ErrorKind::RateLimited(None),
                        "tollgate-proxy: this call brings input the proxy can't see (a previous response, a file by reference, a server-side tool), and such calls of this tenant and model go one at a time until one has been billed; another is still in flight".to_owned(),
                    )
                    .retry_after(Duration::from_secs(1)));
                }
            }
        }
    }
    Ok((extra, alone, (who, model)))
}

/// Refuses a model the upstream doesn't serve, where its configuration says so.
fn refuse_unknown_model(
    upstream: &ReadyUpstream,
    parts: &http::request::Parts,
    estimated: &Estimated,
) -> Result<(), Reject> {
    if upstream.config.unknown_models == UnknownModels::Refuse {
        let named = match upstream.family {
            Family::Azure => model_of(Family::Azure, parts, &serde_json::Value::Null),
            _ => estimated.model(),
        };
        if let Some(model) = named
            && model_entry(&upstream.config, &upstream.profile, model).is_none()
        {
            return Err(Reject::new(
                ErrorKind::Invalid,
                format!(
                    "tollgate-proxy: upstream `{}` does not serve the model `{}`",
                    upstream.name,
                    crate::answer::printable(model)
                ),
            ));
        }
    }
    Ok(())
}

/// Pays the toll at the tenant's own windows (its tier's, at this upstream); what they held
/// then is the view its answer's rate-limit headers show.
async fn tenant_toll(
    shared: &Shared,
    upstream: &ReadyUpstream,
    tenant: &Tenant,
    attempts: &mut Attempts,
) -> Result<Option<TenantView>, Reject> {
    let gate = &upstream.gate;
    let mut tenant_view = None;
    // The tenant's own windows first: while it waits at the organization's key it holds
    // only its own tokens, never the organization's, so no order of waiting can deadlock,
    // and a tenant past its windows can't take the organization's line from the others.
    if let Some(limits) = shared.tenant_limits(&tenant.name) {
        let logical = format!("{}:{TENANT_PART}{}", upstream.name, tenant.name);
        shared.carry(&logical).await;
        let key = shared.store_key(&logical);
        let limiter = shared
            .registry
            .limiter(&key, limits)
            .map_err(|err| refusal(shared, upstream, &err, None))?;
        if tenant.configured {
            upstream.saw_key(&key);
        } else {
            shared.live.other_tenant(&upstream.name, &limiter);
        }
        let cost = gate
            .cost_of(attempts.estimated(), Some(limits))
            .map_err(|err| refusal(shared, upstream, &err, None))?;
        let permit = match limiter.acquire_until(cost, attempts.deadline()).await {
            Ok(permit) => permit,
            Err(err) => {
                let short = match err {
                    Error::Timeout { .. } => short_of(&limiter, cost).await,
                    _ => None,
                };
                return Err(refusal(shared, upstream, &err, short));
            }
        };
        shared.live.admitted(&key);
        attempts.attach(permit);
        if let Ok(snapshot) = limiter.snapshot().await {
            tenant_view = Some(TenantView {
                snapshot,
                at: Instant::now(),
            });
        }
    }
    Ok(tenant_view)
}

/// Reserves the call's price from every budget it spends from.
async fn pay_budgets(
    shared: &Shared,
    upstream: &ReadyUpstream,
    pooled: bool,
    budgets: &[(String, Limits, String)],
    attempts: &mut Attempts,
) -> Result<(), Reject> {
    // Budgets never wait: a spent budget is answered as the provider answers a spent quota.
    // A pool's members' own budgets are paid by the member that serves the call, when it is
    // chosen (`pool.rs`): paid here, the first member's had paid for every member.
    for (key, limits, named) in budgets {
        if pooled && key.starts_with(&format!("{BUDGET}upstream:")) {
            continue;
        }
        let permit = take_budget(shared, upstream, attempts, key, limits, named).await?;
        attempts.attach(permit);
    }
    Ok(())
}

/// The budget of `member` (its upstream's `spend`), paid for the call in `attempts` at once, if
/// it keeps one.
pub(crate) async fn member_budget(
    shared: &Shared,
    member: &ReadyUpstream,
    attempts: &Attempts,
) -> Result<Option<tollgate::Permit>, Reject> {
    if member.config.spend.is_empty() {
        return Ok(None);
    }
    let key = format!("{BUDGET}upstream:{}", member.name);
    let limits = Limits::default().with_spend(member.config.spend.clone());
    let named = format!(
        "the budget of upstream `{}` ({})",
        member.name,
        member.config.spend.money()
    );
    take_budget(shared, member, attempts, &key, &limits, &named)
        .await
        .map(Some)
}

/// Pays the call's most price from the budget `key` now, or answers why it can't (spent, or
/// never enough): budgets never wait.
async fn take_budget(
    shared: &Shared,
    upstream: &ReadyUpstream,
    attempts: &Attempts,
    key: &str,
    limits: &Limits,
    named: &str,
) -> Result<tollgate::Permit, Reject> {
    shared.carry(key).await;
    let key = shared.store_key(key);
    let limiter = shared
        .registry
        .limiter(&key, limits)
        .map_err(|err| refusal(shared, upstream, &err, None))?;
    let cost = upstream
        .gate
        .cost_of(attempts.estimated(), Some(limits))
        .map_err(|err| refusal(shared, upstream, &err, None))?;
    let priced = Dollars(cost.spend);
    match limiter.try_acquire(cost).await {
        Ok(Attempt::Admitted(permit)) => Ok(permit),
        Ok(Attempt::NotYet(wait)) => {
            upstream.metrics.budget_refusals.increment(1);
            shared.live.budget_refused(&key);
            let left = limiter
                .snapshot()
                .await
                .ok()
                .and_then(|s| s.least(Currency::Spend))
                .map_or(0, |l| u64::try_from(l.whole().max(0)).unwrap_or(0));
            Err(Reject::new(
                ErrorKind::BudgetSpent,
                format!(
                    "tollgate-proxy: {named} is spent: {} left, and this call may cost up to {priced}; enough refills in {}",
                    Dollars(left),
                    human(wait)
                ),
            )
            .retry_after(wait))
        }
        Err(Error::CostExceedsCapacity { .. }) => {
            upstream.metrics.budget_refusals.increment(1);
            shared.live.budget_refused(&key);
            Err(Reject::new(
                ErrorKind::BudgetSpent,
                format!(
                    "tollgate-proxy: this call may cost up to {priced}, more than {named} ever holds; lower max_tokens"
                ),
            ))
        }
        Err(err) => Err(refusal(shared, upstream, &err, None)),
    }
}

/// Gives a budget's charge back: the attempt it paid for is billed nothing (an error without
/// usage, a 429, an upstream that could not be reached).
pub(crate) async fn refund(permit: tollgate::Permit) {
    let key = permit.limiter().key().to_owned();
    if let Err(err) = permit
        .settle_usage(tollgate::Usage::default().with_spend(0))
        .await
    {
        tracing::warn!(%key, error = %err, "could not give a budget's charge back");
    }
}

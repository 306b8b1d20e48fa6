//! The fair order's promises, on the rule book: tenants share a key by weight and by cost, one
//! tenant keeps arrival order to the nanosecond, and a waiter's delay is bounded by the weights
//! and the costs ahead of it.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::bucket::op::Op;
use crate::bucket::queue::fair_step;

const MS: u64 = 1_000_000;
const LEASE: Duration = Duration::from_secs(5);

/// A key and its ticket numbers, driven by operations at whole milliseconds.
struct Key {
    limits: Limits,
    state: KeyState,
    next: u64,
}

impl Key {
    fn new(requests: &str, tokens: &str) -> Key {
        let limits = Limits::parse(requests, tokens).unwrap();
        let state = KeyState::new(&limits, Nanos(0));
        Key {
            limits,
            state,
            next: 0,
        }
    }

    fn run(&mut self, at_ms: u64, op: Op) -> Outcome {
        let next = &mut self.next;
        self.state
            .apply(&self.limits, "k", Nanos(at_ms * MS), op, LEASE, || {
                *next += 1;
                *next
            })
            .unwrap()
    }

    fn acquire(&mut self, at_ms: u64, cost: Cost, share: Option<Share>) -> Outcome {
        self.run(
            at_ms,
            Op::Acquire {
                cost,
                max_wait: None,
                fly: false,
                share,
            },
        )
    }
}

/// A call that waits, as its holder sees it.
#[derive(Debug, Clone)]
struct Waiting {
    ticket: Ticket,
}

/// Holders that ask exactly when told: at their due time, and again at every hint (rounded up to
/// the millisecond). Runs until everyone passed; answers the order they passed in (call numbers)
/// and when each passed, in ms.
fn drain(key: &mut Key, mut waiting: BTreeMap<usize, (u64, Waiting)>) -> Vec<(usize, u64)> {
    let mut passed = Vec::new();
    while let Some((&call, _)) = waiting.iter().min_by_key(|(call, (at, _))| (*at, **call)) {
        let (at, w) = waiting.remove(&call).unwrap();
        match key.run(
            at,
            Op::Admit {
                ticket: w.ticket,
                fly: false,
            },
        ) {
            Outcome::Admitted => passed.push((call, at)),
            Outcome::NotYet(hint) | Outcome::Behind(hint) => {
                let ms = u64::try_from(hint.as_nanos().div_ceil(u128::from(MS))).unwrap();
                waiting.insert(call, (at + ms.max(1), w));
            }
            other => panic!("call {call} heard {other:?}"),
        }
    }
    passed
}

/// The time at which a ticket issued at `now_ms` with `due_in` is due, in ms (rounded up).
fn due_ms(now_ms: u64, due_in: Duration) -> u64 {
    now_ms + u64::try_from(due_in.as_nanos().div_ceil(u128::from(MS))).unwrap()
}

#[test]
fn a_tenant_placed_by_weight_passes_between_the_calls_of_a_heavier_backlog() {
    // One request a second: each call's fair cost is 1,000,000 µs of refill.
    let mut key = Key::new("1/s burst 1", "");
    let call = Cost::call(0);
    let a = Share::new("a", 1);
    let b = Share::new("b", 2);
    assert_eq!(key.acquire(0, call, Some(a.clone())), Outcome::Admitted);
    let mut order = Vec::new();
    // `a` queues four calls (tags 1, 2, 3 and 4 seconds of refill), then `b`, of weight 2, four
    // (tags 1.5, 2, 2.5 and 3: ties go to the earlier ticket).
    for share in [&a, &a, &a, &a, &b, &b, &b, &b] {
        match key.acquire(0, call, Some(share.clone())) {
            Outcome::Queued { ticket, due_in } => order.push((share.tenant(), ticket, due_in)),
            other => panic!("expected a ticket, got {other:?}"),
        }
    }
    // Each due when its place in the fair order comes: a1 at 1 s, b1 at 2 s, a2 at 3 s...
    let due = |t: &str, n: usize| {
        let place = ["a1", "b1", "a2", "b2", "b3", "a3", "b4", "a4"]
            .iter()
            .position(|p| *p == format!("{t}{n}"))
            .unwrap();
        Duration::from_secs(place as u64 + 1)
    };
    let mut seen = BTreeMap::new();
    for (tenant, _, due_in) in &order {
        let n = seen.entry(*tenant).or_insert(0);
        *n += 1;
        // A ticket placed ahead of others plans again; those issued behind it are told the
        // time they were due when issued, at the back (the tickets it passed hear it asking).
        if *tenant == "b" {
            assert_eq!(*due_in, due(tenant, *n), "{tenant}{n}");
        }
    }
    let waiting = order
        .iter()
        .enumerate()
        .map(|(call, (_, ticket, due_in))| {
            let w = Waiting { ticket: *ticket };
            (call, (due_ms(0, *due_in), w))
        })
        .collect();
    let passed = drain(&mut key, waiting);
    let names: Vec<String> = passed
        .iter()
        .map(|(call, _)| {
            let (tenant, _, _) = order[*call];
            let n = order[..=*call].iter().filter(|o| o.0 == tenant).count();
            format!("{tenant}{n}")
        })
        .collect();
    assert_eq!(
        names,
        ["a1", "b1", "a2", "b2", "b3", "a3", "b4", "a4"],
        "the fair order"
    );
    // One a second, none lost: the key's capacity, all of it used.
    let times: Vec<u64> = passed.iter().map(|(_, at)| *at).collect();
    assert_eq!(times, [1, 2, 3, 4, 5, 6, 7, 8].map(|s| s * 1_000));
}

#[test]
fn a_quiet_tenant_waits_for_one_call_not_for_a_noisy_backlog() {
    // 20,000 tokens per 10 s: `noisy` queues 200 calls of 300 tokens (30 s of backlog); a
    // quiet call of 300 tokens arriving a second later waits behind at most one of them.
    let mut key = Key::new("", "20000/10s");
    let noisy = Share::new("noisy", 1);
    let quiet = Share::new("quiet", 1);
    let mut waiting = BTreeMap::new();
    for call in 0..200 {
        if let Outcome::Queued { ticket, due_in } =
            key.acquire(0, Cost::call(300), Some(noisy.clone()))
        {
            let w = Waiting { ticket };
            waiting.insert(call, (due_ms(0, due_in), w));
        }
    }
    let Outcome::Queued { ticket, due_in } =
        key.acquire(1_000, Cost::call(300), Some(quiet.clone()))
    else {
        panic!("the quiet call queues")
    };
    // The burst (20,000 tokens) let 66 noisy calls through at once, and 200 tokens were left:
    // the noisy tickets are due at 50 ms and every 150 ms after, and the 7 due by 1 s have
    // passed. The quiet call goes behind the two first in line (the one in line and the one
    // its tag ties with), not behind 127: due at 1.4 s.
    assert_eq!(due_in, Duration::from_millis(400));
    let quiet_call = 1_000;
    let w = Waiting { ticket };
    waiting.insert(quiet_call, (due_ms(1_000, due_in), w));
    let passed = drain(&mut key, waiting);
    let at = passed.iter().find(|(c, _)| *c == quiet_call).unwrap().1;
    assert_eq!(at, 1_400);
    // The noisy tenant loses one call's time, no more: its last call passes when the key's
    // capacity for all 201 calls is used: 60,300 tokens, less the burst's 20,000, at 2,000 a
    // second.
    let last = passed.iter().map(|(_, at)| *at).max().unwrap();
    assert_eq!(last, 20_150);
}

/// `calls` (arrival ms, tenant, tokens), each tenant of `weights[tenant]` (or, with
/// `weights` empty, no share at all): every outcome of every acquire, and the order and times
/// of passing.
fn trace(
    limits: (&str, &str),
    calls: &[(u64, usize, u64)],
    weights: &[u32],
) -> (Vec<Outcome>, Vec<(usize, u64)>, Key) {
    let mut key = Key::new(limits.0, limits.1);
    let mut outcomes = Vec::new();
    let mut waiting = BTreeMap::new();
    for (call, &(at, tenant, tokens)) in calls.iter().enumerate() {
        let share = weights
            .get(tenant)
            .map(|w| Share::new(format!("t{tenant}"), *w));
        let cost = Cost::call(tokens);
        let outcome = key.acquire(at, cost, share);
        if let Outcome::Queued { ticket, due_in } = &outcome {
            let w = Waiting { ticket: *ticket };
            waiting.insert(call, (due_ms(at, *due_in), w));
        }
        outcomes.push(outcome);
    }
    let passed = drain(&mut key, waiting);
    (outcomes, passed, key)
}

fn calls() -> impl Strategy<Value = Vec<(u64, usize, u64)>> {
    prop::collection::vec((0u64..200, 0usize..3, 1u64..=400), 1..40).prop_map(|mut calls| {
        calls.sort_by_key(|c| c.0);
        calls
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// With one tenant (any name, any weight) a key admits exactly as it does without shares:
    /// every outcome, every due time, every admission, to the nanosecond.
    #[test]
    fn one_tenant_keeps_arrival_order_to_the_nanosecond(
        calls in calls(),
        weight in 1u32..1_000,
    ) {
        let alone: Vec<_> = calls.iter().map(|&(at, _, tokens)| (at, 0, tokens)).collect();
        let (plain, plain_passed, _) = trace(("", "1000/s burst 500"), &alone, &[]);
        let (shared, shared_passed, _) = trace(("", "1000/s burst 500"), &alone, &[weight]);
        prop_assert_eq!(plain, shared);
        prop_assert_eq!(plain_passed, shared_passed);
    }

    /// The fairness bound. A call `x` of fair cost `c` (µs of the key's refill) of a tenant of
    /// weight `w`, arriving when its tenant has nothing waiting, passes after calls of each
    /// other tenant `j` of total cost at most `w_j · ⌈c / w⌉ + 2 · c_j` (`c_j` the largest
    /// call of `j`: the one first in line, and one whose tag straddles the head's), whoever
    /// arrives after it; calls that pass on top of it (the key could pay for them and for `x`
    /// alike) delay it by nothing and are not counted. And every call passes: nobody starves.
    #[test]
    fn a_waiter_is_delayed_by_at_most_its_weighted_share_of_each_other_tenants_costs(
        calls in calls(),
        weights in prop::collection::vec(1u32..4, 3),
    ) {
        let limits = Limits::parse("", "1000/s burst 500").unwrap();
        let (outcomes, passed, _) = trace(("", "1000/s burst 500"), &calls, &weights);
        let queued: Vec<usize> = (0..calls.len())
            .filter(|&c| matches!(outcomes[c], Outcome::Queued { .. }))
            .collect();
        prop_assert_eq!(passed.len(), queued.len(), "every waiting call passes");
        let fair = |tokens: u64| fair_step(&limits, Cost::call(tokens), 1);
        let rank: BTreeMap<usize, usize> =
            passed.iter().enumerate().map(|(r, (c, _))| (*c, r)).collect();
        let largest = |tenant: usize| {
            calls.iter().filter(|c| c.1 == tenant).map(|c| fair(c.2)).max().unwrap_or(0)
        };
        for &x in &queued {
            let (arrived, tenant, tokens) = calls[x];
            // Its tenant had nothing waiting when it arrived.
            let own_waiting = queued.iter().any(|&y| {
                y < x && calls[y].1 == tenant && passed[rank[&y]].1 > arrived
            });
            if own_waiting {
                continue;
            }
            let w = u64::from(weights[tenant]);
            let step = fair(tokens).div_ceil(w);
            for j in (0..weights.len()).filter(|&j| j != tenant) {
                // j's calls that passed after x arrived and before x, in line ahead of it (those
                // that passed at once on arrival, or on top of x, left x's schedule whole).
                let ahead: u64 = queued
                    .iter()
                    .filter(|&&y| calls[y].1 == j && rank[&y] < rank[&x])
                    .filter(|&&y| passed[rank[&y]].1 >= arrived)
                    .map(|&y| fair(calls[y].2))
                    .sum();
                let bound = u64::from(weights[j]) * step + 2 * largest(j);
                prop_assert!(
                    ahead <= bound,
                    "call {} of tenant {} (weight {}, cost {} µs) waited behind {} µs of \
                     tenant {} (weight {}), bound {}",
                    x, tenant, w, fair(tokens), ahead, j, weights[j], bound
                );
            }
        }
    }
}

#[test]
fn under_saturation_weights_one_and_two_share_the_key_one_to_two() {
    // Two tenants keep 100 calls of 200 tokens each waiting; over the first 60 admissions the
    // key's tokens go 1:2.
    let calls: Vec<(u64, usize, u64)> = (0..200).map(|n| (0, n % 2, 200)).collect();
    let (_, passed, _) = trace(("", "1000/s burst 200"), &calls, &[1, 2]);
    let first: Vec<usize> = passed.iter().take(60).map(|(c, _)| calls[*c].1).collect();
    let heavy = first.iter().filter(|t| **t == 1).count();
    assert_eq!((60 - heavy, heavy), (20, 40));
    // Time shares too: each call takes 0.2 s of refill, and the 60 pass in 12 s.
    assert_eq!(passed[59].1, 12_000);
}

#[test]
fn a_tenant_whose_calls_were_given_up_starts_again_from_the_head() {
    // One request a second. `b` has a call waiting; `a` queues 50 calls and gives them all up
    // (its clients timed out); then `a` sends one call and `b` 20 more. Nothing of `a` waits,
    // so its call goes behind the call first in line and the one its tag ties with, not
    // behind 50 calls' worth of tags it no longer holds.
    for given_up in [0, 50] {
        let mut key = Key::new("1/s burst 1", "");
        let (a, b) = (Share::new("a", 1), Share::new("b", 1));
        assert_eq!(
            key.acquire(0, Cost::call(0), Some(b.clone())),
            Outcome::Admitted
        );
        key.acquire(0, Cost::call(0), Some(b.clone()));
        for _ in 0..given_up {
            let Outcome::Queued { ticket, .. } = key.acquire(0, Cost::call(0), Some(a.clone()))
            else {
                panic!("a's call queues");
            };
            assert_eq!(key.run(0, Op::Cancel { ticket }), Outcome::Done);
        }
        let Outcome::Queued { ticket, .. } = key.acquire(0, Cost::call(0), Some(a.clone())) else {
            panic!("a's call queues");
        };
        for _ in 0..20 {
            key.acquire(0, Cost::call(0), Some(b.clone()));
        }
        let behind = key.state.behind(ticket.id()).unwrap();
        assert_eq!(behind, 20, "after {given_up} calls given up");
        // Only the tenants with tickets waiting are remembered.
        let tenants = key.state.queue.as_ref().unwrap().tenants.len();
        assert_eq!(tenants, 2);
    }
}

#[test]
fn a_key_remembers_only_the_tenants_that_wait() {
    // One ticket waits throughout; 10,000 tenants each queue a call and give it up, or let it
    // lapse: the key remembers one tenant, whatever came and went.
    let mut key = Key::new("1/h burst 1", "");
    assert_eq!(key.acquire(0, Cost::call(0), None), Outcome::Admitted);
    let Outcome::Queued { .. } = key.acquire(0, Cost::call(0), None) else {
        panic!("the second call queues");
    };
    for n in 0..10_000 {
        let share = Share::new(format!("tenant-{n}"), 1);
        if let Outcome::Queued { ticket, .. } = key.acquire(0, Cost::call(0), Some(share)) {
            key.run(0, Op::Cancel { ticket });
        }
    }
    let queue = key.state.queue.as_ref().unwrap();
    assert_eq!((queue.tickets.len(), queue.tenants.len()), (1, 1));
}

//! The breaker's unit tests.

use super::*;

fn quick() -> BreakerSettings {
    BreakerSettings {
        window: Duration::from_secs(10),
        min_calls: 4,
        failure_rate: 0.5,
        cool_down: Duration::from_millis(200),
        probes: 1,
        close_after: 2,
    }
}

fn call(b: &Breaker, ok: bool) -> bool {
    match b.acquire() {
        Some(p) => {
            b.record(p, ok);
            true
        }
        None => false,
    }
}

#[test]
fn one_blip_does_not_open_but_a_failure_rate_does() {
    let b = Breaker::new(quick());
    assert!(call(&b, false));
    assert_eq!(
        b.state(),
        BreakerState::Closed,
        "below the minimum number of calls"
    );
    assert!(call(&b, true));
    assert!(call(&b, true));
    assert!(call(&b, true));
    assert_eq!(
        b.state(),
        BreakerState::Closed,
        "1 failure in 4 is below 50%"
    );
    assert!(call(&b, false));
    assert!(call(&b, false));
    assert_eq!(b.state(), BreakerState::Open, "3 of 6 failed");
    assert!(b.acquire().is_none(), "open: calls fail at once");
}

#[test]
fn the_cool_down_jitter_stays_within_a_fifth() {
    let b = Breaker::new(quick());
    let base = quick().cool_down;
    let samples: Vec<Duration> = (0..200).map(|_| b.cool_down()).collect();
    assert!(
        samples
            .iter()
            .all(|d| *d >= base && *d <= base.mul_f64(1.2))
    );
    assert!(
        samples.iter().any(|d| *d != samples[0]),
        "jittered, not constant"
    );
}

#[test]
fn a_dropped_half_open_call_gives_its_slot_back() {
    let b = Breaker::new(quick());
    b.trip();
    assert!(b.probe_due());
    b.probe_result(true);
    let abandoned = b.acquire().expect("the one half-open slot");
    assert!(b.acquire().is_none(), "the slot is taken");
    drop(abandoned); // its call's future was dropped, unreported
    assert!(call(&b, true), "the slot is free again");
    assert!(call(&b, true));
    assert_eq!(b.state(), BreakerState::Closed);
}

#[test]
fn it_probes_the_store_before_half_opening_and_closes_or_reopens() {
    let b = Breaker::new(quick());
    for _ in 0..4 {
        call(&b, false);
    }
    assert_eq!(b.state(), BreakerState::Open);
    assert!(!b.probe_due(), "no probe during the cool-down");
    std::thread::sleep(Duration::from_millis(260)); // cool-down 200 ms + ≤ 20 %
    assert_eq!(b.state(), BreakerState::Open, "open until a probe answers");
    assert!(b.probe_due(), "a probe is due after the cool-down");
    assert!(!b.probe_due(), "one probe at a time");
    assert!(b.acquire().is_none(), "calls fail at once while it probes");
    b.probe_result(false);
    assert_eq!(b.state(), BreakerState::Open, "a failed probe: open again");
    assert!(!b.probe_due(), "and a new cool-down");
    std::thread::sleep(Duration::from_millis(260));
    assert!(b.probe_due());
    b.probe_result(true);
    assert_eq!(b.state(), BreakerState::HalfOpen, "the store answered");
    let probe = b.acquire().expect("one real call");
    assert!(b.acquire().is_none(), "half-open calls are bounded");
    b.record(probe, false);
    assert_eq!(
        b.state(),
        BreakerState::Open,
        "a failed call opens it again"
    );
    std::thread::sleep(Duration::from_millis(260));
    assert!(b.probe_due());
    b.probe_result(true);
    assert!(call(&b, true));
    assert_eq!(
        b.state(),
        BreakerState::HalfOpen,
        "one success is not enough"
    );
    assert!(call(&b, true));
    assert_eq!(b.state(), BreakerState::Closed);
}

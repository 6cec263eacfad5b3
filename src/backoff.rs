//! Jittered exponential backoff, shared by every retry loop (commits, catalog reads, the service's polls), so that
//! writers retrying after the same failure spread out instead of colliding again.
use std::time::Duration;

/// A uniformly distributed number in `0..=max` (uuid v4's randomness: no extra crate).
pub(crate) fn random_up_to(max: u64) -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0 % (max + 1)
}

/// "Equal jitter": half of `first * 2^attempt` (capped at 2^10) plus a random part of up to the other half.
pub(crate) fn delay(first: Duration, attempt: u32) -> Duration {
    let base = first.as_millis() as u64 * (1u64 << attempt.min(10));
    Duration::from_millis(base / 2 + random_up_to(base / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_half_and_full_base() {
        for attempt in 0..4 {
            let d = delay(Duration::from_millis(100), attempt).as_millis() as u64;
            let base = 100 << attempt;
            assert!((base / 2..=base).contains(&d), "{d} for attempt {attempt}");
        }
        assert_eq!(random_up_to(0), 0);
    }
}

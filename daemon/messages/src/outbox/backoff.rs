//! Exponential backoff with full jitter (the AWS architecture blog's "full jitter"): attempt n waits a
//! uniformly random time in [0, min(cap, initial * factor^(n-1))], so retries of many messages spread
//! out instead of arriving in waves.

use std::time::Duration;

use consistd_core::config::BackoffConfig;
use rand::Rng;

/// The upper bound of the wait before attempt `attempt + 1`, after `attempt` attempts (1 = the first).
pub(crate) fn bound(config: &BackoffConfig, attempt: u32) -> Duration {
    let exponent = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX).min(1024);
    let grown = config.initial.as_secs_f64() * config.factor.powi(exponent);
    if grown.is_finite() && grown < config.cap.as_secs_f64() { Duration::from_secs_f64(grown) } else { config.cap }
}

/// A random wait in [0, bound].
pub(crate) fn delay(config: &BackoffConfig, attempt: u32) -> Duration {
    let bound = bound(config, attempt);
    if bound.is_zero() {
        return bound;
    }
    Duration::from_secs_f64(rand::rng().random_range(0.0..=bound.as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BackoffConfig {
        BackoffConfig { initial: Duration::from_millis(100), factor: 2.0, cap: Duration::from_secs(1) }
    }

    #[test]
    fn the_bound_grows_by_the_factor_up_to_the_cap() {
        let c = config();
        let bounds: Vec<u128> = (1..=6).map(|a| bound(&c, a).as_millis()).collect();
        assert_eq!(bounds, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(bound(&c, u32::MAX), Duration::from_secs(1));
        assert_eq!(bound(&c, 0), Duration::from_millis(100));
    }

    #[test]
    fn delays_are_spread_over_the_whole_range() {
        let c = config();
        let delays: Vec<Duration> = (0..1000).map(|_| delay(&c, 3)).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(400)));
        // Full jitter: some waits are short, some near the bound.
        assert!(delays.iter().any(|d| *d < Duration::from_millis(40)));
        assert!(delays.iter().any(|d| *d > Duration::from_millis(360)));
    }
}

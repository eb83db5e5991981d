//! Retry delays, as client-go's default controller rate limiter computes them: per key, a base delay
//! doubling with each failure up to a cap, and a token bucket shared by the whole queue; a retry waits for
//! whichever is later.

use std::time::Duration;

use tokio::time::Instant;

/// client-go's `DefaultControllerRateLimiter` per-item base delay.
pub(crate) const DEFAULT_BASE_DELAY: Duration = Duration::from_millis(5);
/// client-go's per-item cap.
pub(crate) const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(1000);
/// client-go's bucket: 10 retries per second ...
pub(crate) const DEFAULT_RATE: f64 = 10.0;
/// ... with a burst of 100.
pub(crate) const DEFAULT_BURST: u32 = 100;

/// How retries are spaced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// The first retry's delay; each further failure doubles it.
    pub base_delay: Duration,
    /// The longest per-key delay.
    pub max_delay: Duration,
    /// Retries per second across the queue.
    pub rate: f64,
    /// Retries the bucket allows at once.
    pub burst: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { base_delay: DEFAULT_BASE_DELAY, max_delay: DEFAULT_MAX_DELAY, rate: DEFAULT_RATE, burst: DEFAULT_BURST }
    }
}

/// The queue's shared token bucket, reserving tokens into the future as client-go's (`rate.Limiter.Reserve`).
#[derive(Debug)]
pub(crate) struct Limiter {
    policy: RetryPolicy,
    /// Tokens available at `at` (negative: reserved ahead).
    tokens: f64,
    at: Instant,
}

impl Limiter {
    /// A full bucket.
    pub(crate) fn new(policy: RetryPolicy, now: Instant) -> Self {
        Self { policy, tokens: f64::from(policy.burst), at: now }
    }

    /// When a key that failed `failures` times (at least 1) may be handed out again, reserving a token.
    pub(crate) fn retry_at(&mut self, failures: u32, now: Instant) -> Instant {
        let per_key = backoff(&self.policy, failures);
        now + per_key.max(self.reserve(now))
    }

    /// Takes a token, returning how long until it is there.
    fn reserve(&mut self, now: Instant) -> Duration {
        let rate = self.policy.rate;
        if rate <= 0.0 || !rate.is_finite() {
            return Duration::ZERO;
        }
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(f64::from(self.policy.burst));
        self.at = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-self.tokens / rate) }
    }
}

/// `base * 2^(failures-1)`, at most `max` (client-go's `ItemExponentialFailureRateLimiter`).
pub(crate) fn backoff(policy: &RetryPolicy, failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(62);
    let factor = 2f64.powi(i32::try_from(exponent).unwrap_or(62));
    let delay = policy.base_delay.as_secs_f64() * factor;
    if delay >= policy.max_delay.as_secs_f64() { policy.max_delay } else { Duration::from_secs_f64(delay) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_key_delays_double_from_5ms_to_1000s() {
        let p = RetryPolicy::default();
        assert_eq!(backoff(&p, 1), Duration::from_millis(5));
        assert_eq!(backoff(&p, 2), Duration::from_millis(10));
        assert_eq!(backoff(&p, 11), Duration::from_millis(5120));
        assert_eq!(backoff(&p, 40), Duration::from_secs(1000));
        assert_eq!(backoff(&p, u32::MAX), Duration::from_secs(1000));
    }

    #[test]
    fn the_bucket_allows_a_burst_then_spaces_retries_at_its_rate() {
        let now = Instant::now();
        let policy = RetryPolicy { burst: 2, rate: 10.0, ..RetryPolicy::default() };
        let mut limiter = Limiter::new(policy, now);
        assert_eq!(limiter.retry_at(1, now), now + Duration::from_millis(5));
        assert_eq!(limiter.retry_at(1, now), now + Duration::from_millis(5));
        // The third waits for the bucket (100 ms a token), not the 5 ms per-key delay.
        let third = limiter.retry_at(1, now).duration_since(now);
        assert!((99..=101).contains(&third.as_millis()), "{third:?}");
        let fourth = limiter.retry_at(1, now).duration_since(now);
        assert!((199..=201).contains(&fourth.as_millis()), "{fourth:?}");
    }
}

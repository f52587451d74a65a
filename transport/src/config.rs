//! Transport limits and timeouts: a plain config as written in a file, checked once into a
//! [`CheckedConfig`] that the endpoint can trust without re-validating.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Largest frame the config may allow, in bytes: the codec's own value limit.
pub const frame_bytes_limit: u32 = 64 * 1024 * 1024;
/// Smallest frame limit worth running with, in bytes: a header plus a small body.
pub const frame_bytes_floor: u32 = 1024;
/// Most concurrent streams per connection the config may allow; quinn's stream credit is a
/// varint but memory per stream is real.
pub const streams_per_connection_limit: u32 = 4096;
/// Longest any configured timeout may be, in milliseconds (one hour).
pub const timeout_ms_limit: u64 = 3_600_000;

/// Transport settings as they appear in a config file; every field has a default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TransportConfig {
    /// Largest frame (length prefix excluded) accepted or sent, in bytes.
    pub frame_bytes_max: u32,
    /// Default deadline for one request/response round trip, in milliseconds.
    pub request_timeout_ms: u64,
    /// A connection with no traffic for this long is closed, in milliseconds.
    pub idle_timeout_ms: u64,
    /// Keep-alive ping interval, in milliseconds; must be below the idle timeout.
    pub keep_alive_ms: u64,
    /// Concurrent streams (and in-flight requests) one peer may have open on one connection.
    pub streams_per_connection_max: u32,
    /// Longest wait between two dial attempts to an unreachable peer, in milliseconds.
    pub dial_backoff_max_ms: u64,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            frame_bytes_max: 16 * 1024 * 1024,
            request_timeout_ms: 5000,
            idle_timeout_ms: 10_000,
            keep_alive_ms: 2000,
            streams_per_connection_max: 256,
            dial_backoff_max_ms: 2000,
        }
    }
}

/// A transport config that does not make sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "transport config: {field} = {value} is out of range {min}..={max}; set it within that range"
    )]
    OutOfRange {
        field: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
    #[error(
        "transport config: keep_alive_ms ({keep_alive_ms}) must be below idle_timeout_ms ({idle_timeout_ms}), or idle connections close between pings"
    )]
    KeepAliveNotBelowIdle {
        keep_alive_ms: u64,
        idle_timeout_ms: u64,
    },
}

/// A [`TransportConfig`] that passed [`TransportConfig::check`].
/// The defaults are valid, so `CheckedConfig::default()` needs no check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckedConfig {
    config: TransportConfig,
}

fn in_range(field: &'static str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::OutOfRange {
            field,
            value,
            min,
            max,
        });
    }
    Ok(())
}

impl TransportConfig {
    /// Checks every field once; the result is what the endpoint takes.
    pub fn check(self) -> Result<CheckedConfig, ConfigError> {
        let c = &self;
        in_range(
            "frame_bytes_max",
            c.frame_bytes_max.into(),
            frame_bytes_floor.into(),
            frame_bytes_limit.into(),
        )?;
        in_range(
            "request_timeout_ms",
            c.request_timeout_ms,
            1,
            timeout_ms_limit,
        )?;
        in_range("idle_timeout_ms", c.idle_timeout_ms, 2, timeout_ms_limit)?;
        in_range("keep_alive_ms", c.keep_alive_ms, 1, timeout_ms_limit)?;
        in_range(
            "streams_per_connection_max",
            c.streams_per_connection_max.into(),
            1,
            streams_per_connection_limit.into(),
        )?;
        in_range(
            "dial_backoff_max_ms",
            c.dial_backoff_max_ms,
            1,
            timeout_ms_limit,
        )?;
        if c.keep_alive_ms >= c.idle_timeout_ms {
            return Err(ConfigError::KeepAliveNotBelowIdle {
                keep_alive_ms: c.keep_alive_ms,
                idle_timeout_ms: c.idle_timeout_ms,
            });
        }
        Ok(CheckedConfig { config: self })
    }
}

impl CheckedConfig {
    /// The checked values, for display.
    pub fn values(&self) -> &TransportConfig {
        &self.config
    }

    pub fn frame_bytes_max(&self) -> usize {
        // u32 always fits in usize on the 64-bit targets mesh supports.
        self.config.frame_bytes_max as usize
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.config.request_timeout_ms)
    }

    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.config.idle_timeout_ms)
    }

    pub fn keep_alive(&self) -> Duration {
        Duration::from_millis(self.config.keep_alive_ms)
    }

    pub fn streams_per_connection_max(&self) -> u32 {
        self.config.streams_per_connection_max
    }

    pub fn dial_backoff_max(&self) -> Duration {
        Duration::from_millis(self.config.dial_backoff_max_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_their_own_check() {
        // Config: the documented defaults are a valid config.
        let checked = TransportConfig::default().check().expect("must succeed");
        assert_eq!(checked, CheckedConfig::default());
        assert_eq!(checked.frame_bytes_max(), 16 * 1024 * 1024);
    }

    #[test]
    fn out_of_range_values_are_refused_by_name() {
        // Config: checked once; a bad value is named with its range.
        let bad = TransportConfig {
            streams_per_connection_max: 0,
            ..TransportConfig::default()
        };
        let err = bad.check().expect_err("must fail");
        assert!(
            err.to_string().contains("streams_per_connection_max"),
            "{err}"
        );
        let bad = TransportConfig {
            keep_alive_ms: 10_000,
            ..TransportConfig::default()
        };
        assert!(matches!(
            bad.check(),
            Err(ConfigError::KeepAliveNotBelowIdle { .. })
        ));
    }
}

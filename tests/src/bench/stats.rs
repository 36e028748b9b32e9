//! Percentiles and summaries.

use serde::{Deserialize, Serialize};

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64
}

pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// Latency percentiles in microseconds, from nanosecond samples.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Latency {
    pub samples: usize,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

impl Latency {
    pub fn from_ns(mut samples: Vec<u64>) -> Self {
        samples.sort_unstable();
        let n = samples.len();
        let sum: f64 = samples.iter().map(|v| *v as f64).sum();
        Self {
            samples: n,
            p50_us: percentile(&samples, 50.0) / 1e3,
            p90_us: percentile(&samples, 90.0) / 1e3,
            p99_us: percentile(&samples, 99.0) / 1e3,
            max_us: samples.last().map_or(0.0, |v| *v as f64 / 1e3),
            mean_us: if n == 0 { 0.0 } else { sum / n as f64 / 1e3 },
        }
    }
}

/// A rate measured once per round: the median is the figure, min and max
/// show the spread between rounds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Rate {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub rounds: usize,
}

impl Rate {
    pub fn from_rounds(values: &[f64]) -> Self {
        Self {
            median: median(values),
            min: if values.is_empty() {
                0.0
            } else {
                values.iter().copied().fold(f64::INFINITY, f64::min)
            },
            max: values.iter().copied().fold(0.0, f64::max),
            rounds: values.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_medians() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let l = Latency::from_ns(vec![2000, 1000, 3000]);
        assert_eq!(l.p50_us, 2.0);
        assert_eq!(l.mean_us, 2.0);
    }
}

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

/// A rate measured once per block (or round): the median is the figure,
/// min and max show the spread; the samples, in measurement order, pair
/// it with another variant's rate measured in the same block pass.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Rate {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub rounds: usize,
    /// Every block's rate (absent from results written before pairing).
    #[serde(default)]
    pub samples: Vec<f64>,
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
            samples: values.to_vec(),
        }
    }
}

/// One variant's rate relative to another's, pair by pair: the ratios of
/// the rates of the same block pass (measured next to each other, so
/// slower drift of the machine cancels out), their median, and the
/// distribution-free 95% confidence interval of that median.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Paired {
    pub median: f64,
    pub low: f64,
    pub high: f64,
    pub pairs: usize,
}

/// Pairs needed for a 95% interval of the median from order statistics.
const PAIRED_MIN: usize = 6;

/// `a` relative to `b`, pair by pair; `None` without enough pairs (then
/// compare the medians).
pub fn paired(a: &Rate, b: &Rate) -> Option<Paired> {
    let mut r: Vec<f64> = a
        .samples
        .iter()
        .zip(&b.samples)
        .filter(|(x, y)| **x > 0.0 && **y > 0.0)
        .map(|(x, y)| x / y)
        .collect();
    let n = r.len();
    if n < PAIRED_MIN {
        return None;
    }
    r.sort_by(f64::total_cmp);
    // Ranks n/2 -+ 1.96 sqrt(n)/2 (normal approximation of the binomial).
    let half = 1.96 * (n as f64).sqrt() / 2.0;
    let lo = ((n as f64 / 2.0 - half).floor() as usize).clamp(1, n) - 1;
    let hi = ((n as f64 / 2.0 + half).ceil() as usize).clamp(1, n) - 1;
    Some(Paired {
        median: median(&r),
        low: r[lo],
        high: r[hi],
        pairs: n,
    })
}

/// `a` relative to `b`: the paired median where there are pairs, else the
/// ratio of the medians (0 when either is missing).
pub fn relative(a: &Rate, b: &Rate) -> f64 {
    match paired(a, b) {
        Some(p) => p.median,
        None if a.median > 0.0 && b.median > 0.0 => a.median / b.median,
        None => 0.0,
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

    #[test]
    fn paired_ratios_cancel_drift_and_bound_the_median() {
        // The machine slows down over the run: both variants' rates fall
        // together, b's always 10% below a's.
        let a: Vec<f64> = (0..50).map(|i| 30_000.0 - 200.0 * f64::from(i)).collect();
        let b: Vec<f64> = a.iter().map(|x| x * 0.9).collect();
        let p = paired(&Rate::from_rounds(&b), &Rate::from_rounds(&a)).expect("pairs");
        assert!((p.median - 0.9).abs() < 1e-9, "{p:?}");
        assert!((p.low - 0.9).abs() < 1e-9 && (p.high - 0.9).abs() < 1e-9);
        assert_eq!(p.pairs, 50);
        // One spoiled block moves the median of the ratios, not the interval's
        // order: ratios 1..=50 / 50.
        let x: Vec<f64> = (1..=50).map(f64::from).collect();
        let one = vec![50.0; 50];
        let p = paired(&Rate::from_rounds(&x), &Rate::from_rounds(&one)).expect("pairs");
        assert!((p.median - 0.51).abs() < 1e-9, "{p:?}");
        assert!(p.low < p.median && p.median < p.high, "{p:?}");
        // Ranks 25 -+ 6.93: the 18th and the 32nd ratio.
        assert!((p.low - 18.0 / 50.0).abs() < 1e-9, "{p:?}");
        assert!((p.high - 32.0 / 50.0).abs() < 1e-9, "{p:?}");
        // Too few pairs: the ratio of the medians instead.
        let few = Rate::from_rounds(&[2.0, 2.0]);
        let base = Rate::from_rounds(&[4.0, 4.0]);
        assert!(paired(&few, &base).is_none());
        assert!((relative(&few, &base) - 0.5).abs() < 1e-9);
        assert_eq!(relative(&few, &Rate::default()), 0.0);
    }
}

//! The small pieces of arithmetic and argument parsing every bench shares.

/// The median of unsorted samples: the middle one, or the mean of the two middle ones of an
/// even count. NaN for no samples.
pub(crate) fn median(x: &[f64]) -> f64 {
    let mut v = x.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[m],
        _ => (v[m - 1] + v[m]) / 2.0,
    }
}

/// A ratio of two variants' times, paired run by run: the spread of `a[i] / b[i]` over runs
/// timed back to back, whose median cancels the host's slower and faster minutes that a ratio
/// of the two medians keeps.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub(crate) struct PairedRatio {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) pairs: usize,
}

impl PairedRatio {
    /// The ratios `a[i] / b[i]` of runs timed together; `None` without a pair.
    pub(crate) fn of(a: &[f64], b: &[f64]) -> Option<PairedRatio> {
        let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
        let min = r.iter().copied().reduce(f64::min)?;
        let max = r.iter().copied().fold(min, f64::max);
        Some(PairedRatio { median: median(&r), min, max, pairs: r.len() })
    }
}

/// Parses `N` comma-separated sizes, each positive, as `what` names them (`"M,K,N"`).
pub(crate) fn parse_dims<const N: usize>(s: &str, what: &str) -> Result<[usize; N], String> {
    let v: Vec<usize> = s
        .split(',')
        .map(|x| x.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{s}: {e}"))?;
    match <[usize; N]>::try_from(v) {
        Ok(dims) if !dims.contains(&0) => Ok(dims),
        _ => Err(format!("{s}: expected {what}, each positive")),
    }
}

/// Parses a block size `ROWSxKEYS` (`4x32`), each positive.
pub(crate) fn parse_tile(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s.split_once('x').ok_or("expected ROWSxKEYS, like 4x32")?;
    let parse =
        |x: &str| x.parse::<usize>().ok().filter(|&v| v > 0).ok_or(format!("{x} is not a positive integer"));
    Ok((parse(a)?, parse(b)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median(&[9.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[9.0, 1.0, 4.0, 2.0]), 3.0);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn dims_are_counted_and_positive() {
        assert_eq!(parse_dims::<3>(" 2, 3,4", "M,K,N"), Ok([2, 3, 4]));
        assert_eq!(parse_dims::<3>("2,3", "M,K,N"), Err("2,3: expected M,K,N, each positive".into()));
        assert_eq!(parse_dims::<2>("2,0", "A,B"), Err("2,0: expected A,B, each positive".into()));
        assert!(parse_dims::<2>("2,x", "A,B").unwrap_err().starts_with("2,x: "));
        assert_eq!(parse_tile("4x32"), Ok((4, 32)));
        assert!(parse_tile("0x32").is_err() && parse_tile("4,32").is_err());
    }
}

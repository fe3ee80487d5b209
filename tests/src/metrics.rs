//! Prometheus text exposition, parsed just enough to assert on counters, gauges and histograms.

/// One sample line: `name{label="value",...} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// A parsed `/metrics` scrape.
#[derive(Clone, Debug)]
pub struct Metrics {
    pub text: String,
    pub samples: Vec<Sample>,
}

impl Metrics {
    pub fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(parse_sample)
            .collect();
        Self {
            text: text.to_owned(),
            samples,
        }
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
        })
    }

    /// The value of the first sample named `name` whose labels include all of `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, labels).next().map(|s| s.value)
    }

    /// Like [`Self::value`], but a missing sample counts as 0 (counters not yet touched).
    pub fn value_or_zero(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels).unwrap_or(0.0)
    }

    /// Asserts that the sample is `want` (a missing one reads as 0), showing the scrape if not.
    pub fn assert_value(&self, name: &str, labels: &[(&str, &str)], want: f64) {
        assert_eq!(self.value_or_zero(name, labels), want, "{}", self.text);
    }

    /// Asserts that the sample is present and is `want`, showing the scrape if not.
    pub fn assert_present(&self, name: &str, labels: &[(&str, &str)], want: f64) {
        assert_eq!(self.value(name, labels), Some(want), "{}", self.text);
    }

    /// Sum over every sample named `name` whose labels include all of `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// Whether any sample of this metric family (including `_bucket`/`_sum`/`_count`) exists.
    pub fn has_samples(&self, family: &str) -> bool {
        self.samples.iter().any(|s| {
            s.name == family
                || s.name
                    .strip_prefix(family)
                    .is_some_and(|rest| matches!(rest, "_bucket" | "_sum" | "_count"))
        })
    }

    pub fn has_help(&self, family: &str) -> bool {
        let prefix = format!("# HELP {family} ");
        self.text.lines().any(|l| l.starts_with(&prefix))
    }

    /// The `# TYPE` of a metric family.
    pub fn type_of(&self, family: &str) -> Option<String> {
        let prefix = format!("# TYPE {family} ");
        self.text
            .lines()
            .find_map(|l| l.strip_prefix(&prefix).map(|t| t.trim().to_owned()))
    }
}

fn parse_sample(line: &str) -> Option<Sample> {
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let close = line.rfind('}')?;
            (
                &line[..open],
                parse_labels(&line[open + 1..close]),
                &line[close + 1..],
            )
        }
        None => {
            let sp = line.find(char::is_whitespace)?;
            (&line[..sp], Vec::new(), &line[sp..])
        }
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.trim().to_owned(),
        labels,
        value,
    })
}

fn parse_labels(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        let key = key.trim().trim_start_matches(',').trim().to_owned();
        if key.is_empty() || chars.next() != Some('"') {
            break;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                '"' => break,
                c => value.push(c),
            }
        }
        out.push((key, value));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_labels_and_histograms() {
        let m = Metrics::parse(
            "# HELP slotgate_requests_total Requests.\n# TYPE slotgate_requests_total counter\n\
             slotgate_requests_total{outcome=\"ok\"} 3\nslotgate_requests_total{outcome=\"queue_full\"} 1\n\
             slotgate_queue_wait_seconds_bucket{le=\"+Inf\"} 4\nslotgate_queue_wait_seconds_sum 0.5\n\
             slotgate_inflight 0\n",
        );
        assert_eq!(
            m.value("slotgate_requests_total", &[("outcome", "ok")]),
            Some(3.0)
        );
        assert_eq!(m.sum("slotgate_requests_total", &[]), 4.0);
        assert!(m.has_samples("slotgate_queue_wait_seconds"));
        assert!(m.has_help("slotgate_requests_total"));
        assert_eq!(
            m.type_of("slotgate_requests_total").as_deref(),
            Some("counter")
        );
        assert_eq!(m.value("slotgate_inflight", &[]), Some(0.0));
        assert_eq!(
            m.value("slotgate_queue_wait_seconds_bucket", &[("le", "+Inf")]),
            Some(4.0)
        );
    }
}
